//! Command tools end to end: the real binary with a config file whose
//! `[[tool]]`s are the small programs in `tests/tools/`, driven over HTTP,
//! with their processes checked in /proc. Covers the command-tool contract
//! of the README ("The config file"): arguments on stdin, the environment,
//! stdout as the result, exit codes, timeouts, the output cap, process-group
//! kills, events on `TASKBROKER_EVENTS_FD`, and refusals of bad configs.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, SseReader, pid_alive};
use serde_json::{Value, json};

/// The test programs.
const TOOLS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools");

const RELATED: &str = "io.modelcontextprotocol/related-task";

/// Every tool the tests use. `@TOOLS@` is the programs' folder; the
/// programs run in the config file's folder (the server's temporary
/// directory, `@DIR@`), where they write their pid files.
const CONFIG: &str = r#"
[[tool]]
name = "whoami"
description = "Print the task id, attempt, tool name, working directory and arguments"
command = ["@TOOLS@/whoami.sh"]
env = { GREETING = "hello from the config" }

[[tool]]
name = "json_out"
description = "Print JSON on stdout"
command = ["@TOOLS@/json_out.py"]
input_schema = { type = "object", properties = { kind = { type = "string", enum = ["content", "object", "array"] } }, required = ["kind"] }

[[tool]]
name = "exit3"
description = "Write to stderr and exit 3"
command = ["@TOOLS@/fail.py"]
max_attempts = 1

[[tool]]
name = "sleeper"
description = "Sleep 30 s, with a 1 s timeout"
command = ["@TOOLS@/sleeper.sh"]
timeout = "1s"
max_attempts = 1

[[tool]]
name = "bigout"
description = "Print 5 MB"
command = ["@TOOLS@/bigout.py"]
max_output = 100000

[[tool]]
name = "stubborn"
description = "Ignore SIGTERM and sleep a minute"
command = ["@TOOLS@/stubborn.py"]
task_support = "required"
kill_grace = "1s"
max_attempts = 1

[[tool]]
name = "progress"
description = "Report progress, logs and status on the events descriptor"
command = ["@TOOLS@/progress.py"]

[[tool]]
name = "tree"
description = "A leader, a child and a grandchild, all sleeping"
command = ["@TOOLS@/tree.sh"]
task_support = "required"
max_attempts = 1
"#;

/// A server (embedded workers) serving the tools of [`CONFIG`].
fn start() -> Server {
    Server::start_with_config(&CONFIG.replace("@TOOLS@", TOOLS), &[])
}

fn task_id(task: &Value) -> String {
    task["taskId"].as_str().unwrap().to_owned()
}

/// The text of the first content block of a CallToolResult.
#[track_caller]
fn text(result: &Value) -> &str {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text content: {result}"))
}

