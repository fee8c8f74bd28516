//! Security end to end (H-13, T-36..T-39, H-2), against the real binary
//! over real HTTP: bearer tokens and their CLI, principals owning tasks and
//! sessions, behaviour without tokens, abuse limits, and the audit trail.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[macro_use]
mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Client, Driver, Raw, Server, create_token};
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn rpc(id: i64, method: &str, params: Value) -> String {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string()
}

fn initialize_body() -> String {
    rpc(
        0,
        "initialize",
        json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": { "name": "security-tests", "version": "0" }
        }),
    )
}

/// Run `taskbroker token <args> --db <server db>`.
fn token_cli(server: &Server, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .arg("token")
        .args(args)
        .arg("--db")
        .arg(server.db_arg())
        .env_remove("TASKBROKER_DB")
        .env("RUST_LOG", "warn")
        .output()
        .expect("taskbroker token runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// (id, secret) of `tbk_<id>_<secret>`.
fn split_token(token: &str) -> (&str, &str) {
    token
        .strip_prefix("tbk_")
        .and_then(|rest| rest.split_once('_'))
        .unwrap_or_else(|| panic!("not a tbk_<id>_<secret> token: {token}"))
}

/// A client carrying `token`, with an initialized session.
async fn authed(server: &Server, token: &str) -> Client {
    let mut c = Client::new(&server.url);
    c.token = Some(token.to_owned());
    c.initialize().await;
    c
}

/// `c`'s headers with Authorization replaced by `value` (removed for None).
fn with_auth(c: &Client, value: Option<&[u8]>) -> HeaderMap {
    let mut h = c.headers();
    h.remove("authorization");
    if let Some(v) = value {
        h.insert("authorization", HeaderValue::from_bytes(v).unwrap());
    }
    h
}

fn www_authenticate(raw: &Raw) -> String {
    raw.headers
        .get("www-authenticate")
        .unwrap_or_else(|| panic!("401 without WWW-Authenticate: {raw:?}"))
        .to_str()
        .unwrap()
        .to_owned()
}

/// A 401 with a Bearer challenge of realm "taskbroker" and a JSON-RPC
/// error body; `invalid` says whether it must carry error="invalid_token".
#[track_caller]
fn assert_401(raw: &Raw, invalid: bool, what: &str) {
    assert_eq!(raw.status, 401, "{what}: {}", raw.body);
    let challenge = www_authenticate(raw);
    assert!(
        challenge.starts_with("Bearer ") && challenge.contains("realm=\"taskbroker\""),
        "{what}: challenge {challenge}"
    );
    assert_eq!(
        challenge.contains("error=\"invalid_token\""),
        invalid,
        "{what}: challenge {challenge}"
    );
    let body = raw.json();
    assert_eq!(body["jsonrpc"], "2.0", "{what}");
    assert!(body["error"]["code"].is_i64(), "{what}: {body}");
    assert!(body.get("result").is_none(), "{what}: {body}");
}

/// The code and message of an error object.
fn code_message(error: &Value) -> (i64, String) {
    (
        error["code"].as_i64().unwrap_or_else(|| panic!("{error}")),
        error["message"].as_str().unwrap().to_owned(),
    )
}

/// Every task id of `c`'s tasks/list, following cursors.
async fn all_task_ids(c: &mut Client) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..1000 {
        let params = match &cursor {
            Some(cur) => json!({ "cursor": cur }),
            None => json!({}),
        };
        let page = c.ok("tasks/list", params).await;
        for t in page["tasks"].as_array().unwrap() {
            ids.push(t["taskId"].as_str().unwrap().to_owned());
        }
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return ids,
        }
    }
    panic!("tasks/list never ended");
}

fn task_id(task: &Value) -> String {
    task["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{task}"))
        .to_owned()
}

