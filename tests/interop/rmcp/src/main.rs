//! Interoperability: taskbroker's MCP 2026-07-28 front end and its tasks
//! extension (`io.modelcontextprotocol/tasks`, SEP-2663), driven by the
//! official Rust MCP SDK client, rmcp 3.11.0.
//!
//! Usage:
//!     taskbroker-rmcp-interop path/to/taskbroker
//!
//! Starts its own processes in a fresh temporary directory:
//!     taskbroker serve  --workers 0 --db DIR/b.db --listen 127.0.0.1:0
//!     taskbroker worker --db DIR/b.db --lease 5
//! and kills them at the end (also on failure, panic, SIGINT and SIGTERM).
//!
//! Checks (demo tools, src/tools/demo.rs):
//!   1. server/discover (rmcp's discover lifecycle): 2026-07-28 and the tasks
//!      extension in the server's capabilities
//!   2. sleep {seconds: 1} with the extension declared -> a task; tasks/get
//!      until completed; the inlined result says "slept 1 s"
//!      (2b: fail as a task -> completed, isError: true, not failed;
//!      2c: tasks/get of an unknown taskId -> -32602)
//!   3. echo without the extension -> a plain result, no task
//!      (3b: sleep_as_task without the extension -> -32021 naming it;
//!      3c: tasks/get of a real task without the extension -> -32021)
//!   4. approve {question: "ship it?"} as a task, elicitation declared ->
//!      input_required with one elicitation/create -> tasks/update accept
//!      {approved: true} -> completed "approved"
//!   5. sleep {seconds: 60} as a task -> tasks/cancel acked -> cancelled
//!   6. sleep {seconds: 4} and approve as tasks, then kill -9 of the server
//!      and a restart on the same db and port, the worker left running:
//!      - 6a: the same client's tasks/get of the held taskId completes
//!        "slept 4 s"
//!      - 6b: the approve task, input_required across the restart, is
//!        answered with tasks/update afterwards and completes "approved"
//!   7. subscriptions/listen {notifications: {taskIds}} for a sleep task:
//!      its notifications/tasks reach ClientHandler::on_task_status, the
//!      last one completed with "slept 2 s" inline
//!
//! All MCP traffic goes through rmcp's public client API (client.rs); no
//! hand-rolled HTTP. Where rmcp and the spec disagree, the code says
//! `RMCP vs SPEC`.
//!
//! Every check prints `ok - ...` or `not ok - ...` (details on `# ` lines);
//! the last line is `N passed, M failed`; exit status 0 only when M is 0.

mod broker;
mod client;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use rmcp::model::{CallToolResponse, ProtocolVersion};
use serde_json::{Value, json};

use broker::Broker;
use client::{Client, Declares};

/// The client of most checks: declares the tasks extension and form
/// elicitation.
const FULL: Declares = Declares {
    tasks: true,
    elicitation: true,
};

/// The client of checks 3, 3b, 3c: declares nothing.
const PLAIN: Declares = Declares {
    tasks: false,
    elicitation: false,
};

/// The longest a task of these checks may take to reach the state wanted.
const TASK_TIMEOUT: Duration = Duration::from_secs(30);

/// Every check, in order (to report the rest as not run when there is no
/// client).
#[rustfmt::skip]
const CHECKS: &[(&str, &str)] = &[
    ("1", "server/discover: MCP 2026-07-28 and the tasks extension"),
    ("2", "sleep {seconds: 1} as a task completes with \"slept 1 s\""),
    ("2b", "fail as a task: completed with isError, not failed"),
    ("2c", "tasks/get of an unknown taskId: -32602"),
    ("3", "echo without the extension: a plain result, no task"),
    ("3b", "sleep_as_task without the extension: -32021 naming the extension"),
    ("3c", "tasks/get without the extension: -32021"),
    ("4", "approve as a task: input_required, tasks/update, completed \"approved\""),
    ("5", "sleep {seconds: 60} as a task: tasks/cancel acked, cancelled"),
    ("6a", "kill -9 and restart of the server: the held task completes \"slept 4 s\""),
    ("6b", "kill -9 and restart of the server: input_required answered afterwards"),
    ("7", "subscriptions/listen {taskIds}: notifications/tasks reach on_task_status"),
];

#[derive(Default)]
struct Tally {
    passed: u32,
    failed: u32,
}

impl Tally {
    fn report(&mut self, id: &str, result: Result<String, String>) {
        let name = CHECKS
            .iter()
            .find(|(i, _)| *i == id)
            .map_or(id, |(_, name)| *name);
        match result {
            Ok(note) => {
                self.passed += 1;
                println!("ok - {id} {name}");
                print_details(&note);
            }
            Err(why) => {
                self.failed += 1;
                println!("not ok - {id} {name}");
                print_details(&why);
            }
        }
    }

