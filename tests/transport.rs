//! Streamable HTTP and the MCP lifecycle (H-1..H-10), against the real
//! binary over real HTTP, including every bad input the issue lists.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{Client, Server, parse_sse};
use reqwest::header::HeaderValue;
use serde_json::{Value, json};

fn request(id: i64, method: &str, params: Value) -> String {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string()
}

/// Covers H-7, T-1, T-3 (list and cancel declared, and served).
#[tokio::test]
async fn h7_t1_initialize_negotiates_version_and_declares_tasks() {
    let server = Server::start(&[]);
    let mut c = Client::new(&server.url);
    let result = c.initialize().await;
    assert_eq!(result["protocolVersion"], "2025-11-25");
    // T-1: tasks declared, with list, cancel and tools/call augmentation.
    let tasks = &result["capabilities"]["tasks"];
    assert_eq!(tasks["list"], json!({}));
    assert_eq!(tasks["cancel"], json!({}));
    assert_eq!(tasks["requests"]["tools"]["call"], json!({}));
    assert!(result["capabilities"]["tools"].is_object());
    assert_eq!(result["serverInfo"]["name"], "taskbroker");

    // H-7: a supported older version is echoed; an unknown one gets ours.
    for (asked, expected) in [("2025-06-18", "2025-06-18"), ("1999-01-01", "2025-11-25")] {
        let c = Client::new(&server.url);
        let body = request(
            1,
            "initialize",
            json!({"protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
        );
        let raw = c.post_raw(c.headers(), body).await;
        assert_eq!(raw.json()["result"]["protocolVersion"], expected);
    }

    // H-7: ping answers {}.
    assert_eq!(c.ok("ping", json!({})).await, json!({}));
    // T-3: the declared tasks/list and tasks/cancel exist.
    assert!(c.ok("tasks/list", json!({})).await["tasks"].is_array());
    assert_eq!(
        c.err("tasks/cancel", json!({"taskId": "x"})).await["code"],
        -32602
    );
}

/// Covers H-5.
#[tokio::test]
async fn h5_session_id_is_random_visible_ascii_and_required() {
    let server = Server::start(&[]);
    let a = server.client().await;
    let b = server.client().await;
    let (sa, sb) = (a.session.clone().unwrap(), b.session.clone().unwrap());
    assert_ne!(sa, sb);
    assert!(sa.len() >= 32 && sa.bytes().all(|b| (0x21..=0x7e).contains(&b)));

    // Missing session after initialize -> 400.
    let mut h = a.headers();
    h.remove("mcp-session-id");
    let raw = a.post_raw(h, request(1, "ping", json!({}))).await;
    assert_eq!(raw.status, 400, "{}", raw.body);
    assert!(
        raw.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Mcp-Session-Id")
    );

    // Unknown session -> 404.
    let mut h = a.headers();
    h.insert(
        "mcp-session-id",
        HeaderValue::from_static("0123456789abcdef0123456789abcdef"),
    );
    let raw = a.post_raw(h, request(1, "ping", json!({}))).await;
    assert_eq!(raw.status, 404, "{}", raw.body);
}

/// Covers H-1, H-5.
#[tokio::test]
async fn h1_h5_delete_ends_the_session_then_404() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let r = c
        .http
        .delete(&c.url)
        .headers(c.headers())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let raw = c.post_raw(c.headers(), request(9, "ping", json!({}))).await;
    assert_eq!(raw.status, 404);
    let r = c
        .http
        .delete(&c.url)
        .headers(c.headers())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // Other HTTP methods are refused with Allow.
    let r = c
        .http
        .put(&c.url)
        .headers(c.headers())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
    assert!(r.headers().get("allow").is_some());
    c.session = None;
    c.initialize().await;
}

/// Covers H-6.
#[tokio::test]
async fn h6_unsupported_protocol_version_header_is_400() {
    let server = Server::start(&[]);
    let c = server.client().await;
    let mut h = c.headers();
    h.insert(
        "mcp-protocol-version",
        HeaderValue::from_static("2024-01-01"),
    );
    let raw = c.post_raw(h, request(1, "ping", json!({}))).await;
    assert_eq!(raw.status, 400);
    assert!(raw.body.contains("MCP-Protocol-Version"));
    // Absent header: assumed 2025-03-26, which is supported.
    let mut h = c.headers();
    h.remove("mcp-protocol-version");
    let raw = c.post_raw(h, request(2, "ping", json!({}))).await;
    assert_eq!(raw.status, 200);
}

/// Covers H-2.
#[tokio::test]
async fn h2_foreign_origin_is_403_and_local_origins_pass() {
    let server = Server::start(&[]);
    let c = server.client().await;
    for (origin, status) in [
        ("https://evil.example.com", 403),
        ("null", 403),
        ("http://localhost:5173", 200),
        ("http://127.0.0.1:1234", 200),
    ] {
        let mut h = c.headers();
        h.insert("origin", HeaderValue::from_static(origin));
        let raw = c.post_raw(h, request(1, "ping", json!({}))).await;
        assert_eq!(raw.status, status, "origin {origin}: {}", raw.body);
    }
    // DNS rebinding: a foreign Host on a loopback listener is refused.
    let mut h = c.headers();
    h.insert("host", HeaderValue::from_static("evil.example.com"));
    let raw = c.post_raw(h, request(1, "ping", json!({}))).await;
    assert_eq!(raw.status, 403);
}

/// Covers H-2.
#[tokio::test]
async fn h2_allowed_origin_flag_admits_that_origin() {
    let server = Server::start(&["--allowed-origin", "https://app.example.com"]);
    let c = server.client().await;
    let mut h = c.headers();
    h.insert(
        "origin",
        HeaderValue::from_static("https://app.example.com"),
    );
    assert_eq!(
        c.post_raw(h, request(1, "ping", json!({}))).await.status,
        200
    );
}

/// Covers H-3, H-8.
#[tokio::test]
async fn h3_h8_bad_input_gets_precise_errors() {
    let server = Server::start(&["--max-body", "4096"]);
    let mut c = server.client().await;
    let code = |raw: &common::Raw| raw.json()["error"]["code"].as_i64().unwrap();

    // Malformed JSON -> -32700.
    let raw = c.post_raw(c.headers(), "{\"jsonrpc\": ").await;
    assert_eq!((raw.status, code(&raw)), (400, -32700));
    // A batch -> -32600; a non-object -> -32600.
    let raw = c
        .post_raw(
            c.headers(),
            "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]",
        )
        .await;
    assert_eq!((raw.status, code(&raw)), (400, -32600));
    let raw = c.post_raw(c.headers(), "\"ping\"").await;
    assert_eq!((raw.status, code(&raw)), (400, -32600));
    let raw = c
        .post_raw(
            c.headers(),
            "{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"ping\"}",
        )
        .await;
    assert_eq!((raw.status, code(&raw)), (400, -32600));
    // Unknown method -> -32601.
    assert_eq!(c.err("no/such/method", json!({})).await["code"], -32601);
    // Wrong param types -> -32602.
    assert_eq!(
        c.err("tasks/get", json!({"taskId": 7})).await["code"],
        -32602
    );
    assert_eq!(c.err("tasks/get", json!({})).await["code"], -32602);
    assert_eq!(
        c.err("tasks/list", json!({"cursor": 3})).await["code"],
        -32602
    );
    assert_eq!(
        c.err("tools/call", json!({"name": ["echo"]})).await["code"],
        -32602
    );
    assert_eq!(
        c.err(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 1}, "task": {"ttl": "long"}})
        )
        .await["code"],
        -32602
    );
    assert_eq!(
        c.err(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 1}, "task": {"ttl": -5}})
        )
        .await["code"],
        -32602
    );
    // Body over the limit -> 413.
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(8192)
    );
    let raw = c.post_raw(c.headers(), big).await;
    assert_eq!(raw.status, 413, "{}", raw.body);
    // Wrong content type -> 415; nothing acceptable -> 406.
    let mut h = c.headers();
    h.insert("content-type", HeaderValue::from_static("text/plain"));
    assert_eq!(
        c.post_raw(h, request(1, "ping", json!({}))).await.status,
        415
    );
    let mut h = c.headers();
    h.insert("accept", HeaderValue::from_static("text/html"));
    assert_eq!(
        c.post_raw(h, request(1, "ping", json!({}))).await.status,
        406
    );
    // Invalid UTF-8 is a parse error, not a crash.
    let raw = c.post_raw(c.headers(), vec![0xff, 0xfe, 0x00]).await;
    assert_eq!(code(&raw), -32700);
    // The server is alive and well after all of it.
    assert_eq!(c.ok("ping", json!({})).await, json!({}));
}