fn contains_bytes(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// GET the session's stream.
async fn open_get(c: &Client) -> reqwest::Response {
    c.http
        .get(&c.url)
        .headers(c.headers())
        .send()
        .await
        .expect("GET failed")
}

async fn raw_of(response: reqwest::Response) -> Raw {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.text().await.unwrap_or_default();
    Raw {
        status,
        headers,
        body,
    }
}

/// Covers H-13: `token create` prints the token once, alone on the last
/// stdout line; `token list` never shows a secret; the database holds only a
/// 32-byte SHA-256 of the secret. (SQLite only: it searches the database
/// and WAL files for the secrets.)
#[tokio::test]
async fn h13_token_cli_prints_once_and_stores_only_a_hash() {
    // Started first: the database exists and is migrated; tokens are made
    // while it runs.
    let server = Server::start(&[]);
    let alice = create_token(&server, "alice", &[]);
    let bob = create_token(&server, "bob", &["--expires", "30d"]);
    assert_ne!(alice, bob);
    let (alice_id, alice_secret) = split_token(&alice);
    let (bob_id, bob_secret) = split_token(&bob);
    assert_ne!(alice_id, bob_id);
    assert!(alice_secret.len() >= 43, "256-bit secret: {alice}");

    // token list: ids and principals, never a secret.
    let out = token_cli(&server, &["list"]);
    assert!(out.status.success());
    let list = stdout(&out);
    let line_of = |id: &str| {
        list.lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("token {id} not listed: {list}"))
            .to_owned()
    };
    assert!(line_of(alice_id).contains("alice"), "{list}");
    assert!(line_of(bob_id).contains("bob"), "{list}");
    assert!(line_of(bob_id).contains("expires"), "{list}");
    for secret in [alice_secret, bob_secret] {
        assert!(!list.contains(secret), "token list shows a secret: {list}");
    }
    assert!(!list.contains("tbk_"), "token list shows a token: {list}");

    // The rows: the principal and a 32-byte hash of the secret, no secret.
    let db = server.read_db().await;
    let rows: Vec<(String, String, Vec<u8>)> =
        sqlx::query_as("SELECT token_id, principal, secret_hash FROM tokens ORDER BY principal")
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(rows.len(), 2);
    for ((id, principal, hash), (want_id, want_principal, secret)) in rows.iter().zip([
        (alice_id, "alice", alice_secret),
        (bob_id, "bob", bob_secret),
    ]) {
        assert_eq!((id.as_str(), principal.as_str()), (want_id, want_principal));
        assert_eq!(hash.len(), 32, "a SHA-256");
        let expected: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        assert_eq!(hash.as_slice(), expected.as_slice());
        assert_ne!(hash.as_slice(), secret.as_bytes());
    }
    let every_column: Vec<(String,)> = sqlx::query_as(
        "SELECT coalesce(token_id, '') || ' ' || principal || ' ' || hex(secret_hash) || ' ' ||
                coalesce(created_at, '') || ' ' || coalesce(expires_at, '') FROM tokens",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    for (text,) in &every_column {
        assert!(!text.contains(alice_secret) && !text.contains(bob_secret));
    }
    db.close().await;
    // Nor anywhere in the database files (main file and WAL).
    for file in ["broker.db", "broker.db-wal"] {
        let bytes = std::fs::read(server.dir.join(file)).unwrap_or_default();
        for secret in [alice_secret, bob_secret] {
            assert!(
                !contains_bytes(&bytes, secret.as_bytes()),
                "{file} holds a token secret"
            );
        }
    }

    // The printed token works.
    let mut c = authed(&server, &alice).await;
    assert_eq!(c.ok("ping", json!({})).await, json!({}));
}

