//! Old databases keep working: a database made by an earlier schema, with
//! rows as the broker wrote them then, is moved by `taskbroker migrate`
//! to the neutral outcome (issue 24, item 1) on both drivers:
//! - a task whose tool returned `isError` keeps its status and result and
//!   gains `tool_error`;
//! - requests to the client lose the 2025-11-25 related-task `_meta` (and
//!   an `_meta` left empty), other `_meta` keys stay;
//! - answers lose their JSON-RPC envelope (`jsonrpc`, `id`);
//! - everything else (an error outcome, history) is left as it was, and
//!   the guards the move lifts are back afterwards.

mod common;

use std::path::Path;
use std::process::Command;

use common::Driver;
use common::pg::PgDb;
use serde_json::{Value, json};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use sqlx::{AssertSqlSafe, Row};

/// The last schema version of each driver before the neutral outcome.
fn version_before(driver: Driver) -> i64 {
    match driver {
        Driver::Sqlite => 13,
        Driver::Postgres => 5,
    }
}

fn driver_dir(driver: Driver) -> &'static str {
    match driver {
        Driver::Sqlite => "sqlite",
        Driver::Postgres => "postgres",
    }
}

/// The migration files of `driver` up to `version`, in order.
fn migrations_up_to(driver: Driver, version: i64) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(driver_dir(driver));
    let mut files: Vec<(i64, std::path::PathBuf)> = std::fs::read_dir(&dir)
        .expect("the migrations directory")
        .map(|e| e.expect("an entry").path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            let v: i64 = name.strip_prefix('V')?.split("__").next()?.parse().ok()?;
            Some((v, p))
        })
        .filter(|(v, _)| *v <= version)
        .collect();
    files.sort();
    assert_eq!(files.len() as i64, version, "one file per version");
    files
        .into_iter()
        .map(|(_, p)| std::fs::read_to_string(p).expect("a migration file"))
        .collect()
}

/// A database under test, read and written as an operator would.
enum Db {
    Sqlite(SqlitePool, std::path::PathBuf),
    Postgres(PgDb),
}

impl Db {
    async fn create(driver: Driver, dir: &Path, name: &str) -> Db {
        match driver {
            Driver::Sqlite => {
                let path = dir.join(name);
                let options = SqliteConnectOptions::new()
                    .filename(&path)
                    .create_if_missing(true);
                let pool = SqlitePool::connect_with(options).await.expect("open");
                Db::Sqlite(pool, path)
            }
            Driver::Postgres => Db::Postgres(PgDb::create().expect("PostgreSQL")),
        }
    }

    fn arg(&self) -> String {
        match self {
            Db::Sqlite(_, path) => path.display().to_string(),
            Db::Postgres(pg) => pg.url.clone(),
        }
    }

    async fn exec(&self, sql: &str) {
        match self {
            Db::Sqlite(pool, _) => {
                sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                    .execute(pool)
                    .await
                    .unwrap_or_else(|e| panic!("{e}: {sql}"));
            }
            Db::Postgres(pg) => {
                pg.psql(sql).unwrap_or_else(|e| panic!("{e}: {sql}"));
            }
        }
    }

    /// The first column of each row, as text.
    async fn texts(&self, sql: &str) -> Vec<String> {
        match self {
            Db::Sqlite(pool, _) => sqlx::query(AssertSqlSafe(sql.to_owned()))
                .fetch_all(pool)
                .await
                .unwrap_or_else(|e| panic!("{e}: {sql}"))
                .iter()
                .map(|r| r.get::<String, _>(0))
                .collect(),
            Db::Postgres(pg) => pg
                .psql(sql)
                .unwrap_or_else(|e| panic!("{e}: {sql}"))
                .lines()
                .map(str::to_owned)
                .collect(),
        }
    }

