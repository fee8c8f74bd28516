//! `taskbroker call TOOL`: call a tool plainly (progress from
//! `notifications/progress`) or as a task (progress from polling
//! `tasks/get`), print the result, exit with a code that says how it went.

use std::io::Write;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::interrupt::Interrupt;
use super::output::print_result;
use super::progress::Progress;
use super::session::{CliSession, Origin};
use super::{
    CLIENT_NAME, CallArgs, DEFAULT_URL, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNREACHABLE,
    McpClient, McpError, Notification, Protocol,
};

/// Run `taskbroker call`; returns the process exit code.
pub async fn run(args: CallArgs) -> u8 {
    if args.protocol.protocol == Protocol::V2026 {
        return super::stateless::call(&args).await;
    }
    // Listen for Ctrl-C before anything is created, so it is never lost.
    let mut interrupt = Interrupt::new();
    let answerer = super::input::Answerer::new(args.input.clone());
    let mut cli = match CliSession::open(&args.conn, answerer, true).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("taskbroker: {e}");
            return EXIT_UNREACHABLE;
        }
    };
    // The session is kept (not ended): `taskbroker tasks` uses it later.
    if args.task {
        as_task(&mut cli, &args, &mut interrupt).await
    } else {
        plain(&mut cli, &args, &mut interrupt).await
    }
}

/// `tools/call`; when the broker no longer knows the stored session (a new
/// database), a new session is opened, stored, and the call sent again.
async fn call_tool(
    cli: &mut CliSession,
    params: Value,
    on_note: &mut impl FnMut(Notification),
) -> Result<Value, McpError> {
    match cli
        .client
        .request_with("tools/call", params.clone(), &mut *on_note)
        .await
    {
        Err(e) if cli.lost_stored_session(&e) => {
            tracing::info!(error = %e, "the stored session is gone; opening a new one");
            cli.renew().await?;
            cli.client.request_with("tools/call", params, on_note).await
        }
        other => other,
    }
}

/// A plain `tools/call` with a progressToken; Ctrl-C just exits.
async fn plain(cli: &mut CliSession, args: &CallArgs, interrupt: &mut Interrupt) -> u8 {
    let token = json!(format!("{CLIENT_NAME}-{}", std::process::id()));
    let params = json!({
        "name": args.tool,
        "arguments": args.args,
        "_meta": { "progressToken": token },
    });
    let mut progress = Progress::new(&format!("calling {}", args.tool));
    let mut on_note = |note: Notification| {
        let p = &note.params;
        if note.method == "notifications/progress" && p.get("progressToken") == Some(&token) {
            progress.update(
                p.get("progress").and_then(Value::as_f64).unwrap_or(0.0),
                p.get("total").and_then(Value::as_f64),
                p.get("message").and_then(Value::as_str),
            );
        }
    };
    let call = call_tool(cli, params, &mut on_note);
    let outcome = tokio::select! {
        outcome = call => Some(outcome),
        () = interrupt.recv() => None,
    };
    progress.clear();
    match outcome {
        Some(Ok(result)) => print_result(&result, args.json),
        Some(Err(e)) => fail_call(&cli.client, args, &e).await,
        None => {
            eprintln!("\ntaskbroker: interrupted");
            EXIT_INTERRUPTED
        }
    }
}