    /// Report every check not yet reported as failed (there is nothing to
    /// run them with).
    fn skip_rest(&mut self, from: &str, why: &str) {
        let start = CHECKS
            .iter()
            .position(|(i, _)| *i == from)
            .unwrap_or(CHECKS.len());
        for (id, _) in &CHECKS[start..] {
            self.report(id, Err(format!("not run: {why}")));
        }
    }
}

fn print_details(text: &str) {
    for line in text.lines().filter(|l| !l.is_empty()) {
        println!("#   {line}");
    }
}

fn expect(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond { Ok(()) } else { Err(what()) }
}

#[tokio::main]
async fn main() -> ExitCode {
    let Some(bin) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: taskbroker-rmcp-interop path/to/taskbroker");
        return ExitCode::from(2);
    };
    broker::kill_all_on_signal();
    let mut tally = Tally::default();
    match Broker::new(&bin) {
        Err(e) => {
            println!("not ok - 0 start taskbroker serve and worker");
            print_details(&e);
            tally.failed += 1;
        }
        Ok(mut broker) => {
            run(&mut broker, &mut tally).await;
            if tally.failed > 0 {
                for log in ["server", "worker"] {
                    println!("# {log}.log (last 40 lines):");
                    print_details(&broker.tail(log, 40));
                }
            }
            drop(broker); // kills the server and the worker
        }
    }
    println!("{} passed, {} failed", tally.passed, tally.failed);
    if tally.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn run(broker: &mut Broker, tally: &mut Tally) {
    let started = async {
        broker.start_server(0).await?;
        broker.start_worker()
    };
    if let Err(e) = started.await {
        println!("not ok - 0 start taskbroker serve and worker");
        print_details(&e);
        tally.failed += 1;
        return;
    }
    println!(
        "# taskbroker serve --workers 0 on {} and one worker",
        broker.url
    );

    let mut client = match client::connect(&broker.url, FULL).await {
        Ok(c) => c,
        Err(e) => {
            tally.report("1", Err(e));
            tally.skip_rest("2", "no MCP 2026-07-28 connection (check 1)");
            return;
        }
    };
    tally.report("1", check_discover(&client));
    tally.report("2", check_sleep_task(&client).await);
    tally.report("2b", check_fail_task(&client).await);
    tally.report("2c", check_unknown_task(&client).await);

    match client::connect(&broker.url, PLAIN).await {
        Ok(mut plain) => {
            tally.report("3", check_plain_call(&plain).await);
            tally.report("3b", check_task_required(&plain).await);
            tally.report("3c", check_tasks_need_extension(&client, &plain).await);
            let _ = plain.close().await;
        }
        Err(e) => {
            tally.report("3", Err(e.clone()));
            tally.report("3b", Err(e.clone()));
            tally.report("3c", Err(e));
        }
    }

    tally.report("4", check_approve_task(&client).await);
    tally.report("5", check_cancel(&client).await);
    let (a, b) = check_restart(broker, &mut client).await;
    tally.report("6a", a);
    tally.report("6b", b);
    tally.report("7", check_task_notifications(&client).await);
    let _ = client.close().await;
}

/// Check 1: what rmcp's discover lifecycle learned from server/discover.
fn check_discover(client: &Client) -> Result<String, String> {
    let info = client
        .peer_info()
        .ok_or("rmcp kept no server info from server/discover")?;
    expect(
        info.protocol_version == ProtocolVersion::V_2026_07_28,
        || format!("negotiated protocol version {}", info.protocol_version),
    )?;
    expect(info.capabilities.supports_tasks(), || {
        format!(
            "server capabilities lack extensions[\"io.modelcontextprotocol/tasks\"]: {}",
            client::show(&info.capabilities)
        )
    })?;
    Ok(format!(
        "server {} speaks {}; capabilities {}",
        info.server_info
            .as_ref()
            .map_or("(unnamed)".to_owned(), |s| format!(
                "{} {}",
                s.name, s.version
            )),
        info.protocol_version,
        client::show(&info.capabilities)
    ))
}

