//! The operator reads (`OpsStore`: `ops_stats`, `ops_workers`,
//! `ops_task_page`, `ops_task_history`, `ops_stats_plans`) against one
//! known state ([`ops_world`]) written through the store's own methods,
//! with exact values.

use super::*;

// Operator and metrics reads (OpsStore, MetricsStore) ---------------------------

/// The clock of [`ops_world`]: two hours after `T0`, so that tasks can
/// finish more than an hour before it.
pub(crate) const OPS_NOW: i64 = T0 + 2 * HOUR_MS;

/// `ms` before [`OPS_NOW`].
pub(super) fn ago(ms: i64) -> i64 {
    OPS_NOW - ms
}

/// The lease token [`OpsWorld::started`] claims task `id` with.
fn lease_of(id: &str) -> String {
    format!("lease-{id}")
}

/// The release reason `job_release` stores for a first attempt.
const RELEASED: &str = "released by a stopping worker (attempt 1 not counted)";

/// What [`ops_world`] built: every task id in creation (row key) order,
/// and each one's row key.
pub(super) struct OpsWorld {
    order: Vec<String>,
    seqs: std::collections::HashMap<String, i64>,
}

impl OpsWorld {
    pub(super) fn seq(&self, id: &str) -> i64 {
        self.seqs[id]
    }

    /// The ids of `ids`, newest first (as `ops_task_page` lists them).
    fn newest_first(&self, ids: &[&str]) -> Vec<String> {
        let mut ids: Vec<&str> = ids.to_vec();
        ids.sort_by_key(|id| std::cmp::Reverse(self.seq(id)));
        ids.into_iter().map(str::to_owned).collect()
    }

    async fn create(
        &mut self,
        store: &Store,
        task: NewTask,
        job: Option<NewJob>,
        outcome: Option<&TaskOutcome>,
        at: i64,
    ) -> i64 {
        let row = store.task_create(&task, job, outcome, at).await.unwrap();
        self.order.push(task.task_id.clone());
        self.seqs.insert(task.task_id, row.seq);
        row.seq
    }

    /// A task of `tool` for `owner` created at `at` with a job, which
    /// `worker` claims 10 ms later with the token [`lease_of`] `id` (the
    /// only job of `tool` in the queue then).
    async fn started(
        &mut self,
        store: &Store,
        (id, owner, tool): (&str, &str, &str),
        worker: &str,
        at: i64,
    ) -> i64 {
        let seq = self
            .create(store, ops_task(id, owner, tool), Some(JOB), None, at)
            .await;
        let quota = [ToolQuota {
            tool: tool.to_owned(),
            free: 1,
            global: None,
        }];
        let claimed = store
            .job_claim_available(worker, &lease_of(id), &quota, 1, LEASE_MS, at + 10)
            .await
            .unwrap();
        let seqs: Vec<i64> = claimed.iter().map(|j| j.task_seq).collect();
        assert_eq!(seqs, [seq], "{id} is the one job of {tool} queued");
        seq
    }
}

/// A task of `tool` for `owner`.
fn ops_task(id: &str, owner: &str, tool: &str) -> NewTask {
    NewTask {
        tool: tool.to_owned(),
        ..new_task(id, owner)
    }
}

/// A worker pool of `kind` with a lease of `lease_ms`.
fn ops_pool(id: &str, kind: WorkerKind, lease_ms: i64) -> NewWorker {
    NewWorker {
        worker_id: id.to_owned(),
        pid: 7,
        host: "host-ops".to_owned(),
        kind,
        concurrency: 4,
        lease_ms,
    }
}