/// Covers H-13 (and H-2 before it): no token -> 401 with a Bearer
/// challenge; wrong secret, unknown id, malformed header -> 401
/// invalid_token; a token in the query string -> 400 even with a valid
/// header; revoked and expired tokens -> 401, at once for open sessions.
async fn h13_requests_need_a_valid_bearer_token(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let alice = create_token(&server, "alice", &[]);
    let (alice_id, alice_secret) = split_token(&alice);
    let other_secret = split_token(&create_token(&server, "other", &[]))
        .1
        .to_owned();

    let mut a = authed(&server, &alice).await;
    assert_eq!(a.ok("ping", json!({})).await, json!({}));

    // No token: 401, a challenge without error=.
    let anonymous = Client::new(&server.url);
    let raw = anonymous
        .post_raw(anonymous.headers(), initialize_body())
        .await;
    assert_401(&raw, false, "no token, initialize");
    let raw = a
        .post_raw(with_auth(&a, None), rpc(1, "ping", json!({})))
        .await;
    assert_401(&raw, false, "no token, on a live session");
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let r = a
            .http
            .request(method.clone(), &a.url)
            .headers(with_auth(&a, None))
            .send()
            .await
            .unwrap();
        assert_401(&raw_of(r).await, false, &format!("no token, {method}"));
    }

    // Bad tokens: 401 with error="invalid_token".
    let wrong_secret = format!("Bearer tbk_{alice_id}_{other_secret}");
    let unknown_id = format!("Bearer tbk_nosuchtokenid_{alice_secret}");
    let truncated = format!("Bearer {}", &alice[..alice.len() - 1]);
    let no_scheme = alice.clone();
    let basic = format!("Basic {alice}");
    let secret_only = format!("Bearer {alice_secret}");
    let no_prefix = format!("Bearer {alice_id}_{alice_secret}");
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("wrong secret", wrong_secret.into_bytes()),
        ("unknown id", unknown_id.into_bytes()),
        ("truncated secret", truncated.into_bytes()),
        ("no scheme", no_scheme.into_bytes()),
        ("Basic scheme", basic.into_bytes()),
        ("secret only", secret_only.into_bytes()),
        ("no tbk_ prefix", no_prefix.into_bytes()),
        ("Bearer alone", b"Bearer".to_vec()),
        ("empty token", b"Bearer ".to_vec()),
        ("no separator", b"Bearer tbk_abcdef".to_vec()),
        ("empty header", b"".to_vec()),
        ("not ASCII", b"Bearer tbk_\xff\xfe_\xfa".to_vec()),
    ];
    for (what, value) in &bad {
        let raw = a
            .post_raw(with_auth(&a, Some(value)), rpc(2, "ping", json!({})))
            .await;
        assert_401(&raw, true, what);
        let raw = anonymous
            .post_raw(with_auth(&anonymous, Some(value)), initialize_body())
            .await;
        assert_401(&raw, true, &format!("{what}, initialize"));
    }

    // A token in the URL: 400, even with a valid header.
    for query in [
        format!("access_token={alice}"),
        format!("x=1&token={alice}"),
        "access_token=x".to_owned(),
    ] {
        let mut in_url = Client::new(&format!("{}?{query}", server.url));
        in_url.session = a.session.clone();
        in_url.token = Some(alice.clone());
        let raw = in_url
            .post_raw(in_url.headers(), rpc(3, "ping", json!({})))
            .await;
        assert_eq!(raw.status, 400, "?{query}: {}", raw.body);
        assert!(raw.body.contains("query string"), "{}", raw.body);
        let raw = in_url.post_raw(in_url.headers(), initialize_body()).await;
        assert_eq!(raw.status, 400, "?{query}, initialize: {}", raw.body);
    }

    // H-2: a foreign Origin is refused even with a valid token.
    let mut h = a.headers();
    h.insert(
        "origin",
        HeaderValue::from_static("https://evil.example.com"),
    );
    let raw = a.post_raw(h, rpc(4, "ping", json!({}))).await;
    assert_eq!(raw.status, 403, "{}", raw.body);

    // Revoked while a session is open: the next request fails.
    let carol = create_token(&server, "carol", &[]);
    let carol_id = split_token(&carol).0.to_owned();
    let mut c = authed(&server, &carol).await;
    assert_eq!(c.ok("ping", json!({})).await, json!({}));
    let out = token_cli(&server, &["revoke", &carol_id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let raw = c.post_raw(c.headers(), rpc(5, "ping", json!({}))).await;
    assert_401(&raw, true, "revoked token, open session");
    let raw = c.post_raw(c.headers(), initialize_body()).await;
    assert_401(&raw, true, "revoked token, initialize");
    let list = stdout(&token_cli(&server, &["list"]));
    let line = list.lines().find(|l| l.starts_with(&carol_id)).unwrap();
    assert!(line.contains("revoked"), "{list}");
    assert!(
        !token_cli(&server, &["revoke", &carol_id]).status.success(),
        "revoking twice is an error"
    );
    assert!(!token_cli(&server, &["revoke", "nosuchid"]).status.success());

    // Expired: works until its time, then 401. (5 s: the CLI and
    // initialize must fit before expiry on a loaded machine; the 401 is
    // polled for, so the test takes no longer than the expiry.)
    let made = Instant::now();
    let dave = create_token(&server, "dave", &["--expires", "5s"]);
    let mut d = authed(&server, &dave).await;
    assert_eq!(d.ok("ping", json!({})).await, json!({}));
    let deadline = made + Duration::from_secs(30);
    let raw = loop {
        let raw = d.post_raw(d.headers(), rpc(6, "ping", json!({}))).await;
        if raw.status != 200 {
            break raw;
        }
        assert!(
            Instant::now() < deadline,
            "the token still works after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        made.elapsed() >= Duration::from_secs(5),
        "refused before its expiry: {:?}",
        made.elapsed()
    );
    assert_401(&raw, true, "expired token, open session");
    let raw = d.post_raw(d.headers(), initialize_body()).await;
    assert_401(&raw, true, "expired token, initialize");
    let list = stdout(&token_cli(&server, &["list"]));
    let dave_id = split_token(&dave).0;
    let line = list.lines().find(|l| l.starts_with(dave_id)).unwrap();
    assert!(line.contains("expired"), "{list}");

    // The valid token still works, and no secret reached the log.
    assert_eq!(a.ok("ping", json!({})).await, json!({}));
    let log = server.log();
    for token in [&alice, &carol, &dave] {
        let secret = split_token(token).1;
        assert!(!log.contains(secret), "the server log holds a token secret");
    }
}

both_drivers!(h13_requests_need_a_valid_bearer_token);

/// Covers T-36 (and H-13): tasks and sessions belong to the principal.
/// Another principal's task answers exactly like a made-up id on tasks/get,
/// tasks/result and tasks/cancel, is absent from tasks/list, and its cursor
/// is refused; another principal's session id answers 404 like an unknown
/// one; one principal's sessions share its tasks.
async fn t36_tasks_and_sessions_belong_to_their_principal(driver: Driver) {
    let server = Server::start_on(driver, &["--page-size", "1", "--workers", "8"]);
    let alice = create_token(&server, "alice", &[]);
    let bob = create_token(&server, "bob", &[]);
    let mut a = authed(&server, &alice).await;
    let mut b = authed(&server, &bob).await;

    let a_working = task_id(&a.call_task("sleep", json!({ "seconds": 30 })).await);
    let a_done = task_id(&a.call_task("sleep", json!({ "seconds": 0 })).await);
    let b_working = task_id(&b.call_task("sleep", json!({ "seconds": 30 })).await);
    let b_done = task_id(&b.call_task("sleep", json!({ "seconds": 0 })).await);
    for (c, id) in [(&mut a, &a_done), (&mut b, &b_done)] {
        let t = c.wait_terminal(id, Duration::from_secs(20)).await;
        assert_eq!(t["status"], "completed", "{t}");
    }

    // Bob on alice's tasks: exactly the answer for a task that never was.
    let made_up = uuid::Uuid::new_v4().to_string();
    for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
        let none = code_message(&b.err(method, json!({ "taskId": made_up })).await);
        assert_eq!(none.0, -32602, "{method}: {none:?}");
        for foreign in [&a_working, &a_done] {
            let got = code_message(&b.err(method, json!({ "taskId": foreign })).await);
            assert_eq!(got, none, "bob's {method} of alice's task {foreign}");
        }
    }
    // ... and changed nothing.
    let t = a.ok("tasks/get", json!({ "taskId": a_working })).await;
    assert_eq!(t["status"], "working", "bob's cancel reached it: {t}");
    let r = a.ok("tasks/result", json!({ "taskId": a_done })).await;
    assert_eq!(r["content"][0]["text"], "slept 0 s", "{r}");

    // tasks/list: each sees only their own.
    let bob_sees = all_task_ids(&mut b).await;
    assert!(bob_sees.contains(&b_working) && bob_sees.contains(&b_done));
    assert!(
        !bob_sees.contains(&a_working) && !bob_sees.contains(&a_done),
        "bob lists alice's tasks: {bob_sees:?}"
    );
    let alice_sees = all_task_ids(&mut a).await;
    assert!(alice_sees.contains(&a_working) && alice_sees.contains(&a_done));
    assert!(!alice_sees.contains(&b_working) && !alice_sees.contains(&b_done));

    // Alice's cursor is refused for bob.
    let page = a.ok("tasks/list", json!({})).await;
    let cursor = page["nextCursor"].as_str().expect("page size 1: a cursor");
    let e = b.err("tasks/list", json!({ "cursor": cursor })).await;
    assert_eq!(e["code"], -32602, "{e}");

    // Bob with alice's session id: 404, exactly like an unknown session,
    // for POST, GET and DELETE.
    let mut bob_on_alice = Client::new(&server.url);
    bob_on_alice.token = Some(bob.clone());
    bob_on_alice.session = a.session.clone();
    let mut bob_on_nothing = Client::new(&server.url);
    bob_on_nothing.token = Some(bob.clone());
    bob_on_nothing.session = Some(uuid::Uuid::new_v4().simple().to_string());
    for body in [
        rpc(7, "ping", json!({})),
        rpc(8, "tasks/get", json!({ "taskId": a_working })),
        rpc(9, "tasks/list", json!({})),
        json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }).to_string(),
    ] {
        let got = bob_on_alice
            .post_raw(bob_on_alice.headers(), body.clone())
            .await;
        let none = bob_on_nothing
            .post_raw(bob_on_nothing.headers(), body.clone())
            .await;
        assert_eq!(none.status, 404, "{}", none.body);
        assert_eq!((got.status, got.body), (none.status, none.body), "{body}");
    }
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let send = |c: &Client| {
            c.http
                .request(method.clone(), &c.url)
                .headers(c.headers())
                .send()
        };
        let got = raw_of(send(&bob_on_alice).await.unwrap()).await;
        let none = raw_of(send(&bob_on_nothing).await.unwrap()).await;
        assert_eq!(none.status, 404, "{method}: {}", none.body);
        assert_eq!((got.status, got.body), (none.status, none.body), "{method}");
    }
    // Bob's DELETE did not end alice's session.
    assert_eq!(a.ok("ping", json!({})).await, json!({}));

    // Alice's second session sees, and acts on, her tasks from the first.
    let mut a2 = authed(&server, &alice).await;
    assert_ne!(a2.session, a.session);
    let from_second = all_task_ids(&mut a2).await;
    assert!(from_second.contains(&a_working) && from_second.contains(&a_done));
    assert!(!from_second.contains(&b_working));
    let a2_done = task_id(&a2.call_task("sleep", json!({ "seconds": 0 })).await);
    assert!(all_task_ids(&mut a).await.contains(&a2_done));
    let r = a2.ok("tasks/result", json!({ "taskId": a_done })).await;
    assert_eq!(r["content"][0]["text"], "slept 0 s");
    // The cursor alice got on her first session works on her second.
    let next = a2.ok("tasks/list", json!({ "cursor": cursor })).await;
    assert!(next["tasks"].is_array(), "{next}");
    let t = a2.ok("tasks/cancel", json!({ "taskId": a_working })).await;
    assert_eq!(t["status"], "cancelled", "{t}");
    let t = b.ok("tasks/get", json!({ "taskId": b_working })).await;
    assert_eq!(t["status"], "working");
}

