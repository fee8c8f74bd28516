//! `taskbroker tasks list|get|result|cancel`: quick inspection of the tasks
//! of a session.

use serde_json::{Value, json};

use super::output::{is_error, print_json};
use super::{
    Connection, EXIT_FAILURE, EXIT_OK, EXIT_UNREACHABLE, McpClient, McpError, TasksArgs,
    TasksCommand,
};

/// Run `taskbroker tasks ...`; returns the process exit code.
pub async fn run(args: TasksArgs) -> u8 {
    let conn = match &args.command {
        TasksCommand::List { conn, .. }
        | TasksCommand::Get { conn, .. }
        | TasksCommand::Result { conn, .. }
        | TasksCommand::Cancel { conn, .. } => conn,
    };
    let client = match McpClient::open(conn).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("taskbroker: {e}");
            return EXIT_UNREACHABLE;
        }
    };
    let code = match &args.command {
        TasksCommand::List { all, .. } => list(&client, *all, conn).await,
        TasksCommand::Get { id, .. } => show(&client, "tasks/get", id, conn).await,
        TasksCommand::Result { id, .. } => show(&client, "tasks/result", id, conn).await,
        TasksCommand::Cancel { id, .. } => show(&client, "tasks/cancel", id, conn).await,
    };
    client.close().await;
    code
}

/// tasks/list, one line per task; every page with `all`.
async fn list(client: &McpClient, all: bool, conn: &Connection) -> u8 {
    let mut cursor: Option<String> = None;
    let mut count = 0usize;
    loop {
        let params = match &cursor {
            Some(c) => json!({ "cursor": c }),
            None => json!({}),
        };
        let page = match client.request("tasks/list", params).await {
            Ok(page) => page,
            Err(e) => return fail(&e, conn),
        };
        let tasks = page
            .get("tasks")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for task in tasks {
            println!("{}", line(task));
        }
        count += tasks.len();
        cursor = page
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match (&cursor, all) {
            (Some(_), true) => continue,
            (Some(_), false) => eprintln!("taskbroker: more tasks on further pages; use --all"),
            (None, _) => {}
        }
        break;
    }
    if count == 0 && conn.session.is_none() {
        eprintln!(
            "taskbroker: no tasks: a new session sees none; pass --session ID to list the tasks of an existing session"
        );
    }
    EXIT_OK
}

/// `taskId  status  lastUpdatedAt  statusMessage`.
fn line(task: &Value) -> String {
    let field = |name: &str| task.get(name).and_then(Value::as_str).unwrap_or("-");
    let message = task
        .get("statusMessage")
        .and_then(Value::as_str)
        .unwrap_or("");
    format!(
        "{}  {:<14}  {}  {}",
        field("taskId"),
        field("status"),
        field("lastUpdatedAt"),
        message
    )
    .trim_end()
    .to_owned()
}

/// tasks/get, tasks/result or tasks/cancel: the answer as pretty JSON; a
/// result with `isError` exits 1 too.
async fn show(client: &McpClient, method: &str, id: &str, conn: &Connection) -> u8 {
    match client.request(method, json!({ "taskId": id })).await {
        Ok(answer) => {
            print_json(&answer);
            if method == "tasks/result" && is_error(&answer) {
                EXIT_FAILURE
            } else {
                EXIT_OK
            }
        }
        Err(e) => fail(&e, conn),
    }
}

/// Print an error; hint at `--session` when a task was not found without one.
fn fail(e: &McpError, conn: &Connection) -> u8 {
    eprintln!("taskbroker: {e}");
    let not_found = e
        .rpc()
        .is_some_and(|r| r.message.to_ascii_lowercase().contains("not found"));
    if not_found && conn.session.is_none() {
        eprintln!(
            "taskbroker: tasks are visible only to the session that created them; pass --session ID"
        );
    }
    e.exit_code()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_line_has_id_status_time_and_message() {
        let task = json!({
            "taskId": "t1", "status": "working",
            "lastUpdatedAt": "2025-11-25T10:30:00.123Z", "statusMessage": "slept 1 of 2 s"
        });
        assert_eq!(
            line(&task),
            "t1  working         2025-11-25T10:30:00.123Z  slept 1 of 2 s"
        );
    }
}
