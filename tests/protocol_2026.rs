//! MCP 2026-07-28 end to end (Issue 16): the stateless base protocol
//! (SEP-2575: version and capabilities in every request's `_meta`), its
//! HTTP headers (SEP-2243: `MCP-Protocol-Version`, `Mcp-Method`,
//! `Mcp-Name`), multi-round calls (SEP-2322: `input_required`,
//! `inputResponses`, `requestState`) and the tasks extension
//! `io.modelcontextprotocol/tasks` (SEP-2663), served by the real
//! `taskbroker serve` over HTTP on the same `/mcp` endpoint as 2025-11-25
//! sessions, on both drivers where the store is involved.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::{Client, Driver, Server, SseReader, WorkerProc, create_token, parse_sse};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

const VERSION: &str = "2026-07-28";
const TASKS: &str = "io.modelcontextprotocol/tasks";
const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
const META_SUBSCRIPTION: &str = "io.modelcontextprotocol/subscriptionId";
const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
const RELATED: &str = "io.modelcontextprotocol/related-task";

/// Client capabilities that declare the tasks extension.
fn with_tasks() -> Value {
    json!({ "extensions": { TASKS: {} } })
}

/// Client capabilities that declare elicitation and the tasks extension.
fn with_tasks_and_elicitation() -> Value {
    json!({ "elicitation": {}, "extensions": { TASKS: {} } })
}

/// A stateless MCP 2026-07-28 client: every request a POST with the
/// headers and the `_meta` envelope of that version, built by
/// [`Modern::call`] so a test can change any of them before
/// [`Modern::send`].
struct Modern {
    http: reqwest::Client,
    url: String,
    /// Sent as `Authorization: Bearer <token>`.
    token: Option<String>,
    /// `_meta` `io.modelcontextprotocol/clientCapabilities` of every request.
    capabilities: Value,
    next_id: i64,
}

/// One request before it is sent.
struct Call {
    headers: HeaderMap,
    /// The whole JSON-RPC request.
    body: Value,
}

impl Call {
    /// Set (or replace) a header.
    fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
        self
    }

    /// Remove a header.
    fn without(mut self, name: &str) -> Self {
        self.headers.remove(name);
        self
    }

    /// Replace `params._meta` (`Value::Null`: remove it).
    fn meta(mut self, meta: Value) -> Self {
        let params = self.body["params"].as_object_mut().unwrap();
        if meta.is_null() {
            params.remove("_meta");
        } else {
            params.insert("_meta".into(), meta);
        }
        self
    }
}

/// What came back for one request.
struct Reply {
    status: u16,
    headers: HeaderMap,
    /// The request's id, to check the answer echoes it.
    id: Value,
    /// The JSON-RPC response (of an SSE body, its last message).
    message: Value,
    /// The messages of an SSE body before the response.
    notifications: Vec<Value>,
}

impl Reply {
    /// The result of a 200 success that echoes the request id.
    #[track_caller]
    fn result(&self) -> &Value {
        assert_eq!(self.status, 200, "HTTP status: {}", self.message);
        assert!(
            self.message.get("error").is_none(),
            "unexpected error: {}",
            self.message
        );
        assert_eq!(self.message["id"], self.id, "the response echoes the id");
        &self.message["result"]
    }

    /// The error object of an error answer with this HTTP status and
    /// JSON-RPC code, echoing the request id.
    #[track_caller]
    fn error(&self, status: u16, code: i64) -> &Value {
        assert_eq!(self.status, status, "HTTP status: {}", self.message);
        assert!(
            self.message.get("result").is_none(),
            "expected an error: {}",
            self.message
        );
        assert_eq!(self.message["error"]["code"], code, "{}", self.message);
        assert_eq!(self.message["id"], self.id, "the error echoes the id");
        assert!(self.message["error"]["message"].is_string());
        &self.message["error"]
    }
}

impl Modern {
    /// A client that declares `capabilities` on every request.
    fn new(url: &str, capabilities: Value) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap(),
            url: url.to_owned(),
            token: None,
            capabilities,
            next_id: 1,
        }
    }

    /// The same, sending `token` as a bearer token.
    fn with_token(url: &str, capabilities: Value, token: &str) -> Self {
        let mut m = Self::new(url, capabilities);
        m.token = Some(token.to_owned());
        m
    }

    /// The request `method` with `params` (an object), its `_meta`
    /// envelope and headers: Content-Type, Accept (JSON and SSE),
    /// MCP-Protocol-Version, Mcp-Method, and Mcp-Name (the tool of
    /// tools/call, else `params.taskId` when there is one).
    fn call(&mut self, method: &str, mut params: Value) -> Call {
        let id = self.next_id;
        self.next_id += 1;
        let obj = params.as_object_mut().expect("params are an object");
        let meta = obj.entry("_meta").or_insert_with(|| json!({}));
        meta[META_VERSION] = json!(VERSION);
        meta[META_CAPABILITIES] = self.capabilities.clone();
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert(
            "accept",
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        headers.insert("mcp-protocol-version", HeaderValue::from_static(VERSION));
        headers.insert("mcp-method", HeaderValue::from_str(method).unwrap());
        let name = match method {
            "tools/call" => params["name"].as_str(),
            _ => params["taskId"].as_str(),
        };
        if let Some(name) = name {
            headers.insert("mcp-name", HeaderValue::from_str(name).unwrap());
        }
        if let Some(t) = &self.token {
            headers.insert(
                "authorization",
                HeaderValue::from_str(&format!("Bearer {t}")).unwrap(),
            );
        }
        Call {
            headers,
            body: json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }),
        }
    }

    /// Point at a restarted server: new connections (the old ones died
    /// with it).
    fn reconnect(&mut self, url: &str) {
        let next_id = self.next_id;
        *self = Self {
            next_id,
            token: self.token.take(),
            capabilities: self.capabilities.take(),
            ..Self::new(url, Value::Null)
        };
    }

    /// POST a request; the answer, JSON or SSE.
    async fn send(&self, call: Call) -> Reply {
        let id = call.body["id"].clone();
        let r = self
            .http
            .post(&self.url)
            .headers(call.headers)
            .body(call.body.to_string())
            .send()
            .await
            .expect("POST failed");
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let text = r.text().await.unwrap_or_default();
        let sse = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        let mut messages: Vec<Value> = if sse {
            parse_sse(&text)
                .into_iter()
                .filter(|e| !e.data.trim().is_empty())
                .map(|e| serde_json::from_str(&e.data).expect("SSE data is JSON"))
                .collect()
        } else {
            vec![
                serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("HTTP {status}: not JSON ({e}): {text:?}")),
            ]
        };
        let message = messages
            .pop()
            .unwrap_or_else(|| panic!("HTTP {status}: no message in {text:?}"));
        Reply {
            status,
            headers,
            id,
            message,
            notifications: messages,
        }
    }

    /// POST a request; the response still streaming (for SSE).
    async fn open(&self, call: Call) -> reqwest::Response {
        self.http
            .post(&self.url)
            .headers(call.headers)
            .body(call.body.to_string())
            .send()
            .await
            .expect("POST failed")
    }

    /// Send `method` with `params` as built by [`Modern::call`].
    async fn request(&mut self, method: &str, params: Value) -> Reply {
        let call = self.call(method, params);
        self.send(call).await
    }

    /// A request that must succeed: its result.
    async fn ok(&mut self, method: &str, params: Value) -> Value {
        self.request(method, params).await.result().clone()
    }

    /// tools/call that must succeed: its result.
    async fn tool(&mut self, name: &str, arguments: Value) -> Value {
        self.ok(
            "tools/call",
            json!({ "name": name, "arguments": arguments }),
        )
        .await
    }

    /// tools/call retried with `inputResponses` and `requestState`.
    async fn tool_retry(
        &mut self,
        name: &str,
        arguments: Value,
        input_responses: Value,
        request_state: &str,
    ) -> Value {
        self.ok(
            "tools/call",
            json!({
                "name": name,
                "arguments": arguments,
                "inputResponses": input_responses,
                "requestState": request_state,
            }),
        )
        .await
    }

    /// tools/call that must create a task: its id.
    async fn create_task(&mut self, name: &str, arguments: Value) -> String {
        let created = self.tool(name, arguments).await;
        assert_eq!(created["resultType"], "task", "{created}");
        created["taskId"].as_str().unwrap().to_owned()
    }

    /// tasks/get that must succeed: the DetailedTask.
    async fn get(&mut self, task_id: &str) -> Value {
        self.ok("tasks/get", json!({ "taskId": task_id })).await
    }

    /// Poll tasks/get every 100 ms until `done` holds (20 s at most).
    async fn wait_until(
        &mut self,
        task_id: &str,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let task = self.get(task_id).await;
            if done(&task) {
                return task;
            }
            assert!(
                Instant::now() < deadline,
                "task {task_id} never {what}: {task}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Poll until the task has `status`.
    async fn wait_status(&mut self, task_id: &str, status: &str) -> Value {
        self.wait_until(task_id, status, |t| t["status"] == status)
            .await
    }
}

/// A 2025-11-25 session carrying `token`.
async fn session_of(server: &Server, token: &str) -> Client {
    let mut c = Client::new(&server.url);
    c.token = Some(token.to_owned());
    c.initialize().await;
    c
}

/// The ids of a 2025 session's tasks/list.
async fn listed(c: &mut Client) -> Vec<String> {
    let list = c.ok("tasks/list", json!({})).await;
    list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["taskId"].as_str().unwrap().to_owned())
        .collect()
}

