//! Issue 13, "limits that fit real use": without tokens the request rate is
//! per session, not per client address, and still stops a runaway client,
//! set low, without touching another session from the same address;
//! initialize has a per-address limit of its own.
//!
//! Every client here comes from 127.0.0.1, as local agents do, so a limit
//! keyed on the client address would refuse them.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::Server;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

/// One MCP session that many requests may use at once (the common
/// `Client` takes `&mut self` per request).
#[derive(Clone)]
struct Session {
    http: reqwest::Client,
    url: String,
    id: String,
    next_id: Arc<AtomicUsize>,
}

/// An answer: HTTP status, `Retry-After` if any, the body.
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

impl Answer {
    /// The JSON-RPC result; panics (naming `what`) on any HTTP status but
    /// 200, on a JSON-RPC error, or on a body that is not JSON.
    #[track_caller]
    fn result(&self, what: &str) -> Value {
        assert_eq!(
            self.status, 200,
            "{what}: HTTP {} {}",
            self.status, self.body
        );
        let message: Value = serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", self.body));
        assert!(message.get("error").is_none(), "{what}: {message}");
        message["result"].clone()
    }
}

fn headers(session: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("content-type", HeaderValue::from_static("application/json"));
    // JSON answers only: every request here is answered at once.
    h.insert("accept", HeaderValue::from_static("application/json"));
    if let Some(id) = session {
        h.insert("mcp-session-id", HeaderValue::from_str(id).unwrap());
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2025-11-25"),
        );
    }
    h
}

async fn post(http: &reqwest::Client, url: &str, session: Option<&str>, body: Value) -> Answer {
    let r = http
        .post(url)
        .headers(headers(session))
        .body(body.to_string())
        .send()
        .await
        .expect("POST failed");
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = r.text().await.unwrap_or_default();
    Answer {
        status,
        retry_after,
        body,
    }
}

fn initialize_body() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": { "name": "default-limits-test", "version": "0" }
        }
    })
}

/// POST initialize with no session; the raw answer.
async fn try_initialize(http: &reqwest::Client, url: &str) -> Answer {
    post(http, url, None, initialize_body()).await
}

impl Session {
    /// initialize + notifications/initialized, each answered without a 429.
    async fn open(url: &str) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let r = http
            .post(url)
            .headers(headers(None))
            .body(initialize_body().to_string())
            .send()
            .await
            .expect("POST initialize");
        let status = r.status().as_u16();
        let id = r
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = r.text().await.unwrap_or_default();
        assert_eq!(status, 200, "initialize: HTTP {status} {body}");
        let session = Self {
            http,
            url: url.to_owned(),
            id: id.expect("initialize sets Mcp-Session-Id"),
            next_id: Arc::new(AtomicUsize::new(1)),
        };
        let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let ack = post(&session.http, url, Some(&session.id), note).await;
        assert_eq!(
            ack.status, 202,
            "initialized: HTTP {} {}",
            ack.status, ack.body
        );
        session
    }

    /// A request on this session; the raw answer.
    async fn send(&self, method: &str, params: Value) -> Answer {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        post(&self.http, &self.url, Some(&self.id), body).await
    }
}

/// Issue 13: the per-session limit still bites, set low. With `--rate 5
/// --rate-burst 5` a session sending back to back is refused with 429 and
/// `Retry-After` within a few requests, while a second session from the
/// same address is served at once.
#[tokio::test]
async fn issue13_low_rate_refuses_a_runaway_session_but_not_its_neighbour() {
    let server = Server::start(&["--rate", "5", "--rate-burst", "5"]);
    let runaway = Session::open(&server.url).await;
    let neighbour = Session::open(&server.url).await;
    let mut refused = None;
    for sent in 1..=20 {
        let answer = runaway.send("ping", json!({})).await;
        if answer.status == 429 {
            refused = Some((sent, answer));
            break;
        }
        answer.result("ping");
    }
    let (sent, answer) = refused.expect("a runaway session is refused within 20 requests");
    assert!(sent <= 10, "refused only at request {sent}");
    let retry: u64 = answer
        .retry_after
        .as_deref()
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry), "Retry-After: {retry}");
    let body: Value = serde_json::from_str(&answer.body).unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Too Many Requests") && message.contains("per session"),
        "{message}"
    );
    // Same address, another session: its own bucket.
    for _ in 0..3 {
        assert_eq!(
            neighbour.send("ping", json!({})).await.result("ping"),
            json!({})
        );
    }
}

/// Issue 13: initialize (no session yet) is limited per client address by
/// a bucket of its own, so a flood of new sessions from one address is
/// slowed while the sessions it already has are served.
#[tokio::test]
async fn issue13_initialize_flood_from_one_address_is_limited() {
    let server = Server::start(&["--initialize-rate", "1", "--initialize-burst", "3"]);
    let first = Session::open(&server.url).await;
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(try_initialize(&http, &server.url).await);
    }
    let refused = statuses
        .iter()
        .position(|a| a.status == 429)
        .expect("a flood of initializes is refused");
    assert!(refused <= 2, "refused only at initialize {}", refused + 2);
    let answer = &statuses[refused];
    assert!(answer.retry_after.is_some(), "Retry-After");
    assert!(
        answer.body.contains("initialize-rate"),
        "the error names the limit: {}",
        answer.body
    );
    // The session it opened before is not slowed by its address.
    for _ in 0..10 {
        first.send("ping", json!({})).await.result("ping");
    }
}