/// A known state written through the store's own methods, times relative
/// to [`OPS_NOW`] (tools echo, slow, flaky; owners alice, bob, carol):
///
/// | task            | tool  | owner | at OPS_NOW                                        |
/// |-----------------|-------|-------|---------------------------------------------------|
/// | done-ancient    | echo  | alice | completed 1 h + 1 ms ago (ttl 1 s: expired)       |
/// | done-edge       | echo  | alice | completed exactly 1 h ago                         |
/// | done-recent     | echo  | bob   | completed 30 s ago                                |
/// | fail-flaky-1    | flaky | alice | failed 20 min ago, "boom 1"                       |
/// | fail-flaky-2    | flaky | bob   | failed 10 s ago, "boom 2"                         |
/// | fail-echo       | echo  | carol | created failed 5 min ago, "bad input" (no job)    |
/// | cancel-running  | slow  | alice | cancelled 2 min ago while w-live ran it           |
/// | running-echo    | echo  | alice | run by w-live since 20 min, two progress reports  |
/// | running-slow    | slow  | bob   | run by w-live since 12 min                        |
/// | asking          | slow  | carol | run by w-embedded, input_required since 7 min     |
/// | plain           | echo  | carol | working, no job                                   |
/// | released-echo   | echo  | bob   | released by w-stopping 3 min ago: queued again    |
/// | cancel-queued   | slow  | bob   | cancelled 15 s ago while queued                   |
/// | queued-echo-1   | echo  | alice | queued since 90 s                                 |
/// | queued-echo-2   | echo  | bob   | queued since 45 s                                 |
/// | queued-slow-1   | slow  | alice | queued since 20 s                                 |
///
/// Worker pools: w-old (dead: its 1 s lease ran out long ago), w-stopped
/// (stopped), w-live (live, heartbeat 5 s ago reporting 0 jobs although it
/// runs two), w-embedded (live, embedded) and w-stopping (stopping), the
/// last two started at the same time.
pub(super) async fn ops_world(store: &Store) -> OpsWorld {
    const MIN: i64 = MINUTE_MS;
    let mut w = OpsWorld {
        order: Vec::new(),
        seqs: std::collections::HashMap::new(),
    };
    store
        .worker_register(&ops_pool("w-old", WorkerKind::Process, 1_000), T0)
        .await
        .unwrap();
    store
        .worker_register(
            &ops_pool("w-stopped", WorkerKind::Process, LEASE_MS),
            ago(40 * MIN),
        )
        .await
        .unwrap();
    store
        .worker_set_state("w-stopped", WorkerState::Stopped, ago(35 * MIN))
        .await
        .unwrap();
    store
        .worker_register(
            &ops_pool("w-live", WorkerKind::Process, LEASE_MS),
            ago(30 * MIN),
        )
        .await
        .unwrap();
    for id in ["w-stopping", "w-embedded"] {
        let kind = if id == "w-embedded" {
            WorkerKind::Embedded
        } else {
            WorkerKind::Process
        };
        store
            .worker_register(&ops_pool(id, kind, LEASE_MS), ago(20 * MIN))
            .await
            .unwrap();
    }

    // Finished, running and released tasks, each claimed as it is made.
    let ancient = w
        .create(
            store,
            NewTask {
                tool: "echo".into(),
                ..new_task_ttl("done-ancient", "alice", 1_000)
            },
            Some(JOB),
            None,
            ago(HOUR_MS + MIN),
        )
        .await;
    claim_one(
        store,
        "w-live",
        &lease_of("done-ancient"),
        ago(HOUR_MS + MIN) + 10,
    )
    .await;
    let edge = w
        .started(
            store,
            ("done-edge", "alice", "echo"),
            "w-live",
            ago(HOUR_MS + 30_000),
        )
        .await;
    let recent = w
        .started(store, ("done-recent", "bob", "echo"), "w-live", ago(50_000))
        .await;
    let flaky1 = w
        .started(
            store,
            ("fail-flaky-1", "alice", "flaky"),
            "w-live",
            ago(25 * MIN),
        )
        .await;
    let flaky2 = w
        .started(
            store,
            ("fail-flaky-2", "bob", "flaky"),
            "w-live",
            ago(15_000),
        )
        .await;
    for (seq, id, outcome, at) in [
        (
            ancient,
            "done-ancient",
            completed_outcome(),
            ago(HOUR_MS + 1),
        ),
        (edge, "done-edge", completed_outcome(), ago(HOUR_MS)),
        (recent, "done-recent", completed_outcome(), ago(30_000)),
        (
            flaky1,
            "fail-flaky-1",
            failed_outcome("boom 1"),
            ago(20 * MIN),
        ),
        (
            flaky2,
            "fail-flaky-2",
            failed_outcome("boom 2"),
            ago(10_000),
        ),
    ] {
        assert!(
            store
                .job_complete(seq, &lease_of(id), &outcome, at)
                .await
                .unwrap()
        );
    }
    w.create(
        store,
        ops_task("fail-echo", "carol", "echo"),
        None,
        Some(&failed_outcome("bad input")),
        ago(5 * MIN),
    )
    .await;
    let cancel_running = w
        .started(
            store,
            ("cancel-running", "alice", "slow"),
            "w-live",
            ago(3 * MIN),
        )
        .await;
    assert!(matches!(
        store
            .task_cancel("cancel-running", "alice", "stopped by alice", ago(2 * MIN))
            .await
            .unwrap(),
        CancelOutcome::Cancelled(_)
    ));
    store
        .job_finish_cancelled(
            cancel_running,
            &lease_of("cancel-running"),
            ago(2 * MIN) + 100,
        )
        .await
        .unwrap();
    let running = w
        .started(
            store,
            ("running-echo", "alice", "echo"),
            "w-live",
            ago(20 * MIN),
        )
        .await;
    for (progress, message, at) in [(1.0, "one", ago(10 * MIN)), (2.0, "two", ago(5 * MIN))] {
        store
            .task_record_progress(
                running,
                &lease_of("running-echo"),
                progress,
                Some(3.0),
                message,
                at,
            )
            .await
            .unwrap();
    }
    w.started(
        store,
        ("running-slow", "bob", "slow"),
        "w-live",
        ago(12 * MIN),
    )
    .await;
    let asking = w
        .started(
            store,
            ("asking", "carol", "slow"),
            "w-embedded",
            ago(8 * MIN),
        )
        .await;
    let ask = TaskMessage {
        request_id: "r-asking".into(),
        task_id: "asking".into(),
        method: "elicitation/create".into(),
        params: "{}".into(),
        response: None,
    };
    store
        .task_message_ask(asking, &lease_of("asking"), &ask, ago(7 * MIN))
        .await
        .unwrap();
    w.create(
        store,
        ops_task("plain", "carol", "echo"),
        None,
        None,
        ago(6 * MIN),
    )
    .await;
    let released = w
        .started(
            store,
            ("released-echo", "bob", "echo"),
            "w-stopping",
            ago(4 * MIN),
        )
        .await;
    assert!(
        store
            .job_release(released, &lease_of("released-echo"), ago(3 * MIN))
            .await
            .unwrap()
    );

    // Queued tasks, one of them cancelled before any worker came.
    w.create(
        store,
        ops_task("cancel-queued", "bob", "slow"),
        Some(JOB),
        None,
        ago(MIN),
    )
    .await;
    assert!(matches!(
        store
            .task_cancel("cancel-queued", "bob", "stopped by bob", ago(15_000))
            .await
            .unwrap(),
        CancelOutcome::Cancelled(_)
    ));
    w.create(
        store,
        ops_task("queued-echo-1", "alice", "echo"),
        Some(JOB),
        None,
        ago(90_000),
    )
    .await;
    w.create(
        store,
        ops_task("queued-echo-2", "bob", "echo"),
        Some(JOB),
        None,
        ago(45_000),
    )
    .await;
    w.create(
        store,
        ops_task("queued-slow-1", "alice", "slow"),
        Some(JOB),
        None,
        ago(20_000),
    )
    .await;

    // Heartbeats: w-live reports a lagging count; w-old never beats.
    store
        .worker_heartbeat("w-live", 0, ago(5_000))
        .await
        .unwrap();
    store
        .worker_heartbeat("w-embedded", 1, ago(5_000))
        .await
        .unwrap();
    store
        .worker_set_state("w-stopping", WorkerState::Stopping, ago(4_000))
        .await
        .unwrap();
    assert_eq!(store.worker_mark_dead(OPS_NOW).await.unwrap(), 1, "w-old");
    w
}

