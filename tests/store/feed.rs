//! The change feed (`ChangeFeed`, `task_events_head`): what a stream of
//! status changes and progress reports reads, and when it wakes.

use super::*;

// change feed: change_feed (version, next_events, next_progress) / task_events_head

async fn change_feed_follows_every_transition_from_the_head(db: TestDb) {
    assert_eq!(db.store.task_events_head().await.unwrap(), 0, "empty feed");
    let mut feed = db
        .store
        .change_feed(FeedInterest::Everything, CancellationToken::new())
        .await
        .unwrap();

    let a = db
        .store
        .task_create(&new_task("t-a", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("t-b", "alice"), None, None, T0 + 1)
        .await
        .unwrap();
    let head_after_create = db.store.task_events_head().await.unwrap();
    assert_eq!(head_after_create, 2);
    // A feed opened now starts at the head: it sees only what follows.
    let mut late = db
        .store
        .change_feed(FeedInterest::Everything, CancellationToken::new())
        .await
        .unwrap();

    claim_one(&db.store, "w1", "lease-1", T0 + 2).await;
    db.store
        .job_complete(a.seq, "lease-1", &completed_outcome(), T0 + 3)
        .await
        .unwrap();
    db.store
        .task_cancel("t-b", "alice", "cancelled", T0 + 4)
        .await
        .unwrap();
    // A status message is not a transition.
    assert_eq!(db.store.task_events_head().await.unwrap(), 4);

    let first = feed.next_events(3).await.unwrap();
    let rest = feed.next_events(100).await.unwrap();
    let got: Vec<(i64, &str, TaskStatus)> = first
        .iter()
        .chain(&rest)
        .map(|e| (e.id, e.task_id.as_str(), e.to_status))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "t-a", TaskStatus::Working),
            (2, "t-b", TaskStatus::Working),
            (3, "t-a", TaskStatus::Completed),
            (4, "t-b", TaskStatus::Cancelled),
        ]
    );
    assert_eq!(first.len(), 3, "the limit holds");

    let tail = late.next_events(100).await.unwrap();
    assert_eq!(tail.iter().map(|e| e.id).collect::<Vec<_>>(), vec![3, 4]);
    assert!(feed.next_events(100).await.unwrap().is_empty(), "read once");
}
store_test!(change_feed_follows_every_transition_from_the_head);

/// `ChangeFeed::version` stays while nothing is committed and moves after a
/// commit the feed reads (at once on SQLite; when the notification arrives
/// on PostgreSQL: a process kicks its own feed after its commits, so it
/// never waits for that).
async fn change_feed_version_moves_after_a_commit(db: TestDb) {
    let shutdown = CancellationToken::new();
    let mut feed = db
        .store
        .change_feed(FeedInterest::Everything, shutdown.clone())
        .await
        .unwrap();
    let v1 = feed.version().await.unwrap();
    assert_eq!(feed.version().await.unwrap(), v1, "no commit, no change");

    db.store
        .task_create(&new_task("t-1", "alice"), None, None, T0)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while feed.version().await.unwrap() == v1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the version never moved after a commit"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(feed.next_events(10).await.unwrap().len(), 1);
    shutdown.cancel();
}
store_test!(change_feed_version_moves_after_a_commit);

