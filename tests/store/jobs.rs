//! The job queue (`JobStore`): claims (priority highest first, age, start
//! times, quotas, global limits, two claimers at once), heartbeats,
//! completion, cancellation,
//! rescue of expired leases, unclaim and release; every write of a job
//! fenced by its lease.

use super::*;

// job_claim_available -------------------------------------------------------------

async fn job_claim_available_priority_then_age(db: TestDb) {
    let raw = db.raw().await;
    // (task id, priority), created in this order.
    let specs = [
        ("p5-old", 5),
        ("p1-old", 1),
        ("p1-new", 1),
        ("p0", 0),
        ("p5-new", 5),
    ];
    for (i, (id, priority)) in specs.iter().enumerate() {
        let mut task = new_task(id, "alice");
        task.tool = format!("tool-{i}");
        task.progress_token = Some(format!("{i}"));
        db.store
            .task_create(
                &task,
                Some(NewJob {
                    max_attempts: 4,
                    priority: *priority,
                    run_after: None,
                }),
                None,
                T0 + i64::try_from(i).unwrap(),
            )
            .await
            .unwrap();
    }
    // Highest of all, but queued to start later (issue 27 item 2).
    let mut later = new_task("p9-later", "alice");
    later.tool = "tool-0".into();
    db.store
        .task_create(
            &later,
            Some(NewJob {
                max_attempts: 4,
                priority: 9,
                run_after: Some(T0 + 1_000),
            }),
            None,
            T0 + 10,
        )
        .await
        .unwrap();
    let now = T0 + 100;
    let tools: Vec<ToolQuota> = (0..specs.len())
        .map(|i| ToolQuota {
            tool: format!("tool-{i}"),
            free: 10,
            global: None,
        })
        .collect();
    let claimed = db
        .store
        .job_claim_available("w1", "lease-1", &tools, 10, LEASE_MS, now)
        .await
        .unwrap();
    let ids: Vec<&str> = claimed.iter().map(|j| j.task_id.as_str()).collect();
    assert_eq!(ids, vec!["p5-old", "p5-new", "p1-old", "p1-new", "p0"]);
    for j in &claimed {
        assert_eq!(j.attempt, 1);
        assert_eq!(j.max_attempts, 4);
        assert_eq!(j.lease_token, "lease-1", "one claim, one token");
        assert_eq!(j.arguments, r#"{"text":"hello"}"#);
        let row = get(&db.store, &j.task_id).await;
        assert_eq!(j.task_seq, row.seq);
        assert_eq!(j.tool, row.tool);
        assert_eq!(j.progress_token, row.progress_token);
        let state = job(&raw, j.task_seq).await.unwrap();
        assert_eq!(state.state, "running");
        assert_eq!(state.lease_owner.as_deref(), Some("w1"));
        assert_eq!(state.lease_token.as_deref(), Some("lease-1"));
        assert_eq!(state.lease_expires_at, Some(now + LEASE_MS));
    }
    // Running jobs are not claimed again.
    assert!(
        db.store
            .job_claim_available("w2", "lease-2", &echo(10), 10, LEASE_MS, now)
            .await
            .unwrap()
            .is_empty()
    );
    // The delayed job is claimed once its start has come, not before.
    assert!(
        db.store
            .job_claim_available("w2", "lease-2", &tools, 10, LEASE_MS, T0 + 999)
            .await
            .unwrap()
            .is_empty()
    );
    let due = db
        .store
        .job_claim_available("w2", "lease-3", &tools, 10, LEASE_MS, T0 + 1_000)
        .await
        .unwrap();
    assert_eq!(
        due.iter().map(|j| j.task_id.as_str()).collect::<Vec<_>>(),
        vec!["p9-later"]
    );
}
store_test!(job_claim_available_priority_then_age);

async fn job_claim_available_respects_limit(db: TestDb) {
    for i in 0..5 {
        db.store
            .task_create(
                &new_task(&format!("t-{i}"), "alice"),
                Some(JOB),
                None,
                T0 + i,
            )
            .await
            .unwrap();
    }
    let now = T0 + 100;
    let first = db
        .store
        .job_claim_available("w1", "lease-1", &echo(2), 2, LEASE_MS, now)
        .await
        .unwrap();
    let ids: Vec<&str> = first.iter().map(|j| j.task_id.as_str()).collect();
    assert_eq!(ids, vec!["t-0", "t-1"]);
    let second = db
        .store
        .job_claim_available("w2", "lease-2", &echo(2), 2, LEASE_MS, now)
        .await
        .unwrap();
    let ids: Vec<&str> = second.iter().map(|j| j.task_id.as_str()).collect();
    assert_eq!(ids, vec!["t-2", "t-3"]);
    assert!(second.iter().all(|j| j.lease_token == "lease-2"));
    let third = db
        .store
        .job_claim_available("w3", "lease-3", &echo(2), 2, LEASE_MS, now)
        .await
        .unwrap();
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].task_id, "t-4");
    assert!(
        db.store
            .job_claim_available("w4", "lease-4", &echo(2), 2, LEASE_MS, now)
            .await
            .unwrap()
            .is_empty()
    );
}
store_test!(job_claim_available_respects_limit);