both_drivers!(t36_tasks_and_sessions_belong_to_their_principal);

/// Covers T-37: without any token, requests need no Authorization, and a
/// session's tasks are invisible to another session.
async fn t37_without_tokens_sessions_own_their_tasks(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let mut a = server.client().await;
    let mut b = server.client().await;
    assert!(a.headers().get("authorization").is_none());
    let id = task_id(&a.call_task("sleep", json!({ "seconds": 0 })).await);
    a.wait_terminal(&id, Duration::from_secs(20)).await;
    let made_up = uuid::Uuid::new_v4().to_string();
    for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
        let none = code_message(&b.err(method, json!({ "taskId": made_up })).await);
        let got = code_message(&b.err(method, json!({ "taskId": id })).await);
        assert_eq!(got, none, "{method} of another session's task");
    }
    assert!(!all_task_ids(&mut b).await.contains(&id));
    assert!(all_task_ids(&mut a).await.contains(&id));
}

both_drivers!(t37_without_tokens_sessions_own_their_tasks);

/// Covers T-38: --max-open-tasks refuses the next task with -32000 naming
/// max_open_tasks, until one ends.
#[tokio::test]
async fn t38_max_open_tasks() {
    let server = Server::start(&["--max-open-tasks", "2", "--workers", "4"]);
    let mut c = server.client().await;
    let first = task_id(&c.call_task("sleep", json!({ "seconds": 30 })).await);
    c.call_task("sleep", json!({ "seconds": 30 })).await;
    let call = json!({ "name": "sleep", "arguments": { "seconds": 30 }, "task": {} });
    let e = c.err("tools/call", call.clone()).await;
    assert_eq!(e["code"], -32000, "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.starts_with("Too many open tasks") && message.contains("max_open_tasks"),
        "{message}"
    );
    assert_eq!(all_task_ids(&mut c).await.len(), 2, "no task was made");
    // Plain calls are not tasks.
    let r = c
        .ok(
            "tools/call",
            json!({ "name": "echo", "arguments": { "x": 1 } }),
        )
        .await;
    assert_eq!(r["structuredContent"]["x"], 1);
    // After a cancel there is room again.
    let t = c.ok("tasks/cancel", json!({ "taskId": first })).await;
    assert_eq!(t["status"], "cancelled");
    c.ok("tools/call", call.clone()).await;
    assert_eq!(c.err("tools/call", call).await["code"], -32000);
}

