//! Traces (issue 27 item 5), through the real binaries: a broker and a
//! `taskbroker worker` in another process export OpenTelemetry spans over
//! OTLP/HTTP to a receiver in this test that decodes the official protobuf
//! (`opentelemetry-proto`). One task's spans share the client's trace and
//! link up: the client's call (its `traceparent` in `_meta` as parent),
//! the creation, the claim and attempt in the worker process, the
//! completion; the command tool gets the attempt's context as
//! `TRACEPARENT`. With export off, a client's context is still carried
//! (stored on the row, handed to the tool) as it came; an invalid one is
//! ignored; the HTTP header is the fallback for `_meta`; 2026-07-28 calls
//! carry it too, and so do calls to upstream servers; a client's
//! not-sampled flag means no spans; an archived task keeps its trace id;
//! an `https://` or empty endpoint is refused at start.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[macro_use]
mod common;

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use common::{Arg, Client, Driver, Server, WorkerProc};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use reqwest::header::HeaderValue;
use serde_json::{Value, json};

/// The client's own span, as an MCP client would send it.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
/// A trace the client did not sample (flags 00).
const UNSAMPLED_TRACE: &str = "5bf92f3577b34da6a3ce929d0e0e4737";

fn client_traceparent() -> String {
    format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
}

/// A command tool that answers with the trace context it was started in.
const CONFIG: &str = r#"
[[tool]]
name = "traced"
description = "Print TRACEPARENT and TRACESTATE"
command = ["sh", "-c", "printf '%s|%s' \"$TRACEPARENT\" \"$TRACESTATE\""]
"#;

/// One span as the receiver decoded it.
#[derive(Debug, Clone)]
struct Got {
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    kind: i32,
    attributes: HashMap<String, String>,
    /// The resource's `taskbroker.process` (serve or worker).
    process: String,
    /// The resource's `process.pid`.
    pid: String,
}

/// An OTLP/HTTP receiver on a free loopback port (`POST /v1/traces`,
/// protobuf), keeping what it decoded.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Got>>>,
    requests: Arc<Mutex<usize>>,
}

fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