    async fn text(&self, sql: &str) -> String {
        let rows = self.texts(sql).await;
        assert_eq!(rows.len(), 1, "one row from {sql}: {rows:?}");
        rows.into_iter().next().unwrap_or_default()
    }

    async fn json(&self, sql: &str) -> Value {
        serde_json::from_str(&self.text(sql).await).expect("JSON")
    }
}

fn migrate(db: &Db) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .args(["migrate", "--db", &db.arg()])
        .output()
        .expect("run taskbroker migrate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "taskbroker migrate failed: {text}");
    text
}

/// A database at the schema before the neutral outcome, as refinery left
/// it: the files up to that version, and their history rows (copied from
/// a database `taskbroker migrate` made, so the checksums are refinery's).
async fn old_database(driver: Driver, dir: &Path) -> Db {
    let before = version_before(driver);
    let reference = Db::create(driver, dir, "reference.db").await;
    migrate(&reference);
    let history: Vec<String> = reference
        .texts(&format!(
            "SELECT version || '|' || name || '|' || applied_on || '|' || checksum
               FROM refinery_schema_history WHERE version <= {before} ORDER BY version"
        ))
        .await;
    assert_eq!(history.len() as i64, before);
    let old = Db::create(driver, dir, "broker.db").await;
    for sql in migrations_up_to(driver, before) {
        old.exec(&sql).await;
    }
    old.exec(
        "CREATE TABLE refinery_schema_history (version INT4 PRIMARY KEY, name VARCHAR(255),
                                               applied_on VARCHAR(255), checksum VARCHAR(255))",
    )
    .await;
    for row in history {
        let f: Vec<&str> = row.splitn(4, '|').collect();
        old.exec(&format!(
            "INSERT INTO refinery_schema_history VALUES ({}, '{}', '{}', '{}')",
            f[0], f[1], f[2], f[3]
        ))
        .await;
    }
    old
}

/// Rows as the broker wrote them before the neutral outcome.
async fn old_rows(db: &Db) {
    let tool_error = json!({"content": [{"type": "text", "text": "boom"}], "isError": true});
    let lost = r#"{"code":-32603,"message":"Task failed: worker lost 3 time(s) (lease expired)"}"#;
    let asked = json!({
        "message": "Deploy?",
        "requestedSchema": {"type": "object", "properties": {}},
        "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "t-asked"}}
    });
    let asked_with_more_meta = json!({
        "message": "Really?",
        "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "t-asked"}, "x-trace": "7"}
    });
    let answer = json!({"jsonrpc": "2.0", "id": "tb-1", "result": {"action": "accept"}});
    let mut sql = String::new();
    for (seq, id) in [(1, "t-tool-error"), (2, "t-lost"), (3, "t-asked")] {
        sql.push_str(&format!(
            "INSERT INTO tasks (seq, task_id, owner, tool, arguments, status, created_at, updated_at)
             VALUES ({seq}, '{id}', 'session:s1', 'demo', '{{}}', 'working', 1000, 1000);\n"
        ));
    }
    sql.push_str(&format!(
        "UPDATE tasks SET status = 'failed', status_message = 'Tool execution failed: boom',
                result = '{tool_error}', result_kind = 'result', updated_at = 2000 WHERE seq = 1;
         UPDATE tasks SET status = 'failed', status_message = 'worker lost 3 time(s)',
                result = '{lost}', result_kind = 'error', updated_at = 2000 WHERE seq = 2;
         UPDATE tasks SET status = 'input_required', updated_at = 2000 WHERE seq = 3;
         INSERT INTO task_messages (task_seq, task_id, request_id, method, params, state, response,
                                    created_at, answered_at)
         VALUES (3, 't-asked', 'tb-1', 'elicitation/create', '{asked}', 'answered', '{answer}',
                 1500, 1600),
                (3, 't-asked', 'tb-2', 'elicitation/create', '{asked_with_more_meta}', 'pending',
                 NULL, 1700, NULL);\n"
    ));
    db.exec(&sql).await;
}

