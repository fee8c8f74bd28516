//! `taskbroker upstreams`: one line per upstream MCP server, read from the
//! database: its state as last seen by a broker or worker process, since
//! when, restarts, the tools served from it, when they were listed, the
//! calls running now and the last error.

use clap::Args;
use serde_json::{Value, json};

use super::{DbArg, age, failed, open, print_json, table};
use crate::client::EXIT_OK;
use crate::clock::now_ms;
use crate::mcp::format_time;
use crate::store::UpstreamRow;
use crate::store::ops::ToolRunning;

/// `taskbroker upstreams`.
#[derive(Debug, Clone, Args)]
pub struct UpstreamsArgs {
    /// The database.
    #[command(flatten)]
    pub db: DbArg,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The names served from an upstream, from its row.
fn served(row: &UpstreamRow) -> Vec<String> {
    row.served
        .as_deref()
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default()
}

/// Jobs running now of the tools in `served`.
fn running(served: &[String], running: &[ToolRunning]) -> i64 {
    running
        .iter()
        .filter(|r| served.contains(&r.tool))
        .map(|r| r.jobs)
        .sum()
}

/// Run `taskbroker upstreams`; the exit code.
pub async fn run(args: UpstreamsArgs) -> u8 {
    let store = match open(&args.db.db).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let now = now_ms();
    let rows = store.upstreams_list().await;
    let stats = store.ops_stats(now).await;
    store.close().await;
    let (rows, stats) = match (rows, stats) {
        (Ok(rows), Ok(stats)) => (rows, stats),
        (Err(e), _) | (_, Err(e)) => return failed(&format!("upstreams: {e}")),
    };
    if args.json {
        return print_json(&Value::Array(
            rows.iter()
                .map(|r| {
                    let served = served(r);
                    json!({
                        "name": r.name,
                        "state": r.state,
                        "since": format_time(r.state_at),
                        "restarts": r.restarts,
                        "tools": served,
                        "listedAt": r.listed_at.map(format_time),
                        "callsRunning": running(&served, &stats.running),
                        "lastError": r.last_error,
                    })
                })
                .collect(),
        ));
    }
    if rows.is_empty() {
        eprintln!(
            "taskbroker: no upstream has been started on this database ([[upstream]] in the config file)"
        );
        return EXIT_OK;
    }
    let mut lines = vec![vec![
        "upstream".into(),
        "state".into(),
        "since".into(),
        "restarts".into(),
        "tools".into(),
        "listed".into(),
        "running".into(),
        "last error".into(),
    ]];
    for r in &rows {
        let served = served(r);
        lines.push(vec![
            r.name.clone(),
            r.state.clone(),
            format!("{} ago", age(now - r.state_at)),
            r.restarts.to_string(),
            served.len().to_string(),
            r.listed_at
                .map(|at| format!("{} ago", age(now - at)))
                .unwrap_or_else(|| "never".into()),
            running(&served, &stats.running).to_string(),
            r.last_error.clone().unwrap_or_default(),
        ]);
    }
    print!("{}", table(&lines, &[3, 4, 6]));
    EXIT_OK
}