/// Check 2: sleep {seconds: 1} -> task -> completed "slept 1 s".
async fn check_sleep_task(client: &Client) -> Result<String, String> {
    let task_id = client::call_task(client, "sleep", json!({ "seconds": 1 })).await?;
    let task = client::poll_until(client, &task_id, TASK_TIMEOUT, "completed", |t| {
        t.task.status() == rmcp::model::TaskStatus::Completed
    })
    .await?;
    let result = client::completed_result(&task)?;
    let text = client::text_of(&result);
    expect(text == "slept 1 s", || {
        format!(
            "result text {text:?}, expected \"slept 1 s\": {}",
            client::show(&result)
        )
    })?;
    expect(result.is_error != Some(true), || {
        format!("isError set: {}", client::show(&result))
    })?;
    Ok(format!("task {task_id}"))
}

/// Check 2b: a tool result with isError: true ends the task completed
/// (SEP-2663: `failed` is only for JSON-RPC errors).
async fn check_fail_task(client: &Client) -> Result<String, String> {
    let task_id =
        client::call_task(client, "fail", json!({ "message": "as asked by rmcp" })).await?;
    let task = client::poll_until(client, &task_id, TASK_TIMEOUT, "terminal", |t| {
        t.task.status().is_terminal()
    })
    .await?;
    let result = client::completed_result(&task)?;
    expect(result.is_error == Some(true), || {
        format!("completed without isError: true: {}", client::show(&result))
    })?;
    let text = client::text_of(&result);
    expect(text == "as asked by rmcp", || {
        format!("result text {text:?}")
    })?;
    Ok(format!("task {task_id}"))
}

/// Check 2c: an unknown taskId is -32602 (Invalid params) on tasks/get
/// (SEP-2663, Error Handling).
async fn check_unknown_task(client: &Client) -> Result<String, String> {
    let unknown = "00000000-0000-4000-8000-000000000000";
    match client::get(client, unknown).await {
        Ok(task) => Err(format!("tasks/get answered {}", client::show(&task))),
        Err(e) => {
            expect(e.contains("JSON-RPC error -32602 "), || {
                format!("expected -32602: {e}")
            })?;
            Ok(e)
        }
    }
}

/// Check 3: without the extension, a plain result.
async fn check_plain_call(plain: &Client) -> Result<String, String> {
    let args = json!({ "hello": "rmcp", "n": 3 });
    match client::call(plain, "echo", args.clone()).await? {
        CallToolResponse::Complete(result) => {
            expect(result.structured_content.as_ref() == Some(&args), || {
                format!(
                    "structuredContent is not the arguments: {}",
                    client::show(&result)
                )
            })?;
            let text: Value = serde_json::from_str(&client::text_of(&result)).map_err(|e| {
                format!(
                    "text is not the arguments as JSON ({e}): {}",
                    client::show(&result)
                )
            })?;
            expect(text == args, || {
                format!("text is not the arguments: {}", client::show(&result))
            })?;
            Ok(String::new())
        }
        other => Err(format!(
            "expected a plain result, got {}",
            client::show_response(&other)
        )),
    }
}

/// Check 3b: a task-only tool, called without the extension: the server
/// must not make a task, and says which capability is missing.
async fn check_task_required(plain: &Client) -> Result<String, String> {
    match client::call(plain, "sleep_as_task", json!({ "seconds": 1 })).await {
        Ok(other) => Err(format!(
            "expected an error, got {}",
            client::show_response(&other)
        )),
        Err(e) => {
            // The 2026-07-28 core schema: MISSING_REQUIRED_CLIENT_CAPABILITY
            // = -32021 (rmcp: ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY).
            // The tasks extension's own text still shows -32003.
            expect(e.contains("JSON-RPC error -32021 "), || {
                format!("expected -32021: {e}")
            })?;
            expect(e.contains("io.modelcontextprotocol/tasks"), || {
                format!("the error does not name the extension: {e}")
            })?;
            Ok(e)
        }
    }
}

/// Check 3c: tasks/get, tasks/update and tasks/cancel from a client that
/// does not declare the extension are -32021 (SEP-2663, Protocol Errors),
/// even for a task that exists (made here by the declaring client).
async fn check_tasks_need_extension(full: &Client, plain: &Client) -> Result<String, String> {
    let task_id = client::call_task(full, "sleep", json!({ "seconds": 0 })).await?;
    match client::get(plain, &task_id).await {
        Ok(task) => Err(format!("tasks/get answered {}", client::show(&task))),
        Err(e) => {
            expect(e.contains("JSON-RPC error -32021 "), || {
                format!("expected -32021: {e}")
            })?;
            Ok(e)
        }
    }
}