/// Wait (up to 15 s) for a program to write its pid to `path`.
async fn wait_pid(path: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "{} never written: the tool did not start",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until none of `pids` is alive; panics after `limit` (measured from
/// `since`). Returns how long it took since `since`.
async fn wait_gone(pids: &[(&str, i32)], since: Instant, limit: Duration) -> Duration {
    loop {
        let alive: Vec<_> = pids.iter().filter(|(_, pid)| pid_alive(*pid)).collect();
        if alive.is_empty() {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < limit,
            "still alive {:?} after {limit:?}: {alive:?}",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Tool processes a test watches: any still alive when the test ends (it
/// failed) are killed, so they do not outlive it.
struct Reap(Vec<i32>);

impl Drop for Reap {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if pid_alive(pid) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
    }
}

/// The server's directory as the programs see it (symlinks resolved).
fn real_dir(server: &Server) -> PathBuf {
    std::fs::canonicalize(&server.dir).unwrap()
}

/// Covers H-10 (a tool result). A plain call and a task call of a command
/// tool: the JSON arguments arrive on stdin, the environment carries
/// `TASKBROKER_TASK_ID` (empty for a plain call, the task id for a task),
/// `TASKBROKER_ATTEMPT=1`, `TASKBROKER_TOOL` and the config's `env`, the
/// program runs in the config file's folder, and its stdout text is the
/// result text.
#[tokio::test]
async fn h10_stdout_is_the_result_and_the_environment_reaches_the_program() {
    let server = start();
    let dir = real_dir(&server);
    let mut c = server.client().await;
    let r = c
        .ok(
            "tools/call",
            json!({"name": "whoami", "arguments": {"greeting": "hi", "n": 7}}),
        )
        .await;
    assert_ne!(r["isError"], true, "{r}");
    assert_eq!(
        text(&r),
        format!(
            "task= attempt=1 tool=whoami cwd={} greeting=hello from the config args={{\"greeting\":\"hi\",\"n\":7}}\n",
            dir.display()
        )
    );
    assert!(r.get("structuredContent").is_none(), "{r}");

    let task = c.call_task("whoami", json!({"greeting": "task"})).await;
    let id = task_id(&task);
    let done = c.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let r = c.ok("tasks/result", json!({"taskId": id})).await;
    assert_eq!(
        text(&r),
        format!(
            "task={id} attempt=1 tool=whoami cwd={} greeting=hello from the config args={{\"greeting\":\"task\"}}\n",
            dir.display()
        )
    );
    assert_eq!(r["_meta"][RELATED]["taskId"], id.as_str());
}

/// Covers H-10 (structured results). stdout holding a JSON object with
/// `content` is the CallToolResult verbatim; another JSON object becomes the
/// text and `structuredContent` equal to it; a JSON array is only text.
#[tokio::test]
async fn h10_json_stdout_becomes_the_result_or_structured_content() {
    let server = start();
    let mut c = server.client().await;
    let verbatim = json!({
        "content": [
            {"type": "text", "text": "first block"},
            {"type": "text", "text": "second block"}
        ],
        "structuredContent": {"from": "the tool"}
    });
    let r = c
        .ok(
            "tools/call",
            json!({"name": "json_out", "arguments": {"kind": "content"}}),
        )
        .await;
    assert_eq!(r, verbatim, "a CallToolResult is taken verbatim");

    let object = json!({"answer": 42, "nested": {"list": [1, 2, 3], "ok": true}});
    let r = c
        .ok(
            "tools/call",
            json!({"name": "json_out", "arguments": {"kind": "object"}}),
        )
        .await;
    assert_eq!(r["structuredContent"], object, "{r}");
    let shown: Value = serde_json::from_str(text(&r)).unwrap();
    assert_eq!(shown, object, "the text is the object too");
    assert_ne!(r["isError"], true);

    let r = c
        .ok(
            "tools/call",
            json!({"name": "json_out", "arguments": {"kind": "array"}}),
        )
        .await;
    assert_eq!(text(&r), "[1, 2, 3]");
    assert!(r.get("structuredContent").is_none(), "{r}");

    // The same through a task: tasks/result returns what the call returned,
    // plus the related-task _meta.
    let id = task_id(&c.call_task("json_out", json!({"kind": "content"})).await);
    c.wait_terminal(&id, Duration::from_secs(20)).await;
    let mut r = c.ok("tasks/result", json!({"taskId": id})).await;
    assert_eq!(r["_meta"][RELATED]["taskId"], id.as_str());
    r.as_object_mut().unwrap().remove("_meta");
    assert_eq!(r, verbatim);
    let id = task_id(&c.call_task("json_out", json!({"kind": "object"})).await);
    c.wait_terminal(&id, Duration::from_secs(20)).await;
    let r = c.ok("tasks/result", json!({"taskId": id})).await;
    assert_eq!(r["structuredContent"], object, "{r}");
}

/// Covers H-10 (`isError`) and T-12. A non-zero exit is a result with
/// `isError: true` whose text names the exit code and holds the tail of
/// stderr (the start of a long stderr is cut, its end kept); as a task, the
/// task is `failed` with a statusMessage that says why, and tasks/result
/// returns the error result.
#[tokio::test]
async fn h10_t12_nonzero_exit_is_an_error_result_with_the_stderr_tail() {
    let server = start();
    let mut c = server.client().await;
    let r = c
        .ok(
            "tools/call",
            json!({"name": "exit3", "arguments": {"big": true}}),
        )
        .await;
    assert_eq!(r["isError"], true, "{r}");
    let t = text(&r);
    assert!(t.contains("exited with code 3"), "{t}");
    assert!(
        t.trim_end()
            .ends_with("disk is full: cannot write /nowhere/out.bin"),
        "the end of stderr is kept: {t}"
    );
    assert!(t.contains("noise line 0999"), "{t}");
    assert!(
        !t.contains("FIRST-LINE-MARKER"),
        "only the tail of 16 KB of stderr is kept"
    );
    assert!(
        !t.contains("some stdout"),
        "stdout is not the result on failure"
    );
    assert!(t.len() < 5000, "tail is bounded: {} bytes", t.len());

    let id = task_id(&c.call_task("exit3", json!({"big": false})).await);
    let done = c.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "failed", "{done}");
    let message = done["statusMessage"].as_str().unwrap_or_default();
    assert!(message.contains("exited with code 3"), "{done}");
    assert!(message.contains("disk is full"), "{done}");
    let r = c.ok("tasks/result", json!({"taskId": id})).await;
    assert_eq!(r["isError"], true, "{r}");
    assert!(text(&r).contains("FIRST-LINE-MARKER"), "short stderr whole");
    assert!(text(&r).contains("disk is full"), "{r}");
}

/// Covers T-12 for timeouts. `timeout = "1s"` on a program that sleeps 30 s:
/// the plain call answers an error saying it timed out; the task fails
/// after about a second with a statusMessage saying it timed out; the
/// program and its child (the whole process group) are gone.
#[tokio::test]
async fn t12_timeout_fails_the_task_and_kills_the_process_group() {
    let server = start();
    let mut c = server.client().await;

    let t0 = Instant::now();
    let e = c
        .err("tools/call", json!({"name": "sleeper", "arguments": {}}))
        .await;
    assert!(e["message"].as_str().unwrap().contains("timed out"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let leader = wait_pid(&server.dir.join("sleeper.plain.pid")).await;
    let child = wait_pid(&server.dir.join("sleeper.plain.child")).await;
    let _reap = Reap(vec![leader, child]);
    wait_gone(
        &[("leader", leader), ("child", child)],
        Instant::now(),
        Duration::from_secs(3),
    )
    .await;

    let t0 = Instant::now();
    let id = task_id(&c.call_task("sleeper", json!({})).await);
    let leader = wait_pid(&server.dir.join(format!("sleeper.{id}.pid"))).await;
    let child = wait_pid(&server.dir.join(format!("sleeper.{id}.child"))).await;
    let _reap = Reap(vec![leader, child]);
    let done = c.wait_terminal(&id, Duration::from_secs(15)).await;
    let took = t0.elapsed();
    assert_eq!(done["status"], "failed", "{done}");
    let message = done["statusMessage"].as_str().unwrap_or_default();
    assert!(message.contains("timed out"), "{done}");
    assert!(message.contains("sleeper"), "names the tool: {done}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "failed after {took:?}, timeout is 1 s"
    );
    wait_gone(
        &[("leader", leader), ("child", child)],
        Instant::now(),
        Duration::from_secs(3),
    )
    .await;
    let e = c.err("tasks/result", json!({"taskId": id})).await;
    assert!(e["message"].as_str().unwrap().contains("timed out"), "{e}");
}

/// Covers H-10 with `max_output`. A program printing 5 MB with
/// `max_output = 100000`: the result is the first 100,000 bytes plus the
/// note "[output cut at 100000 bytes]", for a plain call and a task; the
/// server stays healthy afterwards.
#[tokio::test]
async fn h10_huge_output_is_cut_at_max_output_and_the_cut_said() {
    let server = start();
    let mut c = server.client().await;
    let check = |r: &Value| {
        assert_ne!(r["isError"], true);
        let t = text(r);
        assert!(
            (100_000..100_100).contains(&t.len()),
            "about 100000 bytes, got {}",
            t.len()
        );
        assert!(t.as_bytes()[..100_000].iter().all(|&b| b == b'x'));
        assert!(
            t.trim_end().ends_with("[output cut at 100000 bytes]"),
            "{}",
            &t[99_990..]
        );
    };
    let r = c
        .ok("tools/call", json!({"name": "bigout", "arguments": {}}))
        .await;
    check(&r);
    let id = task_id(&c.call_task("bigout", json!({})).await);
    let done = c.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "completed", "{done}");
    check(&c.ok("tasks/result", json!({"taskId": id})).await);

    // Still healthy: other requests and calls are served.
    assert_eq!(c.ok("ping", json!({})).await, json!({}));
    let r = c
        .ok("tools/call", json!({"name": "whoami", "arguments": {}}))
        .await;
    assert!(text(&r).starts_with("task= attempt=1"), "{r}");
    let mut other = server.client().await;
    let tools = other.ok("tools/list", json!({})).await;
    assert!(
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "bigout")
    );
}

/// Arguments far larger than a pipe's buffer (300 KB), given to a program
/// that never reads its stdin and prints 5 MB: the call still ends with the
/// usual cut result. (Writing all of stdin before reading stdout would
/// deadlock: the program blocks on its full stdout, the broker on its full
/// stdin.)
#[tokio::test]
async fn h10_large_arguments_a_program_does_not_read_do_not_stall_it() {
    let server = start();
    let mut c = server.client().await;
    let pad = "p".repeat(300_000);
    let r = tokio::time::timeout(
        Duration::from_secs(15),
        c.ok(
            "tools/call",
            json!({"name": "bigout", "arguments": {"pad": pad}}),
        ),
    )
    .await
    .expect("no answer within 15 s: stdin and stdout deadlocked");
    let t = text(&r);
    assert!(t.starts_with("xxxx"), "{}", &t[..t.len().min(100)]);
    assert!(t.trim_end().ends_with("[output cut at 100000 bytes]"));
}

/// Covers T-12 for timeouts with large arguments: `timeout = "1s"` holds
/// even while the broker is still writing 300 KB of arguments to a program
/// that never reads them (it sleeps 30 s): the task fails as timed out
/// within seconds and its processes are gone.
#[tokio::test]
async fn t12_timeout_holds_while_large_arguments_are_unread() {
    let server = start();
    let mut c = server.client().await;
    let pad = "p".repeat(300_000);
    let t0 = Instant::now();
    let id = task_id(&c.call_task("sleeper", json!({"pad": pad})).await);
    let leader = wait_pid(&server.dir.join(format!("sleeper.{id}.pid"))).await;
    let child = wait_pid(&server.dir.join(format!("sleeper.{id}.child"))).await;
    let _reap = Reap(vec![leader, child]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let done = loop {
        let t = c.ok("tasks/get", json!({"taskId": id})).await;
        if t["status"] != "working" {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "task still working {:?} after it started, with timeout = 1s: {t}",
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done["status"], "failed", "{done}");
    let message = done["statusMessage"].as_str().unwrap_or_default();
    assert!(message.contains("timed out"), "{done}");
    wait_gone(
        &[("leader", leader), ("child", child)],
        Instant::now(),
        Duration::from_secs(3),
    )
    .await;
}

/// Covers T-21 and T-22 with a program that ignores SIGTERM (and a child
/// that does too) and `kill_grace = "1s"`: tasks/cancel answers `cancelled`
/// at once and the task stays so; TERM alone does not stop the programs
/// (still alive half a second later), KILL after the grace period does:
/// both are gone within kill_grace + 1 s of the cancel.
#[tokio::test]
async fn t21_t22_cancel_kills_a_term_ignoring_tool_after_kill_grace() {
    let server = start();
    let mut c = server.client().await;
    let id = task_id(&c.call_task("stubborn", json!({})).await);
    let leader = wait_pid(&server.dir.join(format!("stubborn.{id}.pid"))).await;
    let child = wait_pid(&server.dir.join(format!("stubborn.{id}.child"))).await;
    let _reap = Reap(vec![leader, child]);
    assert!(pid_alive(leader) && pid_alive(child));

    let cancelled = c.ok("tasks/cancel", json!({"taskId": id})).await;
    let t0 = Instant::now();
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let now = c.ok("tasks/get", json!({"taskId": id})).await;
    assert_eq!(now["status"], "cancelled", "cancelled at once: {now}");

    tokio::time::sleep(Duration::from_millis(500).saturating_sub(t0.elapsed())).await;
    assert!(
        pid_alive(leader) && pid_alive(child),
        "SIGTERM is ignored: only KILL after kill_grace stops it"
    );
    let took = wait_gone(
        &[("leader", leader), ("child", child)],
        t0,
        Duration::from_secs(2),
    )
    .await;
    eprintln!("cancel -> TERM-ignoring tool killed in {took:?} (kill_grace 1 s)");

    let e = c.err("tasks/result", json!({"taskId": id})).await;
    assert_eq!(e["code"], -32800, "{e}");
    assert_eq!(
        c.ok("tasks/get", json!({"taskId": id})).await["status"],
        "cancelled"
    );
}

/// Covers H-11. A plain call with `_meta.progressToken` "p-1" over SSE: the
/// program's three progress lines on the events descriptor arrive as three
/// increasing notifications/progress with that token (total and message
/// kept), before the result; its info log line arrives as
/// notifications/message (the default session level is info) and its debug
/// line does not.
#[tokio::test]
async fn h11_command_tool_events_reach_a_plain_call_as_progress_and_logs() {
    let server = start();
    let mut c = server.client().await;
    let messages = c
        .request_messages(
            "tools/call",
            json!({
                "name": "progress",
                "arguments": {"steps": 3, "delay": 0.3, "log": "hello from the tool"},
                "_meta": {"progressToken": "p-1"}
            }),
        )
        .await;
    let progress: Vec<&Value> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    let values: Vec<f64> = progress
        .iter()
        .map(|m| {
            assert_eq!(m["params"]["progressToken"], "p-1", "{m}");
            assert_eq!(m["params"]["total"], 3.0, "{m}");
            m["params"]["progress"].as_f64().unwrap()
        })
        .collect();
    assert_eq!(values, [1.0, 2.0, 3.0], "three increasing progress values");
    assert_eq!(progress[2]["params"]["message"], "step 3 of 3");
    let logs: Vec<&Value> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .collect();
    assert_eq!(logs.len(), 1, "info only, debug dropped: {logs:?}");
    assert_eq!(logs[0]["params"]["level"], "info");
    assert_eq!(logs[0]["params"]["data"], "hello from the tool");
    let last = messages.last().unwrap();
    assert_eq!(text(&last["result"]), "done after 3 steps\n", "{last}");
}

/// Covers T-32, T-28 and H-11 for tasks. A task call with progressToken 77:
/// a tasks/result stream opened right after the task is created receives
/// the program's progress as notifications/progress with token 77 and
/// `_meta[related-task].taskId` equal to the task id, all before the final
/// result; meanwhile tasks/get's statusMessage shows the latest progress
/// message, then the text of the program's `{"status":...}` line.
#[tokio::test]
async fn t32_t28_task_progress_reaches_tasks_result_with_the_original_token() {
    let server = start();
    let mut c = server.client().await;
    let r = c
        .ok(
            "tools/call",
            json!({
                "name": "progress",
                "arguments": {"start_delay": 0.7, "steps": 3, "delay": 0.3,
                              "status": "finishing up", "end_delay": 0.8},
                "task": {},
                "_meta": {"progressToken": 77}
            }),
        )
        .await;
    let id = task_id(&r["task"]);
    let (rid, response) = c.post_stream("tasks/result", json!({"taskId": id})).await;
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let reader = tokio::spawn(async move {
        let mut sse = SseReader::new(response);
        let mut got = Vec::new();
        while let Some((_, message)) = sse.next_message().await {
            let end = message["id"] == json!(rid);
            got.push(message);
            if end {
                break;
            }
        }
        got
    });

    // Watch the statusMessage while the task runs.
    let mut seen: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = c.ok("tasks/get", json!({"taskId": id})).await;
        if t["status"] != "working" {
            assert_eq!(t["status"], "completed", "{t}");
            break;
        }
        if let Some(m) = t["statusMessage"].as_str()
            && seen.last().map(String::as_str) != Some(m)
        {
            seen.push(m.to_owned());
        }
        assert!(Instant::now() < deadline, "task never ended: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let order = ["step 1 of 3", "step 2 of 3", "step 3 of 3", "finishing up"];
    // Messages of the broker's own (none today) are let through.
    let ranks: Vec<usize> = seen
        .iter()
        .filter_map(|m| order.iter().position(|o| o == m))
        .collect();
    assert!(
        ranks.windows(2).all(|w| w[0] < w[1]),
        "statusMessage follows the latest report: {seen:?}"
    );
    assert!(
        ranks.iter().any(|&r| r < 3),
        "a progress message was seen: {seen:?}"
    );
    assert_eq!(
        seen.last().map(String::as_str),
        Some("finishing up"),
        "the status line set statusMessage: {seen:?}"
    );

    let messages = tokio::time::timeout(Duration::from_secs(20), reader)
        .await
        .expect("tasks/result stream ended")
        .unwrap();
    let last = messages.last().unwrap();
    assert_eq!(
        last["id"],
        json!(rid),
        "the response comes last: {messages:?}"
    );
    assert_eq!(text(&last["result"]), "done after 3 steps\n", "{last}");
    assert_eq!(last["result"]["_meta"][RELATED]["taskId"], id.as_str());
    let progress: Vec<f64> = messages[..messages.len() - 1]
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| {
            assert_eq!(m["params"]["progressToken"], 77, "{m}");
            assert_eq!(m["params"]["_meta"][RELATED]["taskId"], id.as_str(), "{m}");
            m["params"]["progress"].as_f64().unwrap()
        })
        .collect();
    assert_eq!(
        progress,
        [1.0, 2.0, 3.0],
        "every progress report, in order, before the result: {messages:?}"
    );
}

/// Covers T-21 for a process tree. The program starts a subshell that
/// starts a background grandchild; cancel of the task kills the whole
/// process group: leader, child and grandchild are gone within a couple of
/// seconds.
#[tokio::test]
async fn t21_cancel_kills_the_whole_process_tree() {
    let server = start();
    let mut c = server.client().await;
    let id = task_id(&c.call_task("tree", json!({})).await);
    let leader = wait_pid(&server.dir.join(format!("tree.{id}.leader"))).await;
    let child = wait_pid(&server.dir.join(format!("tree.{id}.child"))).await;
    let grandchild = wait_pid(&server.dir.join(format!("tree.{id}.grandchild"))).await;
    let _reap = Reap(vec![leader, child, grandchild]);
    let pids = [
        ("leader", leader),
        ("child", child),
        ("grandchild", grandchild),
    ];
    assert!(pids.iter().all(|(_, p)| pid_alive(*p)), "{pids:?}");
    assert_ne!(child, grandchild);

    let cancelled = c.ok("tasks/cancel", json!({"taskId": id})).await;
    let t0 = Instant::now();
    assert_eq!(cancelled["status"], "cancelled");
    let took = wait_gone(&pids, t0, Duration::from_secs(3)).await;
    eprintln!("cancel -> process tree gone in {took:?}");
    assert_eq!(
        c.ok("tasks/get", json!({"taskId": id})).await["status"],
        "cancelled"
    );
}

/// Run `taskbroker serve --config <file>` on `config` (written to a fresh
/// folder as `taskbroker.toml`); it must exit non-zero on its own. Returns
/// the config path and stderr.
fn serve_refuses(config: &str) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("taskbroker.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .arg("--db")
        .arg(dir.path().join("broker.db"))
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve accepted the config and kept running:\n{config}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "serve exited 0 on a bad config");
    (path.display().to_string(), stderr)
}

/// The config file is refused at start as `file:line: reason`: an unknown
/// key in a `[[tool]]`, a command that does not exist, one that is not
/// executable, and a `[[tool]]` without `command`.
#[test]
fn bad_tool_configs_are_refused_at_start_with_file_and_line() {
    let head = format!(
        "[server]\ndemo_tools = true\n\n[[tool]]\nname = \"ok\"\ndescription = \"d\"\ncommand = [\"{TOOLS}/whoami.sh\"]\n\n"
    );
    // Line 12 is the unknown key.
    let (f, err) = serve_refuses(&format!(
        "{head}[[tool]]\nname = \"a\"\ndescription = \"d\"\ncolour = \"blue\"\ncommand = [\"{TOOLS}/whoami.sh\"]\n"
    ));
    assert!(err.contains(&format!("{f}:12:")), "{err}");
    assert!(
        err.contains("unknown field") && err.contains("colour"),
        "{err}"
    );

    // Line 12 is the command, which does not exist.
    let (f, err) = serve_refuses(&format!(
        "{head}[[tool]]\nname = \"b\"\ndescription = \"d\"\ncommand = [\"{TOOLS}/no-such-tool.sh\", \"--flag\"]\n"
    ));
    assert!(err.contains(&format!("{f}:12:")), "{err}");
    assert!(err.contains("no-such-tool.sh"), "{err}");
    assert!(err.contains("missing or not executable"), "{err}");

    // A command that exists but is a plain file without the execute bit.
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.sh");
    std::fs::write(&plain, "#!/bin/sh\necho hi\n").unwrap();
    let (f, err) = serve_refuses(&format!(
        "{head}[[tool]]\nname = \"c\"\ndescription = \"d\"\ncommand = [\"{}\"]\n",
        plain.display()
    ));
    assert!(err.contains(&format!("{f}:12:")), "{err}");
    assert!(err.contains("missing or not executable"), "{err}");

    // No command at all.
    let (f, err) = serve_refuses(&format!(
        "{head}[[tool]]\nname = \"d\"\ndescription = \"d\"\ntask_support = \"required\"\n"
    ));
    assert!(err.contains(&format!("{f}:")), "{err}");
    assert!(
        err.contains("missing field") && err.contains("command"),
        "{err}"
    );
    let line: usize = err
        .split(&format!("{f}:"))
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no line number: {err}"));
    assert!(
        (9..=12).contains(&line),
        "the line of the tool without command (9-12), got {line}: {err}"
    );
}

/// The README promises duplicate tool names are refused at start as
/// `file:line: reason`; that holds too for a `[[tool]]` named like a demo
/// tool that is served (`echo`, with demo tools on by default).
#[test]
fn a_tool_named_like_a_demo_tool_is_refused_with_file_and_line() {
    // Line 2 is the clashing name.
    let (f, err) = serve_refuses(&format!(
        "[[tool]]\nname = \"echo\"\ndescription = \"d\"\ncommand = [\"{TOOLS}/whoami.sh\"]\n"
    ));
    assert!(err.contains("duplicate tool name 'echo'"), "{err}");
    assert!(err.contains(&format!("{f}:2:")), "{err}");
}

/// Issue 27 item 3: a retention shorter than the longest ttl a task may be
/// given (max_ttl, from the file or the flag) is refused at start as
/// `file:line: reason`, in `[server]`, `[[tool]]`, `[[upstream]]` and
/// `[upstream.tools.X]`; so is one that is not a duration.
#[test]
fn retention_shorter_than_max_ttl_is_refused_at_start_with_file_and_line() {
    let (f, err) = serve_refuses("[server]\nretain_completed = \"1d\"\n");
    assert!(err.contains(&format!("{f}:2:")), "{err}");
    assert!(
        err.contains("[server]: retain_completed = \"1d\" is shorter than max_ttl (7days)")
            && err.contains("raise retain_completed or lower max_ttl"),
        "{err}"
    );
    let (f, err) = serve_refuses(&format!(
        "[server]\nmax_ttl = \"1h\"\n[[tool]]\nname = \"t\"\ndescription = \"d\"\n\
         command = [\"{TOOLS}/whoami.sh\"]\nretain_failed = \"59m\"\n"
    ));
    assert!(
        err.contains(&format!("{f}:7:"))
            && err.contains("tool 't': retain_failed = \"59m\" is shorter than max_ttl (1h)"),
        "{err}"
    );
    let (f, err) = serve_refuses(
        "[server]\nmax_ttl = \"1h\"\n[[upstream]]\nname = \"u\"\ncommand = [\"true\"]\n\
         retain_cancelled = \"30m\"\n",
    );
    assert!(
        err.contains(&format!("{f}:6:")) && err.contains("upstream 'u': retain_cancelled"),
        "{err}"
    );
    let (f, err) = serve_refuses(
        "[server]\nmax_ttl = \"1h\"\n[[upstream]]\nname = \"u\"\ncommand = [\"true\"]\n\
         [upstream.tools.x]\nretain_failed = \"soon\"\n",
    );
    assert!(
        err.contains(&format!("{f}:7:")) && err.contains("'soon' is not a duration"),
        "{err}"
    );
    // A number of seconds too large for a duration: refused, no panic.
    let (f, err) = serve_refuses("[server]\nretain_failed = 1e30\n");
    assert!(
        err.contains(&format!("{f}:2:")) && err.contains("is not a duration"),
        "{err}"
    );
}

/// Issue 27 item 2: the queue settings of a `[[tool]]` and an
/// `[[upstream]]` are checked at start, as `file:line: reason`: an unknown
/// priority name, a number out of range, a max_priority below the priority,
/// a max_delay that is not a duration.
#[test]
fn bad_priority_settings_are_refused_at_start_with_file_and_line() {
    let tool = |lines: &str| {
        format!(
            "[[tool]]\nname = \"t\"\ndescription = \"d\"\ncommand = [\"{TOOLS}/whoami.sh\"]\n{lines}"
        )
    };
    let (f, err) = serve_refuses(&tool("priority = \"urgent\"\n"));
    assert!(err.contains(&format!("{f}:5:")), "{err}");
    assert!(
        err.contains("priority: unknown priority 'urgent'") && err.contains("lowest, low, normal"),
        "{err}"
    );
    let (f, err) = serve_refuses(&tool("priority = 101\n"));
    assert!(
        err.contains(&format!("{f}:5:")) && err.contains("-100 to 100"),
        "{err}"
    );
    let (f, err) = serve_refuses(&tool("priority = \"high\"\nmax_priority = \"normal\"\n"));
    assert!(err.contains(&format!("{f}:6:")), "{err}");
    assert!(
        err.contains("max_priority normal (0) is below priority high (10)"),
        "{err}"
    );
    // A max_priority below the default (normal) without a priority.
    let (f, err) = serve_refuses(&tool("max_priority = \"low\"\n"));
    assert!(
        err.contains(&format!("{f}:5:")) && err.contains("below priority normal (0)"),
        "{err}"
    );
    let (f, err) = serve_refuses(&tool("priority = 1.5\n"));
    assert!(
        err.contains(&format!("{f}:5:")) && err.contains("not a whole number"),
        "{err}"
    );
    let (f, err) = serve_refuses(&tool("max_delay = \"soon\"\n"));
    assert!(
        err.contains(&format!("{f}:5:")) && err.contains("not a duration"),
        "{err}"
    );
    let (f, err) = serve_refuses(
        "[[upstream]]\nname = \"u\"\ncommand = [\"true\"]\n[upstream.tools.x]\nmax_priority = \"top\"\n",
    );
    assert!(
        err.contains(&format!("{f}:5:")) && err.contains("'top'"),
        "{err}"
    );
}
