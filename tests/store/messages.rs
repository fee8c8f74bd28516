//! Requests to a task's client (`MessageStore`): asked, pending, answered
//! once, and the client's capabilities.

use super::*;

// Messages: task_message_ask / _pending / _get / _answer, task_client_capabilities

/// A running task asks its client (input_required), the owner answers;
/// the task works again once nothing is pending. Answers are final, in the
/// database too.
async fn task_messages_ask_answer_round_trip(db: TestDb) {
    let raw = db.raw().await;
    let mut session = new_session("s-1");
    session.client_capabilities = r#"{"elicitation":{},"sampling":{}}"#.to_owned();
    session.principal = Some("alice".to_owned());
    db.store.session_create(&session, T0).await.unwrap();
    assert_eq!(
        db.store
            .session_get("s-1")
            .await
            .unwrap()
            .unwrap()
            .principal
            .as_deref(),
        Some("alice")
    );
    let mut new = new_task("t-m", "alice");
    new.session_id = Some("s-1".to_owned());
    let row = db
        .store
        .task_create(&new, Some(JOB), None, T0)
        .await
        .unwrap();
    let lone = db
        .store
        .task_create(&new_task("t-lone", "alice"), None, None, T0)
        .await
        .unwrap();
    assert_eq!(
        db.store
            .task_client_capabilities(row.seq)
            .await
            .unwrap()
            .as_deref(),
        Some(r#"{"elicitation":{},"sampling":{}}"#)
    );
    assert_eq!(
        db.store.task_client_capabilities(lone.seq).await.unwrap(),
        None,
        "no session"
    );
    assert_eq!(
        db.store
            .task_client_capabilities(row.seq + 100)
            .await
            .unwrap(),
        None,
        "no task"
    );

    let message = |id: &str, method: &str| TaskMessage {
        request_id: id.to_owned(),
        task_id: "t-m".to_owned(),
        method: method.to_owned(),
        params: r#"{"message":"name?"}"#.to_owned(),
        response: None,
    };
    let r1 = message("r-1", "elicitation/create");
    let r2 = message("r-2", "sampling/createMessage");
    // Not claimed: nobody may ask.
    assert_lease_lost(
        db.store
            .task_message_ask(row.seq, "lease-1", &r1, T0 + 1)
            .await,
    );
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    assert_lease_lost(
        db.store
            .task_message_ask(row.seq, "stranger", &r1, T0 + 2)
            .await,
    );
    assert_eq!(db.store.task_message_get("r-1").await.unwrap(), None);

    db.store
        .task_message_ask(row.seq, "lease-1", &r1, T0 + 2)
        .await
        .unwrap();
    let task = get(&db.store, "t-m").await;
    assert_eq!(task.status, TaskStatus::InputRequired);
    assert_eq!(
        task.status_message.as_deref(),
        Some("waiting for the client to answer elicitation/create")
    );
    assert_eq!(task.updated_at, T0 + 2);
    db.store
        .task_message_ask(row.seq, "lease-1", &r2, T0 + 3)
        .await
        .unwrap();
    assert_eq!(
        db.store.task_messages_pending("t-m").await.unwrap(),
        vec![r1.clone(), r2.clone()],
        "oldest first"
    );
    assert_eq!(
        db.store.task_message_get("r-1").await.unwrap(),
        Some(r1.clone())
    );
    assert_eq!(db.store.task_message_get("r-unknown").await.unwrap(), None);

    // Only the task's owner answers.
    assert_eq!(
        db.store
            .task_message_answer("r-1", "mallory", "{}", T0 + 4)
            .await
            .unwrap(),
        AnswerOutcome::Unknown
    );
    let answer = r#"{"jsonrpc":"2.0","id":"r-1","result":{"action":"accept"}}"#;
    assert_eq!(
        db.store
            .task_message_answer("r-1", "alice", answer, T0 + 4)
            .await
            .unwrap(),
        AnswerOutcome::Stored
    );
    assert_eq!(
        get(&db.store, "t-m").await.status,
        TaskStatus::InputRequired,
        "r-2 is still pending"
    );
    assert_eq!(
        db.store.task_messages_pending("t-m").await.unwrap(),
        vec![r2.clone()]
    );
    assert_eq!(
        db.store
            .task_message_answer("r-1", "alice", "{}", T0 + 5)
            .await
            .unwrap(),
        AnswerOutcome::Unknown,
        "answered once"
    );
    assert_eq!(
        db.store
            .task_message_answer("r-2", "alice", r#"{"result":{}}"#, T0 + 6)
            .await
            .unwrap(),
        AnswerOutcome::Stored
    );
    let task = get(&db.store, "t-m").await;
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(
        task.status_message.as_deref(),
        Some("the client answered; working")
    );
    assert_eq!(task.updated_at, T0 + 6);
    assert!(
        db.store
            .task_messages_pending("t-m")
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        db.store
            .task_message_get("r-1")
            .await
            .unwrap()
            .unwrap()
            .response
            .as_deref(),
        Some(answer)
    );
    let states: Vec<(String, Option<i64>)> = raw
        .rows(
            "SELECT state, answered_at FROM task_messages WHERE task_seq = $1 ORDER BY id",
            args![row.seq],
        )
        .await
        .unwrap();
    assert_eq!(
        states,
        vec![
            ("answered".to_owned(), Some(T0 + 4)),
            ("answered".to_owned(), Some(T0 + 6))
        ]
    );
    let r = raw
        .execute(
            "UPDATE task_messages SET response = '{}' WHERE request_id = $1",
            args!["r-1"],
        )
        .await;
    assert_refused(r, "a task message is answered (or abandoned) once");
    assert_eq!(
        transitions(&raw, "t-m").await,
        vec![
            tr(None, "working"),
            tr(Some("working"), "input_required"),
            tr(Some("input_required"), "working"),
        ],
        "the second request was asked while input_required already"
    );

    // A finished task asks nothing more.
    db.store
        .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 7)
        .await
        .unwrap();
    let r3 = message("r-3", "elicitation/create");
    assert_lease_lost(
        db.store
            .task_message_ask(row.seq, "lease-1", &r3, T0 + 8)
            .await,
    );
    assert_eq!(db.store.task_message_get("r-3").await.unwrap(), None);
}
store_test!(task_messages_ask_answer_round_trip);

/// Issue 26 (T-27 across processes): two requests of one task answered at
/// the same moment from two connections, and the same request answered
/// twice at once. The task goes back to working exactly when nothing is
/// pending: whichever answer commits last sees the other (on PostgreSQL,
/// with no lock around whole transactions, each answer locks the task
/// before it counts what is pending); a request is answered once, the
/// second answer to it finds it answered.
async fn issue26_answers_at_the_same_moment_leave_nothing_pending(db: TestDb) {
    const TASKS: usize = 24;
    let ask = |task: usize, n: usize| TaskMessage {
        request_id: format!("r-{task}-{n}"),
        task_id: format!("t{task}"),
        method: "elicitation/create".to_owned(),
        params: r#"{"message":"name?"}"#.to_owned(),
        response: None,
    };
    let seqs = running_tasks(&db.store, TASKS).await;
    for (task, seq) in seqs.iter().enumerate() {
        for n in 0..2 {
            db.store
                .task_message_ask(*seq, "lease-1", &ask(task, n), T0 + 2)
                .await
                .unwrap();
        }
    }
    let store = &db.store;
    let answer = |task: usize, n: usize| async move {
        store
            .task_message_answer(
                &format!("r-{task}-{n}"),
                "alice",
                r#"{"action":"accept"}"#,
                T0 + 3,
            )
            .await
            .expect("an answer")
    };
    for task in 0..TASKS {
        // Both requests at once, and the first of them a second time.
        let (a, b, again) = tokio::join!(answer(task, 0), answer(task, 1), answer(task, 0));
        assert_eq!(b, AnswerOutcome::Stored, "t{task}");
        let mut firsts = [a, again];
        firsts.sort_by_key(|o| o == &AnswerOutcome::Stored);
        assert_eq!(
            firsts,
            [AnswerOutcome::Unknown, AnswerOutcome::Stored],
            "t{task}: one of two answers to one request is stored"
        );
        let task_row = get(&db.store, &format!("t{task}")).await;
        assert_eq!(task_row.status, TaskStatus::Working, "t{task}");
        assert!(
            db.store
                .task_messages_pending(&format!("t{task}"))
                .await
                .unwrap()
                .is_empty()
        );
    }
}
store_test!(
    #[multi_thread]
    issue26_answers_at_the_same_moment_leave_nothing_pending
);