/// The keys of a DetailedTask's inputRequests.
fn request_keys(task: &Value) -> Vec<String> {
    let mut keys: Vec<String> = task["inputRequests"]
        .as_object()
        .unwrap_or_else(|| panic!("no inputRequests: {task}"))
        .keys()
        .cloned()
        .collect();
    keys.sort();
    keys
}

/// An acknowledgement: `resultType: "complete"` and the server's `_meta`,
/// nothing else.
#[track_caller]
fn assert_ack(result: &Value) {
    let keys: Vec<&str> = result
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["_meta", "resultType"], "{result}");
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["_meta"][META_SERVER_INFO]["name"], "taskbroker");
}

// ---------------------------------------------------------------------
// 1. Bad input: one test per error code.
// ---------------------------------------------------------------------

/// Issue 16, SEP-2575: a request whose `_meta` envelope lacks the protocol
/// version or the client capabilities, or has them of the wrong type, is
/// -32602 with HTTP 400.
#[tokio::test]
async fn issue16_a_missing_or_malformed_envelope_is_32602_with_http_400() {
    let server = Server::start(&[]);
    let mut m = Modern::new(&server.url, json!({}));
    let cases = [
        ("no _meta", Value::Null),
        ("_meta not an object", json!("2026-07-28")),
        ("no protocolVersion", json!({ META_CAPABILITIES: {} })),
        ("no clientCapabilities", json!({ META_VERSION: VERSION })),
        (
            "clientCapabilities not an object",
            json!({ META_VERSION: VERSION, META_CAPABILITIES: ["tools"] }),
        ),
        (
            "clientCapabilities null",
            json!({ META_VERSION: VERSION, META_CAPABILITIES: null }),
        ),
        (
            "protocolVersion not a string",
            json!({ META_VERSION: 20260728, META_CAPABILITIES: {} }),
        ),
    ];
    for (what, meta) in cases {
        let call = m.call("tools/list", json!({})).meta(meta);
        let reply = m.send(call).await;
        let error = reply.error(400, -32602);
        assert!(
            error["message"].as_str().unwrap().contains("_meta"),
            "{what}: {error}"
        );
    }
    // A string id is echoed as well.
    let mut call = m.call("tools/list", json!({})).meta(Value::Null);
    call.body["id"] = json!("envelope-check");
    let reply = m.send(call).await;
    assert_eq!(reply.error(400, -32602)["code"], -32602);
    assert_eq!(reply.message["id"], "envelope-check");
    // The same request with its envelope is served.
    let tools = m.ok("tools/list", json!({})).await;
    assert!(tools["tools"].as_array().unwrap().len() >= 5, "{tools}");
}

/// Issue 16, SEP-2243: headers that disagree with the body are -32020
/// (HeaderMismatch) with HTTP 400: MCP-Protocol-Version missing or not the
/// `_meta` version, Mcp-Method missing, different or differing in case,
/// Mcp-Name missing or not the tool of tools/call, Mcp-Name not the taskId
/// of tasks/get. Spaces and tabs around header values are accepted.
#[tokio::test]
async fn issue16_headers_that_disagree_with_the_body_are_32020_with_http_400() {
    let server = Server::start(&[]);
    let mut m = Modern::new(&server.url, with_tasks());
    let task_id = m.create_task("sleep", json!({ "seconds": 0 })).await;

    let mut cases: Vec<(&str, Call)> = Vec::new();
    let c = m
        .call("tools/list", json!({}))
        .without("mcp-protocol-version");
    cases.push(("MCP-Protocol-Version missing", c));
    let c = m
        .call("tools/list", json!({}))
        .header("mcp-protocol-version", "2025-11-25");
    cases.push(("header 2025-11-25, _meta 2026-07-28", c));
    let c = m.call("tools/list", json!({})).meta(json!({
        META_VERSION: "2099-01-01", META_CAPABILITIES: {}
    }));
    cases.push(("header 2026-07-28, _meta 2099-01-01", c));
    let c = m.call("tools/list", json!({})).without("mcp-method");
    cases.push(("Mcp-Method missing", c));
    let c = m
        .call("tools/list", json!({}))
        .header("mcp-method", "tools/call");
    cases.push(("Mcp-Method another method", c));
    let c = m
        .call("tools/list", json!({}))
        .header("mcp-method", "Tools/List");
    cases.push(("Mcp-Method differing in case", c));
    let c = m
        .call("tools/call", json!({ "name": "echo", "arguments": {} }))
        .header("mcp-name", "sleep");
    cases.push(("Mcp-Name another tool", c));
    let c = m
        .call("tools/call", json!({ "name": "echo", "arguments": {} }))
        .without("mcp-name");
    cases.push(("Mcp-Name missing on tools/call", c));
    let c = m
        .call("tools/call", json!({ "name": "echo", "arguments": {} }))
        .header("mcp-name", "ECHO");
    cases.push(("Mcp-Name differing in case", c));
    let c = m
        .call("tasks/get", json!({ "taskId": task_id }))
        .header("mcp-name", "some-other-task");
    cases.push(("Mcp-Name not the taskId of tasks/get", c));
    for (what, call) in cases {
        let reply = m.send(call).await;
        let error = reply.error(400, -32020);
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .starts_with("Header mismatch"),
            "{what}: {error}"
        );
    }

    // Spaces and tabs around the values are not a mismatch.
    let call = m
        .call(
            "tools/call",
            json!({ "name": "echo", "arguments": { "x": 1 } }),
        )
        .header("mcp-protocol-version", "  2026-07-28 ")
        .header("mcp-method", "\ttools/call  ")
        .header("mcp-name", " echo\t");
    let result = m.send(call).await.result().clone();
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["structuredContent"], json!({ "x": 1 }));
    let call = m
        .call("tasks/get", json!({ "taskId": task_id }))
        .header("mcp-name", &format!(" {task_id} "));
    let task = m.send(call).await.result().clone();
    assert_eq!(task["taskId"], json!(task_id));
}