/// `ops_stats` on an empty database, then on [`ops_world`]: queued jobs
/// by tool with the earliest time one became runnable (a released job
/// counts from its release, not its creation), running jobs by tool, open
/// tasks by status, finished tasks by status and by tool over the last
/// minute and hour (both windows include their edge; a task finished
/// 1 h + 1 ms ago is out), and failures by tool with the latest failure's
/// time and message. Two hours later the windows are empty and the rest
/// stands.
async fn ops_stats_counts_queue_running_open_finished_and_failures(db: TestDb) {
    let empty = db.store.ops_stats(OPS_NOW).await.unwrap();
    assert_eq!(
        empty,
        OpsStats {
            now: OPS_NOW,
            queued: vec![],
            running: vec![],
            open: vec![],
            finished: vec![],
            failures: vec![],
            finished_by_tool: vec![],
        }
    );

    ops_world(&db.store).await;
    let mut stats = db.store.ops_stats(OPS_NOW).await.unwrap();
    // Open and finished counts are by status, in no promised order.
    stats.open.sort_by_key(|(s, _)| s.as_str());
    stats.finished.sort_by_key(|f| f.status.as_str());
    let queued = vec![
        ToolQueue {
            tool: "echo".into(),
            jobs: 3,
            oldest_since: ago(3 * MINUTE_MS),
        },
        ToolQueue {
            tool: "slow".into(),
            jobs: 1,
            oldest_since: ago(20_000),
        },
    ];
    let running = vec![
        ToolRunning {
            tool: "echo".into(),
            jobs: 1,
        },
        ToolRunning {
            tool: "slow".into(),
            jobs: 2,
        },
    ];
    let open = vec![(TaskStatus::InputRequired, 1), (TaskStatus::Working, 7)];
    assert_eq!(
        stats,
        OpsStats {
            now: OPS_NOW,
            queued: queued.clone(),
            running: running.clone(),
            open: open.clone(),
            finished: vec![
                Finished {
                    status: TaskStatus::Cancelled,
                    last_minute: 1,
                    last_hour: 2,
                },
                Finished {
                    status: TaskStatus::Completed,
                    last_minute: 1,
                    last_hour: 2,
                },
                Finished {
                    status: TaskStatus::Failed,
                    last_minute: 1,
                    last_hour: 3,
                },
            ],
            failures: vec![
                ToolFailures {
                    tool: "echo".into(),
                    failed: 1,
                    last_at: ago(5 * MINUTE_MS),
                    last_message: Some("bad input".into()),
                },
                ToolFailures {
                    tool: "flaky".into(),
                    failed: 2,
                    last_at: ago(10_000),
                    last_message: Some("boom 2".into()),
                },
            ],
            finished_by_tool: vec![
                ToolFinished {
                    tool: "echo".into(),
                    last_minute: 1,
                    last_hour: 3,
                },
                ToolFinished {
                    tool: "flaky".into(),
                    last_minute: 1,
                    last_hour: 2,
                },
                ToolFinished {
                    tool: "slow".into(),
                    last_minute: 1,
                    last_hour: 2,
                },
            ],
        }
    );

    let later = OPS_NOW + 2 * HOUR_MS;
    let mut stats = db.store.ops_stats(later).await.unwrap();
    stats.open.sort_by_key(|(s, _)| s.as_str());
    assert_eq!(
        stats,
        OpsStats {
            now: later,
            queued,
            running,
            open,
            finished: vec![],
            failures: vec![],
            finished_by_tool: vec![],
        }
    );
}
store_test!(ops_stats_counts_queue_running_open_finished_and_failures);

