//! `taskbroker tasks list --db DB`: every owner's tasks, read from the
//! database, filtered and paged newest first (keyset paging: the cursor is
//! the row key of the last task shown).

use clap::Args;
use serde_json::{Value, json};

use super::{failed, open, table};
use crate::client::EXIT_OK;
use crate::mcp::format_time;
use crate::store::TaskStatus;
use crate::store::ops::{TaskFilter, TaskSummary};

/// The operator flags of `taskbroker tasks list`: with `--db`, the list
/// reads the database directly instead of asking a broker.
#[derive(Debug, Clone, Default, Args)]
pub struct TaskListArgs {
    /// Operators: read this database directly (a SQLite file or a
    /// postgres:// URL) and list every owner's tasks, instead of asking
    /// a broker for one session's. Needs access to the database.
    #[arg(long, value_name = "DB")]
    pub db: Option<std::path::PathBuf>,
    /// With --db: only tasks in this status (repeatable, or a comma list):
    /// working, input_required, completed, failed, cancelled.
    #[arg(long, value_name = "STATUS", value_delimiter = ',', requires = "db", value_parser = parse_status)]
    pub status: Vec<TaskStatus>,
    /// With --db: only tasks of this tool.
    #[arg(long, value_name = "TOOL", requires = "db")]
    pub tool: Option<String>,
    /// With --db: only tasks of this owner (a principal, or a session id
    /// without tokens).
    #[arg(long, value_name = "OWNER", requires = "db")]
    pub owner: Option<String>,
    /// With --db: tasks per page [default: 50].
    #[arg(long, value_name = "N", requires = "db", value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub limit: Option<i64>,
    /// With --db: the page after the one that printed this cursor (tasks
    /// older than it).
    #[arg(long, value_name = "CURSOR", requires = "db", conflicts_with = "all")]
    pub before: Option<i64>,
    /// With --db: print a JSON array of tasks instead of lines.
    #[arg(long, requires = "db")]
    pub json: bool,
}

fn parse_status(s: &str) -> Result<TaskStatus, String> {
    s.trim().parse()
}

/// Default page size.
const LIMIT: i64 = 50;

/// List the tasks: one page, or every page with `all`; the exit code.
pub async fn list(args: &TaskListArgs, all: bool) -> u8 {
    let Some(db) = &args.db else {
        return failed(&"tasks list: no --db");
    };
    let store = match open(db).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let filter = TaskFilter {
        statuses: args.status.clone(),
        tool: args.tool.clone(),
        owner: args.owner.clone(),
    };
    let limit = args.limit.unwrap_or(LIMIT);
    let mut before = args.before;
    let mut tasks: Vec<TaskSummary> = Vec::new();
    let mut more = None;
    loop {
        // One more than a page says whether another follows.
        let page = match store.ops_task_page(&filter, before, limit + 1).await {
            Ok(p) => p,
            Err(e) => {
                store.close().await;
                return failed(&format!("tasks list: {e}"));
            }
        };
        let full = page.len() as i64 > limit;
        let page: Vec<TaskSummary> = page.into_iter().take(limit as usize).collect();
        before = page.last().map(|t| t.seq);
        tasks.extend(page);
        if !full {
            break;
        }
        if !all {
            more = before;
            break;
        }
    }
    store.close().await;
    if args.json {
        println!(
            "{}",
            Value::Array(tasks.iter().map(to_json).collect::<Vec<_>>())
        );
    } else if !tasks.is_empty() {
        let mut rows = vec![vec![
            "taskId".into(),
            "status".into(),
            "tool".into(),
            "owner".into(),
            "lastUpdatedAt".into(),
            "statusMessage".into(),
        ]];
        for t in &tasks {
            rows.push(vec![
                t.task_id.clone(),
                t.status.as_str().into(),
                t.tool.clone(),
                t.owner.clone(),
                format_time(t.updated_at),
                t.status_message
                    .as_deref()
                    .unwrap_or("")
                    .replace(['\n', '\r'], " "),
            ]);
        }
        print!("{}", table(&rows, &[]));
    }
    if let Some(cursor) = more {
        eprintln!(
            "taskbroker: more tasks: the next page is --before {cursor} (--all for every page)"
        );
    }
    EXIT_OK
}

/// One task of `--json`.
fn to_json(t: &TaskSummary) -> Value {
    json!({
        "taskId": t.task_id,
        "status": t.status.as_str(),
        "tool": t.tool,
        "owner": t.owner,
        "createdAt": format_time(t.created_at),
        "lastUpdatedAt": format_time(t.updated_at),
        "statusMessage": t.status_message,
    })
}
