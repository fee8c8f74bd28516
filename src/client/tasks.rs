//! `taskbroker tasks list|get|result|cancel`: quick inspection of the tasks
//! of a session: the one the client keeps for the broker (see
//! [`super::session`]), or `--session ID`.

use serde_json::{Value, json};

use super::output::{is_error, print_json, table};
use super::session::{CliSession, Origin};
use super::state::BrokerState;
use super::{EXIT_FAILURE, EXIT_OK, EXIT_UNREACHABLE, McpError, Protocol, TasksArgs, TasksCommand};

/// Run `taskbroker tasks ...`; returns the process exit code.
pub async fn run(args: TasksArgs) -> u8 {
    let conn = match &args.command {
        TasksCommand::List { conn, .. }
        | TasksCommand::Get { conn, .. }
        | TasksCommand::Result { conn, .. }
        | TasksCommand::Cancel { conn, .. } => conn,
    };
    if args.protocol.protocol == Protocol::V2026 {
        return super::stateless::tasks(&args).await;
    }
    let given = match &args.command {
        TasksCommand::Result { input, .. } => input.clone(),
        _ => None,
    };
    let cli = match CliSession::open(conn, super::input::Answerer::new(given), false).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("taskbroker: {e}");
            return EXIT_UNREACHABLE;
        }
    };
    match &args.command {
        TasksCommand::List { all, .. } => list(&cli, *all).await,
        TasksCommand::Get { id, .. } => show(&cli, "tasks/get", id).await,
        TasksCommand::Result { id, .. } => show(&cli, "tasks/result", id).await,
        TasksCommand::Cancel { id, .. } => show(&cli, "tasks/cancel", id).await,
    }
}

/// The header of `tasks list`, as README shows it.
const LIST_HEADER: [&str; 5] = ["taskId", "status", "tool", "lastUpdatedAt", "statusMessage"];

/// tasks/list as a table under a header line (none when there are no
/// tasks); every page with `all`.
async fn list(cli: &CliSession, all: bool) -> u8 {
    let mut cursor: Option<String> = None;
    let remembered = cli.state.load();
    let mut rows: Vec<Vec<String>> = vec![LIST_HEADER.map(str::to_owned).to_vec()];
    loop {
        let params = match &cursor {
            Some(c) => json!({ "cursor": c }),
            None => json!({}),
        };
        let page = match cli.client.request("tasks/list", params).await {
            Ok(page) => page,
            Err(e) => return fail(&e, cli).await,
        };
        let tasks = page
            .get("tasks")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        rows.extend(tasks.iter().map(|task| row(task, &remembered)));
        cursor = page
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if cursor.is_some() && all {
            continue;
        }
        break;
    }
    if rows.len() > 1 {
        print!("{}", table(&rows, &[]));
    }
    if cursor.is_some() {
        eprintln!("taskbroker: more tasks on further pages; use --all");
    }
    if rows.len() == 1 && cli.origin == Origin::New {
        eprintln!(
            "taskbroker: no tasks: this client had no session with {} yet (tasks started with `taskbroker call --task` show here; pass --session ID for another session's tasks)",
            cli.client.url()
        );
    }
    EXIT_OK
}

/// The cells of [`LIST_HEADER`] for one task; the tool is known for tasks
/// this client started (a Task does not name its tool), else `-`.
fn row(task: &Value, remembered: &BrokerState) -> Vec<String> {
    let field = |name: &str| task.get(name).and_then(Value::as_str).unwrap_or("-");
    let message = task
        .get("statusMessage")
        .and_then(Value::as_str)
        .unwrap_or("")
        .replace(['\n', '\r'], " ");
    let tool = remembered.tool_of(field("taskId")).unwrap_or("-");
    vec![
        field("taskId").to_owned(),
        field("status").to_owned(),
        tool.to_owned(),
        field("lastUpdatedAt").to_owned(),
        message,
    ]
}

/// tasks/get, tasks/result or tasks/cancel: the answer as pretty JSON; a
/// result with `isError` exits 1 too.
async fn show(cli: &CliSession, method: &str, id: &str) -> u8 {
    match cli.client.request(method, json!({ "taskId": id })).await {
        Ok(answer) => {
            print_json(&answer);
            if method == "tasks/result" && is_error(&answer) {
                EXIT_FAILURE
            } else {
                EXIT_OK
            }
        }
        Err(e) => fail(&e, cli).await,
    }
}

/// Print an error. A stored session the broker no longer knows is said
/// plainly (and forgotten); a task not found in the client's own session
/// gets a hint at `--session`.
async fn fail(e: &McpError, cli: &CliSession) -> u8 {
    let url = cli.client.url();
    if cli.lost_stored_session(e) {
        cli.forget().await;
        eprintln!(
            "taskbroker: tasks: the client's session with {url} is gone: the broker no longer knows session {} (a new or replaced database?) (its tasks cannot be reached; the session is forgotten, and the next `taskbroker call` opens a new one)",
            cli.client.session_id().unwrap_or("none")
        );
        return EXIT_FAILURE;
    }
    eprintln!("taskbroker: {e}");
    let not_found = e
        .rpc()
        .is_some_and(|r| r.message.to_ascii_lowercase().contains("not found"));
    if not_found && cli.origin != Origin::Given {
        eprintln!(
            "taskbroker: this client sees the tasks of its own session with {url} ({}); pass --session ID for another session's tasks",
            cli.client.session_id().unwrap_or("none")
        );
    }
    e.exit_code()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_row_has_id_status_tool_time_and_message() {
        let task = json!({
            "taskId": "t1", "status": "working",
            "lastUpdatedAt": "2025-11-25T10:30:00.123Z", "statusMessage": "slept 1\nof 2 s"
        });
        assert_eq!(
            row(&task, &BrokerState::default()),
            [
                "t1",
                "working",
                "-",
                "2025-11-25T10:30:00.123Z",
                "slept 1 of 2 s"
            ]
        );
    }
}
