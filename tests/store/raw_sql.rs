//! The database itself enforces the task lifecycle: raw SQL beside the
//! store, as an operator's sqlite3 or psql shell would send it, is refused
//! where the rules forbid it.

use super::*;

/// The two trigger texts a status change of a terminal task can meet: both
/// rules apply, and which one the database reports first is its own
/// business.
const T11_TERMINAL: &str = "task is in a terminal status and cannot change (T-11)";
const T11_TRANSITION: &str = "illegal task status transition (T-11)";

/// The statement must fail with one of `expected` in the database's message.
#[track_caller]
fn assert_refused_any<T>(result: Result<T, sqlx::Error>, expected: &[&str]) {
    match result {
        Ok(_) => panic!("statement succeeded; expected a refusal containing one of {expected:?}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                expected.iter().any(|x| msg.contains(x)),
                "error {msg:?} contains none of {expected:?}"
            );
        }
    }
}

// The database itself enforces the lifecycle (raw SQL) -------------------------------------------

/// Insert a working task directly; returns its seq.
async fn raw_insert_task(raw: &Raw, task_id: &'static str, at: i64) -> i64 {
    raw.scalar(
        "INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at)
         VALUES ($1, 'alice', 'echo', '{}', 'working', $2, $2) RETURNING seq",
        args![task_id, at],
    )
    .await
    .expect("insert working task")
}