/// `ops_workers` lists every pool that registered, newest first (a tie on
/// the start time by worker id), with its state as stored (a stopped pool
/// with its stop time, a pool marked dead), and its running jobs counted
/// from the jobs it leases, not from its last heartbeat's count (w-live
/// reported 0 and runs two; finished jobs it ran do not count).
async fn ops_workers_lists_pools_newest_first_with_their_running_jobs(db: TestDb) {
    assert!(db.store.ops_workers().await.unwrap().is_empty());
    ops_world(&db.store).await;
    let pool = |id: &str,
                kind: WorkerKind,
                state: WorkerLife,
                lease_ms: i64,
                started_at: i64,
                heartbeat_at: i64,
                stopped_at: Option<i64>,
                jobs_running: i64| WorkerInfo {
        worker_id: id.to_owned(),
        kind,
        state,
        host: "host-ops".to_owned(),
        pid: 7,
        concurrency: 4,
        lease_ms,
        started_at,
        heartbeat_at,
        stopped_at,
        jobs_running,
    };
    let twenty = ago(20 * MINUTE_MS);
    assert_eq!(
        db.store.ops_workers().await.unwrap(),
        vec![
            pool(
                "w-embedded",
                WorkerKind::Embedded,
                WorkerLife::Live,
                LEASE_MS,
                twenty,
                ago(5_000),
                None,
                1
            ),
            pool(
                "w-stopping",
                WorkerKind::Process,
                WorkerLife::Stopping,
                LEASE_MS,
                twenty,
                ago(4_000),
                None,
                0
            ),
            pool(
                "w-live",
                WorkerKind::Process,
                WorkerLife::Live,
                LEASE_MS,
                ago(30 * MINUTE_MS),
                ago(5_000),
                None,
                2
            ),
            pool(
                "w-stopped",
                WorkerKind::Process,
                WorkerLife::Stopped,
                LEASE_MS,
                ago(40 * MINUTE_MS),
                ago(35 * MINUTE_MS),
                Some(ago(35 * MINUTE_MS)),
                0
            ),
            pool(
                "w-old",
                WorkerKind::Process,
                WorkerLife::Dead,
                1_000,
                T0,
                T0,
                None,
                0
            ),
        ]
    );
}
store_test!(ops_workers_lists_pools_newest_first_with_their_running_jobs);

