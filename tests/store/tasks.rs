//! The task rows (`TaskStore`): creation, reading, paging, cancelling,
//! status messages, progress reports, expiry and purge, what a session
//! missed, and the count of open tasks.

use super::*;

// task_create / task_get -----------------------------------------------------

async fn task_create_without_job_starts_working_t9(db: TestDb) {
    let raw = db.raw().await;
    let mut new = new_task_ttl("t-1", "alice", 60_000);
    new.progress_token = Some(r#""tok-7""#.to_owned());
    let row = db.store.task_create(&new, None, None, T0).await.unwrap();

    // T-9: a task starts working.
    assert_eq!(row.status, TaskStatus::Working);
    assert_eq!(row.task_id, "t-1");
    assert_eq!(row.owner, "alice");
    assert_eq!(row.tool, "echo");
    assert_eq!(row.arguments, r#"{"text":"hello"}"#);
    assert_eq!(row.created_at, T0);
    assert_eq!(row.updated_at, T0);
    assert_eq!(row.ttl_ms, Some(60_000));
    assert_eq!(
        row.expires_at,
        Some(T0 + 60_000),
        "T-33: expires_at = created + ttl"
    );
    assert_eq!(row.poll_interval_ms, Some(500));
    assert_eq!(row.progress_token.as_deref(), Some(r#""tok-7""#));
    assert_eq!(row.result, None);
    assert_eq!(row.result_kind, None);
    assert_eq!(row.status_message, None);

    assert_eq!(get(&db.store, "t-1").await, row, "task_get returns the row");
    assert_eq!(db.store.task_get("nope").await.unwrap(), None);
    assert_eq!(job(&raw, row.seq).await, None, "no job without NewJob");
    assert_eq!(
        history(&raw, "t-1").await,
        vec![(None, "working".to_owned(), None, T0)],
        "the insert trigger writes one history row"
    );
    // Nothing to claim: the task has no job.
    let claimed = db
        .store
        .job_claim_available("w", "lease-1", &echo(10), 10, LEASE_MS, T0 + 1)
        .await
        .unwrap();
    assert!(claimed.is_empty());
}
store_test!(task_create_without_job_starts_working_t9);

async fn task_create_with_job_queues_it(db: TestDb) {
    let raw = db.raw().await;
    let job_spec = NewJob {
        max_attempts: 5,
        priority: 7,
        run_after: None,
    };
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(job_spec), None, T0)
        .await
        .unwrap();
    assert_eq!(row.status, TaskStatus::Working);
    assert_eq!(row.ttl_ms, None);
    assert_eq!(row.expires_at, None);
    assert_eq!(
        job(&raw, row.seq).await,
        Some(JobState {
            state: "queued".to_owned(),
            attempt: 0,
            max_attempts: 5,
            priority: 7,
            run_after: T0,
            lease_owner: None,
            lease_token: None,
            lease_expires_at: None,
            cancel_requested: false,
            last_error: None,
            finished_at: None,
        })
    );
}
store_test!(task_create_with_job_queues_it);

async fn task_create_with_outcome_history_shows_working_then_failed_t9(db: TestDb) {
    let raw = db.raw().await;
    let outcome = failed_outcome("arguments do not match the tool's input schema");
    let row = db
        .store
        .task_create(&new_task("t-bad", "alice"), None, Some(&outcome), T0)
        .await
        .unwrap();
    assert_eq!(row.status, TaskStatus::Failed);
    assert_eq!(
        row.status_message.as_deref(),
        Some("arguments do not match the tool's input schema")
    );
    assert_eq!(row.result.as_deref(), Some(outcome.result.as_str()));
    assert_eq!(row.result_kind, Some(ResultKind::Error));
    assert_eq!(row.created_at, T0);
    assert_eq!(row.updated_at, T0);

    // T-9 even here: the task went through working first.
    let h = history(&raw, "t-bad").await;
    assert_eq!(
        h,
        vec![
            (None, "working".to_owned(), None, T0),
            (
                Some("working".to_owned()),
                "failed".to_owned(),
                Some("arguments do not match the tool's input schema".to_owned()),
                T0
            ),
        ]
    );
    assert_eq!(get(&db.store, "t-bad").await, row);
}
store_test!(task_create_with_outcome_history_shows_working_then_failed_t9);

async fn task_create_duplicate_task_id_is_refused_and_writes_nothing(db: TestDb) {
    let raw = db.raw().await;
    db.store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let err = db
        .store
        .task_create(&new_task("t-1", "bob"), Some(JOB), None, T0 + 1)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Db(_)), "{err:?}");
    assert_eq!(get(&db.store, "t-1").await.owner, "alice");
    let tasks = count_all(&raw, "SELECT COUNT(*) FROM tasks").await;
    let jobs = count_all(&raw, "SELECT COUNT(*) FROM jobs").await;
    assert_eq!((tasks, jobs), (1, 1), "the failed transaction left nothing");
    assert_eq!(history(&raw, "t-1").await.len(), 1);
}
store_test!(task_create_duplicate_task_id_is_refused_and_writes_nothing);

// task_list_page ---------------------------------------------------------------

async fn task_list_page_newest_first_keyset_by_before_seq_t17_t18(db: TestDb) {
    // Seven tasks for alice, interleaved with bob's.
    let mut alice_seqs = Vec::new();
    for i in 0..7 {
        let row = db
            .store
            .task_create(&new_task(&format!("a-{i}"), "alice"), None, None, T0 + i)
            .await
            .unwrap();
        alice_seqs.push(row.seq);
        db.store
            .task_create(&new_task(&format!("b-{i}"), "bob"), None, None, T0 + i)
            .await
            .unwrap();
    }
    let now = T0 + 100;

    // T-17/T-18: walk the pages; each page starts strictly below the last
    // seq of the previous one.
    let mut seen = Vec::new();
    let mut before = None;
    let mut pages = 0;
    loop {
        let page = db
            .store
            .task_list_page("alice", before, 3, now)
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        pages += 1;
        assert!(page.len() <= 3, "limit respected");
        for row in &page {
            assert_eq!(row.owner, "alice", "owner filter");
        }
        let seqs: Vec<i64> = page.iter().map(|r| r.seq).collect();
        let mut sorted = seqs.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(seqs, sorted, "newest first within a page");
        if let (Some(b), Some(first)) = (before, seqs.first()) {
            assert!(*first < b, "keyset: strictly older than before_seq");
        }
        before = seqs.last().copied();
        seen.extend(seqs);
    }
    assert_eq!(pages, 3, "7 rows in pages of 3: 3 + 3 + 1");
    let mut expected = alice_seqs.clone();
    expected.reverse();
    assert_eq!(seen, expected, "every task once, newest first");

    // The first page is exactly the newest three.
    let first = db
        .store
        .task_list_page("alice", None, 3, now)
        .await
        .unwrap();
    let ids: Vec<&str> = first.iter().map(|r| r.task_id.as_str()).collect();
    assert_eq!(ids, vec!["a-6", "a-5", "a-4"]);

    // A task created after the first page was read does not shift the next
    // page (keyset, not offset).
    db.store
        .task_create(&new_task("a-new", "alice"), None, None, T0 + 50)
        .await
        .unwrap();
    let second = db
        .store
        .task_list_page("alice", Some(first[2].seq), 3, now)
        .await
        .unwrap();
    let ids: Vec<&str> = second.iter().map(|r| r.task_id.as_str()).collect();
    assert_eq!(ids, vec!["a-3", "a-2", "a-1"]);

    assert!(
        db.store
            .task_list_page("carol", None, 10, now)
            .await
            .unwrap()
            .is_empty()
    );
}
store_test!(task_list_page_newest_first_keyset_by_before_seq_t17_t18);

async fn task_list_page_excludes_expired_rows_t33(db: TestDb) {
    db.store
        .task_create(&new_task_ttl("short", "alice", 1_000), None, None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task_ttl("long", "alice", 100_000), None, None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("forever", "alice"), None, None, T0)
        .await
        .unwrap();

    let ids = |rows: Vec<TaskRow>| rows.into_iter().map(|r| r.task_id).collect::<Vec<_>>();

    let before_expiry = db
        .store
        .task_list_page("alice", None, 10, T0 + 999)
        .await
        .unwrap();
    assert_eq!(ids(before_expiry), vec!["forever", "long", "short"]);

    // At expires_at the task is gone from the list, even before any purge.
    let at_expiry = db
        .store
        .task_list_page("alice", None, 10, T0 + 1_000)
        .await
        .unwrap();
    assert_eq!(ids(at_expiry), vec!["forever", "long"]);

    let later = db
        .store
        .task_list_page("alice", None, 10, T0 + 200_000)
        .await
        .unwrap();
    assert_eq!(ids(later), vec!["forever"]);
}
store_test!(task_list_page_excludes_expired_rows_t33);

// task_cancel ------------------------------------------------------------------

async fn task_cancel_not_found_for_other_owner_or_unknown_id(db: TestDb) {
    db.store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let outcome = db
        .store
        .task_cancel("t-1", "mallory", "cancelled", T0 + 1)
        .await
        .unwrap();
    assert!(matches!(outcome, CancelOutcome::NotFound), "{outcome:?}");
    let outcome = db
        .store
        .task_cancel("t-unknown", "alice", "cancelled", T0 + 1)
        .await
        .unwrap();
    assert!(matches!(outcome, CancelOutcome::NotFound), "{outcome:?}");
    let row = get(&db.store, "t-1").await;
    assert_eq!(
        row.status,
        TaskStatus::Working,
        "another owner cannot cancel"
    );
    assert_eq!(row.updated_at, T0);
}
store_test!(task_cancel_not_found_for_other_owner_or_unknown_id);

async fn task_cancel_terminal_for_completed_task_t11(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let claimed = claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    assert_eq!(claimed.task_seq, row.seq);
    assert!(
        db.store
            .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 2)
            .await
            .unwrap()
    );

    let outcome = db
        .store
        .task_cancel("t-1", "alice", "cancelled", T0 + 3)
        .await
        .unwrap();
    match outcome {
        CancelOutcome::Terminal(status) => assert_eq!(status, TaskStatus::Completed),
        other => panic!("expected Terminal, got {other:?}"),
    }
    let after = get(&db.store, "t-1").await;
    assert_eq!(after.status, TaskStatus::Completed);
    assert_eq!(after.updated_at, T0 + 2);
    assert_eq!(
        transitions(&raw, "t-1").await,
        vec![tr(None, "working"), tr(Some("working"), "completed")]
    );
}
store_test!(task_cancel_terminal_for_completed_task_t11);