/// Covers issue 24 item 1: "a migration moves existing rows; old databases
/// keep working".
async fn issue24_an_old_database_moves_to_the_neutral_outcome(driver: Driver) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = old_database(driver, dir.path()).await;
    old_rows(&db).await;
    let history_before = db
        .texts("SELECT task_id || ':' || to_status FROM task_events ORDER BY id")
        .await;

    let said = migrate(&db);
    // The neutral outcome, and every migration after it.
    let after = match driver {
        Driver::Sqlite => std::fs::read_dir("migrations/sqlite"),
        Driver::Postgres => std::fs::read_dir("migrations/postgres"),
    }
    .expect("migrations")
    .count()
        - match driver {
            Driver::Sqlite => 13,
            Driver::Postgres => 5,
        };
    assert!(
        said.contains(&format!(": {after} migration(s) applied")),
        "{said}"
    );

    let truth = |b: &str| match driver {
        Driver::Sqlite => b.replace("true", "1").replace("false", "0"),
        Driver::Postgres => b.to_owned(),
    };
    // The tool error: same status, message and result, now flagged.
    assert_eq!(
        db.text(
            "SELECT status || '|' || tool_error || '|' || result_kind FROM tasks WHERE seq = 1"
        )
        .await,
        truth("failed|true|result")
    );
    assert_eq!(
        db.json("SELECT result FROM tasks WHERE seq = 1").await["isError"],
        true
    );
    // The error outcome is an error record, as before; not a tool error.
    assert_eq!(
        db.text(
            "SELECT status || '|' || tool_error || '|' || result_kind FROM tasks WHERE seq = 2"
        )
        .await,
        truth("failed|false|error")
    );
    assert_eq!(
        db.json("SELECT result FROM tasks WHERE seq = 2").await["code"],
        -32603
    );
    // Requests as the tool gave them; answers without an envelope.
    assert_eq!(
        db.json("SELECT params FROM task_messages WHERE request_id = 'tb-1'")
            .await,
        json!({"message": "Deploy?", "requestedSchema": {"type": "object", "properties": {}}})
    );
    assert_eq!(
        db.json("SELECT params FROM task_messages WHERE request_id = 'tb-2'")
            .await["_meta"],
        json!({"x-trace": "7"})
    );
    assert_eq!(
        db.json("SELECT response FROM task_messages WHERE request_id = 'tb-1'")
            .await,
        json!({"result": {"action": "accept"}})
    );
    // History untouched.
    assert_eq!(
        db.texts("SELECT task_id || ':' || to_status FROM task_events ORDER BY id")
            .await,
        history_before
    );
    // The guards are back: a terminal task and an answer stay as they are.
    for sql in [
        "UPDATE tasks SET status_message = 'changed' WHERE seq = 1",
        "UPDATE task_messages SET response = '{}' WHERE request_id = 'tb-1'",
    ] {
        let refused = match &db {
            Db::Sqlite(pool, _) => sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                .execute(pool)
                .await
                .is_err(),
            Db::Postgres(pg) => pg.psql(sql).is_err(),
        };
        assert!(refused, "the guard refuses: {sql}");
    }
    // A tool error flag on anything but a failed result is refused.
    let bad = "UPDATE tasks SET tool_error = true WHERE seq = 3";
    let bad = truth(bad);
    let refused = match &db {
        Db::Sqlite(pool, _) => sqlx::raw_sql(AssertSqlSafe(bad.clone()))
            .execute(pool)
            .await
            .is_err(),
        Db::Postgres(pg) => pg.psql(&bad).is_err(),
    };
    assert!(refused, "tool_error only on a failed task with a result");
    // And the broker opens it: a second migrate has nothing to do.
    let again = migrate(&db);
    assert!(again.contains(": 0 migration(s) applied"), "{again}");
}
both_drivers!(issue24_an_old_database_moves_to_the_neutral_outcome);
