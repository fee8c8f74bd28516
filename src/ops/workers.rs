//! `taskbroker workers`: one line per worker pool, read from the database.

use clap::Args;
use serde_json::{Value, json};

use super::{DbArg, age, failed, open, print_json, table};
use crate::client::EXIT_OK;
use crate::clock::now_ms;
use crate::mcp::format_time;
use crate::store::ops::{WorkerInfo, WorkerLife};

/// `taskbroker workers`.
#[derive(Debug, Clone, Args)]
pub struct WorkersArgs {
    /// The database.
    #[command(flatten)]
    pub db: DbArg,
    /// Also list pools that stopped cleanly (hidden otherwise).
    #[arg(long)]
    pub all: bool,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Run `taskbroker workers`; the exit code.
pub async fn run(args: WorkersArgs) -> u8 {
    let store = match open(&args.db.db).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let workers = store.ops_workers().await;
    store.close().await;
    let workers = match workers {
        Ok(w) => w,
        Err(e) => return failed(&format!("workers: {e}")),
    };
    let now = now_ms();
    let (shown, hidden): (Vec<&WorkerInfo>, Vec<&WorkerInfo>) = workers
        .iter()
        .partition(|w| args.all || w.life(now) != WorkerLife::Stopped);
    if args.json {
        return print_json(&Value::Array(
            shown.iter().map(|w| to_json(w, now)).collect(),
        ));
    }
    let mut rows = vec![vec![
        "worker".into(),
        "kind".into(),
        "state".into(),
        "host".into(),
        "pid".into(),
        "heartbeat".into(),
        "jobs".into(),
        "concurrency".into(),
    ]];
    for w in &shown {
        rows.push(vec![
            w.worker_id.clone(),
            w.kind.as_str().into(),
            w.life(now).as_str().into(),
            w.host.clone(),
            w.pid.to_string(),
            format!("{} ago", age(now - w.heartbeat_at)),
            w.jobs_running.to_string(),
            w.concurrency.to_string(),
        ]);
    }
    print!("{}", table(&rows, &[4, 5, 6, 7]));
    if !hidden.is_empty() {
        eprintln!(
            "taskbroker: {} stopped pool(s) not shown (--all shows them)",
            hidden.len()
        );
    }
    EXIT_OK
}

/// One worker for `--json`.
fn to_json(w: &WorkerInfo, now: i64) -> Value {
    json!({
        "workerId": w.worker_id,
        "kind": w.kind.as_str(),
        "state": w.life(now).as_str(),
        "host": w.host,
        "pid": w.pid,
        "concurrency": w.concurrency,
        "jobsRunning": w.jobs_running,
        "startedAt": format_time(w.started_at),
        "lastHeartbeat": format_time(w.heartbeat_at),
        "heartbeatAgeMs": (now - w.heartbeat_at).max(0),
        "stoppedAt": w.stopped_at.map(format_time),
    })
}