/// Issue 23: the headers exactly as the official Python SDK 2.3 sends them
/// (MCP-Protocol-Version and Mcp-Method on every request, Mcp-Name only on
/// tools/call, no Mcp-Param-* for a tool it has not listed). By default an
/// absent Mcp-Name on tasks/* and an absent Mcp-Param-* are accepted (the
/// body decides), a header that disagrees with the body is always -32020;
/// `--strict-headers` (or `strict_headers = true` in `[server]`) restores
/// the SEP's presence rules.
#[tokio::test]
async fn issue23_absent_headers_pass_by_default_wrong_ones_never_strict_refuses_both() {
    let server = Server::start(&["--conformance-tools"]);
    let mut m = Modern::new(&server.url, with_tasks_and_elicitation());
    let task_id = m
        .create_task("approve", json!({ "question": "deploy?" }))
        .await;
    m.wait_status(&task_id, "input_required").await;

    // tasks/get, tasks/update and tasks/cancel without Mcp-Name, as the
    // Python SDK sends them.
    let get = m
        .call("tasks/get", json!({ "taskId": task_id }))
        .without("mcp-name");
    let task = m.send(get).await;
    assert_eq!(task.result()["status"], "input_required");
    let key = request_keys(task.result()).remove(0);
    let update = m.call(
        "tasks/update",
        json!({ "taskId": task_id,
                "inputResponses": { key: { "action": "accept", "content": { "approved": true } } } }),
    );
    assert_ack(m.send(update.without("mcp-name")).await.result());
    m.wait_status(&task_id, "completed").await;
    let long = m.create_task("sleep", json!({ "seconds": 60 })).await;
    let cancel = m
        .call("tasks/cancel", json!({ "taskId": long }))
        .without("mcp-name");
    assert_ack(m.send(cancel).await.result());
    m.wait_status(&long, "cancelled").await;

    // A tool argument marked x-mcp-header, sent without its header.
    let call = m
        .call(
            "tools/call",
            json!({ "name": "test_header_param", "arguments": { "region": "eu-west" } }),
        )
        .without("mcp-param-region");
    let result = m.send(call).await.result().clone();
    assert!(result.to_string().contains("eu-west"), "{result}");

    // Headers that disagree with the body are refused all the same.
    let wrong_task = m
        .call("tasks/get", json!({ "taskId": task_id }))
        .header("mcp-name", "another-task");
    m.send(wrong_task).await.error(400, -32020);
    let wrong_param = m
        .call(
            "tools/call",
            json!({ "name": "test_header_param", "arguments": { "region": "eu-west" } }),
        )
        .header("mcp-param-region", "us-east");
    m.send(wrong_param).await.error(400, -32020);
    let no_name_on_call = m
        .call("tools/call", json!({ "name": "echo", "arguments": {} }))
        .without("mcp-name");
    m.send(no_name_on_call).await.error(400, -32020);

    // Strict, by flag and by config key: absent headers are refused, and
    // the message says why.
    let by_flag = Server::start(&["--conformance-tools", "--strict-headers"]);
    let by_config = Server::start_with_config(
        "[server]\nstrict_headers = true\nconformance_tools = true\n",
        &[],
    );
    for strict in [&by_flag, &by_config] {
        let mut m = Modern::new(&strict.url, with_tasks());
        let task_id = m.create_task("sleep", json!({ "seconds": 0 })).await;
        let get = m
            .call("tasks/get", json!({ "taskId": task_id }))
            .without("mcp-name");
        let reply = m.send(get).await;
        let error = reply.error(400, -32020);
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("--strict-headers"),
            "{error}"
        );
        let call = m
            .call(
                "tools/call",
                json!({ "name": "test_header_param", "arguments": { "region": "eu-west" } }),
            )
            .without("mcp-param-region");
        m.send(call).await.error(400, -32020);
        // With every header, the same requests are served.
        m.get(&task_id).await;
    }
}

/// Issue 16, SEP-2575: a protocol version the server does not serve (in
/// the header and in `_meta` alike) is -32022 with HTTP 400, naming the
/// supported versions and the one requested.
#[tokio::test]
async fn issue16_an_unsupported_version_is_32022_with_the_supported_ones() {
    let server = Server::start(&[]);
    let mut m = Modern::new(&server.url, json!({}));
    for method in ["tools/list", "tools/call"] {
        let params = match method {
            "tools/call" => json!({ "name": "echo", "arguments": {} }),
            _ => json!({}),
        };
        let call = m
            .call(method, params)
            .header("mcp-protocol-version", "2099-01-01")
            .meta(json!({ META_VERSION: "2099-01-01", META_CAPABILITIES: {} }));
        let reply = m.send(call).await;
        let error = reply.error(400, -32022);
        assert_eq!(error["data"]["supported"], json!([VERSION]), "{error}");
        assert_eq!(error["data"]["requested"], "2099-01-01", "{error}");
    }
}

/// Issue 16, SEP-2663: tasks/get, tasks/update and tasks/cancel of a
/// request that did not declare the tasks extension, and a call of a
/// task-only tool (`sleep_as_task`) without it, are -32021 with HTTP 400
/// and `data.requiredCapabilities` naming the extension.
#[tokio::test]
async fn issue16_task_methods_without_the_extension_are_32021_with_http_400() {
    let server = Server::start(&[]);
    let mut with = Modern::new(&server.url, with_tasks());
    let task_id = with.create_task("sleep", json!({ "seconds": 0 })).await;
    let mut without = Modern::new(&server.url, json!({ "elicitation": {} }));
    let cases = [
        ("tasks/get", json!({ "taskId": task_id })),
        (
            "tasks/update",
            json!({ "taskId": task_id, "inputResponses": {} }),
        ),
        ("tasks/cancel", json!({ "taskId": task_id })),
        (
            "tools/call",
            json!({ "name": "sleep_as_task", "arguments": { "seconds": 0 } }),
        ),
    ];
    for (method, params) in cases {
        let reply = without.request(method, params).await;
        let error = reply.error(400, -32021);
        assert!(
            error["data"]["requiredCapabilities"]["extensions"]
                .get(TASKS)
                .is_some_and(Value::is_object),
            "{method}: {error}"
        );
    }
    // The same task is there for a request that declares the extension.
    let task = with.get(&task_id).await;
    assert_eq!(task["taskId"], json!(task_id));
}