/// Move a task to a terminal status directly (an allowed transition).
async fn raw_finish(raw: &Raw, seq: i64, status: &'static str, at: i64) {
    let (result, kind) = match status {
        "completed" => (Some(r#"{"content":[]}"#), Some("result")),
        "failed" => (Some(r#"{"code":-32603,"message":"x"}"#), Some("error")),
        _ => (None, None),
    };
    raw.execute(
        "UPDATE tasks SET status = $1, result = $2, result_kind = $3, updated_at = $4 WHERE seq = $5",
        args![status, result, kind, at, seq],
    )
    .await
    .expect("allowed transition to a terminal status");
}

async fn raw_sql_insert_must_start_working_t9(db: TestDb) {
    let raw = db.raw().await;
    for status in ["completed", "failed", "cancelled", "input_required"] {
        let result = raw
            .execute(
                "INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at)
                 VALUES ($1, 'alice', 'echo', '{}', $2, 0, 0)",
                args![format!("t-{status}"), status],
            )
            .await;
        assert_refused(result, "a task must start in status working (T-9)");
    }
    let tasks = count_all(&raw, "SELECT COUNT(*) FROM tasks").await;
    let events = count_all(&raw, "SELECT COUNT(*) FROM task_events").await;
    assert_eq!((tasks, events), (0, 0), "nothing inserted, no history");
}
store_test!(raw_sql_insert_must_start_working_t9);

async fn raw_sql_allowed_transitions_write_one_history_row_each_t11(db: TestDb) {
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;

    // working -> working is not a transition: allowed, no history row.
    raw.execute(
        "UPDATE tasks SET status = 'working', status_message = 'still going', updated_at = $1
          WHERE seq = $2",
        args![T0 + 1, seq],
    )
    .await
    .unwrap();
    // working -> input_required -> working -> completed: all allowed.
    for (status, at) in [
        ("input_required", T0 + 2),
        ("working", T0 + 3),
        ("input_required", T0 + 4),
    ] {
        raw.execute(
            "UPDATE tasks SET status = $1, status_message = $2, updated_at = $3 WHERE seq = $4",
            args![status, format!("now {status}"), at, seq],
        )
        .await
        .unwrap_or_else(|e| panic!("transition to {status} refused: {e}"));
    }
    raw_finish(&raw, seq, "completed", T0 + 5).await;

    assert_eq!(
        history(&raw, "t-1").await,
        vec![
            (None, "working".to_owned(), None, T0),
            (
                Some("working".to_owned()),
                "input_required".to_owned(),
                Some("now input_required".to_owned()),
                T0 + 2
            ),
            (
                Some("input_required".to_owned()),
                "working".to_owned(),
                Some("now working".to_owned()),
                T0 + 3
            ),
            (
                Some("working".to_owned()),
                "input_required".to_owned(),
                Some("now input_required".to_owned()),
                T0 + 4
            ),
            (
                Some("input_required".to_owned()),
                "completed".to_owned(),
                Some("now input_required".to_owned()),
                T0 + 5
            ),
        ],
        "exactly one history row per transition, written by the triggers"
    );

    // input_required -> failed and -> cancelled, working -> failed/cancelled.
    for (id, via_input, terminal) in [
        ("t-2", true, "failed"),
        ("t-3", true, "cancelled"),
        ("t-4", false, "failed"),
        ("t-5", false, "cancelled"),
    ] {
        let seq = raw_insert_task(&raw, id, T0).await;
        if via_input {
            raw.execute(
                "UPDATE tasks SET status = 'input_required', updated_at = $1 WHERE seq = $2",
                args![T0 + 1, seq],
            )
            .await
            .unwrap();
        }
        raw_finish(&raw, seq, terminal, T0 + 2).await;
        let expected = if via_input {
            vec![
                tr(None, "working"),
                tr(Some("working"), "input_required"),
                tr(Some("input_required"), terminal),
            ]
        } else {
            vec![tr(None, "working"), tr(Some("working"), terminal)]
        };
        assert_eq!(transitions(&raw, id).await, expected, "{id}");
    }
}
store_test!(raw_sql_allowed_transitions_write_one_history_row_each_t11);

async fn raw_sql_terminal_tasks_never_change_t11(db: TestDb) {
    let raw = db.raw().await;
    let mut seqs = Vec::new();
    for (id, status) in [
        ("t-completed", "completed"),
        ("t-failed", "failed"),
        ("t-cancelled", "cancelled"),
    ] {
        let seq = raw_insert_task(&raw, id, T0).await;
        raw_finish(&raw, seq, status, T0 + 1).await;
        seqs.push((id, seq, status));
    }
    let terminal_msg = T11_TERMINAL;
    for (id, seq, status) in seqs {
        let before = get(&db.store, id).await;
        // Back to working (also an illegal transition): refused.
        let r = raw
            .execute(
                "UPDATE tasks SET status = 'working', updated_at = $1 WHERE seq = $2",
                args![T0 + 2, seq],
            )
            .await;
        assert_refused_any(r, &[T11_TERMINAL, T11_TRANSITION]);
        // To another terminal status: refused.
        let other = if status == "cancelled" {
            "failed"
        } else {
            "cancelled"
        };
        let r = raw
            .execute(
                "UPDATE tasks SET status = $1, result = NULL, result_kind = NULL, updated_at = $2
                  WHERE seq = $3",
                args![other, T0 + 2, seq],
            )
            .await;
        assert_refused_any(r, &[T11_TERMINAL, T11_TRANSITION]);
        // Any other column: refused by the terminal trigger.
        for sql in [
            "UPDATE tasks SET status_message = 'rewritten' WHERE seq = $1",
            "UPDATE tasks SET updated_at = updated_at + 1 WHERE seq = $1",
            "UPDATE tasks SET poll_interval_ms = 1 WHERE seq = $1",
            // Even a no-op update of a terminal row is refused.
            "UPDATE tasks SET status = status WHERE seq = $1",
        ] {
            let r = raw.execute(sql, args![seq]).await;
            assert_refused(r, terminal_msg);
        }
        if status != "cancelled" {
            let r = raw
                .execute("UPDATE tasks SET result = '{}' WHERE seq = $1", args![seq])
                .await;
            assert_refused(r, terminal_msg);
        }
        assert_eq!(get(&db.store, id).await, before, "{id} unchanged");
        assert_eq!(transitions(&raw, id).await.len(), 2, "{id}: no new history");
    }
}
store_test!(raw_sql_terminal_tasks_never_change_t11);

/// T-11, for every column the database has: writing any column of a
/// terminal task but keep_until (set once by the retention purge) is
/// refused, so a column added later and left out of the terminal trigger's
/// list fails here.
async fn raw_sql_every_column_of_a_terminal_task_is_fixed_t11(db: TestDb) {
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    raw_finish(&raw, seq, "completed", T0 + 1).await;
    let columns: Vec<(String,)> = match db.driver() {
        Driver::Sqlite => raw.rows("SELECT name FROM pragma_table_info('tasks')", args![]),
        Driver::Postgres => raw.rows(
            "SELECT CAST(column_name AS TEXT) FROM information_schema.columns
              WHERE table_name = 'tasks' AND table_schema = current_schema()",
            args![],
        ),
    }
    .await
    .unwrap();
    assert!(columns.len() > 20, "{columns:?}");
    for (column,) in &columns {
        if column == "keep_until" {
            continue;
        }
        let r = raw
            .execute_text(
                format!("UPDATE tasks SET {column} = {column} WHERE seq = $1"),
                args![seq],
            )
            .await;
        match r {
            Ok(_) => panic!("{column} of a terminal task could be written"),
            Err(e) => assert!(e.to_string().contains(T11_TERMINAL), "{column}: {e}"),
        }
    }
    let r = raw
        .execute("UPDATE tasks SET keep_until = 5 WHERE seq = $1", args![seq])
        .await;
    assert_eq!(r.unwrap(), 1, "keep_until is the one column a purge sets");
}
store_test!(raw_sql_every_column_of_a_terminal_task_is_fixed_t11);

async fn raw_sql_completed_to_working_refused_t11(db: TestDb) {
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    raw_finish(&raw, seq, "completed", T0 + 1).await;
    let r = raw
        .execute(
            "UPDATE tasks SET status = 'working', result = NULL, result_kind = NULL WHERE seq = $1",
            args![seq],
        )
        .await;
    assert_refused_any(r, &[T11_TERMINAL, T11_TRANSITION]);
    assert_eq!(get(&db.store, "t-1").await.status, TaskStatus::Completed);
}
store_test!(raw_sql_completed_to_working_refused_t11);

async fn raw_sql_identity_columns_are_immutable(db: TestDb) {
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    let before = get(&db.store, "t-1").await;
    let msg = "task identity columns are immutable";
    let statements: [&'static str; 7] = [
        "UPDATE tasks SET task_id = 't-other' WHERE seq = $1",
        "UPDATE tasks SET owner = 'mallory' WHERE seq = $1",
        "UPDATE tasks SET created_at = created_at - 1 WHERE seq = $1",
        "UPDATE tasks SET tool = 'rm' WHERE seq = $1",
        "UPDATE tasks SET arguments = '{\"x\":1}' WHERE seq = $1",
        "UPDATE tasks SET ttl_ms = 5, expires_at = created_at + 5 WHERE seq = $1",
        "UPDATE tasks SET seq = seq + 1000 WHERE seq = $1",
    ];
    for sql in statements {
        let r = raw.execute(sql, args![seq]).await;
        assert_refused(r, msg);
    }
    // Setting a column to its own value is not a change.
    raw.execute(
        "UPDATE tasks SET owner = owner, task_id = task_id WHERE seq = $1",
        args![seq],
    )
    .await
    .unwrap();
    assert_eq!(get(&db.store, "t-1").await, before);
}
store_test!(raw_sql_identity_columns_are_immutable);

async fn raw_sql_updated_at_never_moves_backwards_t13(db: TestDb) {
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    raw.execute(
        "UPDATE tasks SET updated_at = $1 WHERE seq = $2",
        args![T0 + 100, seq],
    )
    .await
    .unwrap();
    let r = raw
        .execute(
            "UPDATE tasks SET status_message = 'x', updated_at = $1 WHERE seq = $2",
            args![T0 + 99, seq],
        )
        .await;
    assert_refused(r, "updated_at cannot move backwards");
    let row = get(&db.store, "t-1").await;
    assert_eq!(row.updated_at, T0 + 100);
    assert_eq!(row.status_message, None);
}
store_test!(raw_sql_updated_at_never_moves_backwards_t13);

async fn raw_sql_task_events_are_append_only(db: TestDb) {
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    raw_finish(&raw, seq, "completed", T0 + 1).await;

    let r = raw
        .execute("DELETE FROM task_events WHERE task_seq = $1", args![seq])
        .await;
    assert_refused(r, "task_events of an existing task cannot be deleted");
    let r = raw
        .execute(
            "UPDATE task_events SET to_status = 'failed' WHERE task_seq = $1",
            args![seq],
        )
        .await;
    assert_refused(r, "task_events is append-only");
    let r = raw
        .execute(
            "UPDATE task_events SET message = 'edited' WHERE task_seq = $1",
            args![seq],
        )
        .await;
    assert_refused(r, "task_events is append-only");
    assert_eq!(
        transitions(&raw, "t-1").await,
        vec![tr(None, "working"), tr(Some("working"), "completed")]
    );

    // Deleting the task (what the ttl purge does) takes its history along.
    raw.execute("DELETE FROM tasks WHERE seq = $1", args![seq])
        .await
        .unwrap();
    assert!(history(&raw, "t-1").await.is_empty());
}
store_test!(raw_sql_task_events_are_append_only);

async fn raw_sql_unknown_status_value_refused_by_check(db: TestDb) {
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    let update_to_done = "UPDATE tasks SET status = 'done', updated_at = $1 WHERE seq = $2";
    let insert_done =
        "INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at)
                       VALUES ('t-done', 'alice', 'echo', '{}', 'done', 0, 0)";

    // Through the triggers, 'done' is refused (it is no allowed transition,
    // and no allowed initial status).
    let r = raw.execute(update_to_done, args![T0 + 1, seq]).await;
    assert_refused(r, T11_TRANSITION);
    let r = raw.execute(insert_done, args![]).await;
    assert_refused(r, "a task must start in status working (T-9)");

    // Behind the triggers the CHECK itself holds: drop the triggers inside a
    // transaction (rolled back), then try again. (One transaction per
    // attempt: PostgreSQL takes no statement after an error until the
    // rollback.)
    let (drop_triggers, count_triggers) = match db.driver() {
        Driver::Sqlite => (
            "DROP TRIGGER tasks_insert_working;
             DROP TRIGGER tasks_transition_allowed;",
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger'
                AND name IN ('tasks_insert_working', 'tasks_transition_allowed')",
        ),
        Driver::Postgres => (
            "DROP TRIGGER tasks_insert_working ON tasks;
             DROP TRIGGER tasks_transition_allowed ON tasks;",
            "SELECT COUNT(*) FROM pg_trigger
              WHERE tgname IN ('tasks_insert_working', 'tasks_transition_allowed')",
        ),
    };
    let refusal = check_refusal(db.driver(), "status IN (", "tasks_status_check");
    let attempts: [(&'static str, &[Arg]); 2] =
        [(update_to_done, args![T0 + 1, seq]), (insert_done, args![])];
    for (sql, args) in attempts {
        on_pool!(&raw, |pool| {
            let mut tx = pool.begin().await.unwrap();
            sqlx::raw_sql(drop_triggers)
                .execute(&mut *tx)
                .await
                .unwrap();
            let r = bind_all!(sqlx::query(sql), args).execute(&mut *tx).await;
            assert_refused(r, &refusal);
            tx.rollback().await.unwrap();
        });
    }

    // The rollback restored the triggers.
    assert_eq!(count_all(&raw, count_triggers).await, 2);
    let row = get(&db.store, "t-1").await;
    assert_eq!(row.status, TaskStatus::Working);
    assert_eq!(history(&raw, "t-1").await.len(), 1);
}
store_test!(raw_sql_unknown_status_value_refused_by_check);