async fn job_claim_available_skips_run_after_in_the_future(db: TestDb) {
    // run_after = creation time.
    db.store
        .task_create(&new_task("early", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("late", "alice"), Some(JOB), None, T0 + 5_000)
        .await
        .unwrap();
    assert!(
        db.store
            .job_claim_available("w1", "lease-0", &echo(10), 10, LEASE_MS, T0 - 1)
            .await
            .unwrap()
            .is_empty(),
        "nothing is runnable before its run_after"
    );
    let claimed = db
        .store
        .job_claim_available("w1", "lease-1", &echo(10), 10, LEASE_MS, T0 + 4_999)
        .await
        .unwrap();
    assert_eq!(
        claimed
            .iter()
            .map(|j| j.task_id.as_str())
            .collect::<Vec<_>>(),
        vec!["early"]
    );
    // run_after <= now: runnable exactly at run_after.
    let claimed = db
        .store
        .job_claim_available("w1", "lease-2", &echo(10), 10, LEASE_MS, T0 + 5_000)
        .await
        .unwrap();
    assert_eq!(
        claimed
            .iter()
            .map(|j| j.task_id.as_str())
            .collect::<Vec<_>>(),
        vec!["late"]
    );
}
store_test!(job_claim_available_skips_run_after_in_the_future);

// job_heartbeat ----------------------------------------------------------------------

async fn job_heartbeat_extends_lease(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    assert_eq!(
        job(&raw, row.seq).await.unwrap().lease_expires_at,
        Some(T0 + LEASE_MS)
    );

    let beat_at = T0 + LEASE_MS / 2;
    let hb = db
        .store
        .job_heartbeat(row.seq, "lease-1", LEASE_MS, beat_at)
        .await
        .unwrap();
    assert!(!hb.cancel_requested);
    assert_eq!(
        job(&raw, row.seq).await.unwrap().lease_expires_at,
        Some(beat_at + LEASE_MS)
    );

    // The original lease would have expired here; the extended one has not.
    let report = db
        .store
        .job_rescue_expired(BACKOFF_MS, T0 + LEASE_MS + 1)
        .await
        .unwrap();
    assert_eq!(report, RescueReport::default());
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "running");
    assert_eq!(j.lease_token.as_deref(), Some("lease-1"));
}
store_test!(job_heartbeat_extends_lease);

/// Job history has one row per job whose state a statement changed, in
/// task order, and none for a change of anything else: on PostgreSQL one
/// statement trigger writes a whole statement's history (migration V18),
/// where a row trigger wrote it row by row.
async fn job_history_has_a_row_per_job_a_claim_took_and_none_for_a_heartbeat(db: TestDb) {
    // Three jobs taken by one claim of `w1` at T0 + 1.
    let seqs = running_tasks(&db.store, 3).await;
    for &seq in &seqs {
        db.store
            .job_heartbeat(seq, "lease-1", LEASE_MS, T0 + 20)
            .await
            .unwrap();
    }
    let raw = db.raw().await;
    let history: Vec<(i64, i64, String, Option<String>, i64)> = raw
        .rows(
            "SELECT task_seq, attempt, event, worker, at FROM job_events ORDER BY id",
            args![],
        )
        .await
        .unwrap();
    let expected: Vec<(i64, i64, String, Option<String>, i64)> = seqs
        .iter()
        .map(|&seq| (seq, 1, "claimed".to_owned(), Some("w1".to_owned()), T0 + 1))
        .collect();
    assert_eq!(history, expected);
    raw.close().await;
}
store_test!(job_history_has_a_row_per_job_a_claim_took_and_none_for_a_heartbeat);

async fn job_heartbeat_reports_cancel_requested(db: TestDb) {
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    let hb = db
        .store
        .job_heartbeat(row.seq, "lease-1", LEASE_MS, T0 + 1)
        .await
        .unwrap();
    assert!(!hb.cancel_requested);
    db.store
        .task_cancel("t-1", "alice", "cancelled", T0 + 2)
        .await
        .unwrap();
    let hb = db
        .store
        .job_heartbeat(row.seq, "lease-1", LEASE_MS, T0 + 3)
        .await
        .unwrap();
    assert!(hb.cancel_requested, "the worker learns of the cancel");
}
store_test!(job_heartbeat_reports_cancel_requested);

async fn job_heartbeat_lease_lost_with_wrong_token(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    // Not claimed yet.
    assert_lease_lost(
        db.store
            .job_heartbeat(row.seq, "lease-1", LEASE_MS, T0)
            .await,
    );
    claim_one(&db.store, "w1", "lease-1", T0).await;
    assert_lease_lost(
        db.store
            .job_heartbeat(row.seq, "lease-wrong", LEASE_MS, T0 + 1)
            .await,
    );
    assert_eq!(
        job(&raw, row.seq).await.unwrap().lease_expires_at,
        Some(T0 + LEASE_MS),
        "a wrong token extends nothing"
    );
    // Unknown task.
    assert_lease_lost(
        db.store
            .job_heartbeat(row.seq + 100, "lease-1", LEASE_MS, T0 + 1)
            .await,
    );
    // After completion the token is spent.
    db.store
        .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 2)
        .await
        .unwrap();
    assert_lease_lost(
        db.store
            .job_heartbeat(row.seq, "lease-1", LEASE_MS, T0 + 3)
            .await,
    );
}
store_test!(job_heartbeat_lease_lost_with_wrong_token);

// job_complete -------------------------------------------------------------------------

async fn job_complete_records_outcome_and_closes_job(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    let outcome = completed_outcome();
    assert!(
        db.store
            .job_complete(row.seq, "lease-1", &outcome, T0 + 500)
            .await
            .unwrap()
    );
    let after = get(&db.store, "t-1").await;
    assert_eq!(after.status, TaskStatus::Completed);
    assert_eq!(after.result.as_deref(), Some(outcome.result.as_str()));
    assert_eq!(after.result_kind, Some(ResultKind::Result));
    assert_eq!(after.updated_at, T0 + 500, "T-13");
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "done");
    assert_eq!(j.lease_token, None);
    assert_eq!(j.lease_expires_at, None);
    assert_eq!(j.finished_at, Some(T0 + 500));
    assert_eq!(
        history(&raw, "t-1").await,
        vec![
            (None, "working".to_owned(), None, T0),
            (
                Some("working".to_owned()),
                "completed".to_owned(),
                None,
                T0 + 500
            ),
        ]
    );
    // A second completion with the same token is fenced out.
    assert_lease_lost(
        db.store
            .job_complete(row.seq, "lease-1", &failed_outcome("late"), T0 + 600)
            .await,
    );
    assert_eq!(get(&db.store, "t-1").await, after);
}
store_test!(job_complete_records_outcome_and_closes_job);