async fn task_cancel_finishes_a_queued_job(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let outcome = db
        .store
        .task_cancel(
            "t-1",
            "alice",
            "The task was cancelled by request.",
            T0 + 10,
        )
        .await
        .unwrap();
    let cancelled = match outcome {
        CancelOutcome::Cancelled(row) => *row,
        other => panic!("expected Cancelled, got {other:?}"),
    };
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    assert_eq!(
        cancelled.status_message.as_deref(),
        Some("The task was cancelled by request.")
    );
    assert_eq!(cancelled.updated_at, T0 + 10);
    assert_eq!(cancelled.result, None);
    assert_eq!(get(&db.store, "t-1").await, cancelled);

    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "done", "a queued job is finished by the cancel");
    assert!(j.cancel_requested);
    assert_eq!(j.finished_at, Some(T0 + 10));
    assert_eq!(j.attempt, 0);
    assert_eq!(j.last_error.as_deref(), Some("cancelled while queued"));

    // Nothing left to claim.
    let claimed = db
        .store
        .job_claim_available("w", "lease-1", &echo(10), 10, LEASE_MS, T0 + 20)
        .await
        .unwrap();
    assert!(claimed.is_empty());

    assert_eq!(
        history(&raw, "t-1").await,
        vec![
            (None, "working".to_owned(), None, T0),
            (
                Some("working".to_owned()),
                "cancelled".to_owned(),
                Some("The task was cancelled by request.".to_owned()),
                T0 + 10
            ),
        ]
    );

    // A second cancel finds it terminal (T-22: stays cancelled).
    let again = db
        .store
        .task_cancel("t-1", "alice", "again", T0 + 20)
        .await
        .unwrap();
    match again {
        CancelOutcome::Terminal(status) => assert_eq!(status, TaskStatus::Cancelled),
        other => panic!("expected Terminal, got {other:?}"),
    }
    assert_eq!(history(&raw, "t-1").await.len(), 2);
}
store_test!(task_cancel_finishes_a_queued_job);