/// The task ids of one `ops_task_page`.
async fn page_ids(
    store: &Store,
    filter: &TaskFilter,
    before_seq: Option<i64>,
    limit: i64,
) -> Vec<String> {
    store
        .ops_task_page(filter, before_seq, limit)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.task_id)
        .collect()
}

/// `ops_task_page` lists every owner's tasks newest first, expired ones
/// not yet purged included; pages by `before_seq` strictly older than the
/// cursor, to the end; filters by status (finished ones, unfinished ones
/// only, which takes the open-status index), tool and owner, alone and
/// together; and serves the status message as a client sees it (`queued`
/// while the job waits, with the reason after a release).
async fn ops_task_page_filters_and_pages_newest_first(db: TestDb) {
    let w = ops_world(&db.store).await;
    let any = TaskFilter::default();
    let filter = |statuses: &[TaskStatus], tool: Option<&str>, owner: Option<&str>| TaskFilter {
        statuses: statuses.to_vec(),
        tool: tool.map(str::to_owned),
        owner: owner.map(str::to_owned),
    };

    // Every task, five a page, each page before the last one's oldest.
    let all: Vec<String> = w.order.iter().rev().cloned().collect();
    let (mut pages, mut listed, mut before) = (Vec::new(), Vec::new(), None);
    loop {
        let page = page_ids(&db.store, &any, before, 5).await;
        if page.is_empty() {
            break;
        }
        before = Some(w.seq(page.last().unwrap()));
        pages.push(page.len());
        listed.extend(page);
    }
    assert_eq!(pages, [5, 5, 5, 1]);
    assert_eq!(listed, all);
    assert_eq!(
        page_ids(&db.store, &any, Some(w.seq("plain")), 2).await,
        w.newest_first(&["asking", "running-slow"]),
        "strictly older than the cursor"
    );
    assert!(
        page_ids(&db.store, &any, Some(w.seq("done-ancient")), 10)
            .await
            .is_empty()
    );

    // Expired but not purged: listed for operators, not for its owner.
    let alice = db
        .store
        .task_list_page("alice", None, 100, OPS_NOW)
        .await
        .unwrap();
    assert!(!alice.iter().any(|t| t.task_id == "done-ancient"));
    let ancient = db
        .store
        .ops_task_page(&any, Some(w.seq("done-ancient") + 1), 1)
        .await
        .unwrap();
    assert_eq!(
        ancient,
        vec![TaskSummary {
            seq: w.seq("done-ancient"),
            task_id: "done-ancient".into(),
            status: TaskStatus::Completed,
            tool: "echo".into(),
            owner: "alice".into(),
            created_at: ago(HOUR_MS + MINUTE_MS),
            updated_at: ago(HOUR_MS + 1),
            status_message: None,
            priority: Some(0),
            starts_at: None,
        }]
    );

    use TaskStatus::{Cancelled, Completed, Failed, InputRequired, Working};
    let cases: Vec<(TaskFilter, Vec<&str>)> = vec![
        (
            filter(&[Failed], None, None),
            vec!["fail-flaky-1", "fail-flaky-2", "fail-echo"],
        ),
        (
            filter(&[Completed, Cancelled], None, None),
            vec![
                "done-ancient",
                "done-edge",
                "done-recent",
                "cancel-running",
                "cancel-queued",
            ],
        ),
        (
            filter(&[Working, InputRequired], None, None),
            vec![
                "running-echo",
                "running-slow",
                "asking",
                "plain",
                "released-echo",
                "queued-echo-1",
                "queued-echo-2",
                "queued-slow-1",
            ],
        ),
        (filter(&[InputRequired], None, None), vec!["asking"]),
        (
            filter(&[Working, InputRequired], Some("slow"), None),
            vec!["running-slow", "asking", "queued-slow-1"],
        ),
        (
            filter(&[], Some("flaky"), None),
            vec!["fail-flaky-1", "fail-flaky-2"],
        ),
        (
            filter(&[], None, Some("bob")),
            vec![
                "done-recent",
                "fail-flaky-2",
                "running-slow",
                "released-echo",
                "cancel-queued",
                "queued-echo-2",
            ],
        ),
        (
            filter(&[Working], None, Some("bob")),
            vec!["running-slow", "released-echo", "queued-echo-2"],
        ),
        (
            filter(&[], Some("echo"), Some("bob")),
            vec!["done-recent", "released-echo", "queued-echo-2"],
        ),
        (
            filter(&[Working], Some("slow"), Some("bob")),
            vec!["running-slow"],
        ),
        (filter(&[Cancelled], None, Some("carol")), vec![]),
        (filter(&[], None, Some("nobody")), vec![]),
        (filter(&[], Some("unknown"), None), vec![]),
    ];
    for (f, expected) in &cases {
        assert_eq!(
            page_ids(&db.store, f, None, 100).await,
            w.newest_first(expected),
            "{f:?}"
        );
    }

    // Filtered pages page too, on each of the three paths.
    let open = filter(&[Working, InputRequired], None, None);
    assert_eq!(
        page_ids(&db.store, &open, None, 3).await,
        w.newest_first(&["queued-slow-1", "queued-echo-2", "queued-echo-1"])
    );
    assert_eq!(
        page_ids(&db.store, &open, Some(w.seq("queued-echo-1")), 3).await,
        w.newest_first(&["released-echo", "plain", "asking"])
    );
    assert_eq!(
        page_ids(&db.store, &open, Some(w.seq("asking")), 3).await,
        w.newest_first(&["running-slow", "running-echo"])
    );
    let bob = filter(&[], None, Some("bob"));
    assert_eq!(
        page_ids(&db.store, &bob, Some(w.seq("cancel-queued")), 2).await,
        w.newest_first(&["released-echo", "running-slow"])
    );
    let failed = filter(&[Failed], None, None);
    assert_eq!(
        page_ids(&db.store, &failed, Some(w.seq("fail-echo")), 1).await,
        ["fail-flaky-2"]
    );

    // The status message as served.
    let served = db
        .store
        .ops_task_page(&filter(&[Working], Some("echo"), None), None, 100)
        .await
        .unwrap();
    let messages: Vec<(&str, Option<&str>)> = served
        .iter()
        .map(|t| (t.task_id.as_str(), t.status_message.as_deref()))
        .collect();
    let released = format!("queued: {RELEASED}");
    assert_eq!(
        messages,
        [
            ("queued-echo-2", Some("queued")),
            ("queued-echo-1", Some("queued")),
            ("released-echo", Some(released.as_str())),
            ("plain", None),
            ("running-echo", Some("two")),
        ]
    );
    let queued = &served[1];
    assert_eq!(
        (queued.owner.as_str(), queued.created_at, queued.updated_at),
        ("alice", ago(90_000), ago(90_000))
    );
}
store_test!(ops_task_page_filters_and_pages_newest_first);