/// Covers H-3.
#[tokio::test]
async fn h3_notifications_and_responses_get_202_without_body() {
    let server = Server::start(&[]);
    let c = server.client().await;
    let raw = c
        .post_raw(c.headers(), json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}}).to_string())
        .await;
    assert_eq!(raw.status, 202);
    assert!(raw.body.is_empty());
    let raw = c
        .post_raw(
            c.headers(),
            json!({"jsonrpc": "2.0", "id": "x", "result": {}}).to_string(),
        )
        .await;
    assert_eq!(raw.status, 202);
    assert!(raw.body.is_empty());
}

/// Covers H-4.
#[tokio::test]
async fn h4_get_opens_an_sse_stream_with_a_priming_event() {
    let server = Server::start(&[]);
    let c = server.client().await;
    let mut h = c.headers();
    h.insert("accept", HeaderValue::from_static("text/event-stream"));
    let mut r = c.http.get(&c.url).headers(h).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let chunk = r.chunk().await.unwrap().unwrap();
    let events = parse_sse(std::str::from_utf8(&chunk).unwrap());
    assert!(events[0].id.is_some() && events[0].has_data_field && events[0].data.is_empty());
    // Without accepting SSE, GET is 406.
    let mut h = c.headers();
    h.insert("accept", HeaderValue::from_static("application/json"));
    let r = c.http.get(&c.url).headers(h).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 406);
}