async fn job_complete_with_wrong_token_writes_nothing(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    let task_before = get(&db.store, "t-1").await;
    let job_before = job(&raw, row.seq).await.unwrap();

    assert_lease_lost(
        db.store
            .job_complete(row.seq, "lease-wrong", &completed_outcome(), T0 + 2)
            .await,
    );
    assert_eq!(get(&db.store, "t-1").await, task_before, "task untouched");
    assert_eq!(
        job(&raw, row.seq).await.unwrap(),
        job_before,
        "job untouched"
    );
    assert_eq!(history(&raw, "t-1").await.len(), 1);

    // The rightful holder still completes.
    assert!(
        db.store
            .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 3)
            .await
            .unwrap()
    );
}
store_test!(job_complete_with_wrong_token_writes_nothing);

async fn job_complete_after_cancel_returns_false_and_task_stays_cancelled_t22(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    db.store
        .task_cancel("t-1", "alice", "cancelled by client", T0 + 2)
        .await
        .unwrap();
    let cancelled = get(&db.store, "t-1").await;

    // The tool finished anyway: its outcome is dropped (T-22).
    let took = db
        .store
        .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 3)
        .await
        .unwrap();
    assert!(!took);
    let after = get(&db.store, "t-1").await;
    assert_eq!(after, cancelled, "cancelled stays cancelled, no result");
    assert_eq!(after.status, TaskStatus::Cancelled);
    assert_eq!(after.result, None);

    // The job itself is closed.
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "done");
    assert_eq!(j.lease_token, None);
    assert_eq!(
        transitions(&raw, "t-1").await,
        vec![tr(None, "working"), tr(Some("working"), "cancelled")]
    );
}
store_test!(job_complete_after_cancel_returns_false_and_task_stays_cancelled_t22);

async fn job_complete_by_stale_worker_after_rescue_is_fenced(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    // w1 hangs; its lease expires and the job goes to w2.
    let rescue_at = T0 + LEASE_MS + 1;
    let report = db
        .store
        .job_rescue_expired(BACKOFF_MS, rescue_at)
        .await
        .unwrap();
    assert_eq!(report.requeued, 1);
    let run_after = job(&raw, row.seq).await.unwrap().run_after;
    let second = claim_one(&db.store, "w2", "lease-2", run_after).await;
    assert_eq!(second.attempt, 2);

    // w1 wakes up and tries to write: fenced.
    assert_lease_lost(
        db.store
            .job_complete(row.seq, "lease-1", &failed_outcome("stale"), run_after + 1)
            .await,
    );
    assert_lease_lost(
        db.store
            .task_set_status_message(row.seq, "lease-1", "stale", run_after + 1)
            .await,
    );
    assert_lease_lost(
        db.store
            .job_heartbeat(row.seq, "lease-1", LEASE_MS, run_after + 1)
            .await,
    );
    assert_eq!(get(&db.store, "t-1").await.status, TaskStatus::Working);

    assert!(
        db.store
            .job_complete(row.seq, "lease-2", &completed_outcome(), run_after + 2)
            .await
            .unwrap()
    );
    assert_eq!(get(&db.store, "t-1").await.status, TaskStatus::Completed);
}
store_test!(job_complete_by_stale_worker_after_rescue_is_fenced);

// job_finish_cancelled --------------------------------------------------------------------

async fn job_finish_cancelled_closes_the_job_fenced(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    db.store
        .task_cancel("t-1", "alice", "cancelled", T0 + 1)
        .await
        .unwrap();
    let cancelled = get(&db.store, "t-1").await;

    assert_lease_lost(
        db.store
            .job_finish_cancelled(row.seq, "lease-wrong", T0 + 2)
            .await,
    );
    assert_eq!(job(&raw, row.seq).await.unwrap().state, "running");

    db.store
        .job_finish_cancelled(row.seq, "lease-1", T0 + 3)
        .await
        .unwrap();
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "done");
    assert_eq!(j.lease_token, None);
    assert_eq!(j.lease_expires_at, None);
    assert_eq!(j.finished_at, Some(T0 + 3));
    assert_eq!(j.last_error.as_deref(), Some("cancelled"));
    assert_eq!(get(&db.store, "t-1").await, cancelled, "task untouched");

    // Only once.
    assert_lease_lost(
        db.store
            .job_finish_cancelled(row.seq, "lease-1", T0 + 4)
            .await,
    );
}
store_test!(job_finish_cancelled_closes_the_job_fenced);

// job_rescue_expired ------------------------------------------------------------------------

async fn job_rescue_expired_leaves_live_leases_alone(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    // Queued jobs are not the rescuer's business.
    assert_eq!(
        db.store
            .job_rescue_expired(BACKOFF_MS, T0 + 10 * LEASE_MS)
            .await
            .unwrap(),
        RescueReport::default()
    );
    claim_one(&db.store, "w1", "lease-1", T0).await;
    assert_eq!(
        db.store
            .job_rescue_expired(BACKOFF_MS, T0 + LEASE_MS - 1)
            .await
            .unwrap(),
        RescueReport::default()
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "running");
    assert_eq!(j.lease_token.as_deref(), Some("lease-1"));
}
store_test!(job_rescue_expired_leaves_live_leases_alone);

