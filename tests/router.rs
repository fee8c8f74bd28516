//! The `/mcp` router in process, driven by `tower::ServiceExt::oneshot`
//! (no socket) over a real SQLite file in a temporary directory: the HTTP
//! rules that need no connection, answered with the same statuses,
//! JSON-RPC codes and headers as `tests/transport.rs` and
//! `tests/security.rs` see from the real binary over TCP.

use std::net::SocketAddr;
use std::process::Command;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use serde_json::{Value, json};
use taskbroker::app::{McpEndpoint, ServeConfig};
use taskbroker::tools::demo_tools;
use tempfile::TempDir;
use tower::ServiceExt;

/// The address the endpoint answers as (origin and host checks).
const LOCAL: &str = "127.0.0.1:8808";
/// The body limit of these tests, in bytes.
const MAX_BODY: usize = 4096;

/// An endpoint on a fresh database, and the directory that holds it.
struct Broker {
    endpoint: McpEndpoint,
    _dir: TempDir,
}

/// One answer: status, headers and the body as JSON (Null when empty).
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    /// The JSON-RPC error code of the body.
    fn code(&self) -> Option<i64> {
        self.body["error"]["code"].as_i64()
    }

    /// A header's value as text ("" when absent).
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

impl Broker {
    /// A broker on a new SQLite file; with `principal`, a token is created
    /// for it first (so every request needs one), and returned.
    async fn start(principal: Option<&str>) -> (Self, Option<String>) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let db = dir.path().join("broker.db");
        let token = principal.map(|p| create_token(&db, p));
        let mut config = ServeConfig::new(&db, demo_tools());
        config.server.max_body_bytes = MAX_BODY;
        let local: SocketAddr = LOCAL.parse().expect("an address");
        let endpoint = McpEndpoint::start(config, local)
            .await
            .expect("the endpoint starts");
        (
            Self {
                endpoint,
                _dir: dir,
            },
            token,
        )
    }

    fn router(&self) -> Router {
        self.endpoint.router.clone()
    }

    async fn send(&self, request: Request<Body>) -> Answer {
        let response = self
            .router()
            .oneshot(request)
            .await
            .expect("the router answers");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("a body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)))
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    /// Initialize a session (and confirm it); its id.
    async fn session(&self, token: Option<&str>) -> String {
        let answer = self.send(post(initialize(), token).body_json()).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        let id = answer.header("mcp-session-id").to_owned();
        assert!(!id.is_empty(), "initialize names a session");
        let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let answer = self
            .send(post(initialized, token).session(&id).body_json())
            .await;
        assert_eq!(answer.status, StatusCode::ACCEPTED);
        id
    }
}

/// A request being built, with its JSON body.
struct Draft {
    builder: axum::http::request::Builder,
    body: Value,
}

/// A POST to `/mcp` as a well-behaved local client sends it.
fn post(body: Value, token: Option<&str>) -> Draft {
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri("/mcp")
        .header("host", LOCAL)
        .header("content-type", "application/json")
        .header("accept", "application/json");
    if let Some(t) = token {
        builder = builder.header("authorization", format!("Bearer {t}"));
    }
    Draft { builder, body }
}

impl Draft {
    /// Set header `name` to `value` (replacing what `post` put there).
    fn header(mut self, name: &'static str, value: &str) -> Self {
        if let Some(headers) = self.builder.headers_mut() {
            headers.insert(name, value.parse().expect("a header value"));
        }
        self
    }

    fn session(self, id: &str) -> Self {
        self.header("mcp-session-id", id)
            .header("mcp-protocol-version", "2025-11-25")
    }

    fn body_json(self) -> Request<Body> {
        self.builder
            .body(Body::from(self.body.to_string()))
            .expect("a request")
    }
}

fn initialize() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": { "name": "router-test", "version": "1" }
        }
    })
}

fn ping() -> Value {
    json!({ "jsonrpc": "2.0", "id": 2, "method": "ping" })
}