/// Covers H-9.
#[tokio::test]
async fn h9_tools_list_has_demo_tools_with_schemas_and_task_support() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    // T-2: a `task` field on a request type that is not task-capable is ignored.
    let result = c.ok("tools/list", json!({"task": {"ttl": 1000}})).await;
    let tools = result["tools"].as_array().unwrap();
    let support = |name: &str| {
        let t = tools
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name} listed"));
        assert_eq!(t["inputSchema"]["type"], "object");
        assert!(t["description"].is_string());
        t["execution"]["taskSupport"].as_str().unwrap().to_owned()
    };
    assert_eq!(support("echo"), "forbidden");
    assert_eq!(support("sleep"), "optional");
    assert_eq!(support("sleep_as_task"), "required");
    assert_eq!(support("fail"), "optional");
    assert!(result.get("nextCursor").is_none());
    assert_eq!(
        c.err("tools/list", json!({"cursor": "abc"})).await["code"],
        -32602
    );
}

/// Covers H-10.
#[tokio::test]
async fn h10_tools_call_results_unknown_tool_and_invalid_arguments() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let r = c
        .ok(
            "tools/call",
            json!({"name": "echo", "arguments": {"a": [1, 2]}}),
        )
        .await;
    assert_eq!(r["structuredContent"], json!({"a": [1, 2]}));
    assert_eq!(r["content"][0]["type"], "text");
    // Unknown tool -> -32602.
    let e = c.err("tools/call", json!({"name": "nope"})).await;
    assert_eq!(e["code"], -32602);
    assert!(e["message"].as_str().unwrap().contains("nope"));
    // Invalid arguments -> a tool result with isError.
    let r = c
        .ok(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": "ten"}}),
        )
        .await;
    assert_eq!(r["isError"], true);
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("seconds")
    );
    let r = c
        .ok(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 1, "bogus": 1}}),
        )
        .await;
    assert_eq!(r["isError"], true);
    // fail -> isError result, not a JSON-RPC error.
    let r = c
        .ok(
            "tools/call",
            json!({"name": "fail", "arguments": {"message": "boom"}}),
        )
        .await;
    assert_eq!(r["isError"], true);
    assert_eq!(r["content"][0]["text"], "boom");
}

/// Covers H-11.
#[tokio::test]
async fn h11_plain_call_streams_progress_with_the_callers_token() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let messages = c
        .request_messages(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 2, "message": "done"}, "_meta": {"progressToken": "tok-1"}}),
        )
        .await;
    let progress: Vec<f64> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| {
            assert_eq!(m["params"]["progressToken"], "tok-1");
            m["params"]["progress"].as_f64().unwrap()
        })
        .collect();
    assert_eq!(progress, vec![1.0, 2.0], "progress increases");
    assert_eq!(
        messages.last().unwrap()["result"]["content"][0]["text"],
        "done"
    );
}