/// Issue 16, SEP-2575 / SEP-2663: methods this generation does not have
/// are -32601 with HTTP 404: an unknown one, `initialize` with the
/// 2026-07-28 envelope (naming the supported versions), `tasks/result` and
/// `tasks/list` (removed by the extension, even when declared), `ping`.
#[tokio::test]
async fn issue16_methods_2026_does_not_have_are_32601_with_http_404() {
    let server = Server::start(&[]);
    let mut m = Modern::new(&server.url, with_tasks());
    let task_id = m.create_task("sleep", json!({ "seconds": 0 })).await;
    let initialize = json!({
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": { "name": "t", "version": "0" }
    });
    let cases = [
        ("no/such/method", json!({})),
        ("initialize", initialize),
        ("tasks/result", json!({ "taskId": task_id })),
        ("tasks/list", json!({})),
        ("ping", json!({})),
    ];
    for (method, params) in cases {
        let reply = m.request(method, params).await;
        let error = reply.error(404, -32601);
        assert!(
            reply.headers.get("mcp-session-id").is_none(),
            "{method} opened no session"
        );
        if method == "initialize" {
            let supported = error["data"]["supported"].as_array().unwrap();
            assert!(supported.contains(&json!(VERSION)), "{error}");
            assert!(supported.contains(&json!("2025-11-25")), "{error}");
        }
    }
}

/// Issue 16, SEP-2663 / SEP-2322: errors about the call itself are -32602
/// with HTTP 200: tasks/get and tasks/cancel of an unknown task id, a
/// tools/call of an unknown tool, tasks/update whose inputResponses is not
/// an object, and tools/call with a requestState that was altered.
#[tokio::test]
async fn issue16_bad_params_of_a_call_are_32602_with_http_200() {
    let server = Server::start(&[]);
    let mut m = Modern::new(&server.url, with_tasks());
    let reply = m
        .request(
            "tasks/get",
            json!({ "taskId": "00000000-0000-0000-0000-000000000000" }),
        )
        .await;
    reply.error(200, -32602);

    let reply = m
        .request(
            "tasks/cancel",
            json!({ "taskId": "00000000-0000-0000-0000-000000000000" }),
        )
        .await;
    reply.error(200, -32602);
    let reply = m
        .request(
            "tools/call",
            json!({ "name": "no_such_tool", "arguments": {} }),
        )
        .await;
    reply.error(200, -32602);

    let task_id = m.create_task("sleep", json!({ "seconds": 0 })).await;
    for bad in [json!([1]), json!("yes"), json!(null)] {
        let reply = m
            .request(
                "tasks/update",
                json!({ "taskId": task_id, "inputResponses": bad }),
            )
            .await;
        let error = reply.error(200, -32602);
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("inputResponses"),
            "{error}"
        );
    }

    // A plain call (no extension) that asks: its requestState, altered.
    let mut plain = Modern::new(&server.url, json!({ "elicitation": {} }));
    let asked = plain.tool("approve", json!({ "question": "ok?" })).await;
    assert_eq!(asked["resultType"], "input_required", "{asked}");
    let key = request_keys(&asked).remove(0);
    let state = asked["requestState"].as_str().unwrap();
    let reply = plain
        .request(
            "tools/call",
            json!({
                "name": "approve",
                "arguments": { "question": "ok?" },
                "inputResponses": { key: { "action": "accept", "content": { "approved": true } } },
                "requestState": format!("{state}x"),
            }),
        )
        .await;
    let error = reply.error(200, -32602);
    assert!(
        error["message"].as_str().unwrap().contains("requestState"),
        "{error}"
    );
}

/// Issue 16 (SHTTP): 2026-07-28 has no GET stream and no session to
/// DELETE: both are 405 with `Allow: POST`.
#[tokio::test]
async fn issue16_get_and_delete_are_405() {
    let server = Server::start(&[]);
    let http = reqwest::Client::new();
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let r = http
            .request(method.clone(), &server.url)
            .header("accept", "text/event-stream")
            .header("mcp-protocol-version", VERSION)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 405, "{method}");
        assert_eq!(r.headers()["allow"], "POST", "{method}");
        let body: Value = r.json().await.unwrap();
        assert!(body["error"]["code"].is_i64(), "{method}: {body}");
    }
}

// ---------------------------------------------------------------------
// 2. No sessions.
// ---------------------------------------------------------------------

/// Issue 16, SEP-2575: a 2026-07-28 request is served statelessly even when
/// it carries the Mcp-Session-Id of a live 2025-11-25 session (its task is
/// not that session's), and a made-up Mcp-Session-Id on it is ignored
/// (200, not 404). The 2025 session keeps working on the same endpoint at
/// the same time.
#[tokio::test]
async fn issue16_2026_requests_use_no_session_and_2025_sessions_still_work() {
    let server = Server::start(&[]);
    // initialize without the 2026 _meta opens a 2025 session.
    let mut s = server.client().await;
    let session = s.session.clone().unwrap();
    let mut m = Modern::new(&server.url, with_tasks());

    let call = m
        .call(
            "tools/call",
            json!({ "name": "sleep", "arguments": { "seconds": 0 } }),
        )
        .header("mcp-session-id", &session);
    let reply = m.send(call).await;
    let created = reply.result().clone();
    assert!(reply.headers.get("mcp-session-id").is_none());
    assert_eq!(created["resultType"], "task", "{created}");
    let id = created["taskId"].as_str().unwrap().to_owned();

    assert!(
        !listed(&mut s).await.contains(&id),
        "not the session's task"
    );
    let error = s.err("tasks/get", json!({ "taskId": id })).await;
    assert_eq!(error["code"], -32602, "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("not found"),
        "{error}"
    );

    // Readable statelessly, with or without the session header.
    let call = m
        .call("tasks/get", json!({ "taskId": id }))
        .header("mcp-session-id", &session);
    assert_eq!(m.send(call).await.result()["taskId"], json!(id));
    let done = m.wait_status(&id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "slept 0 s");

    // A made-up session id is ignored.
    for method in ["tools/list", "tasks/get"] {
        let call = m
            .call(method, json!({ "taskId": id }))
            .header("mcp-session-id", "no-such-session");
        let reply = m.send(call).await;
        assert_eq!(reply.status, 200, "{method}: {}", reply.message);
        reply.result();
    }

    // The 2025 session, meanwhile, works as before.
    let own = s.call_task("sleep", json!({ "seconds": 0 })).await;
    let own_id = own["taskId"].as_str().unwrap().to_owned();
    let ended = s.wait_terminal(&own_id, Duration::from_secs(20)).await;
    assert_eq!(ended["status"], "completed");
    let ids = listed(&mut s).await;
    assert_eq!(ids, [own_id], "the session lists its own task only");
    assert!(s.ok("ping", json!({})).await.is_object());
}

// ---------------------------------------------------------------------
// 3. Lifecycle.
// ---------------------------------------------------------------------