fn attribute_map(attributes: &[KeyValue]) -> HashMap<String, String> {
    attributes
        .iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

impl Receiver {
    async fn start() -> Self {
        let spans: Arc<Mutex<Vec<Got>>> = Arc::default();
        let requests: Arc<Mutex<usize>> = Arc::default();
        let (kept, counted) = (spans.clone(), requests.clone());
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let (kept, counted) = (kept.clone(), counted.clone());
                async move {
                    let request = ExportTraceServiceRequest::decode(body)
                        .expect("the exporter sends OTLP protobuf");
                    *counted.lock().unwrap() += 1;
                    let mut spans = kept.lock().unwrap();
                    for resource_spans in request.resource_spans {
                        let resource = resource_spans
                            .resource
                            .map(|r| attribute_map(&r.attributes))
                            .unwrap_or_default();
                        for scope in resource_spans.scope_spans {
                            for span in scope.spans {
                                spans.push(Got {
                                    name: span.name.clone(),
                                    trace_id: hex(&span.trace_id),
                                    span_id: hex(&span.span_id),
                                    parent: hex(&span.parent_span_id),
                                    kind: span.kind,
                                    attributes: attribute_map(&span.attributes),
                                    process: resource
                                        .get("taskbroker.process")
                                        .cloned()
                                        .unwrap_or_default(),
                                    pid: resource.get("process.pid").cloned().unwrap_or_default(),
                                });
                            }
                        }
                    }
                    // An empty ExportTraceServiceResponse: all accepted.
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            url,
            spans,
            requests,
        }
    }

    /// The spans received so far.
    fn spans(&self) -> Vec<Got> {
        self.spans.lock().unwrap().clone()
    }

    /// Wait until a span named `name` of trace `trace_id` has come.
    async fn wait_for(&self, trace_id: &str, name: &str) -> Got {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(span) = self
                .spans()
                .into_iter()
                .find(|s| s.trace_id == trace_id && s.name == name)
            {
                return span;
            }
            assert!(
                Instant::now() < deadline,
                "no span '{name}' of trace {trace_id} within 30 s; got: {:#?}",
                self.spans()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `tools/call traced` as a task with `meta`; the task id.
async fn call_traced(c: &mut Client, meta: Value) -> String {
    let answer = c
        .ok(
            "tools/call",
            json!({ "name": "traced", "arguments": {}, "task": {}, "_meta": meta }),
        )
        .await;
    answer["task"]["taskId"].as_str().unwrap().to_owned()
}

/// What the command printed: (`TRACEPARENT`, `TRACESTATE`).
async fn seen_by_tool(c: &mut Client, task_id: &str) -> (String, String) {
    let task = c.wait_terminal(task_id, Duration::from_secs(30)).await;
    assert_eq!(task["status"], "completed", "{task}");
    let result = c.ok("tasks/result", json!({ "taskId": task_id })).await;
    let printed = result["content"][0]["text"].as_str().unwrap().to_owned();
    let (parent, state) = printed.split_once('|').unwrap();
    (parent.to_owned(), state.to_owned())
}

/// The trace context stored on a task's row, as an operator reads it.
async fn stored(server: &Server, task_id: &str) -> (String, String) {
    let db = server.db_reader().await;
    let parent: String = db
        .scalar(
            "SELECT coalesce(traceparent, '') FROM tasks WHERE task_id = $1",
            &[Arg::Text(task_id.to_owned())],
        )
        .await;
    let state: String = db
        .scalar(
            "SELECT coalesce(tracestate, '') FROM tasks WHERE task_id = $1",
            &[Arg::Text(task_id.to_owned())],
        )
        .await;
    db.close().await;
    (parent, state)
}

/// The text `sql` (one row, one column, `$1` the task id) reads once it
/// finds a row, within 60 s.
async fn row_value(server: &Server, sql: &str, task_id: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let db = server.db_reader().await;
        let found: Option<String> = db
            .scalar_optional(sql, &[Arg::Text(task_id.to_owned())])
            .await;
        db.close().await;
        if let Some(value) = found {
            return value;
        }
        assert!(Instant::now() < deadline, "no row within 60 s: {sql}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait for a process to exit (after SIGTERM).
fn wait_exit(worker: &mut WorkerProc) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while worker.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "worker still running");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 27 item 5: one task's life is one trace across two processes.
/// The broker (`--workers 0`) exports the client's call (server span,
/// child of the client's span) and the creation (its child); a
/// `taskbroker worker` process exports the claim and the attempt (both
/// children of the creation, read from the task's row) and the completion
/// (child of the attempt); the command tool runs under the attempt
/// (`TRACEPARENT`, and the client's `tracestate` passed on). A call
/// without a context starts a trace of its own, which its tool continues.
async fn a_task_is_one_trace_from_call_to_completion(driver: Driver) {
    let receiver = Receiver::start().await;
    let server = Server::start_with_config_on_env(
        driver,
        CONFIG,
        &["--workers", "0", "--otlp-endpoint", &receiver.url],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let config = server.config_path();
    let mut worker = WorkerProc::start(
        &server,
        1,
        &["--config", &config, "--otlp-endpoint", &receiver.url],
    );
    let mut c = server.client().await;
    c.initialize().await;

    // Not sampled by the client: no spans, the context still goes on.
    let unsampled = call_traced(
        &mut c,
        json!({ "traceparent": format!("00-{UNSAMPLED_TRACE}-{CLIENT_SPAN}-00") }),
    )
    .await;
    let (unsampled_parent, _) = seen_by_tool(&mut c, &unsampled).await;
    assert!(
        unsampled_parent.starts_with(&format!("00-{UNSAMPLED_TRACE}-"))
            && unsampled_parent.ends_with("-00"),
        "{unsampled_parent}"
    );

    let task_id = call_traced(
        &mut c,
        json!({ "traceparent": client_traceparent(), "tracestate": "client=7" }),
    )
    .await;
    let (tool_parent, tool_state) = seen_by_tool(&mut c, &task_id).await;
    let fresh = call_traced(&mut c, json!({})).await;
    let (fresh_parent, _) = seen_by_tool(&mut c, &fresh).await;
    // The worker's last spans leave with its graceful stop.
    worker.term();
    wait_exit(&mut worker);

    let call = receiver.wait_for(CLIENT_TRACE, "tools/call traced").await;
    let create = receiver.wait_for(CLIENT_TRACE, "task create").await;
    let claim = receiver.wait_for(CLIENT_TRACE, "task claim").await;
    let attempt = receiver.wait_for(CLIENT_TRACE, "task attempt").await;
    let complete = receiver.wait_for(CLIENT_TRACE, "task complete").await;

    assert_eq!(call.parent, CLIENT_SPAN, "{call:?}");
    assert_eq!(call.kind, SpanKind::Server as i32);
    assert_eq!(call.process, "serve");
    assert_eq!(call.pid, server.pid().to_string());
    assert_eq!(call.attributes["mcp.method.name"], "tools/call");
    assert_eq!(call.attributes["gen_ai.tool.name"], "traced");
    assert_eq!(call.attributes["taskbroker.task.id"], task_id);

    assert_eq!(create.parent, call.span_id, "{create:?}");
    assert_eq!(create.process, "serve");
    assert_eq!(create.attributes["taskbroker.task.id"], task_id);

    for step in [&claim, &attempt] {
        assert_eq!(step.parent, create.span_id, "{step:?}");
        assert_eq!(step.process, "worker", "{step:?}");
        assert_eq!(step.pid, worker.pid().to_string(), "{step:?}");
        assert_eq!(step.attributes["taskbroker.task.id"], task_id);
        assert_eq!(step.attributes["taskbroker.attempt"], "1");
    }
    assert_eq!(attempt.attributes["taskbroker.task.status"], "completed");
    assert_eq!(complete.parent, attempt.span_id, "{complete:?}");
    assert_eq!(complete.process, "worker");
    assert_eq!(complete.attributes["taskbroker.task.status"], "completed");

    // The command ran under the attempt; the client's tracestate came along.
    assert_eq!(
        tool_parent,
        format!("00-{CLIENT_TRACE}-{}-01", attempt.span_id)
    );
    assert_eq!(tool_state, "client=7");
    // The row keeps the creation's context: what any claimer continues.
    assert_eq!(
        stored(&server, &task_id).await,
        (
            format!("00-{CLIENT_TRACE}-{}-01", create.span_id),
            "client=7".to_owned()
        )
    );

    // No context from the client: a new trace, continued by the tool.
    let fresh_trace = &fresh_parent[3..35];
    assert_ne!(fresh_trace, CLIENT_TRACE);
    let root = receiver.wait_for(fresh_trace, "tools/call traced").await;
    assert_eq!(root.parent, "", "a root span: {root:?}");
    let fresh_attempt = receiver.wait_for(fresh_trace, "task attempt").await;
    assert_eq!(
        fresh_parent,
        format!("00-{fresh_trace}-{}-01", fresh_attempt.span_id)
    );
    assert!(
        *receiver.requests.lock().unwrap() >= 2,
        "both processes exported"
    );
    // Exported after the unsampled task's steps, had there been any.
    let unsampled_spans: Vec<_> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == UNSAMPLED_TRACE)
        .collect();
    assert!(unsampled_spans.is_empty(), "{unsampled_spans:#?}");
}
both_drivers!(a_task_is_one_trace_from_call_to_completion; flavor = "multi_thread", worker_threads = 2);

/// Issue 27 item 5, export off (the default): the client's context is
/// carried as it came: stored on the row and handed to the tool
/// unchanged, from `_meta` or else the `traceparent` header; an invalid
/// one is ignored (no context, the call still succeeds); a tool never
/// inherits a `TRACEPARENT` the broker itself was started with.
async fn a_client_context_is_carried_when_export_is_off(driver: Driver) {
    let server = Server::start_with_config_on_env(
        driver,
        CONFIG,
        &[],
        &[(
            "TRACEPARENT",
            "00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-01",
        )],
    );
    let mut c = server.client().await;
    c.initialize().await;

    let from_meta = call_traced(
        &mut c,
        json!({ "traceparent": client_traceparent(), "tracestate": "a=1,b=2" }),
    )
    .await;
    assert_eq!(
        seen_by_tool(&mut c, &from_meta).await,
        (client_traceparent(), "a=1,b=2".to_owned())
    );
    assert_eq!(
        stored(&server, &from_meta).await,
        (client_traceparent(), "a=1,b=2".to_owned())
    );

    // The header, when _meta has none.
    let header_parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let mut headers = c.headers();
    headers.insert("traceparent", HeaderValue::from_static(header_parent));
    let body = json!({
        "jsonrpc": "2.0", "id": 77, "method": "tools/call",
        "params": { "name": "traced", "arguments": {}, "task": {} },
    });
    let answer = c.post_raw(headers, body.to_string()).await.response();
    let from_header = answer["result"]["task"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        seen_by_tool(&mut c, &from_header).await,
        (header_parent.to_owned(), String::new())
    );

    // A tracestate over 512 characters is dropped, its traceparent kept.
    let long_state = format!("v={}", "x".repeat(600));
    let oversized = call_traced(
        &mut c,
        json!({ "traceparent": client_traceparent(), "tracestate": long_state }),
    )
    .await;
    assert_eq!(
        seen_by_tool(&mut c, &oversized).await,
        (client_traceparent(), String::new())
    );

    // Invalid contexts are ignored, never refused; nothing inherited.
    for bad in [
        json!({ "traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01" }),
        json!({ "traceparent": "not a traceparent", "tracestate": "a=1" }),
        json!({ "traceparent": 42 }),
        json!({}),
    ] {
        let task_id = call_traced(&mut c, bad.clone()).await;
        assert_eq!(
            seen_by_tool(&mut c, &task_id).await,
            (String::new(), String::new()),
            "{bad}"
        );
        assert_eq!(
            stored(&server, &task_id).await,
            (String::new(), String::new())
        );
    }
}
both_drivers!(a_client_context_is_carried_when_export_is_off);

/// Issue 27 item 5 for MCP 2026-07-28: the context in the call's `_meta`
/// beside the envelope, else the `traceparent` header, is stored with a
/// task and reaches its tool; a plain call (no tasks extension) passes it
/// to its tool too.
#[tokio::test]
async fn a_2026_call_carries_its_context() {
    let server = Server::start_with_config_on_env(Driver::Sqlite, CONFIG, &[], &[]);
    let http = reqwest::Client::new();
    let post = |traceparent_meta: Option<String>, header: Option<&'static str>, task: bool| {
        let capabilities = if task {
            json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } })
        } else {
            json!({})
        };
        let mut meta = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": capabilities,
        });
        if let Some(parent) = traceparent_meta {
            meta["traceparent"] = json!(parent);
        }
        let body = json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": { "name": "traced", "arguments": {}, "_meta": meta },
        });
        let mut request = http
            .post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "traced");
        if let Some(parent) = header {
            request = request.header("traceparent", parent);
        }
        async move {
            let answer: Value = request
                .body(body.to_string())
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            answer
        }
    };
    let header_parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    for (meta, header, want) in [
        (Some(client_traceparent()), None, client_traceparent()),
        (None, Some(header_parent), header_parent.to_owned()),
    ] {
        let answer = post(meta, header, true).await;
        let task_id = answer["result"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("a task: {answer}"))
            .to_owned();
        assert_eq!(
            stored(&server, &task_id).await,
            (want.clone(), String::new())
        );
        // What the tool printed is the task's result on the row.
        let result = row_value(
            &server,
            "SELECT result FROM tasks WHERE task_id = $1 AND status = 'completed'",
            &task_id,
        )
        .await;
        let result: Value = serde_json::from_str(&result).unwrap();
        assert_eq!(result["content"][0]["text"], format!("{want}|"));
    }
    // A plain call: the tool runs in the request, under the client's context.
    let answer = post(Some(client_traceparent()), None, false).await;
    assert_eq!(
        answer["result"]["content"][0]["text"],
        format!("{}|", client_traceparent()),
        "{answer}"
    );
}