/// Covers T-38: --max-argument-bytes refuses larger arguments with -32602
/// naming max_argument_bytes, for plain and task calls.
#[tokio::test]
async fn t38_max_argument_bytes() {
    let server = Server::start(&["--max-argument-bytes", "100"]);
    let mut c = server.client().await;
    let big = "x".repeat(200);
    for call in [
        json!({ "name": "echo", "arguments": { "text": big } }),
        json!({ "name": "sleep", "arguments": { "seconds": 0, "message": big }, "task": {} }),
    ] {
        let e = c.err("tools/call", call.clone()).await;
        assert_eq!(e["code"], -32602, "{call}: {e}");
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains("max_argument_bytes") && message.contains("the limit is 100"),
            "{message}"
        );
    }
    assert!(all_task_ids(&mut c).await.is_empty(), "no task was made");
    let r = c
        .ok(
            "tools/call",
            json!({ "name": "echo", "arguments": { "text": "small" } }),
        )
        .await;
    assert_eq!(r["structuredContent"]["text"], "small");
}

/// Covers T-38: --rate 2 --rate-burst 3: the 4th quick request gets 429
/// with Retry-After and a JSON-RPC error; after waiting, requests pass.
#[tokio::test]
async fn t38_rate_limit_answers_429_with_retry_after() {
    let server = Server::start(&["--rate", "2", "--rate-burst", "3"]);
    let mut c = server.client().await;
    // Let the bucket fill again after initialize (2 requests); waiting
    // longer changes nothing, a full bucket holds 3.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    // The burst (3) passes, then the first request that finds the bucket
    // empty is refused. The bucket refills at 2/s while the requests run:
    // on a slow machine they may earn more passes, one per 500 ms taken,
    // and never fewer.
    let burst_started = Instant::now();
    let mut passed = 0u32;
    let raw = loop {
        let raw = c.post_raw(c.headers(), rpc(99, "ping", json!({}))).await;
        if raw.status != 200 {
            break raw;
        }
        passed += 1;
        assert!(passed <= 100, "no 429 after 100 requests");
    };
    let earned = (burst_started.elapsed().as_secs_f64() * 2.0).floor() as u32;
    assert!(
        (3..=3 + earned).contains(&passed),
        "{passed} passed in {:?}, burst 3 at 2/s",
        burst_started.elapsed()
    );
    assert_eq!(raw.status, 429, "{}", raw.body);
    let retry: u64 = raw
        .headers
        .get("retry-after")
        .expect("Retry-After")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry), "Retry-After: {retry}");
    let body = raw.json();
    assert_eq!(body["jsonrpc"], "2.0");
    assert_eq!(body["id"], Value::Null);
    assert_eq!(body["error"]["code"], -32000, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Too Many Requests"),
        "{body}"
    );
    tokio::time::sleep(Duration::from_secs(retry)).await;
    assert_eq!(c.ok("ping", json!({})).await, json!({}));
}

