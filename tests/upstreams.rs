//! Upstream MCP servers behind the broker (issue 25): the real `taskbroker`
//! binary with `[[upstream]]` in its config file, over real HTTP, in front
//! of the reference server `@modelcontextprotocol/server-everything` (npm,
//! installed by `npm ci` in tests/upstream, started by the broker over
//! stdio as a user's config would), on both storage drivers.
//!
//! What is proved: its tools are served with their schemas, annotations and
//! the configured task support; plain calls and task calls reach it;
//! progress, questions (elicitation) and results travel through the task;
//! a cancel stops the upstream call; the upstream's own tasks are followed
//! and recorded so they are never run twice; a crashed upstream is started
//! again; one down at start keeps its tools from the database; kill -9 of
//! the broker and of a worker process mid-call; bad configs and bad
//! upstreams are clear errors or clear states while the other tools serve.
//!
//! Skipped (one line on stderr) without node or tests/upstream/node_modules,
//! unless `TASKBROKER_REQUIRE_UPSTREAMS` is set (CI sets it).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[macro_use]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{
    Arg, Client, Driver, Server, SseReader, WorkerProc, everything_section, server_everything,
};
use serde_json::{Value, json};

const RELATED: &str = "io.modelcontextprotocol/related-task";

/// A broker in front of server-everything (`ev_` prefix).
fn broker(driver: Driver, script: &Path, more: &str, flags: &[&str]) -> Server {
    let config = everything_section(script, "everything", Some("ev_"), more);
    Server::start_with_config_on(driver, &config, flags)
}

async fn elicit_client(server: &Server) -> Client {
    let mut c = Client::new(&server.url);
    c.initialize_with(json!({ "elicitation": {} })).await;
    c
}

async fn wait_status(c: &mut Client, task_id: &str, status: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let t = c.ok("tasks/get", json!({ "taskId": task_id })).await;
        if t["status"] == status {
            return t;
        }
        assert!(Instant::now() < deadline, "task never {status}: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn text_of(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The tools/list of the broker, by name.
async fn listed(c: &mut Client) -> Vec<Value> {
    c.ok("tools/list", json!({})).await["tools"]
        .as_array()
        .unwrap()
        .clone()
}

fn tool<'a>(tools: &'a [Value], name: &str) -> Option<&'a Value> {
    tools.iter().find(|t| t["name"] == name)
}

/// The `upstreams` row of `name`: (state, last_error, restarts, served).
async fn upstream_row(
    server: &Server,
    name: &str,
) -> (String, Option<String>, i64, Option<String>) {
    let db = server.db_reader().await;
    let row = db
        .one::<(String, Option<String>, i64, Option<String>)>(
            "SELECT state, last_error, restarts, served FROM upstreams WHERE name = $1",
            &[Arg::Text(name.to_owned())],
        )
        .await;
    db.close().await;
    row
}