/// Issue 27 item 5: a bad `--otlp-endpoint` stops `serve` and `worker`
/// at once with the reason, before anything else starts.
#[test]
fn a_bad_endpoint_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db").display().to_string();
    for (command, url, says) in [
        ("serve", "https://collector:4318", "https is not built in"),
        ("worker", "collector:4318", "give an http:// URL"),
        ("serve", "", "--otlp-endpoint is empty"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
            .args([command, "--db", &db, "--otlp-endpoint", url])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command} {url}: {stderr}");
        assert!(stderr.contains(says), "{command} {url}: {stderr}");
        assert!(!dir.path().join("t.db").exists(), "nothing started");
    }
    // The standard variables are held to the same rule.
    for (var, url) in [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://collector:4318/v1/traces",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
            .args(["serve", "--db", &db])
            .env(var, url)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{var}: {stderr}");
        assert!(
            stderr.contains(var) && stderr.contains("https is not built in"),
            "{var}: {stderr}"
        );
    }
}

/// Issue 27 item 5: a task run through an upstream server passes its
/// context on in the upstream call's `_meta` (SEP-414), over both
/// protocol generations. The upstream here is another taskbroker over
/// HTTP (a real MCP server that reads `_meta.traceparent`), whose command
/// tool prints what reached it: with export off in both, the client's own
/// context, unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_call_carries_the_context() {
    let upstream = Server::start_with_config_on_env(Driver::Sqlite, CONFIG, &[], &[]);
    for protocol in ["2025-11-25", "2026-07-28"] {
        let config = format!(
            "[[upstream]]\nname = \"b\"\nurl = \"{}\"\nprotocol = \"{protocol}\"\nprefix = \"b_\"\n",
            upstream.url
        );
        let front = Server::start_with_config_on_env(Driver::Sqlite, &config, &[], &[]);
        let mut c = front.client().await;
        c.initialize().await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let tools = c.ok("tools/list", json!({})).await;
            if tools["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["name"] == "b_traced"))
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{protocol}: no b_traced: {tools}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for task in [true, false] {
            let mut params = json!({
                "name": "b_traced", "arguments": {},
                "_meta": { "traceparent": client_traceparent(), "tracestate": "up=1" },
            });
            let result = if task {
                params["task"] = json!({});
                let created = c.ok("tools/call", params).await;
                let task_id = created["task"]["taskId"].as_str().unwrap().to_owned();
                let done = c.wait_terminal(&task_id, Duration::from_secs(30)).await;
                assert_eq!(done["status"], "completed", "{protocol}: {done}");
                c.ok("tasks/result", json!({ "taskId": task_id })).await
            } else {
                c.ok("tools/call", params).await
            };
            assert_eq!(
                result["content"][0]["text"],
                format!("{}|up=1", client_traceparent()),
                "{protocol}, task {task}: {result}"
            );
        }
    }
}

/// Issue 27 item 5 with retention's archive: an archived task keeps its
/// `traceparent`, and `v_tasks_archive` shows its trace id.
async fn an_archived_task_keeps_its_trace_id(driver: Driver) {
    let config = format!("[server]\narchive = true\n{CONFIG}");
    let server = Server::start_with_config_on_env(driver, &config, &[], &[]);
    let mut c = server.client().await;
    c.initialize().await;
    let answer = c
        .ok(
            "tools/call",
            json!({
                "name": "traced", "arguments": {}, "task": { "ttl": 1000 },
                "_meta": { "traceparent": client_traceparent() },
            }),
        )
        .await;
    let task_id = answer["task"]["taskId"].as_str().unwrap().to_owned();
    c.wait_terminal(&task_id, Duration::from_secs(30)).await;
    // The broker's purge archives it once its ttl has passed.
    let trace_id = row_value(
        &server,
        "SELECT trace_id FROM v_tasks_archive WHERE task_id = $1",
        &task_id,
    )
    .await;
    assert_eq!(trace_id, CLIENT_TRACE);
}
both_drivers!(an_archived_task_keeps_its_trace_id);