async fn task_cancel_running_job_requests_stop_and_keeps_it_running(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    let outcome = db
        .store
        .task_cancel("t-1", "alice", "cancelled", T0 + 2)
        .await
        .unwrap();
    assert!(
        matches!(outcome, CancelOutcome::Cancelled(_)),
        "{outcome:?}"
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "running", "the worker finishes a running job");
    assert!(j.cancel_requested);
    assert_eq!(j.lease_token.as_deref(), Some("lease-1"));
    assert_eq!(j.finished_at, None);
}
store_test!(task_cancel_running_job_requests_stop_and_keeps_it_running);

async fn task_cancel_without_job_and_never_moves_updated_at_backwards_t13(db: TestDb) {
    db.store
        .task_create(&new_task("t-1", "alice"), None, None, T0)
        .await
        .unwrap();
    // A clock that went backwards: updated_at keeps its value (T-13).
    let outcome = db
        .store
        .task_cancel("t-1", "alice", "cancelled", T0 - 500)
        .await
        .unwrap();
    let row = match outcome {
        CancelOutcome::Cancelled(row) => *row,
        other => panic!("expected Cancelled, got {other:?}"),
    };
    assert_eq!(row.status, TaskStatus::Cancelled);
    assert_eq!(row.updated_at, T0);
}
store_test!(task_cancel_without_job_and_never_moves_updated_at_backwards_t13);