/// `tools/call` with `params.task`, then (unless `--detach`) poll
/// `tasks/get` and fetch `tasks/result`; Ctrl-C asks whether to cancel the
/// task.
async fn as_task(cli: &mut CliSession, args: &CallArgs, interrupt: &mut Interrupt) -> u8 {
    let mut task_meta = json!({});
    if let Some(ttl) = args.ttl {
        task_meta["ttl"] = json!(ttl);
    }
    let mut params = json!({ "name": args.tool, "arguments": args.args, "task": task_meta });
    if let Some(meta) = args.task_meta() {
        params["_meta"] = meta;
    }
    let created = match call_tool(cli, params, &mut |_| {}).await {
        Ok(r) => r,
        Err(e) => return fail_call(&cli.client, args, &e).await,
    };
    let Some(mut task) = created.get("task").cloned() else {
        if created.get("content").is_some() {
            // The server ran it as a plain call after all.
            return print_result(&created, args.json);
        }
        return fail(&McpError::Protocol(format!(
            "tools/call with a task answered neither a task nor a result: {created}"
        )));
    };
    let Some(task_id) = task
        .get("taskId")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return fail(&McpError::Protocol(format!(
            "a task without taskId: {task}"
        )));
    };
    cli.state.remember_task(&task_id, &args.tool).await;
    if args.detach {
        println!("{task_id}");
        let _ = std::io::stdout().flush();
        eprintln!(
            "taskbroker: task {task_id} started; its result: {}",
            follow_up(cli, args, &task_id)
        );
        return EXIT_OK;
    }
    eprintln!(
        "taskbroker: task {task_id} (session {})",
        cli.client.session_id().unwrap_or("none")
    );
    let mut progress = Progress::new(&describe(&task_id, &task));
    let task_params = json!({ "taskId": task_id });
    let client = &cli.client;
    while status(&task) == "working" {
        let wait = poll_interval(&task);
        let poll = async {
            tokio::time::sleep(wait).await;
            client.request("tasks/get", task_params.clone()).await
        };
        let polled = tokio::select! {
            polled = poll => Some(polled),
            () = interrupt.recv() => None,
        };
        match polled {
            Some(Ok(t)) => task = t,
            Some(Err(e)) => {
                progress.clear();
                return fail(&e);
            }
            None => return on_interrupt(cli, args, &task_id, &mut progress, interrupt).await,
        }
        progress.message(&describe(&task_id, &task));
    }
    // Terminal (or input_required): tasks/result answers when it is over.
    let fetch = client.request("tasks/result", task_params.clone());
    let fetched = tokio::select! {
        fetched = fetch => Some(fetched),
        () = interrupt.recv() => None,
    };
    progress.clear();
    match fetched {
        Some(Ok(result)) => {
            let code = print_result(&result, args.json);
            if status(&task) == "failed" {
                EXIT_FAILURE
            } else {
                code
            }
        }
        Some(Err(e @ McpError::Input(_))) => {
            let code = fail(&e);
            eprintln!(
                "taskbroker: task {task_id} waits for that answer; give it later with: {} --input JSON",
                follow_up(cli, args, &task_id)
            );
            code
        }
        Some(Err(e)) => fail(&e),
        None => on_interrupt(cli, args, &task_id, &mut progress, interrupt).await,
    }
}

/// The command that fetches a task's result later: no `--session` unless
/// one was given (the stored session is found again), `--url` unless it is
/// the default.
fn follow_up(cli: &CliSession, args: &CallArgs, task_id: &str) -> String {
    let mut command = format!("taskbroker tasks result {task_id}");
    if cli.origin == Origin::Given
        && let Some(session) = cli.client.session_id()
    {
        command.push_str(&format!(" --session {session}"));
    }
    if args.conn.url.as_str() != DEFAULT_URL {
        command.push_str(&format!(" --url {}", args.conn.url));
    }
    command
}

/// Print why a `tools/call` failed. A -32601 about the task mode becomes
/// advice: `--task` for a tool that runs only as a task, no `--task` for one
/// that cannot (the tool's `execution.taskSupport`, from tools/list).
async fn fail_call(client: &McpClient, args: &CallArgs, e: &McpError) -> u8 {
    let method_not_found = e.rpc().is_some_and(|r| r.code.code() == -32601);
    if !method_not_found {
        return fail(e);
    }
    let support = task_support(client, &args.tool).await;
    match (args.task, support.as_deref()) {
        (false, Some("required")) => {
            eprintln!(
                "taskbroker: call {}: the tool runs only as a task (its execution.taskSupport is 'required'; JSON-RPC error -32601) (add --task)",
                args.tool
            );
            EXIT_FAILURE
        }
        (true, Some("forbidden")) => {
            eprintln!(
                "taskbroker: call {} --task: the tool does not run as a task (its execution.taskSupport is 'forbidden'; JSON-RPC error -32601) (drop --task)",
                args.tool
            );
            EXIT_FAILURE
        }
        _ => fail(e),
    }
}