/// Poll until input_required; check it asks exactly one elicitation/create
/// with `question`; answer it with this client's handler via tasks/update.
async fn answer_approve(client: &Client, task_id: &str, question: &str) -> Result<(), String> {
    let task = client::poll_until(client, task_id, TASK_TIMEOUT, "input_required", |t| {
        t.task.status() == rmcp::model::TaskStatus::InputRequired
    })
    .await?;
    let requests = client::input_requests(&task)?;
    expect(requests.len() == 1, || {
        format!(
            "expected one inputRequests entry, got {}: {}",
            requests.len(),
            client::show(requests)
        )
    })?;
    let (key, request) = requests.iter().next().ok_or("no inputRequests")?;
    let method = client::method_of(request);
    expect(method == "elicitation/create", || {
        format!(
            "inputRequests[{key}] is {method:?}: {}",
            client::show(request)
        )
    })?;
    let wire = serde_json::to_value(request).map_err(|e| e.to_string())?;
    expect(
        wire.pointer("/params/message").and_then(Value::as_str) == Some(question),
        || format!("inputRequests[{key}] does not ask {question:?}: {wire}"),
    )?;
    let responses = client::answer_with_handler(client, requests).await?;
    expect(
        responses.get(key) == Some(&json!({ "action": "accept", "content": { "approved": true } })),
        || format!("the handler answered {}", client::show(&responses)),
    )?;
    client::update(client, task_id, responses).await
}

/// Check 4: approve as a task: input_required -> tasks/update -> "approved".
async fn check_approve_task(client: &Client) -> Result<String, String> {
    let question = "ship it?";
    let task_id = client::call_task(client, "approve", json!({ "question": question })).await?;
    answer_approve(client, &task_id, question).await?;
    let task = client::poll_until(client, &task_id, TASK_TIMEOUT, "completed", |t| {
        t.task.status() == rmcp::model::TaskStatus::Completed
    })
    .await?;
    let result = client::completed_result(&task)?;
    let text = client::text_of(&result);
    expect(text == "approved", || {
        format!("result text {text:?}: {}", client::show(&result))
    })?;
    let asked = client
        .service()
        .asked
        .lock()
        .map(|a| a.clone())
        .unwrap_or_default();
    expect(asked.iter().any(|q| q == question), || {
        format!("the handler was asked {asked:?}")
    })?;
    Ok(format!("task {task_id}"))
}