async fn job_rescue_expired_requeues_with_backoff_while_attempts_remain(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;

    let rescue_at = T0 + LEASE_MS + 1;
    let report = db
        .store
        .job_rescue_expired(BACKOFF_MS, rescue_at)
        .await
        .unwrap();
    assert_eq!(
        report,
        RescueReport {
            requeued: 1,
            failed: vec![],
            closed: 0
        }
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "queued");
    assert_eq!(j.lease_token, None);
    assert_eq!(j.lease_expires_at, None);
    assert_eq!(j.attempt, 1);
    assert_eq!(j.last_error.as_deref(), Some("lease expired on attempt 1"));
    assert!(
        j.run_after > rescue_at,
        "run_after {} is in the future of {rescue_at}",
        j.run_after
    );
    assert!(
        j.run_after <= rescue_at + BACKOFF_MS + JITTER_MAX_MS,
        "backoff * attempt + jitter: {}",
        j.run_after - rescue_at
    );
    assert!(j.run_after >= rescue_at + BACKOFF_MS);
    // The task itself is still working, history unchanged.
    assert_eq!(get(&db.store, "t-1").await.status, TaskStatus::Working);
    assert_eq!(history(&raw, "t-1").await.len(), 1);

    // Not claimable before run_after; claimable at it, as attempt 2.
    assert!(
        db.store
            .job_claim_available("w2", "lease-2", &echo(10), 10, LEASE_MS, j.run_after - 1)
            .await
            .unwrap()
            .is_empty()
    );
    let again = claim_one(&db.store, "w2", "lease-2", j.run_after).await;
    assert_eq!(again.attempt, 2);
    assert_eq!(again.task_seq, row.seq);

    // Second loss: backoff grows with the attempt number.
    let rescue2 = j.run_after + LEASE_MS;
    let report = db
        .store
        .job_rescue_expired(BACKOFF_MS, rescue2)
        .await
        .unwrap();
    assert_eq!(report.requeued, 1);
    let j2 = job(&raw, row.seq).await.unwrap();
    assert!(j2.run_after >= rescue2 + 2 * BACKOFF_MS);
    assert!(j2.run_after <= rescue2 + 2 * BACKOFF_MS + JITTER_MAX_MS);
    assert_eq!(j2.last_error.as_deref(), Some("lease expired on attempt 2"));
}
store_test!(job_rescue_expired_requeues_with_backoff_while_attempts_remain);

async fn job_rescue_expired_fails_task_when_attempts_are_exhausted(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(
            &new_task("t-1", "alice"),
            Some(NewJob {
                max_attempts: 2,
                priority: 0,
                run_after: None,
            }),
            None,
            T0,
        )
        .await
        .unwrap();

    // Attempt 1 lost: requeued.
    claim_one(&db.store, "w1", "lease-1", T0).await;
    let r1 = T0 + LEASE_MS;
    assert_eq!(
        db.store
            .job_rescue_expired(BACKOFF_MS, r1)
            .await
            .unwrap()
            .requeued,
        1
    );
    let run_after = job(&raw, row.seq).await.unwrap().run_after;

    // Attempt 2 lost: no attempts left, the task fails.
    let second = claim_one(&db.store, "w2", "lease-2", run_after).await;
    assert_eq!(second.attempt, 2);
    let r2 = run_after + LEASE_MS + 1;
    let report = db.store.job_rescue_expired(BACKOFF_MS, r2).await.unwrap();
    assert_eq!(
        report,
        RescueReport {
            requeued: 0,
            failed: vec!["echo".to_owned()],
            closed: 0
        }
    );

    let task = get(&db.store, "t-1").await;
    assert_eq!(task.status, TaskStatus::Failed);
    let message = task.status_message.clone().unwrap();
    assert!(message.contains("worker lost"), "{message}");
    assert!(message.contains('2'), "says how many times: {message}");
    assert_eq!(
        message,
        "worker lost 2 time(s): lease expired with no attempts left"
    );
    assert_eq!(task.result_kind, Some(ResultKind::Error));
    assert_eq!(
        task.result.as_deref(),
        Some(r#"{"message":"Task failed: worker lost 2 time(s) (lease expired)"}"#)
    );
    let error: serde_json::Value = serde_json::from_str(task.result.as_deref().unwrap()).unwrap();
    // An error record of the broker's own: no protocol's code (each front
    // end reports it as an internal error; tests/restart.rs sees -32603).
    assert_eq!(error.get("code"), None, "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("worker lost"),
        "{error}"
    );
    assert_eq!(task.updated_at, r2, "T-13");

    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "done");
    assert_eq!(j.lease_token, None);
    assert_eq!(j.finished_at, Some(r2));
    assert_eq!(
        j.last_error.as_deref(),
        Some("lease expired on attempt 2; no attempts left")
    );
    assert_eq!(
        history(&raw, "t-1").await,
        vec![
            (None, "working".to_owned(), None, T0),
            (
                Some("working".to_owned()),
                "failed".to_owned(),
                Some(message),
                r2
            ),
        ]
    );

    // The stale worker cannot overwrite the failure.
    assert_lease_lost(
        db.store
            .job_complete(row.seq, "lease-2", &completed_outcome(), r2 + 1)
            .await,
    );
    // And nothing is left to rescue or claim.
    assert_eq!(
        db.store
            .job_rescue_expired(BACKOFF_MS, r2 + 10 * LEASE_MS)
            .await
            .unwrap(),
        RescueReport::default()
    );
    assert!(
        db.store
            .job_claim_available("w3", "lease-3", &echo(10), 10, LEASE_MS, r2 + 10 * LEASE_MS)
            .await
            .unwrap()
            .is_empty()
    );
}
store_test!(job_rescue_expired_fails_task_when_attempts_are_exhausted);