// task_set_status_message ------------------------------------------------------

async fn task_set_status_message_with_lease_moves_updated_at_t13(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;

    db.store
        .task_set_status_message(row.seq, "lease-1", "step 1 of 3", T0 + 100)
        .await
        .unwrap();
    let after = get(&db.store, "t-1").await;
    assert_eq!(after.status_message.as_deref(), Some("step 1 of 3"));
    assert_eq!(after.updated_at, T0 + 100, "T-13: lastUpdatedAt moves");
    assert_eq!(after.status, TaskStatus::Working);

    // An earlier clock does not move it backwards.
    db.store
        .task_set_status_message(row.seq, "lease-1", "step 2 of 3", T0 + 50)
        .await
        .unwrap();
    let after = get(&db.store, "t-1").await;
    assert_eq!(after.status_message.as_deref(), Some("step 2 of 3"));
    assert_eq!(after.updated_at, T0 + 100);

    // A message is not a transition: no history row.
    assert_eq!(history(&raw, "t-1").await.len(), 1);
}
store_test!(task_set_status_message_with_lease_moves_updated_at_t13);

async fn task_set_status_message_lease_lost_with_wrong_token(db: TestDb) {
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();

    // Queued, not yet claimed: nobody holds a lease.
    assert_lease_lost(
        db.store
            .task_set_status_message(row.seq, "lease-1", "hi", T0 + 1)
            .await,
    );

    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    assert_lease_lost(
        db.store
            .task_set_status_message(row.seq, "lease-other", "hijack", T0 + 2)
            .await,
    );
    let after = get(&db.store, "t-1").await;
    assert_eq!(after.status_message, None, "nothing written");
    assert_eq!(after.updated_at, T0);

    // Once the job is complete, the old token writes nothing either.
    db.store
        .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 3)
        .await
        .unwrap();
    assert_lease_lost(
        db.store
            .task_set_status_message(row.seq, "lease-1", "late", T0 + 4)
            .await,
    );
    assert_eq!(get(&db.store, "t-1").await.status_message, None);
}
store_test!(task_set_status_message_lease_lost_with_wrong_token);

// task_purge -------------------------------------------------------------

