//! `taskbroker tasks list --db DB`: every owner's tasks, read from the
//! database, filtered and paged newest first (keyset paging: the cursor is
//! the row key of the last task shown). Each task's job priority is shown,
//! and a delayed job's start in its status message (`queued: starts at`).

use serde_json::{Value, json};

use super::{failed, open, table};
use crate::client::{EXIT_OK, TaskListArgs};
use crate::mcp::format_time;
use crate::store::ops::{TaskFilter, TaskSummary};
use crate::tools::describe_priority;

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
            "priority".into(),
            "statusMessage".into(),
        ]];
        for t in &tasks {
            rows.push(vec![
                t.task_id.clone(),
                t.status.as_str().into(),
                t.tool.clone(),
                t.owner.clone(),
                format_time(t.updated_at),
                t.priority.map(describe_priority).unwrap_or_default(),
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
        "priority": t.priority,
        "startsAt": t.starts_at.map(format_time),
    })
}