async fn job_rescue_expired_closes_jobs_of_cancelled_tasks_t22(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    db.store
        .task_cancel("t-1", "alice", "cancelled", T0 + 1)
        .await
        .unwrap();
    let cancelled = get(&db.store, "t-1").await;

    // The worker vanished without finishing the cancelled job.
    let at = T0 + LEASE_MS + 1;
    let report = db.store.job_rescue_expired(BACKOFF_MS, at).await.unwrap();
    assert_eq!(
        report,
        RescueReport {
            requeued: 0,
            failed: vec![],
            closed: 1
        }
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(
        j.state, "done",
        "not requeued: attempts remained but the task is cancelled"
    );
    assert_eq!(j.attempt, 1);
    assert_eq!(j.lease_token, None);
    assert_eq!(j.finished_at, Some(at));
    assert_eq!(j.last_error.as_deref(), Some("cancelled; worker lost"));
    assert_eq!(
        get(&db.store, "t-1").await,
        cancelled,
        "T-22: stays cancelled"
    );
    assert!(
        db.store
            .job_claim_available("w2", "lease-2", &echo(10), 10, LEASE_MS, at + 10 * LEASE_MS)
            .await
            .unwrap()
            .is_empty()
    );
}
store_test!(job_rescue_expired_closes_jobs_of_cancelled_tasks_t22);

async fn job_rescue_expired_mixed_batch_counts_each_kind(db: TestDb) {
    let single = NewJob {
        max_attempts: 1,
        priority: 0,
        run_after: None,
    };
    db.store
        .task_create(&new_task("retry", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("exhausted", "alice"), Some(single), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("cancelled", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(
            &new_task("cancelled-exhausted", "alice"),
            Some(single),
            None,
            T0,
        )
        .await
        .unwrap();
    let claimed = db
        .store
        .job_claim_available("w1", "lease-1", &echo(10), 10, LEASE_MS, T0)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 4);
    for id in ["cancelled", "cancelled-exhausted"] {
        db.store
            .task_cancel(id, "alice", "cancelled", T0 + 1)
            .await
            .unwrap();
    }
    let report = db
        .store
        .job_rescue_expired(BACKOFF_MS, T0 + LEASE_MS)
        .await
        .unwrap();
    assert_eq!(
        report,
        RescueReport {
            requeued: 1,
            failed: vec!["echo".to_owned()],
            closed: 2
        }
    );
    assert_eq!(get(&db.store, "retry").await.status, TaskStatus::Working);
    assert_eq!(get(&db.store, "exhausted").await.status, TaskStatus::Failed);
    assert_eq!(
        get(&db.store, "cancelled").await.status,
        TaskStatus::Cancelled
    );
    assert_eq!(
        get(&db.store, "cancelled-exhausted").await.status,
        TaskStatus::Cancelled
    );
}
store_test!(job_rescue_expired_mixed_batch_counts_each_kind);

// Two claimers, two handles on one database ---------------------------------------------------

/// Two `Store` handles on one database, as two broker processes would have.
async fn two_handles(db: &TestDb) -> (Store, Store) {
    let a = store::open(db.location(), Durability::Full).await.unwrap();
    let b = store::open(db.location(), Durability::Full).await.unwrap();
    (a, b)
}

async fn two_claimers_racing_for_one_job_exactly_one_wins(db: TestDb) {
    let raw = db.raw().await;
    let (a, b) = two_handles(&db).await;
    let mut wins = (0u32, 0u32);

    for round in 0..50i64 {
        let now = T0 + round * 10;
        let task = a
            .task_create(
                &new_task(&format!("race-{round}"), "alice"),
                Some(JOB),
                None,
                now,
            )
            .await
            .unwrap();

        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let spawn_claim = |store: &Store, worker: &'static str| {
            let store = store.clone();
            let barrier = Arc::clone(&barrier);
            let token = format!("{worker}-lease-{round}");
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .job_claim_available(worker, &token, &echo(5), 5, LEASE_MS, now)
                    .await
            })
        };
        let ha = spawn_claim(&a, "worker-a");
        let hb = spawn_claim(&b, "worker-b");
        let (ra, rb) = tokio::join!(ha, hb);
        let ra = ra
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: claimer a failed: {e}"));
        let rb = rb
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: claimer b failed: {e}"));

        assert_eq!(
            ra.len() + rb.len(),
            1,
            "round {round}: exactly one claimer gets the job (a: {ra:?}, b: {rb:?})"
        );
        let (winner, worker) = if ra.len() == 1 {
            wins.0 += 1;
            (&ra[0], "worker-a")
        } else {
            wins.1 += 1;
            (&rb[0], "worker-b")
        };
        assert_eq!(winner.task_seq, task.seq);
        assert_eq!(winner.attempt, 1);
        let j = job(&raw, task.seq).await.unwrap();
        assert_eq!(j.state, "running");
        assert_eq!(j.attempt, 1, "round {round}: claimed once, not twice");
        assert_eq!(j.lease_owner.as_deref(), Some(worker));
        assert_eq!(j.lease_token.as_deref(), Some(winner.lease_token.as_str()));
    }
    // Who wins is up to the scheduler; only the totals are fixed.
    eprintln!("wins: worker-a {}, worker-b {}", wins.0, wins.1);
    assert_eq!(wins.0 + wins.1, 50, "wins: {wins:?}");
    a.close().await;
    b.close().await;
}
store_test!(
    #[multi_thread]
    two_claimers_racing_for_one_job_exactly_one_wins
);