async fn task_purge_deletes_task_job_and_history_t33_t34(db: TestDb) {
    let raw = db.raw().await;
    let short = db
        .store
        .task_create(&new_task_ttl("short", "alice", 1_000), Some(JOB), None, T0)
        .await
        .unwrap();
    let short2 = db
        .store
        .task_create(&new_task_ttl("short2", "alice", 1_000), Some(JOB), None, T0)
        .await
        .unwrap();
    let long = db
        .store
        .task_create(&new_task_ttl("long", "alice", 100_000), Some(JOB), None, T0)
        .await
        .unwrap();
    let forever = db
        .store
        .task_create(&new_task("forever", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    // Give "short" more history: claim and complete it.
    let claimed = db
        .store
        .job_claim_available("w1", "lease-1", &echo(1), 1, LEASE_MS, T0)
        .await
        .unwrap();
    assert_eq!(claimed[0].task_seq, short.seq);
    db.store
        .job_complete(short.seq, "lease-1", &completed_outcome(), T0 + 10)
        .await
        .unwrap();
    assert_eq!(history(&raw, "short").await.len(), 2);

    // Before expiry: nothing.
    assert_eq!(db.store.task_purge(T0 + 999, 100).await.unwrap().total(), 0);

    // At expiry, with a limit of 1: one of the two expired tasks goes.
    assert_eq!(db.store.task_purge(T0 + 1_000, 1).await.unwrap().total(), 1);
    assert_eq!(db.store.task_purge(T0 + 1_000, 1).await.unwrap().total(), 1);
    assert_eq!(db.store.task_purge(T0 + 1_000, 1).await.unwrap().total(), 0);

    for (id, seq) in [("short", short.seq), ("short2", short2.seq)] {
        assert_eq!(db.store.task_get(id).await.unwrap(), None, "{id} purged");
        assert_eq!(
            job(&raw, seq).await,
            None,
            "{id}: job deleted with the task"
        );
        assert_eq!(
            count_rows(
                &raw,
                "SELECT COUNT(*) FROM task_events WHERE task_seq = $1",
                seq
            )
            .await,
            0,
            "{id}: history deleted with the task"
        );
    }
    for (id, seq) in [("long", long.seq), ("forever", forever.seq)] {
        assert!(db.store.task_get(id).await.unwrap().is_some());
        assert!(job(&raw, seq).await.is_some());
        assert_eq!(history(&raw, id).await.len(), 1);
    }

    // Much later: "long" goes, "forever" (no ttl) never does.
    assert_eq!(
        db.store
            .task_purge(T0 + 10_000_000, 100)
            .await
            .unwrap()
            .total(),
        1
    );
    assert_eq!(db.store.task_get("long").await.unwrap(), None);
    assert!(db.store.task_get("forever").await.unwrap().is_some());

    // A purged seq is never handed out again, not even the newest task's
    // (SQLite: AUTOINCREMENT; PostgreSQL: an identity).
    let newest = db
        .store
        .task_create(
            &new_task_ttl("newest", "alice", 1),
            None,
            None,
            T0 + 10_000_001,
        )
        .await
        .unwrap();
    assert!(newest.seq > forever.seq);
    assert_eq!(
        db.store
            .task_purge(T0 + 10_000_002, 100)
            .await
            .unwrap()
            .total(),
        1
    );
    let next = db
        .store
        .task_create(&new_task("next", "alice"), None, None, T0 + 10_000_003)
        .await
        .unwrap();
    assert!(next.seq > newest.seq, "{} reused", next.seq);
}
store_test!(task_purge_deletes_task_job_and_history_t33_t34);

/// Issue 27 item 3: past its ttl a task with a rule for its status is kept
/// (once given keep_until it leaves the ttl scan), then archived with its
/// history or deleted; a task without one goes at its ttl; keep_until is
/// set once, and a terminal task changes in no other column.
async fn task_purge_keeps_archives_and_deletes_by_rule(db: TestDb) {
    let raw = db.raw().await;
    let rule = Retention {
        failed_ms: Some(50_000),
        cancelled_ms: Some(1),
        archive: true,
        ..Retention::default()
    };
    let with_rule = |id: &str, retention: Retention| NewTask {
        retention,
        ..new_task_ttl(id, "alice", 1_000)
    };
    // failed: kept 50 s after it failed, then archived.
    let failed = db
        .store
        .task_create(&with_rule("failed", rule), Some(JOB), None, T0)
        .await
        .unwrap();
    // completed: no rule for its status; archived at its ttl.
    db.store
        .task_create(&with_rule("completed", rule), Some(JOB), None, T0)
        .await
        .unwrap();
    // no rule at all: deleted at its ttl.
    db.store
        .task_create(&new_task_ttl("plain", "alice", 1_000), Some(JOB), None, T0)
        .await
        .unwrap();
    // still working at its ttl: no rule keeps it; archived, as its rule
    // says.
    db.store
        .task_create(&with_rule("working", rule), Some(JOB), None, T0)
        .await
        .unwrap();
    let claimed = db
        .store
        .job_claim_available("w1", "lease-1", &echo(3), 3, LEASE_MS, T0)
        .await
        .unwrap();
    let lease = |id: &str| {
        claimed
            .iter()
            .find(|c| c.task_id == id)
            .map(|c| c.task_seq)
            .unwrap()
    };
    db.store
        .job_complete(lease("failed"), "lease-1", &failed_outcome("boom"), T0 + 10)
        .await
        .unwrap();
    db.store
        .job_complete(lease("completed"), "lease-1", &completed_outcome(), T0 + 10)
        .await
        .unwrap();

    let report = db.store.task_purge(T0 + 1_000, 100).await.unwrap();
    assert_eq!(
        report,
        PurgeReport {
            deleted: 1,
            archived: 2,
            kept: 1
        },
        "plain deleted, completed and working archived, failed kept"
    );
    let keep_until: Option<i64> = raw
        .scalar(
            "SELECT keep_until FROM tasks WHERE seq = $1",
            args![failed.seq],
        )
        .await
        .unwrap();
    assert_eq!(keep_until, Some(T0 + 10 + 50_000), "50 s after it failed");
    // Kept rows are not looked at again until they are due.
    assert_eq!(
        db.store.task_purge(T0 + 2_000, 100).await.unwrap(),
        PurgeReport::default()
    );
    // The archive holds the completed task with its history.
    let (status, history): (String, String) = raw
        .row(
            "SELECT status, CAST(history AS TEXT) FROM tasks_archive WHERE task_id = 'completed'",
            args![],
        )
        .await
        .unwrap()
        .expect("archived");
    assert_eq!(status, "completed");
    let history: serde_json::Value = serde_json::from_str(&history).unwrap();
    assert_eq!(history[0]["to"], "working");
    assert_eq!(history[1]["from"], "working");
    assert_eq!(history[1]["to"], "completed");
    assert_eq!(history.as_array().map(Vec::len), Some(2));

    // keep_until is set once; a terminal task's other columns stay fixed.
    let again = raw
        .execute(
            "UPDATE tasks SET keep_until = keep_until + 1 WHERE seq = $1",
            args![failed.seq],
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(again.contains("keep_until is set once"), "{again}");
    let changed = raw
        .execute(
            "UPDATE tasks SET archive = NOT archive WHERE seq = $1",
            args![failed.seq],
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(changed.contains("terminal status"), "{changed}");

    // Due: archived with its history; nothing is left in tasks.
    let report = db.store.task_purge(T0 + 10 + 50_000, 100).await.unwrap();
    assert_eq!(report.archived, 1);
    assert_eq!(db.store.task_get("failed").await.unwrap(), None);
    assert_eq!(
        count_rows(
            &raw,
            "SELECT COUNT(*) FROM task_events WHERE task_seq = $1",
            failed.seq
        )
        .await,
        0
    );
    let archived: Vec<(String,)> = raw
        .rows("SELECT task_id FROM tasks_archive ORDER BY seq", args![])
        .await
        .unwrap();
    assert_eq!(
        archived,
        vec![
            ("failed".to_owned(),),
            ("completed".to_owned(),),
            ("working".to_owned(),)
        ]
    );
    raw.close().await;
}
store_test!(task_purge_keeps_archives_and_deletes_by_rule);

// Progress reports: task_record_progress / task_progress_prune ------------------

/// A progress report, fenced by the lease: the task's statusMessage shows
/// it (lastUpdatedAt never backwards, T-13) and `task_progress` keeps it.
async fn task_record_progress_is_fenced_and_sets_the_status_message_t13(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-p", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    // Queued: nobody holds a lease yet.
    assert_lease_lost(
        db.store
            .task_record_progress(row.seq, "lease-1", 1.0, None, "early", T0 + 1)
            .await,
    );
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    db.store
        .task_record_progress(
            row.seq,
            "lease-1",
            1.5,
            Some(4.0),
            "one and a half",
            T0 + 100,
        )
        .await
        .unwrap();
    // An earlier clock: recorded, lastUpdatedAt stays.
    db.store
        .task_record_progress(row.seq, "lease-1", 2.0, None, "two", T0 + 50)
        .await
        .unwrap();
    let task = get(&db.store, "t-p").await;
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(task.status_message.as_deref(), Some("two"));
    assert_eq!(task.updated_at, T0 + 100);
    type ProgressRow = (String, f64, Option<f64>, Option<String>, i64);
    let rows: Vec<ProgressRow> = raw
        .rows(
            "SELECT task_id, progress, total, message, at FROM task_progress
              WHERE task_seq = $1 ORDER BY id",
            args![row.seq],
        )
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![
            (
                "t-p".to_owned(),
                1.5,
                Some(4.0),
                Some("one and a half".to_owned()),
                T0 + 100
            ),
            ("t-p".to_owned(), 2.0, None, Some("two".to_owned()), T0 + 50),
        ]
    );
    assert_eq!(history(&raw, "t-p").await.len(), 1, "no transition");

    // Another token, or the same once the task is terminal: nothing written.
    assert_lease_lost(
        db.store
            .task_record_progress(row.seq, "lease-other", 3.0, None, "hijack", T0 + 200)
            .await,
    );
    db.store
        .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 300)
        .await
        .unwrap();
    assert_lease_lost(
        db.store
            .task_record_progress(row.seq, "lease-1", 4.0, None, "late", T0 + 400)
            .await,
    );
    assert_eq!(
        count_rows(
            &raw,
            "SELECT COUNT(*) FROM task_progress WHERE task_seq = $1",
            row.seq
        )
        .await,
        2
    );
    assert_eq!(get(&db.store, "t-p").await.status_message, None);
}
store_test!(task_record_progress_is_fenced_and_sets_the_status_message_t13);

async fn task_progress_prune_deletes_reports_older_than_the_cutoff(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-p", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    for at in [T0 + 10, T0 + 20, T0 + 30] {
        db.store
            .task_record_progress(row.seq, "lease-1", (at - T0) as f64, None, "step", at)
            .await
            .unwrap();
    }
    let ats = || async {
        raw.rows::<(i64,)>(
            "SELECT at FROM task_progress WHERE task_seq = $1 ORDER BY id",
            args![row.seq],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|(at,)| at)
        .collect::<Vec<_>>()
    };
    assert_eq!(
        db.store.task_progress_prune(T0 + 10).await.unwrap(),
        0,
        "strictly older than the cutoff"
    );
    assert_eq!(db.store.task_progress_prune(T0 + 21).await.unwrap(), 2);
    assert_eq!(ats().await, vec![T0 + 30]);
    assert_eq!(db.store.task_progress_prune(T0 + 21).await.unwrap(), 0);
    // The task itself is untouched.
    let task = get(&db.store, "t-p").await;
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(task.updated_at, T0 + 30);
}
store_test!(task_progress_prune_deletes_reports_older_than_the_cutoff);

// task_events_for_owner_since / task_count_open ----------------------------------

/// What a session's GET stream missed: one owner's status changes after a
/// feed position, oldest first, with the task's fields.
async fn task_events_for_owner_since_replays_one_owners_changes(db: TestDb) {
    let head = db.store.task_events_head().await.unwrap();
    let a1 = db
        .store
        .task_create(&new_task_ttl("a-1", "alice", 60_000), Some(JOB), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("b-1", "bob"), None, None, T0 + 1)
        .await
        .unwrap();
    let mut a2 = new_task("a-2", "alice");
    a2.poll_interval_ms = None;
    db.store.task_create(&a2, None, None, T0 + 2).await.unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 3).await;
    db.store
        .job_complete(a1.seq, "lease-1", &completed_outcome(), T0 + 5)
        .await
        .unwrap();
    db.store
        .task_cancel("b-1", "bob", "stop", T0 + 6)
        .await
        .unwrap();

    let alice = db
        .store
        .task_events_for_owner_since("alice", head, 100)
        .await
        .unwrap();
    let got: Vec<(&str, Option<TaskStatus>, TaskStatus, i64)> = alice
        .iter()
        .map(|e| (e.task_id.as_str(), e.from_status, e.to_status, e.at))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a-1", None, TaskStatus::Working, T0),
            ("a-2", None, TaskStatus::Working, T0 + 2),
            (
                "a-1",
                Some(TaskStatus::Working),
                TaskStatus::Completed,
                T0 + 5
            ),
        ]
    );
    assert!(alice.windows(2).all(|w| w[0].id < w[1].id), "in feed order");
    assert!(alice.iter().all(|e| e.owner == "alice"));
    let first = &alice[0];
    assert_eq!(first.created_at, T0);
    assert_eq!(first.ttl_ms, Some(60_000));
    assert_eq!(first.poll_interval_ms, Some(500));
    assert_eq!(first.message, None);
    assert_eq!(alice[1].poll_interval_ms, None);
    assert_eq!(alice[1].ttl_ms, None);

    // After a position; at most `limit`.
    let after_first = db
        .store
        .task_events_for_owner_since("alice", first.id, 1)
        .await
        .unwrap();
    assert_eq!(after_first.len(), 1);
    assert_eq!(after_first[0].id, alice[1].id);
    let last = alice[2].id;
    assert!(
        db.store
            .task_events_for_owner_since("alice", last, 100)
            .await
            .unwrap()
            .is_empty()
    );

    let bob = db
        .store
        .task_events_for_owner_since("bob", head, 100)
        .await
        .unwrap();
    let got: Vec<(TaskStatus, Option<&str>)> = bob
        .iter()
        .map(|e| (e.to_status, e.message.as_deref()))
        .collect();
    assert_eq!(
        got,
        vec![
            (TaskStatus::Working, None),
            (TaskStatus::Cancelled, Some("stop"))
        ]
    );
    assert!(
        db.store
            .task_events_for_owner_since("carol", head, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        db.store.task_events_head().await.unwrap(),
        bob[1].id,
        "the cancel was the last change"
    );
}
store_test!(task_events_for_owner_since_replays_one_owners_changes);