/// Issue 16, SEP-2663: with the extension, `sleep` creates a task whose
/// CreateTaskResult is flat (resultType "task", taskId, status, times,
/// integer ttlMs and pollIntervalMs; no `task` wrapper, no result), an
/// immediate tasks/get resolves, and the completed DetailedTask carries the
/// result inline without related-task `_meta`. A tool error result is
/// `completed` with `isError`. Without the extension the same tool answers
/// a plain result (a 2025 `task` param is ignored). tasks/cancel is a bare acknowledgement, also on a task
/// already terminal.
async fn issue16_task_lifecycle_with_the_extension(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let mut m = Modern::new(&server.url, with_tasks());

    let created = m.tool("sleep", json!({ "seconds": 1 })).await;
    assert_eq!(created["resultType"], "task", "{created}");
    assert_eq!(created["status"], "working", "{created}");
    let id = created["taskId"].as_str().unwrap().to_owned();
    assert!(!id.is_empty());
    for key in ["createdAt", "lastUpdatedAt"] {
        common::parse_time_ms(created[key].as_str().unwrap());
    }
    assert!(created["ttlMs"].is_u64(), "ttlMs is an integer: {created}");
    assert!(created["pollIntervalMs"].is_u64(), "{created}");
    for absent in [
        "task",
        "ttl",
        "pollInterval",
        "result",
        "error",
        "inputRequests",
        "requestState",
    ] {
        assert!(created.get(absent).is_none(), "no {absent}: {created}");
    }
    assert_eq!(created["_meta"][META_SERVER_INFO]["name"], "taskbroker");

    let first = m.get(&id).await;
    assert_eq!(first["taskId"], json!(id), "an immediate get resolves");
    assert_eq!(first["resultType"], "complete");
    assert!(first.get("result").is_none(), "not done yet: {first}");

    let done = m.wait_status(&id, "completed").await;
    assert_eq!(done["resultType"], "complete");
    assert_eq!(done["result"]["content"][0]["text"], "slept 1 s", "{done}");
    assert_eq!(
        done["result"]["resultType"], "complete",
        "the inline result is a 2026-07-28 CallToolResult: {done}"
    );
    assert!(
        done["result"]["_meta"].get(RELATED).is_none(),
        "no related-task _meta in the result: {done}"
    );
    assert!(done.get("requestState").is_none());
    assert!(done["ttlMs"].is_u64());

    // A tool error result: completed, with isError.
    let fail_id = m.create_task("fail", json!({})).await;
    let failed = m
        .wait_until(&fail_id, "terminal", |t| t.get("result").is_some())
        .await;
    assert_eq!(failed["status"], "completed", "{failed}");
    assert_eq!(failed["result"]["isError"], true, "{failed}");
    assert_eq!(failed["result"]["resultType"], "complete", "{failed}");
    assert!(failed.get("error").is_none(), "{failed}");

    // Without the extension: a plain result.
    let mut plain = Modern::new(&server.url, json!({}));
    let result = plain.tool("sleep", json!({ "seconds": 0 })).await;
    assert_eq!(result["resultType"], "complete", "{result}");
    assert_eq!(result["content"][0]["text"], "slept 0 s");
    assert!(result.get("taskId").is_none(), "{result}");
    // The 2025 `task` param does not make one either: ignored.
    let result = plain
        .ok(
            "tools/call",
            json!({ "name": "sleep", "arguments": { "seconds": 0 }, "task": { "ttl": 60000 } }),
        )
        .await;
    assert_eq!(result["resultType"], "complete", "{result}");
    assert_eq!(result["content"][0]["text"], "slept 0 s");

    // tasks/cancel of a running task: a bare acknowledgement.
    let long = m.create_task("sleep", json!({ "seconds": 60 })).await;
    let db = server.db_reader().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let state: String = db
            .scalar(
                "SELECT j.state FROM jobs j JOIN tasks t ON t.seq = j.task_seq WHERE t.task_id = $1",
                &[(&long).into()],
            )
            .await;
        if state == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "the job never ran: {state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    db.close().await;
    let ack = m.ok("tasks/cancel", json!({ "taskId": long })).await;
    assert_ack(&ack);
    let cancelled = m.get(&long).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert!(cancelled.get("result").is_none(), "{cancelled}");
    let again = m.ok("tasks/cancel", json!({ "taskId": long })).await;
    assert_ack(&again);
    let completed_cancel = m.ok("tasks/cancel", json!({ "taskId": id })).await;
    assert_ack(&completed_cancel);
    assert_eq!(m.get(&id).await["status"], "completed", "still completed");
}

both_drivers!(issue16_task_lifecycle_with_the_extension);

// ---------------------------------------------------------------------
// 4. One task, two generations.
// ---------------------------------------------------------------------

/// Issue 16, SEP-2663 (backward compatibility): a task belongs to its
/// principal, whichever generation created it. A `fail` task created by
/// alice over 2026-07-28 is in her 2025 session's tasks/list, `failed` to
/// tasks/get there with the isError result from tasks/result, and
/// `completed` with `result.isError` to 2026 tasks/get; a task her 2025
/// session created is readable by 2026 tasks/get.
async fn issue16_one_task_seen_by_both_generations(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let alice = create_token(&server, "alice", &[]);
    let mut m = Modern::with_token(&server.url, with_tasks(), &alice);
    let id = m
        .create_task("fail", json!({ "message": "on purpose" }))
        .await;
    let modern_view = m
        .wait_until(&id, "terminal", |t| t.get("result").is_some())
        .await;
    assert_eq!(modern_view["status"], "completed", "{modern_view}");
    assert_eq!(modern_view["result"]["isError"], true);
    assert_eq!(modern_view["result"]["content"][0]["text"], "on purpose");

    let mut s = session_of(&server, &alice).await;
    assert!(listed(&mut s).await.contains(&id), "in alice's tasks/list");
    let old_view = s.ok("tasks/get", json!({ "taskId": id })).await;
    assert_eq!(old_view["status"], "failed", "{old_view}");
    let result = s.ok("tasks/result", json!({ "taskId": id })).await;
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(result["content"][0]["text"], "on purpose");
    assert_eq!(result["_meta"][RELATED]["taskId"], json!(id));
    assert_eq!(m.get(&id).await["status"], "completed", "unchanged");

    // The other way: a 2025 task, read over 2026-07-28.
    let old = s.call_task("sleep", json!({ "seconds": 0 })).await;
    let old_id = old["taskId"].as_str().unwrap().to_owned();
    let seen = m.wait_status(&old_id, "completed").await;
    assert_eq!(seen["result"]["content"][0]["text"], "slept 0 s", "{seen}");
    assert!(seen["result"]["_meta"].get(RELATED).is_none(), "{seen}");
}

both_drivers!(issue16_one_task_seen_by_both_generations);

// ---------------------------------------------------------------------
// 5. Both generations at once, tools in a worker process.
// ---------------------------------------------------------------------