/// Covers T-38: --max-sessions 2: the third initialize gets 503; ending a
/// session makes room.
#[tokio::test]
async fn t38_max_sessions() {
    let server = Server::start(&["--max-sessions", "2"]);
    let first = server.client().await;
    let _second = server.client().await;
    let third = Client::new(&server.url);
    let raw = third.post_raw(third.headers(), initialize_body()).await;
    assert_eq!(raw.status, 503, "{}", raw.body);
    assert!(raw.headers.get("mcp-session-id").is_none());
    let body = raw.json();
    assert_eq!(body["error"]["code"], -32000, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum is 2"),
        "{body}"
    );
    let r = first
        .http
        .delete(&first.url)
        .headers(first.headers())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    server.client().await;
}

/// Covers T-38: --max-sse-streams 1: with one GET stream open a second gets
/// 503; once the first is dropped a new one is accepted.
#[tokio::test]
async fn t38_max_sse_streams() {
    let server = Server::start(&["--max-sse-streams", "1"]);
    let c = server.client().await;
    let first = open_get(&c).await;
    assert_eq!(first.status().as_u16(), 200);
    let second = raw_of(open_get(&c).await).await;
    assert_eq!(second.status, 503, "{}", second.body);
    let body = second.json();
    assert_eq!(body["error"]["code"], -32000, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_sse_streams"),
        "{body}"
    );
    // Plain JSON requests are not streams.
    let raw = c
        .post_raw(
            {
                let mut h = c.headers();
                h.insert("accept", HeaderValue::from_static("application/json"));
                h
            },
            rpc(1, "ping", json!({})),
        )
        .await;
    assert_eq!(raw.status, 200, "{}", raw.body);
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = open_get(&c).await;
        match r.status().as_u16() {
            200 => break,
            503 if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => panic!("GET after the first stream dropped: {other}"),
        }
    }
}