/// A commit from another handle on the database (another process),
/// announced as a process does after its commits: the feed's remote signal
/// fires, its version moves, and it reads what the other handle wrote.
async fn change_feed_wakes_when_another_handle_commits(db: TestDb) {
    let shutdown = CancellationToken::new();
    let mut feed = db
        .store
        .change_feed(FeedInterest::Everything, shutdown.clone())
        .await
        .unwrap();
    let v1 = feed.version().await.unwrap();

    let other = store::open(db.location(), Durability::Full).await.unwrap();
    let other_feed = other
        .change_feed(FeedInterest::Everything, shutdown.clone())
        .await
        .unwrap();
    let remote = feed.remote();
    let woken = remote.notified();
    other
        .task_create(&new_task("t-other", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    other.announce(Signal::Changed);
    tokio::time::timeout(Duration::from_secs(10), woken)
        .await
        .expect("the other handle's commit wakes this feed");
    assert_ne!(feed.version().await.unwrap(), v1);

    let events = feed.next_events(10).await.unwrap();
    let got: Vec<(&str, TaskStatus)> = events
        .iter()
        .map(|e| (e.task_id.as_str(), e.to_status))
        .collect();
    assert_eq!(got, vec![("t-other", TaskStatus::Working)]);
    assert_eq!(events[0].from_status, None);
    assert_eq!(events[0].owner, "alice");
    assert!(feed.next_events(10).await.unwrap().is_empty());

    // A progress report from the other handle reaches this feed too.
    let claimed = claim_one(&other, "w1", "lease-1", T0 + 1).await;
    other
        .task_record_progress(claimed.task_seq, "lease-1", 0.5, None, "half", T0 + 2)
        .await
        .unwrap();
    other.announce(Signal::Changed);
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let woken = remote.notified();
            let progress = feed.next_progress(10).await.unwrap();
            if let Some(p) = progress.first() {
                assert_eq!((p.task_id.as_str(), p.progress), ("t-other", 0.5));
                return;
            }
            woken.await;
        }
    })
    .await
    .expect("the other handle's progress report reaches this feed");
    shutdown.cancel();
    // A feed holds a connection of its own: drop it before closing.
    drop(other_feed);
    other.close().await;
}
store_test!(change_feed_wakes_when_another_handle_commits);

async fn change_feed_reads_progress_reports_in_order(db: TestDb) {
    let mut feed = db
        .store
        .change_feed(FeedInterest::Everything, CancellationToken::new())
        .await
        .unwrap();
    let row = db
        .store
        .task_create(&new_task("t-p", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-p", T0 + 1).await;
    for (i, msg) in ["one", "two", "three"].iter().enumerate() {
        db.store
            .task_record_progress(row.seq, "lease-p", i as f64 + 1.0, Some(3.0), msg, T0 + 2)
            .await
            .unwrap();
    }
    let got: Vec<(f64, Option<String>)> = feed
        .next_progress(10)
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.progress, p.message))
        .collect();
    assert_eq!(
        got,
        vec![
            (1.0, Some("one".to_owned())),
            (2.0, Some("two".to_owned())),
            (3.0, Some("three".to_owned())),
        ]
    );
    assert_lease_lost(
        db.store
            .task_record_progress(row.seq, "stranger", 4.0, None, "x", T0 + 3)
            .await,
    );
    assert!(feed.next_progress(10).await.unwrap().is_empty());
}
store_test!(change_feed_reads_progress_reports_in_order);