async fn two_claimers_draining_one_queue_never_share_a_job(db: TestDb) {
    let (a, b) = two_handles(&db).await;
    let mut all = HashSet::new();
    for i in 0..40 {
        let row = db
            .store
            .task_create(&new_task(&format!("t-{i}"), "alice"), Some(JOB), None, T0)
            .await
            .unwrap();
        all.insert(row.seq);
    }
    let drain = |store: Store, worker: &'static str| {
        tokio::spawn(async move {
            let mut got = Vec::new();
            for n in 0.. {
                let token = format!("{worker}-{n}");
                let jobs = store
                    .job_claim_available(worker, &token, &echo(3), 3, LEASE_MS, T0 + 1)
                    .await
                    .unwrap_or_else(|e| panic!("{worker}: claim failed: {e}"));
                if jobs.is_empty() {
                    break;
                }
                assert!(jobs.len() <= 3);
                got.extend(jobs.into_iter().map(|j| j.task_seq));
            }
            got
        })
    };
    let (ga, gb) = tokio::join!(drain(a.clone(), "worker-a"), drain(b.clone(), "worker-b"));
    let (ga, gb) = (ga.unwrap(), gb.unwrap());
    let sa: HashSet<i64> = ga.iter().copied().collect();
    let sb: HashSet<i64> = gb.iter().copied().collect();
    assert_eq!(sa.len(), ga.len(), "a never got a job twice");
    assert_eq!(sb.len(), gb.len(), "b never got a job twice");
    assert!(sa.is_disjoint(&sb), "no job went to both claimers");
    let union: HashSet<i64> = sa.union(&sb).copied().collect();
    assert_eq!(union, all, "every job claimed");
    a.close().await;
    b.close().await;
}
store_test!(
    #[multi_thread]
    two_claimers_draining_one_queue_never_share_a_job
);

/// A job back in the queue (its worker vanished) abandons what the lost
/// attempt asked the client and sets an input_required task working again
/// (T-27), in the rescue itself, stamped with the rescuer's clock; while it
/// waits, the task says it is queued and why; the next run starts with no
/// stale message.
async fn new_attempt_abandons_old_requests_and_resumes_working(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    let ask = taskbroker::store::TaskMessage {
        request_id: "r-1".into(),
        task_id: "t".into(),
        method: "elicitation/create".into(),
        params: "{}".into(),
        response: None,
    };
    db.store
        .task_message_ask(row.seq, "lease-1", &ask, T0 + 2)
        .await
        .unwrap();
    assert_eq!(get(&db.store, "t").await.status, TaskStatus::InputRequired);
    // The worker vanishes; its lease runs out; another claims the job.
    let rescued_at = T0 + LEASE_MS + 10;
    let report = db.store.job_rescue_expired(0, rescued_at).await.unwrap();
    assert_eq!(report.requeued, 1);
    let task = get(&db.store, "t").await;
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(
        task.status_message.as_deref(),
        Some("queued: lease expired on attempt 1")
    );
    assert_eq!(task.updated_at, rescued_at, "T-13: the caller's clock");
    let again = claim_one(&db.store, "w2", "lease-2", T0 + LEASE_MS + 2_000).await;
    assert_eq!(again.attempt, 2);
    let task = get(&db.store, "t").await;
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(
        task.status_message, None,
        "the new run has said nothing yet"
    );
    assert!(
        db.store
            .task_messages_pending("t")
            .await
            .unwrap()
            .is_empty()
    );
    let state: String = raw
        .scalar(
            "SELECT state FROM task_messages WHERE request_id = 'r-1'",
            args![],
        )
        .await
        .unwrap();
    assert_eq!(state, "abandoned");
}
store_test!(new_attempt_abandons_old_requests_and_resumes_working);

/// A claim undone (its pool stopped before it got the job): queued again,
/// the attempt not counted, fenced by the lease token.
async fn job_unclaim_queues_again_without_counting_the_attempt(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    assert!(
        !db.store
            .job_unclaim(row.seq, "not-the-lease", T0 + 2)
            .await
            .unwrap()
    );
    assert!(
        db.store
            .job_unclaim(row.seq, "lease-1", T0 + 2)
            .await
            .unwrap()
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "queued");
    assert_eq!(j.lease_token, None);
    assert!(
        !db.store
            .job_unclaim(row.seq, "lease-1", T0 + 2)
            .await
            .unwrap()
    );
    let again = claim_one(&db.store, "w2", "lease-2", T0 + 2).await;
    assert_eq!(again.attempt, 1, "the undone claim did not count");
}
store_test!(job_unclaim_queues_again_without_counting_the_attempt);