/// A status change without its feed id: (from, to, message, at).
type Change = (Option<TaskStatus>, TaskStatus, Option<String>, i64);

/// One history's status changes without their feed ids.
fn changes(h: &TaskHistory) -> Vec<Change> {
    h.events
        .iter()
        .map(|e| (e.from_status, e.to_status, e.message.clone(), e.at))
        .collect()
}

/// A job event without its id: (attempt, event, worker, reason, at).
type JobChange = (i64, String, Option<String>, Option<String>, i64);

/// One history's job events without their ids.
fn job_changes(h: &TaskHistory) -> Vec<JobChange> {
    h.job_events
        .iter()
        .map(|e| {
            (
                e.attempt,
                e.event.clone(),
                e.worker.clone(),
                e.reason.clone(),
                e.at,
            )
        })
        .collect()
}

/// Ids strictly increase: oldest first.
#[track_caller]
fn assert_oldest_first(ids: &[i64]) {
    assert!(ids.windows(2).all(|p| p[0] < p[1]), "{ids:?}");
}

/// The history of `id`, which exists.
async fn task_history(store: &Store, id: &str) -> TaskHistory {
    let h = store.ops_task_history(id).await.unwrap().unwrap();
    assert_eq!(h.task.task_id, id);
    assert_oldest_first(&h.events.iter().map(|e| e.id).collect::<Vec<_>>());
    assert_oldest_first(&h.job_events.iter().map(|e| e.id).collect::<Vec<_>>());
    assert_oldest_first(&h.progress.iter().map(|e| e.id).collect::<Vec<_>>());
    h
}