/// Issue 26: the feed's row of a task's end carries its outcome when it is
/// small (up to 4 KB: a waiter then needs no read of the task), not when
/// it is larger, nor on other changes; a GET stream's catch-up read of an
/// owner's changes carries none.
async fn change_feed_carries_a_small_outcome_with_the_end(db: TestDb) {
    let mut feed = db
        .store
        .change_feed(FeedInterest::Everything, CancellationToken::new())
        .await
        .unwrap();
    let small = db
        .store
        .task_create(&new_task("t-small", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-s", T0 + 1).await;
    let large = db
        .store
        .task_create(&new_task("t-large", "alice"), Some(JOB), None, T0 + 2)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-l", T0 + 3).await;
    let big = TaskOutcome {
        result: serde_json::json!({"content": [{"type": "text", "text": "x".repeat(5000)}]})
            .to_string(),
        ..completed_outcome()
    };
    let failed = failed_outcome("it broke");
    assert!(
        db.store
            .job_complete(small.seq, "lease-s", &failed, T0 + 4)
            .await
            .unwrap()
    );
    assert!(
        db.store
            .job_complete(large.seq, "lease-l", &big, T0 + 5)
            .await
            .unwrap()
    );
    let events = feed.next_events(10).await.unwrap();
    let ends: Vec<(&str, TaskStatus, bool)> = events
        .iter()
        .map(|e| (e.task_id.as_str(), e.to_status, e.outcome.is_some()))
        .collect();
    assert_eq!(
        ends,
        [
            ("t-small", TaskStatus::Working, false),
            ("t-large", TaskStatus::Working, false),
            ("t-small", TaskStatus::Failed, true),
            ("t-large", TaskStatus::Completed, false),
        ]
    );
    let carried = events[2].outcome.as_ref().unwrap();
    assert_eq!(carried.status, TaskStatus::Failed);
    assert_eq!(carried.status_message, failed.status_message);
    assert_eq!(carried.result, failed.result);
    assert_eq!(carried.result_kind, failed.result_kind);
    assert_eq!(carried.tool_error, failed.tool_error);
    let caught_up = db
        .store
        .task_events_for_owner_since("alice", 0, 10)
        .await
        .unwrap();
    assert_eq!(caught_up.len(), 4);
    assert!(caught_up.iter().all(|e| e.outcome.is_none()));
}
store_test!(change_feed_carries_a_small_outcome_with_the_end);

/// Many writers at once: the feed still sees every event, each once and
/// in id order (on PostgreSQL, ids become visible in id order).
async fn feed_misses_nothing_under_concurrent_writers(db: TestDb) {
    const WRITERS: usize = 6;
    const TASKS_EACH: usize = 25;
    let shutdown = CancellationToken::new();
    let mut feed = db
        .store
        .change_feed(FeedInterest::Everything, shutdown.clone())
        .await
        .unwrap();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = db.store.clone();
            tokio::spawn(async move {
                for i in 0..TASKS_EACH {
                    store
                        .task_create(
                            &new_task(&format!("w{w}-{i}"), "alice"),
                            Some(JOB),
                            None,
                            T0,
                        )
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    let mut seen = HashSet::new();
    let mut last = 0;
    let all_written = async {
        for w in writers {
            w.await.expect("writer");
        }
    };
    tokio::pin!(all_written);
    let mut finished = false;
    loop {
        for e in feed.next_events(7).await.unwrap() {
            assert!(e.id > last, "feed out of order");
            last = e.id;
            assert!(seen.insert(e.task_id), "an event twice");
        }
        if finished {
            // Everything committed: one more read must find the rest.
            for e in feed.next_events(1000).await.unwrap() {
                assert!(e.id > last, "feed out of order");
                last = e.id;
                assert!(seen.insert(e.task_id), "an event twice");
            }
            assert_eq!(seen.len(), WRITERS * TASKS_EACH, "the feed skipped events");
            break;
        }
        tokio::select! {
            () = &mut all_written => finished = true,
            // Read while the writers write: the reads interleave with commits.
            () = tokio::time::sleep(Duration::from_millis(2)) => {}
        }
    }
    shutdown.cancel();
}
store_test!(
    #[multi_thread]
    feed_misses_nothing_under_concurrent_writers
);

/// Whether `notify` fires within `wait`.
async fn fires(notify: &tokio::sync::Notify, wait: Duration) -> bool {
    tokio::time::timeout(wait, notify.notified()).await.is_ok()
}

/// Two worker processes' feeds (interest Control) on `db`, and another
/// process's store (with its own feed, kept open) to queue jobs from.
async fn claimers_and_a_queuer(
    db: &TestDb,
    shutdown: &CancellationToken,
) -> (
    [Box<dyn store::ChangeFeed>; 2],
    Store,
    Box<dyn store::ChangeFeed>,
) {
    let open_feed = || {
        db.store
            .change_feed(FeedInterest::Control, shutdown.clone())
    };
    let claimers = [open_feed().await.unwrap(), open_feed().await.unwrap()];
    let other = store::open(db.location(), Durability::Full).await.unwrap();
    let other_feed = other
        .change_feed(FeedInterest::Everything, shutdown.clone())
        .await
        .unwrap();
    (claimers, other, other_feed)
}

/// Queue the job of a new task `t-<n>` from `other`, as a process's
/// writer does: commit, then announce.
async fn queue_one(other: &Store, n: i64) {
    other
        .task_create(
            &new_task(&format!("t-{n}"), "alice"),
            Some(JOB),
            None,
            T0 + n,
        )
        .await
        .unwrap();
    other.announce_queued(&QueuedJobs::one_of("echo"));
}

/// Issue 26: a commit that queues jobs names the live worker processes
/// asked to claim at once (fresh heartbeat, kind `process`; PostgreSQL in
/// its notification, SQLite in the queue's wake file), and a feed hears
/// the signal as `queued` when its claimer is named (or none is), as
/// `queued_for_others` when others are. With no live worker process to
/// name, every claimer is asked. (SQLite reads the live workers at most
/// once a second, in the background: the first pokes, and those within a
/// second of a change, may name no one or a stopped worker; the test
/// queues again until the new list shows.)
async fn a_queued_job_asks_the_named_claimers_at_once(db: TestDb) {
    let shutdown = CancellationToken::new();
    let ([named, unnamed], other, _other_feed) = claimers_and_a_queuer(&db, &shutdown).await;
    let quiet = Duration::from_millis(300);
    let long = Duration::from_secs(10);
    let now = wall_clock_ms();
    let pool = |id: &str| process_worker(id, 4);
    other.worker_register(&pool("w-named"), now).await.unwrap();
    let queued = std::sync::atomic::AtomicI64::new(0);
    let queue = || {
        let other = other.clone();
        let n = queued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        async move { queue_one(&other, n).await }
    };
    // Queue jobs until `notify` fires (each waited for `quiet`).
    let queue_until = async |notify: &tokio::sync::Notify| {
        let deadline = std::time::Instant::now() + long;
        while std::time::Instant::now() < deadline {
            let heard = notify.notified();
            queue().await;
            if tokio::time::timeout(quiet, heard).await.is_ok() {
                return true;
            }
        }
        false
    };
    let (Some(named_id), Some(unnamed_id)) = (named.claimer(), unnamed.claimer()) else {
        panic!("every driver names claimers");
    };
    named_id.set("w-named".to_owned()).unwrap();
    unnamed_id.set("w-unnamed".to_owned()).unwrap();
    let for_others = unnamed.queued_for_others().unwrap();

    // One live worker process, named: it claims at once, the other later.
    assert!(
        queue_until(&for_others).await,
        "the other hears a job was for others"
    );
    // What earlier pokes left (a signal not waited for is kept) goes.
    tokio::time::sleep(quiet).await;
    for notify in [named.queued(), unnamed.queued(), for_others.clone()] {
        fires(&notify, Duration::from_millis(1)).await;
    }
    queue().await;
    assert!(
        fires(&named.queued(), long).await,
        "the named claimer is asked"
    );
    assert!(fires(&for_others, long).await);
    assert!(
        !fires(&unnamed.queued(), quiet).await,
        "and the other is not asked at once"
    );

    // No live worker process (it stopped): every claimer is asked.
    other
        .worker_set_state("w-named", WorkerState::Stopped, now + 1)
        .await
        .unwrap();
    assert!(
        queue_until(&unnamed.queued()).await,
        "no one to name: everyone"
    );
    assert!(fires(&named.queued(), long).await);
    shutdown.cancel();
}
store_test!(a_queued_job_asks_the_named_claimers_at_once);

/// Queue jobs from `other` (as [`queue_one`]) and check that each time the
/// signal asks `asked` to claim at once and passes over `passed`, which
/// hears it as queued for others. First queues until a signal names
/// `passed` out (SQLite reads the live workers in the background, at
/// most once a second: until it has, its pokes name no one).
async fn each_job_asks_one_and_passes_over_the_other(
    other: &Store,
    asked: &dyn store::ChangeFeed,
    passed: &dyn store::ChangeFeed,
) {
    let passed_over = passed.queued_for_others().unwrap();
    let mut n = 0;
    let mut queue = async || {
        n += 1;
        queue_one(other, n).await;
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let heard = passed_over.notified();
        queue().await;
        if tokio::time::timeout(Duration::from_millis(300), heard)
            .await
            .is_ok()
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no poke named anyone");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for notify in [asked.queued(), passed.queued(), passed_over.clone()] {
        fires(&notify, Duration::from_millis(1)).await;
    }
    // Named at random or in turn: the same one, every time.
    for _ in 0..8 {
        queue().await;
        assert!(
            fires(&asked.queued(), Duration::from_secs(10)).await,
            "the right worker is asked"
        );
        assert!(fires(&passed_over, Duration::from_secs(10)).await);
        assert!(
            !fires(&passed.queued(), Duration::from_millis(100)).await,
            "the other is not asked at once"
        );
    }
}

/// Issue 26: a queued job is named for a worker process with room for
/// it, not for one that reported itself full at its last heartbeat (both
/// drivers: PostgreSQL's notification, SQLite's wake file), so that a
/// commit of a few jobs asks one claimer, and one that can take them.
async fn a_queued_job_is_named_for_a_worker_with_room(db: TestDb) {
    let shutdown = CancellationToken::new();
    let ([roomy, full], other, _other_feed) = claimers_and_a_queuer(&db, &shutdown).await;
    let now = wall_clock_ms();
    for (id, running) in [("w-roomy", 1), ("w-full", 4)] {
        other
            .worker_register(&process_worker(id, 4), now)
            .await
            .unwrap();
        other.worker_heartbeat(id, running, now).await.unwrap();
    }
    let (Some(roomy_id), Some(full_id)) = (roomy.claimer(), full.claimer()) else {
        panic!("every driver names claimers");
    };
    roomy_id.set("w-roomy".to_owned()).unwrap();
    full_id.set("w-full".to_owned()).unwrap();
    // A job goes to the one with room.
    each_job_asks_one_and_passes_over_the_other(&other, &*roomy, &*full).await;
    shutdown.cancel();
}
store_test!(a_queued_job_is_named_for_a_worker_with_room);

/// Issue 26: a queued job is named only for worker processes that serve
/// its tool (as each reported, `worker_serves`), so that where processes
/// serve different tools a job does not wait for the others' later look
/// (both drivers: PostgreSQL's notification, SQLite's wake file).
async fn a_queued_job_is_named_for_a_worker_serving_its_tool(db: TestDb) {
    let shutdown = CancellationToken::new();
    let ([serving, other_tools], other, _other_feed) = claimers_and_a_queuer(&db, &shutdown).await;
    let now = wall_clock_ms();
    for (id, tools) in [
        ("w-echo", ["echo", "sleep"]),
        ("w-report", ["report", "sleep"]),
    ] {
        other
            .worker_register(&process_worker(id, 4), now)
            .await
            .unwrap();
        let tools: Vec<String> = tools.iter().map(|t| (*t).to_owned()).collect();
        other.worker_serves(id, &tools).await.unwrap();
    }
    let (Some(serving_id), Some(other_id)) = (serving.claimer(), other_tools.claimer()) else {
        panic!("every driver names claimers");
    };
    serving_id.set("w-echo".to_owned()).unwrap();
    other_id.set("w-report".to_owned()).unwrap();
    // Both have room: an echo job goes to the one serving echo.
    each_job_asks_one_and_passes_over_the_other(&other, &*serving, &*other_tools).await;
    shutdown.cancel();
}
store_test!(a_queued_job_is_named_for_a_worker_serving_its_tool);

/// A worker process's feed (interest Control) is woken by another
/// process's cancellations and answers, not by its creations, claims,
/// progress or completions, and reads only those; its claim signal
/// (`queued`) fires when a job is queued, and not when one is claimed or
/// completed. (What keeps the work per task flat as worker processes are
/// added.)
async fn a_control_feed_wakes_for_cancels_and_answers_only(db: TestDb) {
    let shutdown = CancellationToken::new();
    let mut feed = db
        .store
        .change_feed(FeedInterest::Control, shutdown.clone())
        .await
        .unwrap();
    let other = store::open(db.location(), Durability::Full).await.unwrap();
    // The other handle announces as a process does (a feed of its own opens
    // its wake files).
    let other_feed = other
        .change_feed(FeedInterest::Everything, shutdown.clone())
        .await
        .unwrap();
    let (remote, queued) = (feed.remote(), feed.queued());
    let quiet = Duration::from_millis(300);
    let long = Duration::from_secs(10);

    // A task with a job: claimers hear of it; the control feed does not.
    let row = other
        .task_create(&new_task("t-q", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    other.announce(Signal::Changed);
    other.announce(Signal::Queued);
    assert!(fires(&queued, long).await, "a queued job wakes claimers");
    assert!(
        !fires(&remote, quiet).await,
        "a creation does not wake a control feed"
    );

    // Claim, progress, completion: neither signal.
    let claimed = claim_one(&other, "w1", "lease-q", T0 + 1).await;
    other
        .task_record_progress(claimed.task_seq, "lease-q", 1.0, None, "one", T0 + 2)
        .await
        .unwrap();
    other
        .job_complete(row.seq, "lease-q", &completed_outcome(), T0 + 3)
        .await
        .unwrap();
    other.announce(Signal::Changed);
    assert!(
        !fires(&remote, quiet).await,
        "a completion does not wake a control feed"
    );
    assert!(
        !fires(&queued, quiet).await,
        "a claim or completion does not wake claimers"
    );

    // A cancellation does.
    other
        .task_create(&new_task("t-c", "alice"), Some(JOB), None, T0 + 4)
        .await
        .unwrap();
    claim_one(&other, "w1", "lease-c", T0 + 5).await;
    let _ = fires(&queued, quiet).await;
    other
        .task_cancel("t-c", "alice", "stop", T0 + 6)
        .await
        .unwrap();
    other.announce(Signal::Changed);
    other.announce(Signal::Control);
    assert!(
        fires(&remote, long).await,
        "a cancellation wakes a control feed"
    );
    // It reads the cancellation only: not the creations, nor t-q's end.
    let read: Vec<(String, TaskStatus)> = feed
        .next_control_events(10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.task_id, e.to_status))
        .collect();
    assert_eq!(read, vec![("t-c".to_owned(), TaskStatus::Cancelled)]);
    assert!(feed.next_control_events(10).await.unwrap().is_empty());

    // A question is no control change; its answer is (the task goes back
    // to working), and it is read.
    let asking = other
        .task_create(&new_task("t-a", "alice"), Some(JOB), None, T0 + 7)
        .await
        .unwrap();
    claim_one(&other, "w1", "lease-a", T0 + 8).await;
    let question = TaskMessage {
        request_id: "r-a".to_owned(),
        task_id: "t-a".to_owned(),
        method: "elicitation/create".to_owned(),
        params: r#"{"message":"go?"}"#.to_owned(),
        response: None,
    };
    other
        .task_message_ask(asking.seq, "lease-a", &question, T0 + 9)
        .await
        .unwrap();
    other.announce(Signal::Changed);
    assert!(
        !fires(&remote, quiet).await,
        "a question does not wake a control feed"
    );
    assert_eq!(
        other
            .task_message_answer("r-a", "alice", r#"{"action":"accept"}"#, T0 + 10)
            .await
            .unwrap(),
        AnswerOutcome::Stored
    );
    other.announce(Signal::Changed);
    other.announce(Signal::Control);
    assert!(fires(&remote, long).await, "an answer wakes a control feed");
    let read: Vec<(String, Option<TaskStatus>, TaskStatus)> = feed
        .next_control_events(10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.task_id, e.from_status, e.to_status))
        .collect();
    assert_eq!(
        read,
        vec![(
            "t-a".to_owned(),
            Some(TaskStatus::InputRequired),
            TaskStatus::Working
        )]
    );

    shutdown.cancel();
    drop(other_feed);
    other.close().await;
}
store_test!(a_control_feed_wakes_for_cancels_and_answers_only);

/// `next_control_events` passes over everything but cancellations and
/// answers, in order, a batch at a time, and then stands at the head.
async fn control_events_are_the_cancels_and_answers_in_order(db: TestDb) {
    let mut feed = db
        .store
        .change_feed(FeedInterest::Control, CancellationToken::new())
        .await
        .unwrap();
    for i in 0..5 {
        db.store
            .task_create(&new_task(&format!("t-{i}"), "alice"), Some(JOB), None, T0)
            .await
            .unwrap();
    }
    for i in [1, 3, 4] {
        db.store
            .task_cancel(&format!("t-{i}"), "alice", "stop", T0 + 1)
            .await
            .unwrap();
    }
    let first: Vec<String> = feed
        .next_control_events(2)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.task_id)
        .collect();
    assert_eq!(first, ["t-1", "t-3"]);
    let rest: Vec<String> = feed
        .next_control_events(2)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.task_id)
        .collect();
    assert_eq!(rest, ["t-4"]);
    assert!(feed.next_control_events(2).await.unwrap().is_empty());
    // Later creations are passed over too.
    db.store
        .task_create(&new_task("t-5", "alice"), Some(JOB), None, T0 + 2)
        .await
        .unwrap();
    assert!(feed.next_control_events(2).await.unwrap().is_empty());
}
store_test!(control_events_are_the_cancels_and_answers_in_order);