/// A claim takes at most each tool's quota, leaves tools without a quota,
/// and for a tool with a global limit counts its running jobs in every
/// process, except those of tasks waiting for their client.
async fn job_claim_respects_tool_quotas_and_global_limits(db: TestDb) {
    let mut seq = 0;
    let mut create = |tool: &str| {
        seq += 1;
        let mut task = new_task(&format!("{tool}-{seq}"), "alice");
        task.tool = tool.to_owned();
        task
    };
    for tool in ["a", "a", "a", "b", "b", "b", "b", "c"] {
        let task = create(tool);
        db.store
            .task_create(&task, Some(JOB), None, T0)
            .await
            .unwrap();
    }
    let quota = |tool: &str, free: i64, global: Option<i64>| ToolQuota {
        tool: tool.into(),
        free,
        global,
    };
    let tools = |jobs: &[ClaimedJob]| {
        let mut t: Vec<String> = jobs.iter().map(|j| j.tool.clone()).collect();
        t.sort();
        t
    };
    // a: 1 free here; b: 10 free here but 2 in all processes; c: not served.
    let first = db
        .store
        .job_claim_available(
            "w1",
            "lease-1",
            &[quota("a", 1, None), quota("b", 10, Some(2))],
            10,
            LEASE_MS,
            T0 + 1,
        )
        .await
        .unwrap();
    assert_eq!(tools(&first), ["a", "b", "b"]);
    // Another process: b's two running jobs count against its global limit.
    let second = db
        .store
        .job_claim_available(
            "w2",
            "lease-2",
            &[quota("a", 5, None), quota("b", 10, Some(2))],
            10,
            LEASE_MS,
            T0 + 2,
        )
        .await
        .unwrap();
    assert_eq!(tools(&second), ["a", "a"], "b is at its global limit");
    // One running b waits for its client: it no longer counts.
    let waiting = first.iter().find(|j| j.tool == "b").unwrap();
    let ask = taskbroker::store::TaskMessage {
        request_id: "r-b".into(),
        task_id: waiting.task_id.clone(),
        method: "elicitation/create".into(),
        params: "{}".into(),
        response: None,
    };
    db.store
        .task_message_ask(waiting.task_seq, "lease-1", &ask, T0 + 3)
        .await
        .unwrap();
    let third = db
        .store
        .job_claim_available(
            "w2",
            "lease-3",
            &[quota("b", 10, Some(2))],
            10,
            LEASE_MS,
            T0 + 4,
        )
        .await
        .unwrap();
    assert_eq!(tools(&third), ["b"], "one slot of b's two is free again");
    let none = db
        .store
        .job_claim_available(
            "w2",
            "lease-4",
            &[quota("b", 10, Some(2))],
            10,
            LEASE_MS,
            T0 + 5,
        )
        .await
        .unwrap();
    assert!(none.is_empty());
}
store_test!(job_claim_respects_tool_quotas_and_global_limits);

// job_any_runnable / job_release -----------------------------------------------------

async fn job_any_runnable_sees_queued_jobs_whose_time_has_come(db: TestDb) {
    assert!(!db.store.job_any_runnable(T0).await.unwrap(), "empty");
    db.store
        .task_create(&new_task("no-job", "alice"), None, None, T0)
        .await
        .unwrap();
    assert!(!db.store.job_any_runnable(T0).await.unwrap(), "no job");
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0 + 10)
        .await
        .unwrap();
    assert!(!db.store.job_any_runnable(T0 + 9).await.unwrap());
    assert!(db.store.job_any_runnable(T0 + 10).await.unwrap());

    // Running: nothing to claim.
    claim_one(&db.store, "w1", "lease-1", T0 + 10).await;
    assert!(!db.store.job_any_runnable(T0 + 10).await.unwrap());

    // Requeued with a backoff: runnable once its run_after comes.
    let rescued_at = T0 + 10 + LEASE_MS;
    db.store
        .job_rescue_expired(BACKOFF_MS, rescued_at)
        .await
        .unwrap();
    let run_after = job(&db.raw().await, row.seq).await.unwrap().run_after;
    assert!(!db.store.job_any_runnable(run_after - 1).await.unwrap());
    assert!(db.store.job_any_runnable(run_after).await.unwrap());

    // Cancelled while queued: done, never runnable again.
    db.store
        .task_cancel("t-1", "alice", "cancelled", run_after)
        .await
        .unwrap();
    assert!(
        !db.store
            .job_any_runnable(run_after + LEASE_MS)
            .await
            .unwrap()
    );
}
store_test!(job_any_runnable_sees_queued_jobs_whose_time_has_come);

/// A stopping worker gives back a running job: queued again at once, the
/// attempt not counted, what it asked the client abandoned and the task
/// working again (T-27); fenced by the lease. The job of a cancelled task
/// is finished instead.
async fn job_release_requeues_without_counting_the_attempt_t27(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    let ask = TaskMessage {
        request_id: "r-1".into(),
        task_id: "t-1".into(),
        method: "elicitation/create".into(),
        params: "{}".into(),
        response: None,
    };
    db.store
        .task_message_ask(row.seq, "lease-1", &ask, T0 + 2)
        .await
        .unwrap();
    assert_lease_lost(db.store.job_release(row.seq, "lease-other", T0 + 5).await);

    assert!(
        db.store
            .job_release(row.seq, "lease-1", T0 + 5)
            .await
            .unwrap(),
        "requeued"
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "queued");
    assert_eq!(j.attempt, 0, "not counted");
    assert_eq!(j.run_after, T0 + 5, "runnable at once");
    assert_eq!(j.lease_owner, None);
    assert_eq!(j.lease_token, None);
    assert_eq!(j.lease_expires_at, None);
    assert_eq!(
        j.last_error.as_deref(),
        Some("released by a stopping worker (attempt 1 not counted)")
    );
    let task = get(&db.store, "t-1").await;
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(
        task.status_message.as_deref(),
        Some("queued: released by a stopping worker (attempt 1 not counted)")
    );
    assert_eq!(task.updated_at, T0 + 5);
    assert!(
        db.store
            .task_messages_pending("t-1")
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        transitions(&raw, "t-1").await,
        vec![
            tr(None, "working"),
            tr(Some("working"), "input_required"),
            tr(Some("input_required"), "working"),
        ]
    );
    // Released once.
    assert_lease_lost(db.store.job_release(row.seq, "lease-1", T0 + 6).await);

    let again = claim_one(&db.store, "w2", "lease-2", T0 + 5).await;
    assert_eq!(again.attempt, 1, "the released run did not count");

    // Cancelled while running, then released: finished, not requeued.
    db.store
        .task_cancel("t-1", "alice", "cancelled", T0 + 6)
        .await
        .unwrap();
    assert!(
        !db.store
            .job_release(row.seq, "lease-2", T0 + 7)
            .await
            .unwrap(),
        "not requeued"
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "done");
    assert_eq!(j.attempt, 1);
    assert_eq!(j.finished_at, Some(T0 + 7));
    assert_eq!(j.last_error.as_deref(), Some("cancelled"));
    assert_eq!(get(&db.store, "t-1").await.status, TaskStatus::Cancelled);
}
store_test!(job_release_requeues_without_counting_the_attempt_t27);