/// Covers T-38: --max-body 1000: a larger body gets 413, with or without a
/// Content-Length.
#[tokio::test]
async fn t38_max_body() {
    let server = Server::start(&["--max-body", "1000"]);
    let c = server.client().await;
    let big = rpc(
        5,
        "tools/call",
        json!({ "name": "echo", "arguments": { "text": "x".repeat(2000) } }),
    );
    let raw = c.post_raw(c.headers(), big.clone()).await;
    assert_eq!(raw.status, 413, "{}", raw.body);
    assert_eq!(raw.json()["error"]["code"], -32000);
    // Chunked: no Content-Length to judge by. Over a raw connection, to
    // see what becomes of it: a server that closes it after the 413 must
    // say so (Connection: close), or a pooling client's next request on it
    // fails.
    let (head, body) = chunked_post(&server, c.session.as_deref().unwrap(), &big).await;
    assert!(head.starts_with("HTTP/1.1 413"), "chunked: {head}{body}");
    assert!(body.contains("Payload Too Large"), "{body}");
    // A fresh client: the connection of the chunked request is dealt with
    // above.
    let mut fresh = Client::new(&server.url);
    fresh.session = c.session.clone();
    let r = fresh
        .ok(
            "tools/call",
            json!({ "name": "echo", "arguments": { "text": "x".repeat(500) } }),
        )
        .await;
    assert_eq!(r["structuredContent"]["text"].as_str().unwrap().len(), 500);
}

/// Read one HTTP/1.1 response (with a Content-Length) from `stream`:
/// (status line and headers, body); None at end of stream.
async fn read_response(stream: &mut tokio::net::TcpStream) -> Option<(String, String)> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + length]).into_owned();
                return Some((head, body));
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .expect("no response within 10 s")
            .unwrap_or(0);
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// POST `body` chunked on a new connection; return the response. If the
/// server keeps the connection open (no Connection: close), a ping must
/// then be answered on it.
async fn chunked_post(server: &Server, session: &str, body: &str) -> (String, String) {
    use tokio::io::AsyncWriteExt;
    let addr = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\n\
         Transfer-Encoding: chunked\r\n\r\n"
    );
    for piece in body.as_bytes().chunks(300) {
        request.push_str(&format!("{:x}\r\n", piece.len()));
        request.push_str(std::str::from_utf8(piece).unwrap());
        request.push_str("\r\n");
    }
    request.push_str("0\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let (head, answer) = read_response(&mut stream)
        .await
        .expect("the connection closed without a response");
    let closes = head
        .lines()
        .any(|l| l.to_ascii_lowercase().replace(' ', "") == "connection:close");
    if !closes {
        let ping = rpc(1, "ping", json!({}));
        let next = format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Accept: application/json\r\nMcp-Session-Id: {session}\r\n\
             Content-Length: {}\r\n\r\n{ping}",
            ping.len()
        );
        // A write may fail already when the server has closed.
        let written = stream.write_all(next.as_bytes()).await;
        let second = match written {
            Ok(()) => read_response(&mut stream).await,
            Err(_) => None,
        };
        let (second_head, _) = second.unwrap_or_else(|| {
            panic!(
                "the server closed the connection after this response without \
                 Connection: close, so a client that reuses it fails:\n{head}"
            )
        });
        assert!(second_head.starts_with("HTTP/1.1 200"), "{second_head}");
    }
    (head, answer)
}

/// The log lines of target `audit`.
fn audit_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains(" audit: ")).collect()
}

/// Whether one audit line holds every needle.
fn audited(log: &str, needles: &[&str]) -> bool {
    audit_lines(log)
        .iter()
        .any(|l| needles.iter().all(|n| l.contains(n)))
}