/// `ops_task_history` of any owner's task: the task as served, its job
/// (none for a task made without one), its status changes with their
/// messages, its job's claims, requeue (with the release reason) and
/// finish (how it ended), its progress reports (the latest
/// `PROGRESS_LIMIT` of more) and its requests to the client, each oldest
/// first; None for an unknown id.
async fn ops_task_history_has_status_changes_job_events_progress_and_requests(db: TestDb) {
    let w = ops_world(&db.store).await;
    assert!(
        db.store
            .ops_task_history("unknown")
            .await
            .unwrap()
            .is_none()
    );
    let working = |at: i64| (None, TaskStatus::Working, None, at);
    let claimed =
        |worker: &str, at: i64| (1, "claimed".to_owned(), Some(worker.to_owned()), None, at);

    let h = task_history(&db.store, "running-echo").await;
    let started = ago(20 * MINUTE_MS);
    assert_eq!(
        (
            h.task.status,
            h.task.status_message.as_deref(),
            h.task.owner.as_str()
        ),
        (TaskStatus::Working, Some("two"), "alice")
    );
    assert_eq!(
        h.job,
        Some(JobInfo {
            state: "running".into(),
            attempt: 1,
            max_attempts: 3,
            priority: 0,
            run_after: started,
            lease_owner: Some("w-live".into()),
            lease_expires_at: Some(started + 10 + LEASE_MS),
            cancel_requested: false,
            last_error: None,
            finished_at: None,
        })
    );
    assert_eq!(changes(&h), [working(started)]);
    assert_eq!(job_changes(&h), [claimed("w-live", started + 10)]);
    let progress: Vec<(f64, Option<f64>, Option<&str>, i64)> = h
        .progress
        .iter()
        .map(|p| (p.progress, p.total, p.message.as_deref(), p.at))
        .collect();
    assert_eq!(
        progress,
        [
            (1.0, Some(3.0), Some("one"), ago(10 * MINUTE_MS)),
            (2.0, Some(3.0), Some("two"), ago(5 * MINUTE_MS)),
        ]
    );
    assert!(h.messages.is_empty());

    let h = task_history(&db.store, "fail-flaky-1").await;
    let started = ago(25 * MINUTE_MS);
    assert_eq!(h.task.status, TaskStatus::Failed);
    assert_eq!(h.task.result_kind, Some(ResultKind::Error));
    assert_eq!(
        changes(&h),
        [
            working(started),
            (
                Some(TaskStatus::Working),
                TaskStatus::Failed,
                Some("boom 1".into()),
                ago(20 * MINUTE_MS)
            ),
        ]
    );
    let job = h.job.as_ref().unwrap();
    assert_eq!(
        (
            job.state.as_str(),
            job.attempt,
            job.lease_expires_at,
            job.finished_at
        ),
        ("done", 1, None, Some(ago(20 * MINUTE_MS)))
    );
    assert_eq!(
        job_changes(&h),
        [
            claimed("w-live", started + 10),
            (
                1,
                "finished".into(),
                Some("w-live".into()),
                Some("outcome recorded".into()),
                ago(20 * MINUTE_MS)
            ),
        ]
    );
    assert!(h.progress.is_empty());

    let h = task_history(&db.store, "released-echo").await;
    let started = ago(4 * MINUTE_MS);
    assert_eq!(
        h.job,
        Some(JobInfo {
            state: "queued".into(),
            attempt: 0,
            max_attempts: 3,
            priority: 0,
            run_after: ago(3 * MINUTE_MS),
            lease_owner: None,
            lease_expires_at: None,
            cancel_requested: false,
            last_error: Some(RELEASED.into()),
            finished_at: None,
        })
    );
    assert_eq!(
        job_changes(&h),
        [
            claimed("w-stopping", started + 10),
            (
                1,
                "requeued".into(),
                Some("w-stopping".into()),
                Some(RELEASED.into()),
                ago(3 * MINUTE_MS)
            ),
        ]
    );
    assert_eq!(
        changes(&h),
        [working(started)],
        "a requeue is no status change"
    );

    let h = task_history(&db.store, "cancel-running").await;
    let started = ago(3 * MINUTE_MS);
    assert_eq!(
        changes(&h),
        [
            working(started),
            (
                Some(TaskStatus::Working),
                TaskStatus::Cancelled,
                Some("stopped by alice".into()),
                ago(2 * MINUTE_MS)
            ),
        ]
    );
    let job = h.job.as_ref().unwrap();
    assert_eq!(
        (
            job.state.as_str(),
            job.cancel_requested,
            job.last_error.as_deref()
        ),
        ("done", true, Some("cancelled"))
    );
    assert_eq!(
        job_changes(&h),
        [
            claimed("w-live", started + 10),
            (
                1,
                "finished".into(),
                Some("w-live".into()),
                Some("cancelled".into()),
                ago(2 * MINUTE_MS) + 100
            ),
        ]
    );

    let h = task_history(&db.store, "cancel-queued").await;
    assert_eq!(
        job_changes(&h),
        [(
            0,
            "finished".into(),
            None,
            Some("cancelled while queued".into()),
            ago(15_000)
        )],
        "never claimed"
    );

    let h = task_history(&db.store, "asking").await;
    let asked = "waiting for the client to answer elicitation/create";
    assert_eq!(h.task.status, TaskStatus::InputRequired);
    assert_eq!(
        changes(&h),
        [
            working(ago(8 * MINUTE_MS)),
            (
                Some(TaskStatus::Working),
                TaskStatus::InputRequired,
                Some(asked.into()),
                ago(7 * MINUTE_MS)
            ),
        ]
    );
    assert_eq!(
        h.messages,
        [MessageInfo {
            request_id: "r-asking".into(),
            method: "elicitation/create".into(),
            params: "{}".into(),
            state: "pending".into(),
            response: None,
            created_at: ago(7 * MINUTE_MS),
            answered_at: None,
        }]
    );
    assert_eq!(
        job_changes(&h),
        [claimed("w-embedded", ago(8 * MINUTE_MS) + 10)]
    );

    let h = task_history(&db.store, "plain").await;
    assert!(h.job.is_none() && h.job_events.is_empty() && h.progress.is_empty());
    assert_eq!(changes(&h), [working(ago(6 * MINUTE_MS))]);

    // Only the latest PROGRESS_LIMIT reports, oldest first.
    let seq = w.seq("running-slow");
    let reports = PROGRESS_LIMIT + 2;
    for n in 1..=reports {
        db.store
            .task_record_progress(
                seq,
                &lease_of("running-slow"),
                n as f64,
                None,
                "step",
                ago(60_000) + n,
            )
            .await
            .unwrap();
    }
    let h = task_history(&db.store, "running-slow").await;
    let kept: Vec<f64> = h.progress.iter().map(|p| p.progress).collect();
    let expected: Vec<f64> = (3..=reports).map(|n| n as f64).collect();
    assert_eq!(kept, expected);
    assert_eq!(h.progress.last().unwrap().at, ago(60_000) + reports);
}
store_test!(ops_task_history_has_status_changes_job_events_progress_and_requests);