// job_checkpoint --------------------------------------------------------------------

/// Issue 25 item 5: where a run got to is kept, fenced by its lease, and
/// the next attempt (after the lease was lost) is claimed with it.
async fn job_checkpoint_is_fenced_and_survives_a_lost_lease(db: TestDb) {
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let first = claim_one(&db.store, "w1", "lease-1", T0).await;
    assert_eq!(first.checkpoint, None, "a first run starts from nothing");
    db.store
        .job_checkpoint(row.seq, "lease-1", r#"{"sent":true}"#, T0 + 1)
        .await
        .unwrap();
    db.store
        .job_checkpoint(row.seq, "lease-1", r#"{"upstreamTask":"u-7"}"#, T0 + 2)
        .await
        .unwrap();
    assert_lease_lost(
        db.store
            .job_checkpoint(row.seq, "lease-other", r#"{"sent":false}"#, T0 + 3)
            .await,
    );

    let report = db
        .store
        .job_rescue_expired(BACKOFF_MS, T0 + LEASE_MS + 1)
        .await
        .unwrap();
    assert_eq!(report.requeued, 1, "{report:?}");
    assert_lease_lost(
        db.store
            .job_checkpoint(row.seq, "lease-1", r#"{"sent":false}"#, T0 + LEASE_MS + 2)
            .await,
    );
    let raw = db.raw().await;
    let run_after = job(&raw, row.seq).await.unwrap().run_after;
    let again = claim_one(&db.store, "w2", "lease-2", run_after).await;
    assert_eq!(again.attempt, 2);
    assert_eq!(
        again.checkpoint.as_deref(),
        Some(r#"{"upstreamTask":"u-7"}"#),
        "the last checkpoint of the lost run"
    );
}
store_test!(job_checkpoint_is_fenced_and_survives_a_lost_lease);

/// Issue 27 item 4: within a priority, owners take turns (each job is
/// numbered one after its owner's last queued job of the tool, and no
/// earlier than the tool's lowest due number), also for jobs created in
/// one grouped batch.
async fn job_claim_available_owners_take_turns(db: TestDb) {
    let create = |id: &str, owner: &str| {
        let mut task = new_task(id, owner);
        task.tool = "echo".into();
        task
    };
    for (id, owner) in [
        ("a0", "alice"),
        ("a1", "alice"),
        ("a2", "alice"),
        ("b0", "bob"),
    ] {
        db.store
            .task_create(&create(id, owner), Some(JOB), None, T0)
            .await
            .unwrap();
    }
    // One batch: carol's two and alice's fourth.
    let batch: Vec<Write> = [("c0", "carol"), ("c1", "carol"), ("a3", "alice")]
        .iter()
        .map(|(id, owner)| Write::Create {
            new: Box::new(create(id, owner)),
            job: Some(JOB),
            outcome: None,
        })
        .collect();
    for done in db.store.write_batch(&batch, T0 + 1).await.unwrap() {
        done.unwrap();
    }
    // One at a time: the order of taking.
    let mut order = Vec::new();
    for n in 0..8 {
        let claimed = db
            .store
            .job_claim_available("w1", &format!("lease-{n}"), &echo(10), 1, LEASE_MS, T0 + 2)
            .await
            .unwrap();
        order.extend(claimed.into_iter().map(|j| j.task_id));
    }
    assert_eq!(order, ["a0", "b0", "c0", "a1", "c1", "a2", "a3"]);
}
store_test!(job_claim_available_owners_take_turns);

/// Issue 27 item 4: turns are kept per priority (a requestor's high job is
/// not numbered after its normal backlog), and jobs that wait for their
/// start neither use up their owner's turns nor hold the turns back.
async fn job_claim_available_turns_by_priority_and_start(db: TestDb) {
    let create = |id: &str, owner: &str| {
        let mut task = new_task(id, owner);
        task.tool = "echo".into();
        task
    };
    let job = |priority: i64, run_after: Option<i64>| NewJob {
        max_attempts: 3,
        priority,
        run_after,
    };
    let specs: [(&str, &str, i64, Option<i64>); 13] = [
        // Alice: three normal jobs, two for later, then one now; then bob
        // four.
        ("a0", "alice", 0, None),
        ("a1", "alice", 0, None),
        ("a2", "alice", 0, None),
        ("later-0", "alice", 0, Some(T0 + 10_000)),
        ("later-1", "alice", 0, Some(T0 + 10_000)),
        ("a-now", "alice", 0, None),
        ("b0", "bob", 0, None),
        ("b1", "bob", 0, None),
        ("b2", "bob", 0, None),
        ("b3", "bob", 0, None),
        // Then one high of alice's and two of bob's.
        ("a-high", "alice", 10, None),
        ("b-high-0", "bob", 10, None),
        ("b-high-1", "bob", 10, None),
    ];
    for (id, owner, priority, run_after) in specs {
        db.store
            .task_create(&create(id, owner), Some(job(priority, run_after)), None, T0)
            .await
            .unwrap();
    }
    let mut order = Vec::new();
    for n in 0..12 {
        let claimed = db
            .store
            .job_claim_available("w1", &format!("lease-{n}"), &echo(10), 1, LEASE_MS, T0 + 1)
            .await
            .unwrap();
        order.extend(claimed.into_iter().map(|j| j.task_id));
    }
    assert_eq!(
        order,
        [
            "a-high", "b-high-0", "b-high-1", "a0", "b0", "a1", "b1", "a2", "b2", "a-now", "b3"
        ]
    );
}
store_test!(job_claim_available_turns_by_priority_and_start);
