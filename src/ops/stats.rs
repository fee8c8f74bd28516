//! `taskbroker stats`: the queue, running jobs, tasks by status, finish
//! rates and recent failures, read from the database.

use clap::Args;
use serde_json::{Map, Value, json};

use super::{DbArg, age, failed, open, print_json, table};
use crate::client::EXIT_OK;
use crate::clock::now_ms;
use crate::mcp::format_time;
use crate::store::TaskStatus;
use crate::store::ops::OpsStats;

/// `taskbroker stats`.
#[derive(Debug, Clone, Args)]
pub struct StatsArgs {
    /// The database.
    #[command(flatten)]
    pub db: DbArg,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

const OPEN: [TaskStatus; 2] = [TaskStatus::Working, TaskStatus::InputRequired];
const FINISHED: [TaskStatus; 3] = [
    TaskStatus::Completed,
    TaskStatus::Failed,
    TaskStatus::Cancelled,
];

/// Run `taskbroker stats`; the exit code.
pub async fn run(args: StatsArgs) -> u8 {
    let store = match open(&args.db.db).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let stats = store.ops_stats(now_ms()).await;
    store.close().await;
    match stats {
        Ok(stats) if args.json => print_json(&to_json(&stats)),
        Ok(stats) => {
            print!("{}", to_text(&stats));
            EXIT_OK
        }
        Err(e) => failed(&format!("stats: {e}")),
    }
}

fn open_count(stats: &OpsStats, status: TaskStatus) -> i64 {
    stats
        .open
        .iter()
        .find(|(s, _)| *s == status)
        .map_or(0, |(_, n)| *n)
}

/// Finished with `status` in the last minute and hour.
fn finished(stats: &OpsStats, status: TaskStatus) -> (i64, i64) {
    stats
        .finished
        .iter()
        .find(|f| f.status == status)
        .map_or((0, 0), |f| (f.last_minute, f.last_hour))
}

/// Tasks per minute, rounded to hundredths.
fn per_minute(count: i64, minutes: f64) -> f64 {
    (count as f64 / minutes * 100.0).round() / 100.0
}

/// The JSON of `taskbroker stats --json`.
pub fn to_json(stats: &OpsStats) -> Value {
    let queued: Vec<Value> = stats
        .queued
        .iter()
        .map(|q| {
            json!({
                "tool": q.tool,
                "jobs": q.jobs,
                "oldestSince": format_time(q.oldest_since),
                "oldestAgeMs": (stats.now - q.oldest_since).max(0),
            })
        })
        .collect();
    let running: Vec<Value> = stats
        .running
        .iter()
        .map(|r| json!({ "tool": r.tool, "jobs": r.jobs }))
        .collect();
    let mut open = Map::new();
    for status in OPEN {
        open.insert(status.as_str().into(), open_count(stats, status).into());
    }
    let (mut minute, mut hour, mut rate_minute, mut rate_hour) =
        (Map::new(), Map::new(), Map::new(), Map::new());
    for status in FINISHED {
        let (m, h) = finished(stats, status);
        minute.insert(status.as_str().into(), m.into());
        hour.insert(status.as_str().into(), h.into());
        rate_minute.insert(status.as_str().into(), per_minute(m, 1.0).into());
        rate_hour.insert(status.as_str().into(), per_minute(h, 60.0).into());
    }
    let failures: Vec<Value> = stats
        .failures
        .iter()
        .map(|f| {
            json!({
                "tool": f.tool,
                "failed": f.failed,
                "lastAt": format_time(f.last_at),
                "lastMessage": f.last_message,
            })
        })
        .collect();
    let by_tool: Vec<Value> = stats
        .finished_by_tool
        .iter()
        .map(|f| json!({ "tool": f.tool, "lastMinute": f.last_minute, "lastHour": f.last_hour }))
        .collect();
    json!({
        "now": format_time(stats.now),
        "queueDepth": stats.queued.iter().map(|q| q.jobs).sum::<i64>(),
        "queued": queued,
        "runningJobs": stats.running.iter().map(|r| r.jobs).sum::<i64>(),
        "running": running,
        "openTasks": open,
        "finished": { "lastMinute": minute, "lastHour": hour },
        "perMinute": { "lastMinute": rate_minute, "lastHour": rate_hour },
        "finishedByTool": by_tool,
        "failuresLastHour": failures,
    })
}

/// The tables of `taskbroker stats`.
pub fn to_text(stats: &OpsStats) -> String {
    let mut out = String::new();
    let depth: i64 = stats.queued.iter().map(|q| q.jobs).sum();
    out.push_str(&format!("queued jobs: {depth}\n"));
    if !stats.queued.is_empty() {
        let mut rows = vec![vec!["  tool".into(), "queued".into(), "oldest".into()]];
        for q in &stats.queued {
            rows.push(vec![
                format!("  {}", q.tool),
                q.jobs.to_string(),
                age(stats.now - q.oldest_since),
            ]);
        }
        out.push_str(&table(&rows, &[1, 2]));
    }
    let running: i64 = stats.running.iter().map(|r| r.jobs).sum();
    out.push_str(&format!("\nrunning jobs: {running}\n"));
    if !stats.running.is_empty() {
        let mut rows = vec![vec!["  tool".into(), "running".into()]];
        for r in &stats.running {
            rows.push(vec![format!("  {}", r.tool), r.jobs.to_string()]);
        }
        out.push_str(&table(&rows, &[1]));
    }
    out.push_str("\ntasks\n");
    let mut rows = vec![vec![
        "  status".into(),
        "now".into(),
        "last minute".into(),
        "last hour".into(),
        "per minute (hour)".into(),
    ]];
    for status in OPEN {
        rows.push(vec![
            format!("  {status}"),
            open_count(stats, status).to_string(),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    for status in FINISHED {
        let (m, h) = finished(stats, status);
        rows.push(vec![
            format!("  {status}"),
            String::new(),
            m.to_string(),
            h.to_string(),
            format!("{:.2}", per_minute(h, 60.0)),
        ]);
    }
    out.push_str(&table(&rows, &[1, 2, 3, 4]));
    if !stats.finished_by_tool.is_empty() {
        out.push_str("\nfinished by tool\n");
        let mut rows = vec![vec![
            "  tool".into(),
            "last minute".into(),
            "last hour".into(),
        ]];
        for f in &stats.finished_by_tool {
            rows.push(vec![
                format!("  {}", f.tool),
                f.last_minute.to_string(),
                f.last_hour.to_string(),
            ]);
        }
        out.push_str(&table(&rows, &[1, 2]));
    }
    let failed: i64 = stats.failures.iter().map(|f| f.failed).sum();
    out.push_str(&format!("\nfailures in the last hour: {failed}\n"));
    if !stats.failures.is_empty() {
        let mut rows = vec![vec![
            "  tool".into(),
            "failed".into(),
            "last".into(),
            "last message".into(),
        ]];
        for f in &stats.failures {
            rows.push(vec![
                format!("  {}", f.tool),
                f.failed.to_string(),
                format!("{} ago", age(stats.now - f.last_at)),
                one_line(f.last_message.as_deref().unwrap_or("-"), 100),
            ]);
        }
        out.push_str(&table(&rows, &[1, 2]));
    }
    out
}

/// `text` on one line, at most `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() > max {
        let cut: String = flat.chars().take(max.saturating_sub(3)).collect();
        format!("{cut}...")
    } else {
        flat
    }
}