/// `ops_stats_plans` on [`ops_world`]'s rows: one plan per stats query, in
/// the order `ops_stats` runs them, each by the index it is written for
/// and none a scan of `tasks` or `jobs` without an index (PostgreSQL: no
/// sequential scan).
async fn ops_stats_plans_search_indexes(db: TestDb) {
    ops_world(&db.store).await;
    let plans = db.store.ops_stats_plans(OPS_NOW).await.unwrap();
    let names: Vec<&str> = plans.iter().map(|p| p.name).collect();
    let index_of = [
        ("queued_by_tool", "jobs_queued"),
        ("running_by_tool", "jobs_running_tool"),
        ("open_by_status", "tasks_open_status"),
        ("finished_since", "tasks_finished"),
        ("failures_since", "tasks_finished"),
        ("finished_by_tool", "tasks_finished"),
    ];
    assert_eq!(names, index_of.map(|(name, _)| name));
    for (p, (_, index)) in plans.iter().zip(index_of) {
        assert!(
            p.plan.contains(index),
            "{}: not by {index}:\n{}",
            p.name,
            p.plan
        );
        for line in p.plan.lines() {
            let scan = match db.driver() {
                Driver::Sqlite => {
                    (line.contains("SCAN tasks") || line.contains("SCAN jobs"))
                        && !line.contains("INDEX")
                }
                Driver::Postgres => line.contains("Seq Scan"),
            };
            assert!(!scan, "{}: a full scan:\n{}", p.name, p.plan);
        }
    }
}
store_test!(ops_stats_plans_search_indexes);