/// Check 5: sleep 60 -> tasks/cancel -> cancelled within a few seconds.
async fn check_cancel(client: &Client) -> Result<String, String> {
    let task_id = client::call_task(client, "sleep", json!({ "seconds": 60 })).await?;
    // Let the worker take it, so the cancel reaches a running tool.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = client::get(client, &task_id).await?;
    expect(!before.task.status().is_terminal(), || {
        format!("a 60 s sleep is already {}", client::status_of(&before))
    })?;
    // As the spec has it: cancel_task sends tasks/cancel and no
    // notifications/cancelled (which SEP-2663 forbids for tasks); rmcp
    // sends that notification only when a pending request's future is
    // dropped, which this test does not do here.
    client::cancel(client, &task_id).await?;
    client::poll_until(client, &task_id, Duration::from_secs(5), "cancelled", |t| {
        t.task.status() == rmcp::model::TaskStatus::Cancelled
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = client::get(client, &task_id).await?;
    expect(
        after.task.status() == rmcp::model::TaskStatus::Cancelled,
        || format!("cancelled, then {}", client::status_of(&after)),
    )?;
    Ok(format!(
        "task {task_id} was {} when cancelled",
        client::status_of(&before)
    ))
}

/// Check 6: tasks outlive a kill -9 of the server: the worker keeps running
/// the job, and a question out before the kill can be answered after it.
async fn check_restart(
    broker: &mut Broker,
    client: &mut Client,
) -> (Result<String, String>, Result<String, String>) {
    let question = "ship it after the restart?";
    let sleeping = client::call_task(client, "sleep", json!({ "seconds": 4 })).await;
    let asking = async {
        let task_id = client::call_task(client, "approve", json!({ "question": question })).await?;
        client::poll_until(client, &task_id, TASK_TIMEOUT, "input_required", |t| {
            t.task.status() == rmcp::model::TaskStatus::InputRequired
        })
        .await?;
        Ok::<_, String>(task_id)
    }
    .await;
    if sleeping.is_err() && asking.is_err() {
        return (sleeping, asking);
    }

    broker.kill_server();
    // A request while nothing listens: rmcp reports it as that request's
    // error (not shown as a check; it shows whether the client survives).
    if let Ok(id) = &sleeping {
        match client::get(client, id).await {
            Ok(task) => println!(
                "# tasks/get with the server down answered?! {}",
                client::show(&task)
            ),
            Err(e) => println!("# tasks/get with the server down: {e}"),
        }
    }
    let port = broker.port;
    if let Err(e) = broker.start_server(port).await {
        let e = format!("restart on port {port}: {e}");
        return (Err(e.clone()), Err(e));
    }
    let worker = if broker.worker_alive() {
        "the worker kept running"
    } else {
        "the worker died too"
    };
    println!(
        "# killed the server (SIGKILL), restarted it on {}; {worker}",
        broker.url
    );

    // The same rmcp client goes on: 2026-07-28 has no session, and each
    // request is its own POST.
    if let Err(e) = client::timed("tools/list after the restart", client.list_tools(None)).await {
        println!("# the rmcp client did not survive the restart ({e}); a new one on the same URL");
        let _ = client.close().await;
        *client = match client::connect(&broker.url, FULL).await {
            Ok(c) => c,
            Err(e) => return (Err(e.clone()), Err(e)),
        };
    }

    let a = async {
        let task_id = sleeping?;
        let task = client::poll_until(client, &task_id, TASK_TIMEOUT, "completed", |t| {
            t.task.status() == rmcp::model::TaskStatus::Completed
        })
        .await?;
        let result = client::completed_result(&task)?;
        let text = client::text_of(&result);
        expect(text == "slept 4 s", || {
            format!("result text {text:?}: {}", client::show(&result))
        })?;
        Ok(format!("task {task_id}; {worker}"))
    }
    .await;
    let b = async {
        let task_id = asking?;
        answer_approve(client, &task_id, question).await?;
        let task = client::poll_until(client, &task_id, TASK_TIMEOUT, "completed", |t| {
            t.task.status() == rmcp::model::TaskStatus::Completed
        })
        .await?;
        let result = client::completed_result(&task)?;
        let text = client::text_of(&result);
        expect(text == "approved", || {
            format!("result text {text:?}: {}", client::show(&result))
        })?;
        Ok(format!("task {task_id}"))
    }
    .await;
    let tail = |r: Result<String, String>, log: &str| {
        r.map_err(|e| format!("{e}\n{log} (last 20 lines):\n{}", broker.tail(log, 20)))
    };
    (tail(a, "worker"), tail(b, "server"))
}

/// Check 7: SEP-2663 task status notifications. A task is followed with
/// `subscriptions/listen {notifications: {taskIds: [id]}}` (rmcp's untyped
/// request: its typed filter has no taskIds); its `notifications/tasks`
/// arrive, decoded by rmcp, at `ClientHandler::on_task_status`, the last
/// one carrying the result inline.
async fn check_task_notifications(client: &Client) -> Result<String, String> {
    let task_id = client::call_task(client, "sleep", json!({ "seconds": 2 })).await?;
    let listen = client::listen_tasks(client, &[&task_id]).await?;
    let handler = client.service();
    let deadline = tokio::time::Instant::now() + TASK_TIMEOUT;
    let outcome = loop {
        let mine: Vec<_> = client::lock(&handler.task_statuses)
            .iter()
            .filter(|p| p.task.task.task_id == task_id)
            .cloned()
            .collect();
        if let Some(last) = mine.iter().find(|p| p.task.status().is_terminal()) {
            let states: Vec<String> = mine
                .iter()
                .map(|p| client::show(&p.task.status()))
                .collect();
            break Ok((last.clone(), states));
        }
        if tokio::time::Instant::now() >= deadline {
            break Err(format!(
                "no terminal notifications/tasks for {task_id} within {TASK_TIMEOUT:?}; got: {}",
                client::show(&mine)
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Ends the listen stream (rmcp: notifications/cancelled, which its
    // 2026-07-28 HTTP transport turns into closing that response).
    let _ = listen.cancel(Some("seen enough".into())).await;
    let (last, states) = outcome?;
    expect(
        last.task.status() == rmcp::model::TaskStatus::Completed,
        || format!("the task ended {}", client::show(&last)),
    )?;
    let result = match &last.task.payload {
        rmcp::model::TaskPayload::Completed { result } => {
            serde_json::from_value::<rmcp::model::CallToolResult>(Value::Object(result.clone()))
                .map_err(|e| format!("no CallToolResult inline ({e}): {}", client::show(&last)))?
        }
        _ => return Err(format!("no result inline: {}", client::show(&last))),
    };
    let text = client::text_of(&result);
    expect(text == "slept 2 s", || {
        format!("result text {text:?}: {}", client::show(&last))
    })?;
    let acks = client::lock(&handler.acknowledged).clone();
    Ok(format!(
        "task {task_id}: notifications {}; the acknowledgement as rmcp kept it: {} \
         (rmcp's SubscriptionFilter has no taskIds)",
        states.join(" -> "),
        client::show(&acks)
    ))
}