/// Unfinished tasks are working or input_required ones; terminal ones do
/// not count, nor other owners'.
async fn task_count_open_counts_working_and_input_required_tasks(db: TestDb) {
    assert_eq!(db.store.task_count_open("alice").await.unwrap(), 0);
    let waiting = db
        .store
        .task_create(&new_task("waiting", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    let ask = TaskMessage {
        request_id: "r-1".into(),
        task_id: "waiting".into(),
        method: "elicitation/create".into(),
        params: "{}".into(),
        response: None,
    };
    db.store
        .task_message_ask(waiting.seq, "lease-1", &ask, T0 + 1)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("working", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(
            &new_task("refused", "alice"),
            None,
            Some(&failed_outcome("bad arguments")),
            T0,
        )
        .await
        .unwrap();
    db.store
        .task_create(&new_task("cancelled", "alice"), None, None, T0)
        .await
        .unwrap();
    db.store
        .task_cancel("cancelled", "alice", "cancelled", T0 + 1)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("bobs", "bob"), None, None, T0)
        .await
        .unwrap();
    assert_eq!(
        get(&db.store, "waiting").await.status,
        TaskStatus::InputRequired
    );
    assert_eq!(db.store.task_count_open("alice").await.unwrap(), 2);
    assert_eq!(db.store.task_count_open("bob").await.unwrap(), 1);
    assert_eq!(db.store.task_count_open("carol").await.unwrap(), 0);
}
store_test!(task_count_open_counts_working_and_input_required_tasks);

/// Issue 24, item 1: a result its tool flagged as an error is stored as
/// the tool gave it, on a failed task with `tool_error`, read back so by
/// the row and by the change feed (what the front ends map); the database
/// refuses the flag on anything else.
async fn a_tool_error_is_stored_as_given_and_flagged(db: TestDb) {
    let flagged = TaskOutcome {
        status: TaskStatus::Failed,
        status_message: Some("Tool execution failed: boom".into()),
        result: r#"{"content":[{"type":"text","text":"boom"}],"isError":true}"#.into(),
        result_kind: ResultKind::Result,
        tool_error: true,
    };
    let row = db
        .store
        .task_create(&new_task("t-flagged", "alice"), None, Some(&flagged), T0)
        .await
        .unwrap();
    assert!(row.tool_error);
    assert_eq!(row.status, TaskStatus::Failed);
    assert_eq!(row.result.as_deref(), Some(flagged.result.as_str()));
    let read = db.store.task_get("t-flagged").await.unwrap().unwrap();
    assert!(read.tool_error);
    let plain = db
        .store
        .task_create(
            &new_task("t-plain", "alice"),
            None,
            Some(&failed_outcome("no")),
            T0,
        )
        .await
        .unwrap();
    assert!(!plain.tool_error);
    let events = db
        .store
        .task_events_for_owner_since("alice", 0, 100)
        .await
        .unwrap();
    let last = |id: &str| {
        events
            .iter()
            .rev()
            .find(|e| e.task_id == id)
            .unwrap_or_else(|| panic!("an event of {id}"))
            .clone()
    };
    assert!(last("t-flagged").tool_error);
    assert_eq!(last("t-flagged").to_status, TaskStatus::Failed);
    assert!(!last("t-plain").tool_error);

    // The flag belongs to a failed task with a result, nothing else.
    let wrong = TaskOutcome {
        status: TaskStatus::Completed,
        ..flagged
    };
    let refused = db
        .store
        .task_create(&new_task("t-wrong", "alice"), None, Some(&wrong), T0)
        .await;
    assert!(
        refused.is_err(),
        "a completed task with tool_error is refused"
    );
}
store_test!(a_tool_error_is_stored_as_given_and_flagged);