/// Issue 16, SEP-2663 (authorization by principal): `serve --workers 0`
/// and one worker process; alice (2025 session) and bob (2026-07-28) each
/// create tasks at the same time. All complete, run by the worker
/// process; alice's tasks/list has none of bob's; neither reads the
/// other's task.
async fn issue16_two_principals_two_generations_one_worker(driver: Driver) {
    let server = Server::start_on(driver, &["--workers", "0"]);
    let worker = WorkerProc::start(&server, 0, &["--lease", "5"]);
    let alice_token = create_token(&server, "alice", &[]);
    let bob_token = create_token(&server, "bob", &[]);
    let mut alice = session_of(&server, &alice_token).await;
    let mut bob = Modern::with_token(&server.url, with_tasks(), &bob_token);

    let alice_side = async {
        let mut ids = Vec::new();
        for n in 0..3 {
            let t = alice
                .call_task(
                    "sleep",
                    json!({ "seconds": 0.2, "message": format!("alice {n}") }),
                )
                .await;
            ids.push(t["taskId"].as_str().unwrap().to_owned());
        }
        for (n, id) in ids.iter().enumerate() {
            let done = alice.wait_terminal(id, Duration::from_secs(30)).await;
            assert_eq!(done["status"], "completed", "{done}");
            let result = alice.ok("tasks/result", json!({ "taskId": id })).await;
            assert_eq!(result["content"][0]["text"], format!("alice {n}"));
        }
        ids
    };
    let bob_side = async {
        let mut ids = Vec::new();
        for n in 0..3 {
            let id = bob
                .create_task(
                    "sleep",
                    json!({ "seconds": 0.2, "message": format!("bob {n}") }),
                )
                .await;
            ids.push(id);
        }
        for (n, id) in ids.iter().enumerate() {
            let done = bob.wait_status(id, "completed").await;
            assert_eq!(done["result"]["content"][0]["text"], format!("bob {n}"));
        }
        ids
    };
    let (alice_ids, bob_ids) = tokio::join!(alice_side, bob_side);

    let db = server.db_reader().await;
    for (id, owner) in alice_ids
        .iter()
        .map(|id| (id, "principal:alice"))
        .chain(bob_ids.iter().map(|id| (id, "principal:bob")))
    {
        let (task_owner, ran_by): (String, String) = db
            .one(
                "SELECT t.owner, j.lease_owner FROM jobs j JOIN tasks t ON t.seq = j.task_seq
                  WHERE t.task_id = $1",
                &[id.into()],
            )
            .await;
        assert_eq!(task_owner, owner);
        assert!(
            ran_by.contains(&format!(":{}:", worker.pid())),
            "{id} ran in the worker process: {ran_by}"
        );
    }
    db.close().await;

    let alice_list = listed(&mut alice).await;
    for id in &alice_ids {
        assert!(alice_list.contains(id), "alice lists her own {id}");
    }
    for id in &bob_ids {
        assert!(!alice_list.contains(id), "alice does not list bob's {id}");
        let error = alice.err("tasks/get", json!({ "taskId": id })).await;
        assert_eq!(error["code"], -32602, "{error}");
    }
    for id in &alice_ids {
        let reply = bob.request("tasks/get", json!({ "taskId": id })).await;
        reply.error(200, -32602);
        let reply = bob.request("tasks/cancel", json!({ "taskId": id })).await;
        reply.error(200, -32602);
    }
}

both_drivers!(issue16_two_principals_two_generations_one_worker);

/// Issue 16, SEP-2663: without tokens, a 2025 session's tasks are its own
/// and a 2026-07-28 task is nobody's session's: a 2026 tasks/get of the
/// session's task is -32602, and the session neither lists nor reads the
/// 2026 task.
async fn issue16_without_tokens_the_generations_share_no_tasks(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let mut s = server.client().await;
    let mut m = Modern::new(&server.url, with_tasks());
    let old = s.call_task("sleep", json!({ "seconds": 0 })).await;
    let old_id = old["taskId"].as_str().unwrap().to_owned();
    let new_id = m.create_task("sleep", json!({ "seconds": 0 })).await;

    let reply = m.request("tasks/get", json!({ "taskId": old_id })).await;
    reply.error(200, -32602);
    let ids = listed(&mut s).await;
    assert!(ids.contains(&old_id), "{ids:?}");
    assert!(!ids.contains(&new_id), "{ids:?}");
    let error = s.err("tasks/get", json!({ "taskId": new_id })).await;
    assert_eq!(error["code"], -32602);
    let db = server.db_reader().await;
    let owner: String = db
        .scalar(
            "SELECT owner FROM tasks WHERE task_id = $1",
            &[(&new_id).into()],
        )
        .await;
    assert_eq!(owner, "stateless");
    db.close().await;
}

both_drivers!(issue16_without_tokens_the_generations_share_no_tasks);

// ---------------------------------------------------------------------
// 6. input_required across a restart.
// ---------------------------------------------------------------------

/// Issue 16, SEP-2663 (tasks/update): a task in a worker process asks two
/// questions at once; tasks/get shows both under inputRequests (without
/// related-task `_meta`); tasks/update answering one (plus an unknown key)
/// is acknowledged and leaves the other; the server is killed -9 and
/// restarted, the remaining request is still there; an answer of the wrong
/// shape is -32602 and stores nothing; the right answer completes the task.
/// A task created without the elicitation capability cannot ask.
async fn issue16_input_required_survives_a_restart(driver: Driver) {
    let mut server = Server::start_on(driver, &["--workers", "0"]);
    let worker = WorkerProc::start(&server, 0, &["--lease", "5"]);
    let mut m = Modern::new(&server.url, with_tasks_and_elicitation());
    let id = m
        .create_task("approve", json!({ "question": "a?", "also": "b?" }))
        .await;
    let waiting = m
        .wait_until(&id, "input_required with two requests", |t| {
            t["status"] == "input_required"
                && t["inputRequests"].as_object().map(|o| o.len()) == Some(2)
        })
        .await;
    assert!(waiting.get("result").is_none());
    let mut key_of = std::collections::HashMap::new();
    for (key, request) in waiting["inputRequests"].as_object().unwrap() {
        assert_eq!(request["method"], "elicitation/create", "{request}");
        assert!(
            request["params"]["_meta"].get(RELATED).is_none(),
            "no related-task _meta: {request}"
        );
        assert_eq!(request["params"]["mode"], "form");
        let question = request["params"]["message"].as_str().unwrap().to_owned();
        key_of.insert(question, key.clone());
    }
    let (a, b) = (key_of["a?"].clone(), key_of["b?"].clone());

    let yes = json!({ "action": "accept", "content": { "approved": true } });
    let ack = m
        .ok(
            "tasks/update",
            json!({ "taskId": id, "inputResponses": { a.clone(): yes, "no-such-key": yes } }),
        )
        .await;
    assert_ack(&ack);
    let left = m.get(&id).await;
    assert_eq!(left["status"], "input_required", "{left}");
    assert_eq!(request_keys(&left), vec![b.clone()]);

    server.kill_and_restart();
    m.reconnect(&server.url);
    let after = m.get(&id).await;
    assert_eq!(after["status"], "input_required", "{after}");
    assert_eq!(request_keys(&after), vec![b.clone()]);
    assert_eq!(after["inputRequests"][&b], left["inputRequests"][&b]);

    // An answer that is no elicitation result: refused, nothing stored.
    let reply = m
        .request(
            "tasks/update",
            json!({ "taskId": id, "inputResponses": { b.clone(): { "foo": 1 } } }),
        )
        .await;
    reply.error(200, -32602);
    let still = m.get(&id).await;
    assert_eq!(still["status"], "input_required", "{still}");
    assert_eq!(request_keys(&still), vec![b.clone()]);

    let ack = m
        .ok(
            "tasks/update",
            json!({ "taskId": id, "inputResponses": { b.clone(): yes } }),
        )
        .await;
    assert_ack(&ack);
    let done = m.wait_status(&id, "completed").await;
    assert_eq!(done["result"]["content"][0]["text"], "approved", "{done}");
    assert_eq!(done["result"]["structuredContent"]["approved"], true);
    assert!(done.get("inputRequests").is_none(), "{done}");
    assert!(
        worker.log().contains("task asks the client"),
        "the worker asked"
    );

    // The capabilities are the creating request's: a task created without
    // elicitation cannot ask (SEP-2322), and says so in its result.
    let mut mute = Modern::new(&server.url, with_tasks());
    let id = mute
        .create_task("approve", json!({ "question": "c?" }))
        .await;
    let done = mute
        .wait_until(&id, "terminal", |t| t.get("result").is_some())
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["isError"], true, "{done}");
    assert!(
        done["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("could not ask"),
        "{done}"
    );
}

