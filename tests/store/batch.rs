//! Group commit (`write_batch`): creations, completions and claims of one
//! batch in one commit, and a write that fails alone.

use super::*;

// Group commit (write_batch) --------------------------------------------------

/// A creation for `write_batch`.
fn create_op(new: NewTask, job: Option<NewJob>, outcome: Option<TaskOutcome>) -> Write {
    Write::Create {
        new: Box::new(new),
        job,
        outcome,
    }
}

/// A completion for `write_batch`.
fn complete_op(task_seq: i64, token: &str, outcome: TaskOutcome) -> Write {
    Write::Complete {
        task_seq,
        task_id: String::new(),
        lease_token: token.to_owned(),
        outcome,
    }
}

/// The row a batch's creation answered.
fn created(done: Result<Written, StoreError>) -> Result<TaskRow, StoreError> {
    match done? {
        Written::Created(row) => Ok(row),
        other => panic!("expected a created row, got {other:?}"),
    }
}

/// What a batch's completion answered.
fn completed(done: Result<Written, StoreError>) -> Result<bool, StoreError> {
    match done? {
        Written::Completed(took) => Ok(took),
        other => panic!("expected a completion, got {other:?}"),
    }
}

/// Grouped path: creations and completions of one batch in one commit; a
/// lost lease answers LeaseLost for that write alone (T-9, T-22 fencing).
async fn write_batch_groups_creations_and_completions(db: TestDb) {
    let raw = db.raw().await;
    let a = db
        .store
        .task_create(&new_task("a", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let b = db
        .store
        .task_create(&new_task("b", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let claimed = db
        .store
        .job_claim_available("w1", "lease-1", &echo(10), 10, LEASE_MS, T0 + 1)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    assert!(
        claimed.iter().all(|j| j.progress_token.is_none()),
        "a NULL column stays None: {claimed:?}"
    );
    let mut ops = Vec::new();
    for id in ["n1", "n2", "n3"] {
        ops.push(create_op(new_task(id, "bob"), Some(JOB), None));
    }
    ops.push(complete_op(a.seq, "lease-1", completed_outcome()));
    ops.push(complete_op(b.seq, "not-the-lease", completed_outcome()));
    let mut done = db
        .store
        .write_batch(&ops, T0 + 10)
        .await
        .unwrap()
        .into_iter();
    let news: Vec<_> = done.by_ref().take(3).collect();
    let done_a = done.next().unwrap();
    let stale_b = done.next().unwrap();

    for (d, id) in news.into_iter().zip(["n1", "n2", "n3"]) {
        let row = created(d).unwrap();
        assert_eq!(row.task_id, id);
        assert_eq!(row.status, TaskStatus::Working, "T-9");
        assert_eq!(row.created_at, T0 + 10);
        assert_eq!(
            row,
            get(&db.store, id).await,
            "the answer is the stored row"
        );
        let j = job(&raw, row.seq).await.unwrap();
        assert_eq!(j.state, "queued");
    }
    assert!(completed(done_a).unwrap(), "a took its outcome");
    assert_lease_lost(completed(stale_b));
    assert_eq!(get(&db.store, "a").await.status, TaskStatus::Completed);
    assert_eq!(get(&db.store, "a").await.updated_at, T0 + 10);
    assert_eq!(
        get(&db.store, "b").await.status,
        TaskStatus::Working,
        "fenced out"
    );
    assert_eq!(job(&raw, b.seq).await.unwrap().state, "running");
}
store_test!(write_batch_groups_creations_and_completions);

/// A write the grouped statements cannot take (a duplicate task id) sends
/// the batch one by one: that write fails alone, the others commit.
async fn write_batch_failing_write_fails_alone(db: TestDb) {
    let raw = db.raw().await;
    let mut not_json = new_task("not-json", "alice");
    not_json.arguments = "not json".to_owned();
    let ops = vec![
        create_op(new_task("dup", "alice"), Some(JOB), None),
        create_op(new_task("dup", "alice"), Some(JOB), None),
        create_op(not_json, Some(JOB), None),
        create_op(new_task("ok", "alice"), Some(JOB), None),
        create_op(
            new_task("refused", "alice"),
            None,
            Some(failed_outcome("bad arguments")),
        ),
    ];
    let mut done = db.store.write_batch(&ops, T0).await.unwrap().into_iter();
    let first = created(done.next().unwrap()).unwrap();
    assert!(matches!(
        created(done.next().unwrap()),
        Err(StoreError::Db(_))
    ));
    assert_db_refused(
        created(done.next().unwrap()),
        &check_refusal(
            db.driver(),
            "json_valid(arguments)",
            "tasks_arguments_check",
        ),
    );
    let other = created(done.next().unwrap()).unwrap();
    let refused = created(done.next().unwrap()).unwrap();
    assert_eq!(refused.status, TaskStatus::Failed);
    assert_eq!(
        transitions(&raw, "refused").await,
        vec![tr(None, "working"), tr(Some("working"), "failed")],
        "T-9: even a refused call starts working"
    );
    let n = count_all(&raw, "SELECT count(*) FROM tasks").await;
    assert_eq!(n, 3);
    assert!(job(&raw, first.seq).await.is_some());
    assert!(job(&raw, other.seq).await.is_some());
    assert!(job(&raw, refused.seq).await.is_none());
}
store_test!(write_batch_failing_write_fails_alone);

/// A batch of completions only (on PostgreSQL one statement committed on
/// its own): each completion answers as it would alone: the lease holds
/// and the task takes its outcome; the lease is lost (nothing written for
/// it); the task was cancelled meanwhile (its job closes, the task keeps
/// its cancel). And a batch of creations only where one creation fails
/// (on PostgreSQL the one statement fails whole and the general way tells
/// each creation its own answer): the others are created, with their jobs.
async fn write_batch_of_one_kind_answers_each_write(db: TestDb) {
    let raw = db.raw().await;
    for id in ["ok", "lost", "cancelled"] {
        db.store
            .task_create(&new_task(id, "alice"), Some(JOB), None, T0)
            .await
            .unwrap();
    }
    let mut claimed = db
        .store
        .job_claim_available("w1", "lease-1", &echo(3), 3, LEASE_MS, T0 + 1)
        .await
        .unwrap();
    claimed.sort_by_key(|j| j.task_seq);
    let seq = |id: &str| {
        claimed
            .iter()
            .find(|j| j.task_id == id)
            .map(|j| j.task_seq)
            .unwrap()
    };
    db.store
        .task_cancel("cancelled", "alice", "stop", T0 + 2)
        .await
        .unwrap();
    let ops = vec![
        complete_op(seq("cancelled"), "lease-1", completed_outcome()),
        complete_op(seq("ok"), "lease-1", completed_outcome()),
        complete_op(seq("lost"), "not-the-lease", completed_outcome()),
    ];
    let mut done = db
        .store
        .write_batch(&ops, T0 + 3)
        .await
        .unwrap()
        .into_iter();
    assert!(
        !completed(done.next().unwrap()).unwrap(),
        "already cancelled"
    );
    assert!(completed(done.next().unwrap()).unwrap());
    assert_lease_lost(completed(done.next().unwrap()));
    assert_eq!(get(&db.store, "ok").await.status, TaskStatus::Completed);
    assert_eq!(get(&db.store, "lost").await.status, TaskStatus::Working);
    assert_eq!(
        transitions(&raw, "cancelled").await,
        vec![tr(None, "working"), tr(Some("working"), "cancelled")]
    );
    assert_eq!(job(&raw, seq("ok")).await.unwrap().state, "done");
    assert_eq!(job(&raw, seq("lost")).await.unwrap().state, "running");
    assert_eq!(job(&raw, seq("cancelled")).await.unwrap().state, "done");

    let bad = NewTask {
        arguments: "not json".to_owned(),
        ..new_task("bad", "alice")
    };
    let ops = vec![
        create_op(new_task("n1", "bob"), Some(JOB), None),
        create_op(bad, Some(JOB), None),
        create_op(new_task("n2", "bob"), Some(JOB), None),
    ];
    let mut done = db
        .store
        .write_batch(&ops, T0 + 4)
        .await
        .unwrap()
        .into_iter();
    let n1 = created(done.next().unwrap()).unwrap();
    assert!(created(done.next().unwrap()).is_err());
    let n2 = created(done.next().unwrap()).unwrap();
    assert_eq!(n1.status_message.as_deref(), Some("queued"));
    assert!(job(&raw, n1.seq).await.is_some());
    assert!(job(&raw, n2.seq).await.is_some());
    assert_eq!(
        count_all(&raw, "SELECT count(*) FROM tasks WHERE task_id = 'bad'").await,
        0
    );
    raw.close().await;
}
store_test!(write_batch_of_one_kind_answers_each_write);

/// Issue 26: a batch of completions and a claim (what a busy worker
/// process commits) answers each write in its place: the completions took
/// (a lost lease answers LeaseLost), the claim took the queued jobs,
/// whatever the claim's place in the batch. (PostgreSQL runs it as two
/// statements, completions first; SQLite as one transaction.)
async fn write_batch_of_completions_and_a_claim_answers_each_write(db: TestDb) {
    let raw = db.raw().await;
    let running = running_tasks(&db.store, 2).await;
    for id in ["c", "d"] {
        db.store
            .task_create(&new_task(id, "alice"), Some(JOB), None, T0 + 2)
            .await
            .unwrap();
    }
    let claim = Write::Claim {
        worker: "w1".into(),
        lease_token: "lease-2".into(),
        quotas: echo(5),
        limit: 5,
        lease_ms: LEASE_MS,
    };
    let ops = vec![
        complete_op(running[0], "lease-1", completed_outcome()),
        claim,
        complete_op(running[1], "not-the-lease", completed_outcome()),
    ];
    let mut done = db
        .store
        .write_batch(&ops, T0 + 3)
        .await
        .unwrap()
        .into_iter();
    assert!(completed(done.next().unwrap()).unwrap());
    let mut took: Vec<String> = match done.next().unwrap().unwrap() {
        Written::Claimed(jobs) => jobs.into_iter().map(|j| j.task_id).collect(),
        other => panic!("expected a claim, got {other:?}"),
    };
    took.sort();
    assert_eq!(took, ["c", "d"]);
    assert_lease_lost(completed(done.next().unwrap()));
    assert!(done.next().is_none());
    assert_eq!(get(&db.store, "t0").await.status, TaskStatus::Completed);
    assert_eq!(get(&db.store, "t1").await.status, TaskStatus::Working);
    assert_eq!(job(&raw, running[1]).await.unwrap().state, "running");
    raw.close().await;
}
store_test!(write_batch_of_completions_and_a_claim_answers_each_write);

/// Issue 26: a batch of creations, completions and a claim (what a broker
/// with its own workers commits under load; on PostgreSQL one statement
/// for the creations and completions, then the claim) answers each write
/// in its place: the claim, first in the batch, takes the jobs created
/// after it in the batch, and those tasks are served running, not queued;
/// the completion whose lease holds took, the other is LeaseLost. Then the
/// same shape with a creation that fails (the one statement fails whole,
/// the general way tells each write its own answer): the completion is
/// written once, the good creation is claimed.
async fn write_batch_of_creations_completions_and_a_claim_answers_each_write(db: TestDb) {
    let raw = db.raw().await;
    let running = running_tasks(&db.store, 3).await;
    let claim = |token: &str| Write::Claim {
        worker: "w2".into(),
        lease_token: token.into(),
        quotas: echo(5),
        limit: 5,
        lease_ms: LEASE_MS,
    };
    let ops = vec![
        claim("lease-2"),
        create_op(new_task("n1", "bob"), Some(JOB), None),
        complete_op(running[0], "lease-1", completed_outcome()),
        create_op(new_task("n2", "bob"), Some(JOB), None),
        complete_op(running[1], "not-the-lease", completed_outcome()),
    ];
    let mut done = db
        .store
        .write_batch(&ops, T0 + 3)
        .await
        .unwrap()
        .into_iter();
    let mut took: Vec<String> = match done.next().unwrap().unwrap() {
        Written::Claimed(jobs) => jobs.into_iter().map(|j| j.task_id).collect(),
        other => panic!("expected a claim, got {other:?}"),
    };
    took.sort();
    assert_eq!(took, ["n1", "n2"]);
    let n1 = created(done.next().unwrap()).unwrap();
    assert!(completed(done.next().unwrap()).unwrap());
    let n2 = created(done.next().unwrap()).unwrap();
    assert_lease_lost(completed(done.next().unwrap()));
    assert!(done.next().is_none());
    for row in [&n1, &n2] {
        assert_eq!(row.status, TaskStatus::Working);
        assert_eq!(row.status_message, None, "claimed at once: not queued");
        assert_eq!(job(&raw, row.seq).await.unwrap().state, "running");
    }
    assert_eq!(get(&db.store, "t0").await.status, TaskStatus::Completed);
    assert_eq!(job(&raw, running[1]).await.unwrap().state, "running");

    let bad = NewTask {
        arguments: "not json".to_owned(),
        ..new_task("bad", "bob")
    };
    let ops = vec![
        complete_op(running[2], "lease-1", completed_outcome()),
        create_op(bad, Some(JOB), None),
        create_op(new_task("n3", "bob"), Some(JOB), None),
        claim("lease-3"),
    ];
    let mut done = db
        .store
        .write_batch(&ops, T0 + 4)
        .await
        .unwrap()
        .into_iter();
    assert!(completed(done.next().unwrap()).unwrap());
    assert!(created(done.next().unwrap()).is_err());
    let n3 = created(done.next().unwrap()).unwrap();
    let took: Vec<i64> = match done.next().unwrap().unwrap() {
        Written::Claimed(jobs) => jobs.into_iter().map(|j| j.task_seq).collect(),
        other => panic!("expected a claim, got {other:?}"),
    };
    assert_eq!(took, [n3.seq]);
    assert!(done.next().is_none());
    assert_eq!(
        transitions(&raw, "t2").await,
        vec![tr(None, "working"), tr(Some("working"), "completed")],
        "the completion is written once"
    );
    assert_eq!(
        count_all(&raw, "SELECT count(*) FROM tasks WHERE task_id = 'bad'").await,
        0
    );
    raw.close().await;
}
store_test!(write_batch_of_creations_completions_and_a_claim_answers_each_write);

/// The same job completed twice in one batch: the first holds the lease,
/// the second is fenced out.
async fn write_batch_same_job_twice_second_is_fenced(db: TestDb) {
    let row = db
        .store
        .task_create(&new_task("t", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    let ops = vec![
        complete_op(row.seq, "lease-1", completed_outcome()),
        complete_op(row.seq, "lease-1", failed_outcome("again")),
    ];
    let mut done = db
        .store
        .write_batch(&ops, T0 + 5)
        .await
        .unwrap()
        .into_iter();
    assert!(completed(done.next().unwrap()).unwrap());
    assert_lease_lost(completed(done.next().unwrap()));
    assert_eq!(get(&db.store, "t").await.status, TaskStatus::Completed);
}
store_test!(write_batch_same_job_twice_second_is_fenced);

/// A claim in a group commit sees the jobs created earlier in the same
/// batch, and shares its transaction.
async fn write_batch_claim_sees_jobs_created_in_the_same_batch(db: TestDb) {
    let c1 = create_op(new_task("c1", "alice"), Some(JOB), None);
    let claim = Write::Claim {
        worker: "w1".into(),
        lease_token: "lease-1".into(),
        quotas: echo(5),
        limit: 5,
        lease_ms: LEASE_MS,
    };
    let mut done = db
        .store
        .write_batch(&[claim, c1], T0)
        .await
        .unwrap()
        .into_iter();
    let jobs = match done.next().unwrap().unwrap() {
        Written::Claimed(jobs) => jobs,
        other => panic!("expected claimed jobs, got {other:?}"),
    };
    let row = created(done.next().unwrap()).unwrap();
    assert_eq!(
        row.status_message, None,
        "claimed in its own commit: never says queued"
    );
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].task_seq, row.seq);
    assert_eq!(jobs[0].task_id, "c1");
    assert_eq!(jobs[0].attempt, 1);
    assert_eq!(jobs[0].lease_token, "lease-1");
    assert_eq!(
        job(&db.raw().await, row.seq).await.unwrap().state,
        "running"
    );
}
store_test!(write_batch_claim_sees_jobs_created_in_the_same_batch);

/// Issue 27 item 1 (idempotent creation): a task's idempotency key is
/// unique per owner and tool, in one batch and across batches: the second
/// creation with it fails alone with `IdempotencyKeyTaken` (the broker then
/// answers with the first task); another owner, another tool or no key
/// never collide; `task_by_idempotency_key` finds the task.
async fn idempotency_keys_are_unique_per_owner_and_tool(db: TestDb) {
    let keyed = |id: &str, owner: &str, tool: &str, key: Option<&str>| NewTask {
        tool: tool.to_owned(),
        idempotency_key: key.map(str::to_owned),
        ..new_task(id, owner)
    };
    let ops = vec![
        create_op(keyed("a1", "alice", "echo", Some("k")), Some(JOB), None),
        create_op(keyed("a2", "alice", "echo", Some("k")), Some(JOB), None),
        create_op(keyed("b1", "bob", "echo", Some("k")), Some(JOB), None),
        create_op(keyed("a3", "alice", "sleep", Some("k")), Some(JOB), None),
        create_op(keyed("a4", "alice", "echo", None), Some(JOB), None),
        create_op(keyed("a5", "alice", "echo", None), Some(JOB), None),
    ];
    let done: Vec<_> = db.store.write_batch(&ops, T0).await.unwrap();
    let outcomes: Vec<_> = done.into_iter().map(created).collect();
    assert!(outcomes[0].is_ok(), "{:?}", outcomes[0]);
    assert!(
        matches!(outcomes[1], Err(StoreError::IdempotencyKeyTaken)),
        "{:?}",
        outcomes[1]
    );
    for (i, o) in outcomes.iter().enumerate().skip(2) {
        assert!(o.is_ok(), "write {i}: {o:?}");
    }
    // In a batch of its own too.
    let again = vec![create_op(
        keyed("a6", "alice", "echo", Some("k")),
        Some(JOB),
        None,
    )];
    let mut done = db.store.write_batch(&again, T0 + 1).await.unwrap();
    assert!(matches!(
        created(done.remove(0)),
        Err(StoreError::IdempotencyKeyTaken)
    ));
    let found = db
        .store
        .task_by_idempotency_key("alice", "echo", "k")
        .await
        .unwrap()
        .expect("the first task");
    assert_eq!(found.task_id, "a1");
    assert_eq!(found.arguments, r#"{"text":"hello"}"#);
    assert!(
        db.store
            .task_by_idempotency_key("carol", "echo", "k")
            .await
            .unwrap()
            .is_none()
    );
}
store_test!(idempotency_keys_are_unique_per_owner_and_tool);

/// Issue 27 item 5: the trace context a task is created with comes back
/// with its claim, whether the task was made alone (`task_create`) or in a
/// group commit of several, with and without a `tracestate`; a task made
/// without one claims with none.
async fn trace_context_comes_back_with_the_claim(db: TestDb) {
    let parent = |n: u8| format!("00-{:032x}-{:016x}-01", u128::from(n) + 1, u64::from(n) + 1);
    let traced = |id: &str, n: u8, state: Option<&str>| NewTask {
        traceparent: Some(parent(n)),
        tracestate: state.map(str::to_owned),
        ..new_task(id, "alice")
    };
    db.store
        .task_create(&traced("alone", 1, Some("v=1")), Some(JOB), None, T0)
        .await
        .unwrap();
    let ops = vec![
        create_op(traced("grouped-a", 2, None), Some(JOB), None),
        create_op(traced("grouped-b", 3, Some("v=3,w=4")), Some(JOB), None),
        create_op(new_task("untraced", "alice"), Some(JOB), None),
    ];
    for done in db.store.write_batch(&ops, T0).await.unwrap() {
        created(done).unwrap();
    }
    let claimed = db
        .store
        .job_claim_available("w1", "lease-1", &echo(10), 10, LEASE_MS, T0 + 1)
        .await
        .unwrap();
    let got: std::collections::HashMap<_, _> = claimed
        .into_iter()
        .map(|j| (j.task_id, (j.traceparent, j.tracestate)))
        .collect();
    assert_eq!(got["alone"], (Some(parent(1)), Some("v=1".to_owned())));
    assert_eq!(got["grouped-a"], (Some(parent(2)), None));
    assert_eq!(
        got["grouped-b"],
        (Some(parent(3)), Some("v=3,w=4".to_owned()))
    );
    assert_eq!(got["untraced"], (None, None));
}
store_test!(trace_context_comes_back_with_the_claim);

/// Issue 26: a claim says when each job became runnable (for the time it
/// waited, with no read of its own): a new job at its creation, a delayed
/// one at its start, a job given back at its release.
async fn a_claim_says_when_each_job_became_runnable(db: TestDb) {
    db.store
        .task_create(&new_task("now", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let delayed = NewJob {
        run_after: Some(T0 + 500),
        ..JOB
    };
    db.store
        .task_create(&new_task("later", "alice"), Some(delayed), None, T0)
        .await
        .unwrap();
    let first = claim_one(&db.store, "w1", "lease-1", T0 + 10).await;
    assert_eq!((first.task_id.as_str(), first.runnable_since), ("now", T0));
    assert!(
        db.store
            .job_release(first.task_seq, "lease-1", T0 + 200)
            .await
            .unwrap()
    );
    let claimed = db
        .store
        .job_claim_available("w2", "lease-2", &echo(10), 10, LEASE_MS, T0 + 600)
        .await
        .unwrap();
    let mut since: Vec<_> = claimed
        .into_iter()
        .map(|j| (j.task_id, j.runnable_since))
        .collect();
    since.sort();
    assert_eq!(
        since,
        [("later".to_owned(), T0 + 500), ("now".to_owned(), T0 + 200)]
    );
}
store_test!(a_claim_says_when_each_job_became_runnable);

/// Issue 26: PostgreSQL holds no lock around whole transactions, so the
/// writers of one task from several processes must take its rows in one
/// order (its job, then the task). Grouped completions (batches of 8, keys
/// from the top), cancels (one at a time, from the top too) and status
/// messages (from the bottom) of the same 96 running tasks run at once, each on its own
/// connection: every call answers as it would alone (a cycle of row locks
/// fails one of them with "deadlock detected"), and every task ends
/// terminal with its job done.
async fn issue26_writers_of_the_same_tasks_take_rows_in_one_order(db: TestDb) {
    const TASKS: usize = 96;
    let seqs = running_tasks(&db.store, TASKS).await;
    let store = &db.store;
    let completer = async {
        for chunk in seqs.iter().rev().collect::<Vec<_>>().chunks(8) {
            let ops: Vec<Write> = chunk
                .iter()
                .map(|seq| complete_op(**seq, "lease-1", completed_outcome()))
                .collect();
            for done in store.write_batch(&ops, T0 + 10).await.expect("the batch") {
                completed(done).expect("a completion holding its lease");
            }
        }
    };
    let canceller = async {
        for i in (0..TASKS).rev() {
            match store
                .task_cancel(&format!("t{i}"), "alice", "stop", T0 + 10)
                .await
                .expect("a cancel")
            {
                CancelOutcome::Cancelled(_) | CancelOutcome::Terminal(_) => {}
                other => panic!("t{i}: {other:?}"),
            }
        }
    };
    let messenger = async {
        for seq in &seqs {
            match store
                .task_set_status_message(*seq, "lease-1", "still going", T0 + 10)
                .await
            {
                Ok(()) | Err(StoreError::LeaseLost) => {}
                Err(e) => panic!("task {seq}: {e}"),
            }
        }
    };
    tokio::join!(completer, canceller, messenger);
    let raw = db.raw().await;
    let open = count_all(
        &raw,
        "SELECT count(*) FROM tasks WHERE status NOT IN ('completed', 'cancelled')",
    )
    .await;
    assert_eq!(open, 0, "every task ends completed or cancelled");
    let running = count_all(&raw, "SELECT count(*) FROM jobs WHERE state <> 'done'").await;
    assert_eq!(running, 0, "every job ends done");
    raw.close().await;
}
store_test!(
    #[multi_thread]
    issue26_writers_of_the_same_tasks_take_rows_in_one_order
);

/// SQLite only, on the real engine: every statement of the driver that
/// joins a table to a JSON array (`json_each`: the grouped statements of
/// the group commit, the retention rules) walks the array and looks each
/// row up, never the other way round. The other way round, a group commit
/// of 16 completions visited every open task 16 times: a backlog of 10,000
/// queued tasks drained at about 300 tasks/s instead of 10,000. Read from
/// the driver's own statements (the offline data of its queries in
/// `.sqlx/`), planned by `EXPLAIN QUERY PLAN` on a migrated database.
#[tokio::test]
async fn sqlite_statements_walk_their_json_array_not_the_table() {
    let mut checked = 0;
    for (sql, plan) in sqlite_plans().await {
        if !sql.contains("json_each") {
            continue;
        }
        // Within one loop nest (same parent), the rows come outer first: a
        // table searched or scanned before the array means the array is
        // walked once per row of the table.
        let mut parents: Vec<i64> = plan.iter().map(|p| p.1).collect();
        parents.dedup();
        for parent in parents {
            let nest: Vec<&str> = plan
                .iter()
                .filter(|p| p.1 == parent)
                .map(|p| p.3.as_str())
                .filter(|d| d.starts_with("SCAN ") || d.starts_with("SEARCH "))
                .collect();
            let array = nest.iter().position(|d| d.contains("VIRTUAL TABLE"));
            let table = nest.iter().position(|d| !d.contains("VIRTUAL TABLE"));
            if let (Some(array), Some(table)) = (array, table) {
                assert!(
                    array < table,
                    "the plan walks a table before its JSON array:\n{}\n{sql}",
                    nest.join("\n")
                );
            }
        }
        checked += 1;
    }
    assert!(
        checked >= 5,
        "only {checked} statements with json_each found"
    );
}

/// SQLite only, on the real engine: no statement of the driver reads a
/// whole table of the task lifecycle (tasks, jobs, their events, their
/// messages) without an index. A statement that finds one task's rows by a
/// column no index leads with reads every row ever kept: a task's pending
/// requests were found by `task_id` while the index leads with `task_seq`.
#[tokio::test]
async fn sqlite_statements_read_no_whole_lifecycle_table_unindexed() {
    let mut offending = Vec::new();
    for (sql, plan) in sqlite_plans().await {
        for (_, _, _, detail) in &plan {
            let whole = ["tasks", "jobs", "task_events", "task_messages"]
                .iter()
                .any(|table| detail == &format!("SCAN {table}"));
            if whole {
                offending.push(format!("{detail}: {sql}"));
            }
        }
    }
    assert!(offending.is_empty(), "{}", offending.join("\n\n"));
}

/// Every SQLite statement of the driver (the offline data of its queries
/// in `.sqlx/`) with its `EXPLAIN QUERY PLAN` rows (id, parent, unused,
/// detail) on a freshly migrated database.
async fn sqlite_plans() -> Vec<(String, Vec<(i64, i64, i64, String)>)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plans.db");
    let store = store::open(&path, Durability::Full).await.unwrap();
    store.close().await;
    let raw = raw_sqlite(&path).await;
    let offline = Path::new(env!("CARGO_MANIFEST_DIR")).join(".sqlx");
    let mut plans = Vec::new();
    for entry in std::fs::read_dir(&offline).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let data: serde_json::Value = serde_json::from_str(&text).unwrap();
        if data["db_name"] != "SQLite" {
            continue;
        }
        let sql = data["query"].as_str().unwrap().to_owned();
        let plan = sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
            .fetch_all(&raw)
            .await
            .unwrap_or_else(|e| panic!("cannot plan {sql}: {e}"));
        plans.push((sql, plan));
    }
    assert!(
        plans.len() > 50,
        "only {} SQLite statements in .sqlx",
        plans.len()
    );
    plans
}

/// SQLite only: no statement of the driver limits its rows by a bare
/// parameter (`LIMIT ?`, `OFFSET ?`). SQLite plans with the value bound
/// there, so each new binding expires the prepared statement and every
/// execution is parsed and planned again: the claim and the feed reads were,
/// on every commit (about 1,450 re-preparations in a broker and 190 in each
/// of 8 worker processes for 2,000 tasks). `LIMIT CAST(? AS INTEGER)` is
/// planned once. Read from the offline data of the driver's queries.
#[tokio::test]
async fn sqlite_statements_limit_rows_by_no_bare_parameter() {
    let mut offending = Vec::new();
    for (sql, _) in sqlite_plans().await {
        let upper = sql.to_ascii_uppercase();
        for keyword in ["LIMIT", "OFFSET"] {
            for (at, _) in upper.match_indices(keyword) {
                let word_before = upper[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
                // What the value starts with, past spaces and parentheses.
                let value = upper[at + keyword.len()..]
                    .trim_start_matches(|c: char| c.is_whitespace() || c == '(');
                let bare = value.starts_with(['?', ':', '@', '$']);
                if !word_before && bare {
                    offending.push(sql.clone());
                }
            }
        }
    }
    assert!(offending.is_empty(), "{}", offending.join("\n\n"));
}