/// The tool's `execution.taskSupport` (`forbidden` when it has none), or
/// None when tools/list does not list it.
async fn task_support(client: &McpClient, tool: &str) -> Option<String> {
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let params = match &cursor {
            Some(c) => json!({ "cursor": c }),
            None => json!({}),
        };
        let page = client.request("tools/list", params).await.ok()?;
        let found = page
            .get("tools")
            .and_then(Value::as_array)?
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some(tool));
        if let Some(t) = found {
            let support = t
                .pointer("/execution/taskSupport")
                .and_then(Value::as_str)
                .unwrap_or("forbidden");
            return Some(support.to_owned());
        }
        cursor = Some(page.get("nextCursor").and_then(Value::as_str)?.to_owned());
    }
    None
}

/// Ctrl-C during a task: ask on stderr, read one line from stdin; `y`
/// cancels the task, anything else leaves it running (in the kept session).
async fn on_interrupt(
    cli: &CliSession,
    args: &CallArgs,
    task_id: &str,
    progress: &mut Progress,
    interrupt: &mut Interrupt,
) -> u8 {
    progress.clear();
    eprint!("\nCancel task {task_id}? [y/N] ");
    let _ = std::io::stderr().flush();
    let answer = tokio::select! {
        line = read_line() => line.unwrap_or_default(),
        // A second Ctrl-C: leave the task alone.
        () = interrupt.recv() => {
            eprintln!();
            String::new()
        }
    };
    if matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
        match cli
            .client
            .request("tasks/cancel", json!({ "taskId": task_id }))
            .await
        {
            Ok(task) => eprintln!("taskbroker: task {task_id} {}", status(&task)),
            Err(e) => eprintln!("taskbroker: could not cancel task {task_id}: {e}"),
        }
        return EXIT_INTERRUPTED;
    }
    eprintln!(
        "taskbroker: task {task_id} keeps running; fetch its result with: {}",
        follow_up(cli, args, task_id)
    );
    EXIT_INTERRUPTED
}

/// Print an error on stderr; its exit code.
fn fail(e: &McpError) -> u8 {
    eprintln!("taskbroker: {e}");
    e.exit_code()
}

fn status(task: &Value) -> &str {
    task.get("status")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
}

/// `task <id>: <status>: <statusMessage>`.
fn describe(task_id: &str, task: &Value) -> String {
    match task.get("statusMessage").and_then(Value::as_str) {
        Some(message) => format!("task {task_id}: {}: {message}", status(task)),
        None => format!("task {task_id}: {}", status(task)),
    }
}

/// The task's pollInterval, kept between 50 ms and 60 s (1 s if absent).
fn poll_interval(task: &Value) -> Duration {
    let ms = task
        .get("pollInterval")
        .and_then(Value::as_u64)
        .unwrap_or(1000);
    Duration::from_millis(ms.clamp(50, 60_000))
}

/// One line from stdin; None at end of input or on error.
async fn read_line() -> Option<String> {
    let mut line = String::new();
    match BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await
    {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_interval_is_honoured_within_bounds() {
        assert_eq!(
            poll_interval(&json!({ "pollInterval": 250 })),
            Duration::from_millis(250)
        );
        assert_eq!(poll_interval(&json!({})), Duration::from_secs(1));
        assert_eq!(
            poll_interval(&json!({ "pollInterval": 1 })),
            Duration::from_millis(50)
        );
    }

    #[test]
    fn describe_shows_the_status_message() {
        let task = json!({ "status": "working", "statusMessage": "slept 3 of 10 s" });
        assert_eq!(describe("t1", &task), "task t1: working: slept 3 of 10 s");
    }
}