/// `taskbroker token create` on `db` (it creates the database); the token.
fn create_token(db: &std::path::Path, principal: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .args(["token", "create", "--principal", principal, "--db"])
        .arg(db)
        .env_remove("TASKBROKER_DB")
        .output()
        .expect("taskbroker token runs");
    assert!(
        out.status.success(),
        "token create failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let token = text.lines().last().unwrap_or_default().trim().to_owned();
    assert!(token.starts_with("tbk_"), "last stdout line: {text:?}");
    token
}

/// Covers H-2: a foreign Origin, or a foreign Host, is 403 before anything
/// else is looked at; a local Origin passes.
#[tokio::test]
async fn h2_foreign_origin_or_host_is_403() {
    let (broker, _) = Broker::start(None).await;
    for (name, value) in [
        ("origin", "https://evil.example.com"),
        ("origin", "null"),
        ("host", "evil.example.com"),
    ] {
        let answer = broker
            .send(post(initialize(), None).header(name, value).body_json())
            .await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{name}: {value}");
        assert_eq!(answer.code(), Some(-32000), "{name}: {value}");
        assert_eq!(answer.header("content-type"), "application/json");
    }
    let answer = broker
        .send(
            post(initialize(), None)
                .header("origin", "http://localhost:5173")
                .body_json(),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    broker.endpoint.stop().await;
}

/// Covers H-13: with a token in the database, a request without one is 401
/// with a plain Bearer challenge, a bad one 401 with error="invalid_token",
/// a token in the query string 400; a valid one passes.
#[tokio::test]
async fn h13_missing_or_invalid_bearer_is_401_when_tokens_exist() {
    let (broker, token) = Broker::start(Some("alice")).await;
    let token = token.expect("a token");

    let answer = broker.send(post(initialize(), None).body_json()).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    assert_eq!(answer.code(), Some(-32001));
    assert_eq!(
        answer.header("www-authenticate"),
        "Bearer realm=\"taskbroker\""
    );

    let answer = broker
        .send(post(initialize(), Some("tbk_nosuchid_nosecret")).body_json())
        .await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    assert_eq!(answer.code(), Some(-32001));
    assert_eq!(
        answer.header("www-authenticate"),
        "Bearer realm=\"taskbroker\", error=\"invalid_token\""
    );

    let in_query = Request::builder()
        .method(Method::POST)
        .uri(format!("/mcp?access_token={token}"))
        .header("host", LOCAL)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {token}"))
        .body(Body::from(initialize().to_string()))
        .expect("a request");
    let answer = broker.send(in_query).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.code(), Some(-32000));

    let answer = broker
        .send(post(initialize(), Some(&token)).body_json())
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    broker.endpoint.stop().await;
}

/// Covers H-3: a body over the limit is 413 (and the connection is not
/// kept), whether its length is declared or not.
#[tokio::test]
async fn h3_oversized_body_is_413() {
    let (broker, _) = Broker::start(None).await;
    let big = json!({
        "jsonrpc": "2.0", "id": 1, "method": "ping",
        "params": { "pad": "x".repeat(2 * MAX_BODY) }
    });
    let declared = post(big.clone(), None)
        .header("content-length", &big.to_string().len().to_string())
        .body_json();
    for (how, request) in [
        ("declared", declared),
        ("undeclared", post(big, None).body_json()),
    ] {
        let answer = broker.send(request).await;
        assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE, "{how}");
        assert_eq!(answer.code(), Some(-32000), "{how}");
        assert_eq!(
            answer.body["error"]["message"],
            format!("Payload Too Large: the body limit is {MAX_BODY} bytes"),
            "{how}"
        );
        assert_eq!(answer.header("connection"), "close", "{how}");
    }
    broker.endpoint.stop().await;
}

/// Covers H-3: a body that is not JSON by its media type is 415; a client
/// that accepts neither JSON nor SSE is 406.
#[tokio::test]
async fn h3_wrong_content_type_is_415_and_nothing_acceptable_is_406() {
    let (broker, _) = Broker::start(None).await;
    let mut request = post(ping(), None).body_json();
    request
        .headers_mut()
        .insert("content-type", "text/plain".parse().expect("a value"));
    let answer = broker.send(request).await;
    assert_eq!(answer.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(answer.code(), Some(-32000));

    let mut request = post(ping(), None).body_json();
    request
        .headers_mut()
        .insert("accept", "text/html".parse().expect("a value"));
    let answer = broker.send(request).await;
    assert_eq!(answer.status, StatusCode::NOT_ACCEPTABLE);
    assert_eq!(answer.code(), Some(-32000));
    broker.endpoint.stop().await;
}

/// Covers H-3, H-8: malformed JSON is 400 with -32700; an unknown method on
/// a session is a JSON-RPC -32601.
#[tokio::test]
async fn h3_h8_parse_error_and_unknown_method() {
    let (broker, _) = Broker::start(None).await;
    let malformed = Request::builder()
        .method(Method::POST)
        .uri("/mcp")
        .header("host", LOCAL)
        .header("content-type", "application/json")
        .body(Body::from("{\"jsonrpc\": "))
        .expect("a request");
    let answer = broker.send(malformed).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.code(), Some(-32700));

    let session = broker.session(None).await;
    let unknown = json!({ "jsonrpc": "2.0", "id": 7, "method": "no/such/method" });
    let answer = broker
        .send(post(unknown, None).session(&session).body_json())
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body["id"], 7);
    assert_eq!(answer.code(), Some(-32601));
    broker.endpoint.stop().await;
}

/// Covers H-4: GET on a session without accepting text/event-stream is 406.
/// Covers H-1: a method other than POST, GET and DELETE is 405 with Allow.
#[tokio::test]
async fn h4_get_without_sse_accept_is_406_and_h1_other_methods_405() {
    let (broker, _) = Broker::start(None).await;
    let session = broker.session(None).await;
    let get = Request::builder()
        .method(Method::GET)
        .uri("/mcp")
        .header("host", LOCAL)
        .header("accept", "application/json")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .body(Body::empty())
        .expect("a request");
    let answer = broker.send(get).await;
    assert_eq!(answer.status, StatusCode::NOT_ACCEPTABLE);

    let put = Request::builder()
        .method(Method::PUT)
        .uri("/mcp")
        .header("host", LOCAL)
        .header("mcp-session-id", &session)
        .body(Body::empty())
        .expect("a request");
    let answer = broker.send(put).await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(answer.header("allow"), "GET, POST, DELETE");
    assert_eq!(answer.code(), Some(-32000));
    broker.endpoint.stop().await;
}