/// Covers T-39 (with H-13, T-36): task creation, result retrieval and
/// cancellation are audited with principal and task id; so is every refused
/// lookup (tasks/get, tasks/result, tasks/cancel of another's task) and
/// every refused authentication; no token secret reaches the log.
#[tokio::test]
async fn t39_audit_trail_records_task_operations_and_refusals() {
    let server = Server::start(&["--workers", "4"]);
    let alice = create_token(&server, "alice", &[]);
    let bob = create_token(&server, "bob", &[]);
    let mut a = authed(&server, &alice).await;
    let mut b = authed(&server, &bob).await;

    let done = task_id(&a.call_task("sleep", json!({ "seconds": 0 })).await);
    a.wait_terminal(&done, Duration::from_secs(20)).await;
    a.ok("tasks/result", json!({ "taskId": done })).await;
    let working = task_id(&a.call_task("sleep", json!({ "seconds": 30 })).await);
    a.ok("tasks/cancel", json!({ "taskId": working })).await;

    b.err("tasks/get", json!({ "taskId": done })).await;
    b.err("tasks/result", json!({ "taskId": done })).await;
    b.err("tasks/cancel", json!({ "taskId": working })).await;

    let anonymous = Client::new(&server.url);
    assert_eq!(
        anonymous
            .post_raw(anonymous.headers(), initialize_body())
            .await
            .status,
        401
    );
    let raw = anonymous
        .post_raw(
            with_auth(&anonymous, Some(b"Bearer tbk_nosuchid_secret")),
            initialize_body(),
        )
        .await;
    assert_eq!(raw.status, 401);

    let log = server.log();
    let mut missing = Vec::new();
    for (event, id) in [
        ("task.create", &done),
        ("task.create", &working),
        ("task.result", &done),
        ("task.cancel", &working),
    ] {
        let needles = [&format!("event=\"{event}\""), "principal=\"alice\"", id];
        if !audited(&log, &needles) {
            missing.push(format!("{event} of {id} by alice"));
        }
    }
    for (event, id) in [
        ("task.get", &done),
        ("task.result", &done),
        ("task.cancel", &working),
    ] {
        let needles = [
            "audit: refused",
            &format!("event=\"{event}\""),
            "principal=\"bob\"",
            id,
        ];
        if !audited(&log, &needles) {
            missing.push(format!("refused {event} of {id} by bob"));
        }
    }
    let auth_refused = audit_lines(&log)
        .iter()
        .filter(|l| l.contains("event=\"auth.refused\""))
        .count();
    if auth_refused < 2 {
        missing.push(format!("auth.refused twice (found {auth_refused})"));
    }
    assert!(
        missing.is_empty(),
        "audit lines missing: {missing:?}\naudit trail:\n{}",
        audit_lines(&log).join("\n")
    );
    for token in [&alice, &bob] {
        assert!(!log.contains(split_token(token).1), "a secret in the log");
    }
}

/// Covers T-39: the 10th refused task lookup by one principal within a
/// minute raises the warning "repeated refused task lookups", not before.
#[tokio::test]
async fn t39_repeated_refused_lookups_raise_a_warning() {
    let server = Server::start(&[]);
    let carol = create_token(&server, "carol", &[]);
    let mut c = authed(&server, &carol).await;
    let warned = |log: &str| {
        audit_lines(log)
            .iter()
            .any(|l| l.contains("repeated refused task lookups") && l.contains("carol"))
    };
    for i in 1..=10 {
        assert!(
            !warned(&server.log()),
            "warning after only {} refused lookups",
            i - 1
        );
        let guess = uuid::Uuid::new_v4().to_string();
        let method = if i % 2 == 0 {
            "tasks/get"
        } else {
            "tasks/result"
        };
        c.err(method, json!({ "taskId": guess })).await;
        assert!(
            audited(
                &server.log(),
                &["audit: refused", "principal=\"carol\"", &guess]
            ),
            "refused {method} of {guess} not audited"
        );
    }
    let log = server.log();
    let warning = audit_lines(&log)
        .into_iter()
        .find(|l| l.contains("repeated refused task lookups"))
        .unwrap_or_else(|| panic!("no warning:\n{}", audit_lines(&log).join("\n")));
    assert!(
        warning.contains("WARN") && warning.contains("principal=\"carol\""),
        "{warning}"
    );
}

/// Covers H-13: once `token create` returned, no session opens without a
/// token, even when the request carries a made-up Mcp-Session-Id (requests
/// on open sessions may reuse a 20 ms old look at whether tokens exist;
/// initialize never does). An anonymous session opened before the first
/// token is refused too once that look is renewed.
async fn h13_first_token_closes_new_sessions_at_once(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let mut anonymous = server.client().await;
    assert_eq!(anonymous.ok("ping", json!({})).await, json!({}));
    // The look "no tokens" is now fresh in the server.
    create_token(&server, "alice", &[]);
    let probe = Client::new(&server.url);
    let mut h = probe.headers();
    h.insert(
        "mcp-session-id",
        HeaderValue::from_static("made-up-session-id"),
    );
    let raw = probe.post_raw(h, initialize_body()).await;
    assert_401(&raw, false, "initialize with a made-up session id");
    let raw = probe.post_raw(probe.headers(), initialize_body()).await;
    assert_401(&raw, false, "initialize");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let raw = anonymous
        .post_raw(anonymous.headers(), rpc(7, "ping", json!({})))
        .await;
    assert_401(
        &raw,
        false,
        "ping on a session opened before the first token",
    );
}

both_drivers!(h13_first_token_closes_new_sessions_at_once);
