//! Server-to-client traffic inside a plain tools/call, over the request's
//! SSE stream: logging (notifications/message), requests to the client
//! (elicitation, sampling) answered by POST, and resumption of a closed
//! stream with Last-Event-ID (H-4, H-11, H-12). Uses the conformance fixture
//! tools (`--conformance-tools`).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{Client, Server, SseReader};
use reqwest::header::HeaderValue;
use serde_json::json;

/// Covers H-12: the elicitation request arrives on the call's stream, the
/// client answers by POST (202), and the tool gets the answer.
#[tokio::test]
async fn h12_elicitation_round_trip_inside_a_plain_call() {
    let server = Server::start(&["--conformance-tools"]);
    let mut c = Client::new(&server.url);
    c.initialize_with(json!({"elicitation": {}})).await;
    let (id, response) = c
        .post_stream(
            "tools/call",
            json!({"name": "test_elicitation", "arguments": {"message": "Who are you?"}}),
        )
        .await;
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut sse = SseReader::new(response);
    let priming = sse.next_event().await.unwrap();
    assert!(priming.id.is_some() && priming.data.is_empty());
    let (_, request) = sse.next_message().await.unwrap();
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(request["params"]["message"], "Who are you?");
    assert_eq!(request["params"]["requestedSchema"]["type"], "object");
    let answer = json!({"jsonrpc": "2.0", "id": request["id"],
                        "result": {"action": "accept", "content": {"username": "ada", "email": "ada@example.com"}}});
    let raw = c.post_raw(c.headers(), answer.to_string()).await;
    assert_eq!(raw.status, 202);
    let (_, result) = sse.next_message().await.unwrap();
    assert_eq!(result["id"], id);
    let text = result["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("action=accept") && text.contains("ada@example.com"),
        "{text}"
    );
}

/// Covers H-12: a client that declared no elicitation capability is never
/// asked; the tool hears the refusal.
#[tokio::test]
async fn h12_no_request_to_a_client_without_the_capability() {
    let server = Server::start(&["--conformance-tools"]);
    let mut c = server.client().await; // declares no capabilities
    let r = c
        .ok(
            "tools/call",
            json!({"name": "test_sampling", "arguments": {"prompt": "hi"}}),
        )
        .await;
    assert_eq!(r["isError"], true);
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("did not declare"),
        "{r}"
    );
}

/// A client's error answer reaches the tool as an error.
#[tokio::test]
async fn h12_client_error_answer_reaches_the_tool() {
    let server = Server::start(&["--conformance-tools"]);
    let mut c = Client::new(&server.url);
    c.initialize_with(json!({"sampling": {}})).await;
    let (_, response) = c
        .post_stream(
            "tools/call",
            json!({"name": "test_sampling", "arguments": {"prompt": "p"}}),
        )
        .await;
    let mut sse = SseReader::new(response);
    let (_, request) = sse.next_message().await.unwrap();
    assert_eq!(request["method"], "sampling/createMessage");
    assert_eq!(request["params"]["messages"][0]["content"]["text"], "p");
    let answer = json!({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -1, "message": "user declined"}});
    assert_eq!(
        c.post_raw(c.headers(), answer.to_string()).await.status,
        202
    );
    let (_, result) = sse.next_message().await.unwrap();
    assert_eq!(result["result"]["isError"], true);
    assert!(
        result["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("user declined")
    );
    // An answer to no pending request is accepted and ignored.
    let stray = json!({"jsonrpc": "2.0", "id": 987654, "result": {}});
    assert_eq!(c.post_raw(c.headers(), stray.to_string()).await.status, 202);
}

/// Covers H-4: the server closes the stream after the priming event (with
/// `retry`); GET with Last-Event-ID resumes it and delivers the result; a
/// foreign session cannot resume it.
#[tokio::test]
async fn h4_closed_stream_resumes_with_last_event_id() {
    let server = Server::start(&["--conformance-tools"]);
    let mut c = server.client().await;
    let (id, response) = c
        .post_stream("tools/call", json!({"name": "test_reconnection"}))
        .await;
    let body = response.text().await.unwrap();
    let events = common::parse_sse(&body);
    assert_eq!(
        events.len(),
        1,
        "only the priming event before the close: {body}"
    );
    assert!(body.contains("retry: "), "{body}");
    let last = events[0].id.clone().unwrap();

    // Another session may not resume it: it gets a fresh stream instead.
    let other = server.client().await;
    let mut h = other.headers();
    h.insert("accept", HeaderValue::from_static("text/event-stream"));
    h.insert("last-event-id", HeaderValue::from_str(&last).unwrap());
    let r = other.http.get(&other.url).headers(h).send().await.unwrap();
    let mut foreign = SseReader::new(r);
    let priming = foreign.next_event().await.unwrap();
    assert_ne!(priming.id.as_deref(), Some(last.as_str()));

    let mut h = c.headers();
    h.insert("accept", HeaderValue::from_static("text/event-stream"));
    h.insert("last-event-id", HeaderValue::from_str(&last).unwrap());
    let r = c.http.get(&c.url).headers(h).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut sse = SseReader::new(r);
    let (event, message) = sse.next_message().await.unwrap();
    assert_eq!(message["id"], id);
    assert_eq!(
        message["result"]["content"][0]["text"],
        "Reconnection test completed successfully"
    );
    // Event ids name the stream: same prefix as the priming event.
    let prefix = last.rsplit_once('-').unwrap().0;
    assert!(event.id.unwrap().starts_with(prefix));
    assert!(
        sse.next_event().await.is_none(),
        "stream ends after the response"
    );
}

/// Covers H-11 and logging/setLevel: log messages arrive on the call's
/// stream at or above the level the client set.
#[tokio::test]
async fn h11_logging_respects_set_level() {
    let server = Server::start(&["--conformance-tools"]);
    let mut c = server.client().await;
    assert_eq!(
        c.err("logging/setLevel", json!({"level": "loud"})).await["code"],
        -32602
    );
    assert_eq!(
        c.ok("logging/setLevel", json!({"level": "info"})).await,
        json!({})
    );
    let messages = c
        .request_messages("tools/call", json!({"name": "test_tool_with_logging"}))
        .await;
    let logs: Vec<_> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .collect();
    assert_eq!(logs.len(), 3);
    assert_eq!(logs[0]["params"]["level"], "info");
    assert_eq!(logs[0]["params"]["data"], "Tool execution started");
    c.ok("logging/setLevel", json!({"level": "error"})).await;
    let messages = c
        .request_messages("tools/call", json!({"name": "test_tool_with_logging"}))
        .await;
    assert!(
        messages
            .iter()
            .all(|m| m["method"] != "notifications/message")
    );
}