/// Wait until the `upstreams` row of `name` is in `state`.
async fn wait_upstream_state(server: &Server, name: &str, state: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let db = server.db_reader().await;
        let now = db
            .scalar_optional::<String>(
                "SELECT state FROM upstreams WHERE name = $1",
                &[Arg::Text(name.to_owned())],
            )
            .await;
        db.close().await;
        if now.as_deref() == Some(state) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "upstream {name} never {state} (now {now:?}): {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Open `tasks/result` of a task waiting for its client: the stream, and
/// the first request the broker sends on it (the upstream's question).
async fn question_on_result_stream(c: &mut Client, task_id: &str) -> (SseReader, Value) {
    let (_, response) = c
        .post_stream("tasks/result", json!({ "taskId": task_id }))
        .await;
    let mut sse = SseReader::new(response);
    loop {
        let (_, m) = sse.next_message().await.expect("the question");
        if m.get("method").is_some() && m.get("id").is_some() {
            return (sse, m);
        }
    }
}

/// Answer `request` with `result` (a POST, 202) and read the stream on
/// to the task's result (or error).
async fn answer_on_result_stream(
    c: &Client,
    sse: &mut SseReader,
    request: &Value,
    result: Value,
) -> Value {
    let body = json!({ "jsonrpc": "2.0", "id": request["id"], "result": result });
    let raw = c.post_raw(c.headers(), body.to_string()).await;
    assert_eq!(raw.status, 202, "{}", raw.body);
    loop {
        let (_, m) = sse.next_message().await.expect("the result");
        if m.get("result").is_some() || m.get("error").is_some() {
            return m;
        }
    }
}

/// `/readyz`: the HTTP status and the body.
async fn readyz(server: &Server) -> (u16, Value) {
    let response = reqwest::get(server.url.replace("/mcp", "/readyz"))
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// The job's checkpoint of a task.
async fn checkpoint_of(server: &Server, task_id: &str) -> Option<String> {
    let db = server.db_reader().await;
    let checkpoint = db
        .scalar_optional::<Option<String>>(
            "SELECT j.checkpoint FROM jobs j JOIN tasks t ON t.seq = j.task_seq WHERE t.task_id = $1",
            &[Arg::Text(task_id.to_owned())],
        )
        .await
        .flatten();
    db.close().await;
    checkpoint
}

/// Issue 25 items 1 and 6: the upstream's tools are served under the
/// prefix, with their schemas, annotations and title as the upstream lists
/// them and `execution.taskSupport` as configured (per tool over the
/// upstream's default); plain calls reach it; the listing is kept in the
/// database with the upstream's state.
async fn tools_are_served_as_listed_and_plain_calls_reach_the_upstream(driver: Driver) {
    let Some(script) = server_everything() else {
        return;
    };
    let server = broker(
        driver,
        &script,
        "task_support = \"optional\"\n[upstream.tools.echo]\ntask_support = \"forbidden\"\n",
        &[],
    );
    let mut c = server.client().await;
    let tools = listed(&mut c).await;
    let echo = tool(&tools, "ev_echo").unwrap_or_else(|| panic!("no ev_echo in {tools:?}"));
    assert_eq!(echo["execution"]["taskSupport"], "forbidden", "{echo}");
    assert!(
        echo["inputSchema"]["properties"]["message"].is_object(),
        "{echo}"
    );
    assert!(echo["annotations"].is_object(), "annotations kept: {echo}");
    let research = tool(&tools, "ev_simulate-research-query").unwrap();
    assert_eq!(
        research["execution"]["taskSupport"], "optional",
        "{research}"
    );
    assert_eq!(research["title"], "Simulate Research Query", "{research}");
    // The broker's own tools are still served beside them.
    assert!(tool(&tools, "sleep").is_some());

    let result = c
        .ok(
            "tools/call",
            json!({ "name": "ev_echo", "arguments": { "message": "through the broker" } }),
        )
        .await;
    assert_eq!(text_of(&result), "Echo: through the broker", "{result}");
    // Arguments are checked against the upstream's schema by the broker.
    let refused = c
        .ok(
            "tools/call",
            json!({ "name": "ev_echo", "arguments": { "message": 12 } }),
        )
        .await;
    assert_eq!(refused["isError"], true, "{refused}");

    let (state, last_error, restarts, served) = upstream_row(&server, "everything").await;
    assert_eq!(state, "ready");
    assert_eq!(last_error, None);
    assert_eq!(restarts, 0);
    let served: Vec<String> = serde_json::from_str(&served.unwrap()).unwrap();
    assert!(served.contains(&"ev_echo".to_owned()), "{served:?}");

    // The console's overview (loopback, no tokens) lists it.
    let overview: Value = reqwest::get(server.url.replace("/mcp", "/ui/api/overview"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let row = &overview["upstreams"][0];
    assert_eq!(row["name"], "everything", "{overview}");
    assert_eq!(row["state"], "ready", "{overview}");
    assert_eq!(row["tools"], json!(served.len()), "{overview}");
    assert_eq!(row["restarts"], 0, "{overview}");
}
both_drivers!(tools_are_served_as_listed_and_plain_calls_reach_the_upstream);

/// Issue 25 items 2 and 3: a task call of an upstream tool runs in a
/// worker; the upstream's progress notifications become the task's
/// progress (stored rows), its result the task's result. Issue 27 item 3:
/// the task carries the retention rule of its upstream, a per-tool
/// section winning over the upstream's own.
async fn a_task_call_relays_progress_and_ends_with_the_upstreams_result(driver: Driver) {
    let Some(script) = server_everything() else {
        return;
    };
    let server = broker(
        driver,
        &script,
        "retain_completed = \"8d\"\nretain_failed = \"8d\"\narchive = true\n\
         [upstream.tools.trigger-long-running-operation]\nretain_failed = \"9d\"\n",
        &[],
    );
    let mut c = server.client().await;
    let task = c
        .call_task(
            "ev_trigger-long-running-operation",
            json!({ "duration": 2, "steps": 4 }),
        )
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let done = c.wait_terminal(&task_id, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let result = c.ok("tasks/result", json!({ "taskId": task_id })).await;
    assert!(
        text_of(&result).contains("Long running operation completed"),
        "{result}"
    );
    let db = server.db_reader().await;
    let progress: i64 = db
        .scalar(
            "SELECT COUNT(*) FROM task_progress p JOIN tasks t ON t.seq = p.task_seq WHERE t.task_id = $1",
            &[Arg::Text(task_id.clone())],
        )
        .await;
    let rule: (Option<i64>, Option<i64>, Option<i64>) = db
        .one(
            "SELECT retain_completed_ms, retain_failed_ms, retain_cancelled_ms FROM tasks WHERE task_id = $1",
            &[Arg::Text(task_id.clone())],
        )
        .await;
    let archived: i64 = db
        .scalar(
            "SELECT CAST(CASE WHEN archive THEN 1 ELSE 0 END AS BIGINT) FROM tasks WHERE task_id = $1",
            &[Arg::Text(task_id.clone())],
        )
        .await;
    db.close().await;
    assert_eq!(
        rule,
        (Some(8 * 86_400_000), Some(9 * 86_400_000), None),
        "the upstream's rule, its tool's section winning"
    );
    assert_eq!(archived, 1);
    assert!(progress >= 1, "no progress stored");
    // A tool the upstream does not run as a task: the checkpoint says the
    // call was sent (so a lost run is not repeated unless allowed).
    assert_eq!(
        checkpoint_of(&server, &task_id).await.as_deref(),
        Some(r#"{"sent":true}"#)
    );
}
both_drivers!(a_task_call_relays_progress_and_ends_with_the_upstreams_result);

/// Issue 25 item 3: an elicitation of the upstream during a task makes the
/// task input_required; the request reaches the client on tasks/result with
/// the related-task `_meta` (2025-11-25); the client's answer goes back to
/// the upstream, whose result shows it.
async fn an_upstream_question_is_answered_through_the_task(driver: Driver) {
    let Some(script) = server_everything() else {
        return;
    };
    let server = broker(driver, &script, "", &[]);
    let mut c = elicit_client(&server).await;
    let task = c
        .call_task("ev_trigger-elicitation-request", json!({}))
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    wait_status(&mut c, &task_id, "input_required", Duration::from_secs(20)).await;
    let (mut sse, request) = question_on_result_stream(&mut c, &task_id).await;
    assert_eq!(request["method"], "elicitation/create", "{request}");
    assert_eq!(
        request["params"]["_meta"][RELATED]["taskId"],
        task_id.as_str()
    );
    let answer =
        json!({ "action": "accept", "content": { "name": "Ada Lovelace", "check": true } });
    let last = answer_on_result_stream(&c, &mut sse, &request, answer).await;
    let text = last["result"].to_string();
    assert!(
        text.contains("Ada Lovelace"),
        "the answer reached the upstream: {last}"
    );
}
both_drivers!(an_upstream_question_is_answered_through_the_task);

/// Issue 25 item 4: tasks/cancel of a running upstream call ends the task
/// cancelled at once, and the upstream stays usable.
async fn a_cancel_stops_the_upstream_call(driver: Driver) {
    let Some(script) = server_everything() else {
        return;
    };
    let server = broker(driver, &script, "", &[]);
    let mut c = server.client().await;
    let task = c
        .call_task(
            "ev_trigger-long-running-operation",
            json!({ "duration": 60, "steps": 60 }),
        )
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    server
        .wait_for_log("job started", Duration::from_secs(10))
        .await;
    let asked = Instant::now();
    let cancelled = c.ok("tasks/cancel", json!({ "taskId": task_id })).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    server
        .wait_for_log("job stopped: task cancelled", Duration::from_secs(10))
        .await;
    assert!(asked.elapsed() < Duration::from_secs(10));
    let result = c
        .ok(
            "tools/call",
            json!({ "name": "ev_echo", "arguments": { "message": "still there" } }),
        )
        .await;
    assert_eq!(text_of(&result), "Echo: still there");
}
both_drivers!(a_cancel_stops_the_upstream_call);

/// Issue 25 item 5: a tool the upstream runs as its own task (it declares
/// `tasks.requests.tools.call`; `simulate-research-query` is task-only):
/// the worker creates the upstream task, keeps its id in the job's row,
/// follows it to its result; its status messages become the task's.
async fn an_upstream_task_is_followed_and_its_id_kept(driver: Driver) {
    let Some(script) = server_everything() else {
        return;
    };
    let server = broker(driver, &script, "", &[]);
    let mut c = server.client().await;
    let task = c
        .call_task(
            "ev_simulate-research-query",
            json!({ "topic": "durable tasks" }),
        )
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let done = c.wait_terminal(&task_id, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let result = c.ok("tasks/result", json!({ "taskId": task_id })).await;
    assert!(
        result.to_string().contains("durable tasks"),
        "the upstream's report: {result}"
    );
    let checkpoint = checkpoint_of(&server, &task_id).await.unwrap();
    let checkpoint: Value = serde_json::from_str(&checkpoint).unwrap();
    assert!(
        checkpoint["upstreamTask"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{checkpoint}"
    );
}
both_drivers!(an_upstream_task_is_followed_and_its_id_kept);

/// The pid of the server-everything process started for `config_dir`'s
/// broker (its command line names the script).
fn upstream_pids(script: &Path) -> Vec<i32> {
    let out = std::process::Command::new("pgrep")
        .arg("-f")
        .arg(format!("{} stdio", script.display()))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Issue 25 item 1 (restart) and the test list's "an upstream that crashes
/// mid-call": the call fails naming the upstream and the reason; the broker
/// starts the server again (the restart counted in the database and in
/// `/metrics`), and the next call works.
async fn a_crashed_upstream_fails_its_call_clearly_and_is_started_again(driver: Driver) {
    let Some(script) = server_everything() else {
        return;
    };
    // A copy of the script path no other test's broker uses, to find this
    // broker's server process.
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("everything.mjs");
    std::fs::write(&own, format!("import '{}';\n", script.display())).unwrap();
    let server = broker(driver, &own, "", &[]);
    let mut c = server.client().await;
    let task = c
        .call_task(
            "ev_trigger-long-running-operation",
            json!({ "duration": 60, "steps": 60 }),
        )
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    server
        .wait_for_log("job started", Duration::from_secs(10))
        .await;
    let pids = upstream_pids(&own);
    assert_eq!(pids.len(), 1, "one server process: {pids:?}");
    std::process::Command::new("kill")
        .args(["-9", &pids[0].to_string()])
        .status()
        .unwrap();
    let done = c.wait_terminal(&task_id, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "failed", "{done}");
    let error = c
        .request("tasks/result", json!({ "taskId": task_id }))
        .await;
    let message = error["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("upstream 'everything'") && message.contains("lost"),
        "{error}"
    );
    server
        .wait_for_log(
            "upstream connection ended; starting it again",
            Duration::from_secs(10),
        )
        .await;
    wait_upstream_state(&server, "everything", "ready", Duration::from_secs(20)).await;
    let (_, _, restarts, _) = upstream_row(&server, "everything").await;
    assert_eq!(restarts, 1);
    let result = c
        .ok(
            "tools/call",
            json!({ "name": "ev_echo", "arguments": { "message": "again" } }),
        )
        .await;
    assert_eq!(text_of(&result), "Echo: again");
    let metrics = reqwest::get(server.url.replace("/mcp", "/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("taskbroker_upstream_restarts_total{upstream=\"everything\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "taskbroker_upstream_calls_total{upstream=\"everything\",outcome=\"error\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("taskbroker_upstream_up{upstream=\"everything\"} 1"),
        "{metrics}"
    );
    let sample = |prefix: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {prefix}: {metrics}"))
    };
    let ok = sample("taskbroker_upstream_calls_total{upstream=\"everything\",outcome=\"ok\"} ");
    assert!(ok >= 1.0, "the call after the restart counts: {metrics}");
    let timed = sample("taskbroker_upstream_call_duration_seconds_count{upstream=\"everything\"} ");
    assert_eq!(
        timed,
        ok + 1.0,
        "every call is timed, the failed one too: {metrics}"
    );
}
both_drivers!(a_crashed_upstream_fails_its_call_clearly_and_is_started_again);

/// Issue 25 item 1: an upstream that cannot be started is a warning and a
/// clear state, not a refusal to start: its tools stay served from the
/// listing kept in the database, the broker's other tools serve, and a
/// call waits for it, then fails after its timeout naming the upstream and
/// the reason.
async fn an_upstream_down_at_start_keeps_its_tools_and_calls_fail_after_their_timeout(
    driver: Driver,
) {
    let Some(script) = server_everything() else {
        return;
    };
    let mut server = broker(driver, &script, "timeout = \"2s\"\n", &[]);
    let mut c = server.client().await;
    assert!(tool(&listed(&mut c).await, "ev_echo").is_some());
    let (code, ready) = readyz(&server).await;
    assert_eq!(
        (code, &ready["upstreams"]["everything"]),
        (200, &json!("ready")),
        "{ready}"
    );
    // The same upstream, now a program that exits at once.
    let config = std::fs::read_to_string(server.config_path()).unwrap();
    let broken = config.replace(
        &format!("command = [\"node\", \"{}\", \"stdio\"]", script.display()),
        "command = [\"sh\", \"-c\", \"echo 'no server here' >&2; exit 3\"]",
    );
    assert_ne!(broken, config);
    std::fs::write(server.config_path(), broken).unwrap();
    server.kill_and_restart();
    let mut c = server.client().await;
    let tools = listed(&mut c).await;
    assert!(
        tool(&tools, "ev_echo").is_some(),
        "kept from the database: {tools:?}"
    );
    assert!(tool(&tools, "sleep").is_some());
    wait_upstream_state(&server, "everything", "down", Duration::from_secs(10)).await;
    let (_, last_error, _, _) = upstream_row(&server, "everything").await;
    let last_error = last_error.unwrap();
    assert!(last_error.contains("everything"), "{last_error}");
    // /readyz: still ready (the broker serves), with the upstream's state
    // and reason as detail.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, ready) = readyz(&server).await;
        assert_eq!(
            code, 200,
            "a down upstream does not make the broker unready: {ready}"
        );
        let state = ready["upstreams"]["everything"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if state.starts_with("down: ") {
            assert!(state.contains("exit status: 3"), "{ready}");
            break;
        }
        assert!(Instant::now() < deadline, "never down in /readyz: {ready}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let task = c
        .call_task("ev_echo", json!({ "message": "anyone?" }))
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let done = c.wait_terminal(&task_id, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "failed", "{done}");
    let error = c
        .request("tasks/result", json!({ "taskId": task_id }))
        .await;
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("upstream 'everything'") && message.contains("timeout"),
        "{error}"
    );
    // Other tools serve.
    let echo = c
        .ok(
            "tools/call",
            json!({ "name": "echo", "arguments": { "a": 1 } }),
        )
        .await;
    assert!(text_of(&echo).contains("\"a\":1"), "{echo}");
}
both_drivers!(an_upstream_down_at_start_keeps_its_tools_and_calls_fail_after_their_timeout);

/// Issue 25 "bad input": two upstreams with colliding tool names and no
/// prefix (and one colliding with the built-in demo `echo`): the first
/// source wins, each tool left out is a warning naming why, and everything
/// else serves. A server that answers garbage is a clear state.
#[tokio::test]
async fn colliding_names_and_a_garbage_server_are_clear_states_not_failures() {
    let Some(script) = server_everything() else {
        return;
    };
    let config = format!(
        "{}{}{}",
        everything_section(&script, "first", None, ""),
        everything_section(&script, "second", None, ""),
        "[[upstream]]\nname = \"garbage\"\ncommand = [\"sh\", \"-c\", \"echo '<html>hello</html>'; exit 0\"]\n",
    );
    let server = Server::start_with_config(&config, &[]);
    let log = server
        .wait_for_log("an upstream tool is not served", Duration::from_secs(20))
        .await;
    assert!(
        log.contains("a built-in or command tool already serves a tool named 'echo' (give upstream 'first' a prefix)"),
        "{log}"
    );
    server
        .wait_for_log(
            "upstream 'first' already serves a tool named 'get-sum' (give upstream 'second' a prefix)",
            Duration::from_secs(20),
        )
        .await;
    wait_upstream_state(&server, "garbage", "down", Duration::from_secs(20)).await;
    let (_, last_error, _, _) = upstream_row(&server, "garbage").await;
    assert!(
        last_error.unwrap().contains("<html>"),
        "the garbage is quoted"
    );
    let mut c = server.client().await;
    let sum = c
        .ok(
            "tools/call",
            json!({ "name": "get-sum", "arguments": { "a": 2, "b": 3 } }),
        )
        .await;
    assert!(text_of(&sum).contains('5'), "{sum}");
    let echo = c
        .ok(
            "tools/call",
            json!({ "name": "echo", "arguments": { "x": 1 } }),
        )
        .await;
    assert!(
        text_of(&echo).contains("\"x\":1"),
        "the demo echo won: {echo}"
    );
}

/// Issue 25 "bad input": a config naming a missing program, or an unknown
/// setting, is refused at start with `file:line: reason`.
#[test]
fn a_bad_upstream_config_is_refused_with_file_line_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    for (config, expected) in [
        (
            "[[upstream]]\nname = \"x\"\ncommand = [\"no-such-program-here\"]\n",
            "taskbroker.toml:3: upstream 'x': command 'no-such-program-here' is not on PATH",
        ),
        (
            "[[upstream]]\nname = \"x\"\ncommand = [\"sh\"]\nretry = \"sometimes\"\n",
            "taskbroker.toml:4: upstream 'x': retry 'sometimes' (expected never or always)",
        ),
        (
            "[[upstream]]\nname = \"x\"\ncommand = [\"sh\"]\n[upstream.tools.t]\ntimout = 3\n",
            "unknown field `timout`",
        ),
        (
            "[[upstream]]\nname = \"x\"\n",
            "taskbroker.toml:2: upstream 'x': give the server's command",
        ),
        (
            "[[upstream]]\nname = \"x\"\nurl = \"http://127.0.0.1:9/mcp\"\nprotocol = \"2024-01-01\"\n",
            "taskbroker.toml:4: upstream 'x': protocol '2024-01-01' is not one this broker speaks to servers",
        ),
        (
            "[[upstream]]\nname = \"x\"\ncommand = [\"sh\"]\nprotocol = \"2026-07-28\"\n",
            "taskbroker.toml:4: upstream 'x': protocol applies to an HTTP server (url)",
        ),
        (
            "[[upstream]]\nname = \"x\"\ncommand = [\"sh\"]\nprincipals = []\n",
            "taskbroker.toml:4: upstream 'x': principals = [] would hide its tools from every client",
        ),
    ] {
        std::fs::write(dir.path().join("taskbroker.toml"), config).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_taskbroker"))
            .current_dir(dir.path())
            .args([
                "serve",
                "--config",
                "taskbroker.toml",
                "--listen",
                "127.0.0.1:0",
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{config}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{config}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    }
}

/// Issue 25 "kill -9 of the broker in the middle of an upstream call": with
/// `retry = "always"` the next run calls again and the client gets the
/// result through tasks/result after the restart; with the default the
/// task fails saying why it was not sent again.
async fn kill9_of_the_broker_mid_call_resumes_or_fails_as_configured(driver: Driver) {
    let Some(script) = server_everything() else {
        return;
    };
    for retry in ["always", "never"] {
        let more =
            format!("[upstream.tools.trigger-long-running-operation]\nretry = \"{retry}\"\n");
        let mut server = broker(driver, &script, &more, &["--lease", "2"]);
        let mut c = server.client().await;
        let task = c
            .call_task(
                "ev_trigger-long-running-operation",
                json!({ "duration": 3, "steps": 3 }),
            )
            .await;
        let task_id = task["taskId"].as_str().unwrap().to_owned();
        // Killed once the call may have reached the upstream (the job
        // keeps that before it sends).
        let deadline = Instant::now() + Duration::from_secs(15);
        while checkpoint_of(&server, &task_id).await.as_deref() != Some(r#"{"sent":true}"#) {
            assert!(Instant::now() < deadline, "never sent: {}", server.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server.kill_and_restart();
        c.reconnect(&server.url);
        let done = c.wait_terminal(&task_id, Duration::from_secs(40)).await;
        if retry == "always" {
            assert_eq!(done["status"], "completed", "{done}");
            let result = c.ok("tasks/result", json!({ "taskId": task_id })).await;
            assert!(text_of(&result).contains("completed"), "{result}");
        } else {
            assert_eq!(done["status"], "failed", "{done}");
            let error = c
                .request("tasks/result", json!({ "taskId": task_id }))
                .await;
            let message = error["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("retry = \"always\""), "{error}");
        }
    }
}
both_drivers!(kill9_of_the_broker_mid_call_resumes_or_fails_as_configured);

/// Issue 25 item 2: with `--workers 0` the broker runs no job; a
/// `taskbroker worker` process with the same config holds its own upstream
/// connection and runs the call; killed with kill -9 mid-call, another
/// worker process runs it again (`retry = "always"`) and the client gets
/// the result.
async fn a_worker_process_runs_upstream_calls_and_survives_kill9(driver: Driver) {
    let Some(script) = server_everything() else {
        return;
    };
    let server = broker(
        driver,
        &script,
        "retry = \"always\"\n",
        &["--workers", "0", "--lease", "2"],
    );
    let config = server.config_path();
    let mut first = WorkerProc::start(&server, 1, &["--config", &config, "--lease", "2"]);
    let mut c = server.client().await;
    let task = c
        .call_task(
            "ev_trigger-long-running-operation",
            json!({ "duration": 3, "steps": 3 }),
        )
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !first.log().contains("job started") {
        assert!(Instant::now() < deadline, "{}", first.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.kill9();
    let second = WorkerProc::start(&server, 2, &["--config", &config, "--lease", "2"]);
    let done = c.wait_terminal(&task_id, Duration::from_secs(40)).await;
    assert_eq!(done["status"], "completed", "{done} {}", second.log());
    assert!(second.log().contains("upstream ready"), "{}", second.log());
}
both_drivers!(a_worker_process_runs_upstream_calls_and_survives_kill9);

/// Issue 25 item 6: an upstream that comes up after the broker started
/// (nothing kept from an earlier run) adds its tools: the broker then
/// declares `tools.listChanged`, tells the open GET stream of a 2025-11-25
/// session `notifications/tools/list_changed`, and tools/list has them.
async fn tools_arriving_later_are_announced_with_list_changed(driver: Driver) {
    let Some(script) = server_everything() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("up");
    // The upstream's program fails until the file `up` exists.
    let config = format!(
        "[[upstream]]\nname = \"late\"\nprefix = \"late_\"\ninclude = [\"get-sum\"]\n\
         command = [\"sh\", \"-c\", \"test -e '{}' || exit 4; exec node '{}' stdio\"]\n",
        gate.display(),
        script.display()
    );
    let server = Server::start_with_config_on(driver, &config, &[]);
    let mut c = Client::new(&server.url);
    let init = c.initialize().await;
    assert_eq!(init["capabilities"]["tools"]["listChanged"], true, "{init}");
    assert!(tool(&listed(&mut c).await, "late_get-sum").is_none());
    let mut h = c.headers();
    h.insert(
        "accept",
        reqwest::header::HeaderValue::from_static("text/event-stream"),
    );
    let response = c.http.get(&c.url).headers(h).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut sse = SseReader::new(response);

    std::fs::write(&gate, "").unwrap();
    let message = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let (_, m) = sse.next_message().await.expect("the stream stays open");
            if m["method"] == "notifications/tools/list_changed" {
                break m;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no list_changed: {}", server.log()));
    assert!(message.get("id").is_none(), "a notification: {message}");
    let tools = listed(&mut c).await;
    assert!(tool(&tools, "late_get-sum").is_some(), "{tools:?}");
}
both_drivers!(tools_arriving_later_are_announced_with_list_changed);

/// Issue 25 item 1: `principals` on an upstream: its tools are listed to
/// and callable by those principals only (plainly and as tasks, in both
/// protocol generations); to any other client, a token's or none, they do
/// not exist. The broker's own tools serve everyone. The upstream's
/// credentials (its `env`) are not in the log.
async fn an_upstreams_tools_serve_only_its_principals(driver: Driver) {
    let Some(script) = server_everything() else {
        return;
    };
    let server = broker(
        driver,
        &script,
        "principals = [\"alice\"]\ninclude = [\"get-sum\"]\nenv = { API_KEY = \"s3cret-value\" }\n",
        &[],
    );
    let alice_token = common::create_token(&server, "alice", &[]);
    let bob_token = common::create_token(&server, "bob", &[]);
    let session_of = |token: &str| {
        let mut c = Client::new(&server.url);
        c.token = Some(token.to_owned());
        c
    };
    let mut alice = session_of(&alice_token);
    alice.initialize().await;
    let mut bob = session_of(&bob_token);
    bob.initialize().await;

    assert!(tool(&listed(&mut alice).await, "ev_get-sum").is_some());
    let sum = alice
        .ok(
            "tools/call",
            json!({ "name": "ev_get-sum", "arguments": { "a": 2, "b": 3 } }),
        )
        .await;
    assert_eq!(text_of(&sum), "The sum of 2 and 3 is 5.");
    let task = alice
        .call_task("ev_get-sum", json!({ "a": 1, "b": 1 }))
        .await;
    let done = alice
        .wait_terminal(task["taskId"].as_str().unwrap(), Duration::from_secs(20))
        .await;
    assert_eq!(done["status"], "completed", "{done}");

    let bobs = listed(&mut bob).await;
    assert!(tool(&bobs, "ev_get-sum").is_none(), "{bobs:?}");
    assert!(
        tool(&bobs, "sleep").is_some(),
        "the broker's own tools serve everyone"
    );
    for params in [
        json!({ "name": "ev_get-sum", "arguments": { "a": 2, "b": 3 } }),
        json!({ "name": "ev_get-sum", "arguments": { "a": 2, "b": 3 }, "task": { "ttl": 60000 } }),
    ] {
        let refused = bob.request("tools/call", params).await;
        assert_eq!(refused["error"]["code"], -32602, "{refused}");
        assert_eq!(
            refused["error"]["message"], "Unknown tool: ev_get-sum",
            "as if it did not exist: {refused}"
        );
    }

    // MCP 2026-07-28, with bob's token: not listed (the list is private to
    // each principal), not callable.
    let post = |token: &str, id: i64, method: &str, params: Value| {
        let mut params = params;
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        let mut request = reqwest::Client::new()
            .post(&server.url)
            .bearer_auth(token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", method)
            .json(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        if let Some(name) = params.get("name").and_then(Value::as_str) {
            request = request.header("mcp-name", name);
        }
        request
    };
    let listed: Value = post(&bob_token, 1, "tools/list", json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        !names.contains(&"ev_get-sum") && names.contains(&"sleep"),
        "{listed}"
    );
    assert_eq!(listed["result"]["cacheScope"], "private", "{listed}");
    let refused: Value = post(
        &bob_token,
        2,
        "tools/call",
        json!({ "name": "ev_get-sum", "arguments": { "a": 2, "b": 3 } }),
    )
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(
        refused["error"]["message"], "Unknown tool: ev_get-sum",
        "{refused}"
    );
    let called: Value = post(
        &alice_token,
        3,
        "tools/call",
        json!({ "name": "ev_get-sum", "arguments": { "a": 2, "b": 3 } }),
    )
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(
        called["result"]["content"][0]["text"], "The sum of 2 and 3 is 5.",
        "{called}"
    );
    // The upstream's credentials never reach the log.
    assert!(!server.log().contains("s3cret-value"), "{}", server.log());
}
both_drivers!(an_upstreams_tools_serve_only_its_principals);

// ---------------------------------------------------------------------
// Streamable HTTP upstreams.
// ---------------------------------------------------------------------

/// Issue 25 items 1-4 over Streamable HTTP: server-everything started as
/// its users start it (`streamableHttp`), declared with `url`, a header
/// and a bearer token read from the environment. Its tools are served
/// (those it registers after the handshake too: its tools/list_changed
/// comes on the session's GET stream); a plain call, a task with the
/// upstream's progress, an elicitation answered through the task, and a
/// cancel all work; the token is never in the log.
async fn an_http_upstream_serves_plain_calls_tasks_questions_and_cancels(driver: Driver) {
    let Some(script) = server_everything() else {
        return;
    };
    let upstream = common::EverythingHttp::start(&script);
    let config = format!(
        "[[upstream]]\nname = \"web\"\nprefix = \"ev_\"\nurl = \"{}\"\n\
         headers = {{ X-Client = \"taskbroker-tests\" }}\nbearer_token_env = \"TB_TEST_UPSTREAM_TOKEN\"\n",
        upstream.url
    );
    let server = Server::start_with_config_on_env(
        driver,
        &config,
        &[],
        &[("TB_TEST_UPSTREAM_TOKEN", "tok-Secret-42")],
    );
    let mut c = elicit_client(&server).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while tool(&listed(&mut c).await, "ev_trigger-elicitation-request").is_none() {
        assert!(Instant::now() < deadline, "{}", server.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let sum = c
        .ok(
            "tools/call",
            json!({ "name": "ev_get-sum", "arguments": { "a": 2, "b": 3 } }),
        )
        .await;
    assert_eq!(text_of(&sum), "The sum of 2 and 3 is 5.");

    let task = c
        .call_task(
            "ev_trigger-long-running-operation",
            json!({ "duration": 1, "steps": 2 }),
        )
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let done = c.wait_terminal(&task_id, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let db = server.db_reader().await;
    let progress: i64 = db
        .scalar(
            "SELECT COUNT(*) FROM task_progress p JOIN tasks t ON t.seq = p.task_seq WHERE t.task_id = $1",
            &[Arg::Text(task_id.clone())],
        )
        .await;
    db.close().await;
    assert!(progress >= 1, "the upstream's progress was kept");

    // A question of the upstream, answered through the task.
    let task = c
        .call_task("ev_trigger-elicitation-request", json!({}))
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    wait_status(&mut c, &task_id, "input_required", Duration::from_secs(20)).await;
    let (mut sse, request) = question_on_result_stream(&mut c, &task_id).await;
    assert_eq!(request["method"], "elicitation/create", "{request}");
    let answer =
        json!({ "action": "accept", "content": { "name": "Ada Lovelace", "check": true } });
    let last = answer_on_result_stream(&c, &mut sse, &request, answer).await;
    assert!(
        last["result"].to_string().contains("Ada Lovelace"),
        "{last}"
    );

    // A cancel ends the task cancelled.
    let task = c
        .call_task(
            "ev_trigger-long-running-operation",
            json!({ "duration": 60, "steps": 60 }),
        )
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    while checkpoint_of(&server, &task_id).await.is_none() {
        assert!(Instant::now() < deadline, "never sent: {}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.ok("tasks/cancel", json!({ "taskId": task_id })).await;
    let cancelled = c.wait_terminal(&task_id, Duration::from_secs(10)).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");

    let (state, _, _, _) = upstream_row(&server, "web").await;
    assert_eq!(state, "ready");
    assert!(
        !server.log().contains("tok-Secret-42"),
        "the token is never logged"
    );
}
both_drivers!(an_http_upstream_serves_plain_calls_tasks_questions_and_cancels);

/// Issue 25 "bad input": a URL that refuses is a clear state (down, with
/// the reason), not a refusal to start; the broker's own tools serve. A
/// bad url, a missing token variable, or both command and url are
/// refused at start with file:line.
#[tokio::test]
async fn an_http_upstream_that_refuses_is_a_clear_state_and_bad_http_configs_are_refused() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = format!("[[upstream]]\nname = \"gone\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n");
    let server = Server::start_with_config(&config, &[]);
    wait_upstream_state(&server, "gone", "down", Duration::from_secs(20)).await;
    let (_, last_error, _, _) = upstream_row(&server, "gone").await;
    let last_error = last_error.unwrap();
    assert!(
        last_error.contains(&format!("cannot reach http://127.0.0.1:{port}/mcp")),
        "{last_error}"
    );
    let mut c = server.client().await;
    let echo = c
        .ok(
            "tools/call",
            json!({ "name": "echo", "arguments": { "a": 1 } }),
        )
        .await;
    assert!(text_of(&echo).contains("\"a\":1"), "{echo}");

    let dir = tempfile::tempdir().unwrap();
    for (config, expected) in [
        (
            "[[upstream]]\nname = \"x\"\nurl = \"ftp://example\"\n",
            "taskbroker.toml:3: upstream 'x': url 'ftp://example' is not an http:// or https:// URL",
        ),
        (
            "[[upstream]]\nname = \"x\"\nurl = \"http://127.0.0.1:9/mcp\"\nbearer_token_env = \"TB_NO_SUCH_VARIABLE_SET\"\n",
            "taskbroker.toml:4: upstream 'x': bearer_token_env: the environment variable TB_NO_SUCH_VARIABLE_SET is not set",
        ),
        (
            "[[upstream]]\nname = \"x\"\ncommand = [\"sh\"]\nurl = \"http://127.0.0.1:9/mcp\"\n",
            "taskbroker.toml:4: upstream 'x': give either command (a stdio server) or url (an HTTP server), not both",
        ),
    ] {
        std::fs::write(dir.path().join("taskbroker.toml"), config).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_taskbroker"))
            .current_dir(dir.path())
            .env_remove("TB_NO_SUCH_VARIABLE_SET")
            .args([
                "serve",
                "--config",
                "taskbroker.toml",
                "--listen",
                "127.0.0.1:0",
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{config}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{config}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    }
}

/// Issue 25 item 5, "the case where nothing is run twice": an upstream
/// over HTTP that runs the call as its own task (server-everything's
/// `simulate-research-query`); the broker is killed with kill -9 while the
/// upstream task runs. The restarted broker's next run follows the same
/// upstream task in the server session it was created in (kept in the
/// job's checkpoint) instead of calling the tool again, and the client
/// gets its result through tasks/result: the tool ran exactly once.
async fn kill9_mid_upstream_task_over_http_follows_the_same_task(driver: Driver) {
    let Some(script) = server_everything() else {
        return;
    };
    let upstream = common::EverythingHttp::start(&script);
    let config = format!(
        "[[upstream]]\nname = \"web\"\nprefix = \"ev_\"\nurl = \"{}\"\n",
        upstream.url
    );
    let mut server = Server::start_with_config_on(driver, &config, &["--lease", "2"]);
    let mut c = server.client().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while tool(&listed(&mut c).await, "ev_simulate-research-query").is_none() {
        assert!(Instant::now() < deadline, "{}", server.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let task = c
        .call_task(
            "ev_simulate-research-query",
            json!({ "topic": "durability" }),
        )
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    let kept = loop {
        if let Some(c) = checkpoint_of(&server, &task_id).await
            && c.contains("upstreamTask")
        {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "no upstream task: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let kept: Value = serde_json::from_str(&kept).unwrap();
    assert!(kept["upstreamSession"].is_string(), "{kept}");
    server.kill_and_restart();
    c.reconnect(&server.url);
    let done = c.wait_terminal(&task_id, Duration::from_secs(60)).await;
    assert_eq!(done["status"], "completed", "{done} {}", server.log());
    let result = c.ok("tasks/result", json!({ "taskId": task_id })).await;
    assert!(
        text_of(&result).contains("Research Report: durability"),
        "{result}"
    );
    assert_eq!(
        result["_meta"][RELATED]["taskId"], task_id,
        "the broker's task, not the upstream's: {result}"
    );
    let after: Value =
        serde_json::from_str(&checkpoint_of(&server, &task_id).await.unwrap()).unwrap();
    assert_eq!(after, kept, "the same upstream task throughout");
    let log = server.log();
    let created = log
        .lines()
        .filter(|l| {
            l.contains("the upstream runs the call as its own task") && l.contains(&task_id)
        })
        .count();
    assert_eq!(created, 1, "the tool was called once: {log}");
    assert!(
        log.lines()
            .any(|l| l.contains("resuming: following the upstream's task") && l.contains(&task_id)),
        "{log}"
    );
}
both_drivers!(kill9_mid_upstream_task_over_http_follows_the_same_task);

/// Issue 25 "bad input": an upstream tool whose input schema is not valid
/// JSON Schema is not served, and a warning names it and why; its other
/// tools serve. (A scripted server: no real one lists such a tool.)
#[tokio::test]
async fn a_tool_with_an_invalid_schema_is_left_out_and_said_why() {
    let script = r#"read l; echo '{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"scripted","version":"0"}}}'; read l; read l; echo '{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"fine","inputSchema":{"type":"object"}},{"name":"broken","inputSchema":{"type":"object","properties":{"x":{"type":"no-such-type"}}}}]}}'; cat >/dev/null"#;
    let config = format!(
        "[[upstream]]\nname = \"scripted\"\ncommand = [\"sh\", \"-c\", {}]\n",
        serde_json::to_string(script).unwrap()
    );
    let server = Server::start_with_config(&config, &[]);
    let log = server
        .wait_for_log("an upstream tool is not served", Duration::from_secs(20))
        .await;
    let line = log
        .lines()
        .find(|l| l.contains("an upstream tool is not served"))
        .unwrap();
    assert!(
        line.contains("tool=broken") && line.contains("inputSchema is not valid JSON Schema"),
        "{line}"
    );
    let mut c = server.client().await;
    let tools = listed(&mut c).await;
    assert!(tool(&tools, "fine").is_some(), "{tools:?}");
    assert!(tool(&tools, "broken").is_none(), "{tools:?}");
    assert!(tool(&tools, "sleep").is_some(), "{tools:?}");
}

/// Issue 25 item 3: the upstream's `sampling/createMessage` during a task
/// becomes `input_required`; the client's answer (a message of its model)
/// goes back to the upstream, whose result quotes it.
async fn an_upstream_sampling_request_is_answered_through_the_task(driver: Driver) {
    let Some(script) = server_everything() else {
        return;
    };
    let server = broker(driver, &script, "", &[]);
    let mut c = Client::new(&server.url);
    c.initialize_with(json!({ "sampling": {} })).await;
    let task = c
        .call_task(
            "ev_trigger-sampling-request",
            json!({ "prompt": "a haiku about queues", "maxTokens": 20 }),
        )
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    wait_status(&mut c, &task_id, "input_required", Duration::from_secs(20)).await;
    let (mut sse, request) = question_on_result_stream(&mut c, &task_id).await;
    assert_eq!(request["method"], "sampling/createMessage", "{request}");
    assert!(
        request["params"]["messages"][0]["content"]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("a haiku about queues"),
        "{request}"
    );
    let answer = json!({
        "role": "assistant",
        "content": { "type": "text", "text": "jobs wait in a row" },
        "model": "test-model",
        "stopReason": "endTurn",
    });
    let last = answer_on_result_stream(&c, &mut sse, &request, answer).await;
    let text = last["result"].to_string();
    assert!(
        text.contains("jobs wait in a row") && text.contains("test-model"),
        "the answer reached the upstream: {last}"
    );
}
both_drivers!(an_upstream_sampling_request_is_answered_through_the_task);

// MCP 2026-07-28 upstreams ---------------------------------------------------

/// A broker in front of the Python SDK 2.x server at `url` (`py_` prefix),
/// with `more` lines in its `[[upstream]]`; waits until `py_add` is served.
async fn broker_2026(driver: Driver, url: &str, more: &str, flags: &[&str]) -> (Server, Client) {
    let config =
        format!("[[upstream]]\nname = \"py\"\nprefix = \"py_\"\nurl = \"{url}\"\n{more}\n");
    let server = Server::start_with_config_on(driver, &config, flags);
    let mut c = elicit_client(&server).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while tool(&listed(&mut c).await, "py_add").is_none() {
        assert!(Instant::now() < deadline, "{}", server.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (server, c)
}

/// The broker's log says the upstream is ready speaking `version`, and a
/// plain call of its `add` answers.
async fn speaks(server: &Server, c: &mut Client, version: &str) {
    assert!(
        server
            .log()
            .lines()
            .any(|l| l.contains("upstream ready") && l.contains(version)),
        "{}",
        server.log()
    );
    let sum = c
        .ok(
            "tools/call",
            json!({ "name": "py_add", "arguments": { "a": 2, "b": 3 } }),
        )
        .await;
    assert_eq!(text_of(&sum), "The sum of 2 and 3 is 5.", "{sum}");
}

/// Issue 25 ("the protocol version to speak ... discover it when not
/// given"; items 3-5 against a 2026-07-28 server): a server written with
/// the Python SDK 2.3 (FastMCP 4.1 and its tasks extension) at a URL,
/// with no `protocol` in the config, is asked `server/discover` and spoken
/// to in 2026-07-28. A plain call answers; a task's progress and log
/// lines reach the task (the log level asked in `_meta`); the server's
/// question (an `input_required` result, answered by calling again with
/// `inputResponses`) is answered through the broker's task; a tool the
/// server runs as its own task is followed with `tasks/get` (its id kept
/// in the job's row), and a question asked inside it goes back with
/// `tasks/update`; a cancel closes the call's stream, and the server stops
/// stepping.
async fn a_2026_upstream_is_discovered_and_serves_calls_tasks_questions_and_cancels(
    driver: Driver,
) {
    let dir = tempfile::tempdir().unwrap();
    let Some(upstream) = common::Python2026::start(dir.path()) else {
        return;
    };
    let (server, mut c) = broker_2026(driver, &upstream.url, "", &[]).await;
    speaks(&server, &mut c, "2026-07-28").await;

    // Progress and log lines of a plain upstream call, kept with the task:
    // each log line is the task's status message while it works.
    let task = c
        .call_task("py_slow", json!({ "seconds": 3, "steps": 3 }))
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut said = Vec::new();
    let done = loop {
        let t = c.ok("tasks/get", json!({ "taskId": task_id })).await;
        if let Some(m) = t["statusMessage"].as_str()
            && said.last().map(String::as_str) != Some(m)
        {
            said.push(m.to_owned());
        }
        if t["status"] != "working" {
            break t;
        }
        assert!(Instant::now() < deadline, "{t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done["status"], "completed", "{done}");
    assert!(
        said.iter()
            .any(|m| m.starts_with("step ") && m.contains(" of 3")),
        "the server's log lines were the status message: {said:?}"
    );
    let result = c.ok("tasks/result", json!({ "taskId": task_id })).await;
    assert_eq!(text_of(&result), "slow done after 3 steps", "{result}");
    let db = server.db_reader().await;
    let progress: i64 = db
        .scalar(
            "SELECT COUNT(*) FROM task_progress p JOIN tasks t ON t.seq = p.task_seq WHERE t.task_id = $1",
            &[Arg::Text(task_id.clone())],
        )
        .await;
    db.close().await;
    assert!(progress >= 1, "the upstream's progress was kept");

    // A question as an input_required result, answered through the task.
    let task = c.call_task("py_ask_name", json!({})).await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    wait_status(&mut c, &task_id, "input_required", Duration::from_secs(20)).await;
    let (mut sse, request) = question_on_result_stream(&mut c, &task_id).await;
    assert_eq!(request["method"], "elicitation/create", "{request}");
    assert_eq!(request["params"]["message"], "What is your name?");
    let answer = json!({ "action": "accept", "content": { "name": "Ada" } });
    let last = answer_on_result_stream(&c, &mut sse, &request, answer).await;
    assert_eq!(text_of(&last["result"]), "Hello, Ada!", "{last}");

    // The server's own task: followed, its id kept; its question answered.
    let task = c.call_task("py_ask_name_task", json!({})).await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    wait_status(&mut c, &task_id, "input_required", Duration::from_secs(20)).await;
    let kept: Value =
        serde_json::from_str(&checkpoint_of(&server, &task_id).await.unwrap()).unwrap();
    assert!(kept["upstreamTask"].is_string(), "{kept}");
    assert!(kept.get("upstreamSession").is_none(), "no sessions: {kept}");
    let (mut sse, request) = question_on_result_stream(&mut c, &task_id).await;
    let answer = json!({ "action": "accept", "content": { "name": "Tess" } });
    let last = answer_on_result_stream(&c, &mut sse, &request, answer).await;
    assert_eq!(text_of(&last["result"]), "Hello, Tess!", "{last}");

    // A cancel closes the call's stream: the server stops stepping.
    let task = c
        .call_task("py_slow", json!({ "seconds": 20, "steps": 40 }))
        .await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    while common::Python2026::lines(&upstream.step_log)
        .iter()
        .all(|l| !l.ends_with("/40"))
    {
        assert!(Instant::now() < deadline, "never stepped: {}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.ok("tasks/cancel", json!({ "taskId": task_id })).await;
    let cancelled = c.wait_terminal(&task_id, Duration::from_secs(10)).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let steps = || {
        common::Python2026::lines(&upstream.step_log)
            .iter()
            .filter(|l| l.ends_with("/40"))
            .count()
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_cancel = steps();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(steps(), at_cancel, "the server stopped stepping");
    assert!(at_cancel < 40);
}
both_drivers!(a_2026_upstream_is_discovered_and_serves_calls_tasks_questions_and_cancels);

/// Issue 25 item 5 with a 2026-07-28 server: kill -9 of the broker while
/// the server runs the call as its own task (the tasks extension). The
/// restarted broker follows the same task with `tasks/get` (its id kept in
/// the job's row) instead of calling again: the tool ran exactly once
/// (counted by the server), and the client gets the result.
async fn kill9_mid_2026_upstream_task_follows_the_same_task(driver: Driver) {
    let dir = tempfile::tempdir().unwrap();
    let Some(upstream) = common::Python2026::start(dir.path()) else {
        return;
    };
    let (mut server, mut c) = broker_2026(driver, &upstream.url, "", &["--lease", "2"]).await;
    let task = c.call_task("py_long_task", json!({ "seconds": 4 })).await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    let kept = loop {
        if let Some(c) = checkpoint_of(&server, &task_id).await
            && c.contains("upstreamTask")
        {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "no upstream task: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    server.kill_and_restart();
    c.reconnect(&server.url);
    let done = c.wait_terminal(&task_id, Duration::from_secs(60)).await;
    assert_eq!(done["status"], "completed", "{done} {}", server.log());
    let result = c.ok("tasks/result", json!({ "taskId": task_id })).await;
    assert_eq!(text_of(&result), "long_task done", "{result}");
    assert_eq!(
        checkpoint_of(&server, &task_id).await.as_deref(),
        Some(kept.as_str()),
        "the same upstream task throughout"
    );
    assert_eq!(
        common::Python2026::lines(&upstream.run_log).len(),
        1,
        "the tool ran once"
    );
    assert!(
        server
            .log()
            .lines()
            .any(|l| l.contains("resuming: following the upstream's task") && l.contains(&task_id)),
        "{}",
        server.log()
    );
}
both_drivers!(kill9_mid_2026_upstream_task_follows_the_same_task);

/// Issue 25 item 6 with a 2026-07-28 server: the broker keeps a
/// `subscriptions/listen` stream open on it, so a tool the server adds
/// later is served (and one it removes is not) without a reconnection.
/// `protocol = "2025-11-25"` makes the broker speak the handshake to the
/// same (two-generation) server instead; `protocol = "2026-07-28"` to a
/// server of 2025-11-25 only (server-everything) is a clear down state
/// naming the failed `server/discover`, and the broker's other tools
/// serve.
#[tokio::test]
async fn a_2026_upstream_announces_its_tools_and_the_protocol_setting_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let Some(upstream) = common::Python2026::start(dir.path()) else {
        return;
    };
    let (server, mut c) = broker_2026(Driver::Sqlite, &upstream.url, "", &[]).await;
    assert!(tool(&listed(&mut c).await, "py_extra").is_none());
    let toggled = c
        .ok(
            "tools/call",
            json!({ "name": "py_toggle_extra", "arguments": {} }),
        )
        .await;
    assert!(text_of(&toggled).contains("added"), "{toggled}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while tool(&listed(&mut c).await, "py_extra").is_none() {
        assert!(Instant::now() < deadline, "never listed: {}", server.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(server);

    let (legacy, mut c) = broker_2026(
        Driver::Sqlite,
        &upstream.url,
        "protocol = \"2025-11-25\"",
        &[],
    )
    .await;
    speaks(&legacy, &mut c, "2025-11-25").await;
    drop(legacy);

    if let Some(script) = server_everything() {
        let everything = common::EverythingHttp::start(&script);
        let config = format!(
            "[[upstream]]\nname = \"web\"\nurl = \"{}\"\nprotocol = \"2026-07-28\"\n",
            everything.url
        );
        let server = Server::start_with_config(&config, &[]);
        wait_upstream_state(&server, "web", "down", Duration::from_secs(20)).await;
        let (_, error, _, _) = upstream_row(&server, "web").await;
        let error = error.unwrap_or_default();
        assert!(error.contains("server/discover failed"), "{error}");
        let mut c = server.client().await;
        let echo = c
            .ok(
                "tools/call",
                json!({ "name": "echo", "arguments": { "text": "still serving" } }),
            )
            .await;
        assert!(echo.to_string().contains("still serving"), "{echo}");
    }
}

/// Issue 25 "two upstreams with colliding names": the first declared wins
/// a name even when it comes up later. Here `first` is down at start, so
/// `second` serves `get-sum`; once `first` is up it takes the name, and
/// `second`'s row in `upstreams` no longer lists it as served (operators
/// read that column with `taskbroker upstreams` and the console).
#[tokio::test]
async fn a_name_taken_by_an_earlier_upstream_coming_up_later_leaves_the_later_ones_served_list() {
    let Some(script) = server_everything() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("up");
    let config = format!(
        "[[upstream]]\nname = \"first\"\ninclude = [\"get-sum\"]\n\
         command = [\"sh\", \"-c\", \"test -e '{gate}' || exit 4; exec node '{script}' stdio\"]\n\
         [[upstream]]\nname = \"second\"\ninclude = [\"get-sum\", \"echo\"]\n\
         command = [\"node\", \"{script}\", \"stdio\"]\n",
        gate = gate.display(),
        script = script.display()
    );
    let server = Server::start_with_config(&config, &["--no-demo-tools"]);
    wait_upstream_state(&server, "second", "ready", Duration::from_secs(20)).await;
    let served = |row: (String, Option<String>, i64, Option<String>)| -> Vec<String> {
        let mut names: Vec<String> =
            serde_json::from_str(&row.3.unwrap_or_else(|| "[]".to_owned())).unwrap();
        names.sort();
        names
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while served(upstream_row(&server, "second").await) != ["echo", "get-sum"] {
        assert!(Instant::now() < deadline, "{}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    std::fs::write(&gate, "").unwrap();
    wait_upstream_state(&server, "first", "ready", Duration::from_secs(20)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let first = served(upstream_row(&server, "first").await);
        let second = served(upstream_row(&server, "second").await);
        if first == ["get-sum"] && second == ["echo"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "first {first:?}, second {second:?}: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