both_drivers!(issue16_input_required_survives_a_restart);

// ---------------------------------------------------------------------
// 7. Plain multi-round calls.
// ---------------------------------------------------------------------

/// Issue 16, SEP-2322: a plain call (no extension) of a tool that asks the
/// client ends `input_required` with one inputRequests entry and a
/// requestState; the retry with the answer and that state completes. A
/// plain call's progress streams before its result. Without the elicitation
/// capability the tool may not ask, and its result is an error result.
#[tokio::test]
async fn issue16_a_plain_call_asks_in_rounds() {
    let server = Server::start(&[]);
    let mut m = Modern::new(&server.url, json!({ "elicitation": {} }));
    let asked = m.tool("approve", json!({ "question": "ok?" })).await;
    assert_eq!(asked["resultType"], "input_required", "{asked}");
    assert!(asked.get("taskId").is_none(), "no task: {asked}");
    let keys = request_keys(&asked);
    assert_eq!(keys.len(), 1, "{asked}");
    let request = &asked["inputRequests"][&keys[0]];
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(request["params"]["message"], "ok?");
    let state = asked["requestState"].as_str().expect("a requestState");

    let done = m
        .tool_retry(
            "approve",
            json!({ "question": "ok?" }),
            json!({ keys[0].clone(): { "action": "accept", "content": { "approved": true } } }),
            state,
        )
        .await;
    assert_eq!(done["resultType"], "complete", "{done}");
    assert_eq!(done["content"][0]["text"], "approved");
    assert_eq!(done["structuredContent"]["approved"], true);
    assert!(done.get("requestState").is_none(), "{done}");

    // A plain call's progress goes out on its SSE stream, before the
    // result, under the request's progressToken.
    let reply = m
        .request(
            "tools/call",
            json!({
                "name": "sleep",
                "arguments": { "seconds": 1.5 },
                "_meta": { "progressToken": "p-1" },
            }),
        )
        .await;
    assert_eq!(reply.result()["content"][0]["text"], "slept 1.5 s");
    let progress: Vec<f64> = reply
        .notifications
        .iter()
        .map(|note| {
            assert_eq!(note["method"], "notifications/progress", "{note}");
            assert_eq!(note["params"]["progressToken"], "p-1", "{note}");
            assert_eq!(note["params"]["total"], 1.5, "{note}");
            note["params"]["progress"].as_f64().unwrap()
        })
        .collect();
    assert_eq!(
        progress,
        [1.0, 1.5],
        "each step, the last before the result"
    );

    let mut mute = Modern::new(&server.url, json!({}));
    let refused = mute.tool("approve", json!({ "question": "ok?" })).await;
    assert_eq!(refused["resultType"], "complete", "{refused}");
    assert_eq!(refused["isError"], true, "{refused}");
    assert!(
        refused["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("could not ask"),
        "{refused}"
    );
}

/// Issue 23: the requestState of a multi-round call is signed with a key
/// kept in the database, so the retry completes wherever it lands: on
/// another broker on the same PostgreSQL database, and on the only broker
/// after a kill -9 and restart (both drivers). One key row serves them all.
async fn issue23_a_multi_round_retry_completes_on_another_broker_and_after_kill9(driver: Driver) {
    let mut server = Server::start_on(driver, &[]);
    async fn ask(m: &mut Modern) -> (String, String) {
        let asked = m.tool("approve", json!({ "question": "ship it?" })).await;
        assert_eq!(asked["resultType"], "input_required", "{asked}");
        let key = request_keys(&asked).remove(0);
        let state = asked["requestState"].as_str().unwrap().to_owned();
        (key, state)
    }
    async fn retry(m: &mut Modern, key: String, state: String) {
        let done = m
            .tool_retry(
                "approve",
                json!({ "question": "ship it?" }),
                json!({ key: { "action": "accept", "content": { "approved": true } } }),
                &state,
            )
            .await;
        assert_eq!(done["resultType"], "complete", "{done}");
        assert_eq!(done["structuredContent"]["approved"], true, "{done}");
    }

    if driver == Driver::Postgres {
        // Asked by one broker, answered through another.
        let other = Server::start_sharing(&server, &[]);
        let mut here = Modern::new(&server.url, json!({ "elicitation": {} }));
        let mut there = Modern::new(&other.url, json!({ "elicitation": {} }));
        let (key, state) = ask(&mut here).await;
        retry(&mut there, key, state).await;
        // And the other way round, now that both have read the key.
        let (key, state) = ask(&mut there).await;
        retry(&mut here, key, state).await;
    }

    // Asked, then the only broker is killed -9 and restarted.
    let mut m = Modern::new(&server.url, json!({ "elicitation": {} }));
    let (key, state) = ask(&mut m).await;
    let epoch: i64 = state.split('.').next().unwrap().parse().unwrap();
    server.kill_and_restart();
    let mut m = Modern::new(&server.url, json!({ "elicitation": {} }));
    retry(&mut m, key, state).await;

    // One key for the state's period, made once by whichever broker came
    // first (a run across midnight UTC makes a second period's key too).
    let db = server.db_reader().await;
    let keys: i64 = db
        .scalar(
            "SELECT COUNT(*) FROM request_state_keys WHERE epoch = $1",
            &[epoch.into()],
        )
        .await;
    assert_eq!(keys, 1, "one key for the period, made once");
}

both_drivers!(issue23_a_multi_round_retry_completes_on_another_broker_and_after_kill9);

// ---------------------------------------------------------------------
// 8. subscriptions/listen.
// ---------------------------------------------------------------------

/// Issue 16, SEP-2663 (notifications/tasks): subscriptions/listen with
/// `notifications.taskIds` answers an SSE stream that opens with
/// notifications/subscriptions/acknowledged (the subscription id is the
/// listen request's id), then sends notifications/tasks tagged with it
/// until the task completes, the last carrying the result. Without Accept:
/// text/event-stream it is 400; taskIds without the extension are -32021.
#[tokio::test]
async fn issue16_subscriptions_listen_follows_a_task() {
    let server = Server::start(&[]);
    let mut m = Modern::new(&server.url, with_tasks());
    let id = m.create_task("sleep", json!({ "seconds": 1 })).await;

    let mut call = m.call(
        "subscriptions/listen",
        json!({ "notifications": { "taskIds": [id] } }),
    );
    call.body["id"] = json!("listen-1");
    let response = m.open(call).await;
    assert_eq!(response.status().as_u16(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut sse = SseReader::new(response);
    let (_, ack) = sse.next_message().await.expect("the acknowledgement");
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    assert!(ack.get("id").is_none(), "a notification: {ack}");
    assert_eq!(ack["params"]["_meta"][META_SUBSCRIPTION], "listen-1");
    assert_eq!(ack["params"]["notifications"]["taskIds"], json!([id]));

    let mut seen = Vec::new();
    let last = loop {
        let (_, note) = tokio::time::timeout(Duration::from_secs(20), sse.next_message())
            .await
            .expect("a notification within 20 s")
            .expect("the stream stays open");
        assert_eq!(note["method"], "notifications/tasks", "{note}");
        assert_eq!(note["params"]["_meta"][META_SUBSCRIPTION], "listen-1");
        assert_eq!(note["params"]["taskId"], json!(id));
        let status = note["params"]["status"].as_str().unwrap().to_owned();
        seen.push(status.clone());
        if status == "completed" {
            break note;
        }
        assert_eq!(status, "working", "{note}");
        assert!(note["params"].get("result").is_none(), "{note}");
    };
    assert_eq!(seen[0], "working", "the current state first: {seen:?}");
    assert_eq!(
        last["params"]["result"]["content"][0]["text"], "slept 1 s",
        "{last}"
    );
    drop(sse);

    // Without SSE in Accept: 400.
    let call = m
        .call(
            "subscriptions/listen",
            json!({ "notifications": { "taskIds": [id] } }),
        )
        .header("accept", "application/json");
    let reply = m.send(call).await;
    reply.error(400, -32600);

    // taskIds without the extension: -32021.
    let mut without = Modern::new(&server.url, json!({}));
    let reply = without
        .request(
            "subscriptions/listen",
            json!({ "notifications": { "taskIds": [id] } }),
        )
        .await;
    let error = reply.error(400, -32021);
    assert!(
        error["data"]["requiredCapabilities"]["extensions"]
            .get(TASKS)
            .is_some(),
        "{error}"
    );
}

// ---------------------------------------------------------------------
// Upstream servers for MCP 2026-07-28 clients (issue 25).
// ---------------------------------------------------------------------

/// Issue 25 ("both protocol generations on the client side"): a 2026-07-28
/// client calls the tools of an upstream that speaks only 2025-11-25
/// (server-everything over stdio, `ev_` prefix). A plain call answers at
/// once; with the tasks extension the call is a task the broker directs,
/// whose result is the upstream's; the upstream's elicitation becomes an
/// input request of the task, and the answer given with `tasks/update`
/// reaches the upstream.
async fn issue25_a_2026_client_calls_an_upstream_plain_as_a_task_and_answers_it(driver: Driver) {
    let Some(script) = common::server_everything() else {
        return;
    };
    let config = common::everything_section(&script, "everything", Some("ev_"), "");
    let server = Server::start_with_config_on(driver, &config, &[]);

    let mut plain = Modern::new(&server.url, json!({}));
    let sum = plain.tool("ev_get-sum", json!({ "a": 2, "b": 3 })).await;
    assert_eq!(sum["resultType"], "complete", "{sum}");
    assert_eq!(
        sum["content"][0]["text"], "The sum of 2 and 3 is 5.",
        "{sum}"
    );

    let mut m = Modern::new(&server.url, with_tasks_and_elicitation());
    let id = m
        .create_task(
            "ev_trigger-long-running-operation",
            json!({ "duration": 1, "steps": 2 }),
        )
        .await;
    let done = m.wait_status(&id, "completed").await;
    let text = done["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("Long running operation completed"), "{done}");
    assert_eq!(done["result"]["resultType"], "complete", "{done}");

    let id = m
        .create_task("ev_trigger-elicitation-request", json!({}))
        .await;
    let waiting = m
        .wait_until(&id, "input_required", |t| t["status"] == "input_required")
        .await;
    let keys = request_keys(&waiting);
    assert_eq!(keys.len(), 1, "{waiting}");
    let request = &waiting["inputRequests"][&keys[0]];
    assert_eq!(request["method"], "elicitation/create", "{request}");
    assert!(
        request["params"]["_meta"].get(RELATED).is_none(),
        "no related-task _meta: {request}"
    );
    let answer =
        json!({ "action": "accept", "content": { "name": "Ada Lovelace", "check": true } });
    let ack = m
        .ok(
            "tasks/update",
            json!({ "taskId": id, "inputResponses": { keys[0].clone(): answer } }),
        )
        .await;
    assert_ack(&ack);
    let done = m.wait_status(&id, "completed").await;
    assert!(
        done["result"].to_string().contains("Ada Lovelace"),
        "the answer reached the upstream: {done}"
    );
}
both_drivers!(issue25_a_2026_client_calls_an_upstream_plain_as_a_task_and_answers_it);

/// Issue 25 item 6 for 2026-07-28 clients: a `subscriptions/listen`
/// stream that asks for `toolsListChanged` is acknowledged with it (the
/// broker serves an upstream, so its tools can change) and hears
/// `notifications/tools/list_changed`, tagged with the subscription id,
/// when an upstream that was down at start comes up and adds its tools.
/// Without upstreams the acknowledgement leaves it out (nothing changes).
#[tokio::test]
async fn issue25_a_listen_stream_hears_the_tools_of_an_upstream_arrive() {
    let Some(script) = common::server_everything() else {
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
    let server = Server::start_with_config(&config, &[]);
    let mut m = Modern::new(&server.url, json!({}));
    let mut call = m.call(
        "subscriptions/listen",
        json!({ "notifications": { "toolsListChanged": true, "promptsListChanged": true } }),
    );
    call.body["id"] = json!("tools-1");
    let response = m.open(call).await;
    assert_eq!(response.status().as_u16(), 200);
    let mut sse = SseReader::new(response);
    let (_, ack) = sse.next_message().await.expect("the acknowledgement");
    assert_eq!(
        ack["params"]["notifications"],
        json!({ "toolsListChanged": true }),
        "only what is honoured: {ack}"
    );

    std::fs::write(&gate, "").unwrap();
    let (_, note) = tokio::time::timeout(Duration::from_secs(30), sse.next_message())
        .await
        .unwrap_or_else(|_| panic!("no list_changed: {}", server.log()))
        .expect("the stream stays open");
    assert_eq!(note["method"], "notifications/tools/list_changed", "{note}");
    assert!(note.get("id").is_none(), "a notification: {note}");
    assert_eq!(note["params"]["_meta"][META_SUBSCRIPTION], "tools-1");
    let listed = m.ok("tools/list", json!({})).await;
    assert!(
        listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "late_get-sum"),
        "{listed}"
    );

    // A broker without upstreams: its tools never change, so not honoured.
    let plain = Server::start(&[]);
    let mut m = Modern::new(&plain.url, json!({}));
    let call = m.call(
        "subscriptions/listen",
        json!({ "notifications": { "toolsListChanged": true } }),
    );
    let mut sse = SseReader::new(m.open(call).await);
    let (_, ack) = sse.next_message().await.expect("the acknowledgement");
    assert_eq!(ack["params"]["notifications"], json!({}), "{ack}");
    // A filter that is not a boolean is refused.
    let reply = m
        .request(
            "subscriptions/listen",
            json!({ "notifications": { "toolsListChanged": "yes" } }),
        )
        .await;
    reply.error(200, -32602);
}
