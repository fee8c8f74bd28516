//! Issue 14, timeouts on the wire and the connection cap: slow or silent
//! clients are let go within the documented deadlines, connections beyond
//! `--max-connections` are refused at once, and none of it cuts an SSE
//! stream or stops oversized headers being answered 431.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::{Duration, Instant};

use common::{Client, Server, SseReader};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `host:port` of the broker.
fn address(server: &Server) -> String {
    server
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned()
}

/// Read until the broker closes the connection (EOF or reset) or `limit`
/// passes; returns what was read and when it closed, if it did.
async fn read_until_closed(tcp: &mut TcpStream, limit: Duration) -> (String, Option<Instant>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), None),
            Ok(Ok(0)) | Ok(Err(_)) => {
                return (
                    String::from_utf8_lossy(&got).into_owned(),
                    Some(Instant::now()),
                );
            }
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Issue 14: 200 connections that sent half of their request head are all
/// closed by the broker within the header timeout (1 s) plus a margin.
#[tokio::test]
async fn issue14_half_open_headers_are_closed_within_the_header_timeout() {
    let server = Server::start(&["--header-timeout", "1", "--idle-timeout", "30"]);
    let addr = address(&server);
    let started = Instant::now();
    let mut held = Vec::new();
    for _ in 0..200 {
        let mut tcp = TcpStream::connect(&addr).await.unwrap();
        tcp.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
            .await
            .unwrap();
        held.push(tcp);
    }
    let readers = held.into_iter().map(|mut tcp| {
        tokio::spawn(async move { read_until_closed(&mut tcp, Duration::from_secs(5)).await })
    });
    for reader in readers {
        let (_, closed) = reader.await.unwrap();
        let closed = closed.expect("a half-open connection still held after 5 s");
        let after = closed - started;
        assert!(after < Duration::from_secs(4), "closed after {after:?}");
    }
    // The broker still serves.
    server.client().await.ok("ping", json!({})).await;
}

/// Issue 14: a POST that declares `Content-Length: 100` and sends 10 bytes
/// is answered 408 within the body timeout (1 s) plus a margin.
#[tokio::test]
async fn issue14_a_stalled_body_is_answered_408_within_the_body_timeout() {
    let server = Server::start(&["--body-timeout", "1"]);
    let addr = address(&server);
    let mut tcp = TcpStream::connect(&addr).await.unwrap();
    let started = Instant::now();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(b"{\"jsonrpc\"").await.unwrap();
    let (answer, closed) = read_until_closed(&mut tcp, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("--body-timeout"), "{answer}");
    let closed = closed.expect("connection still open after the 408");
    let after = closed - started;
    assert!(
        after >= Duration::from_millis(900) && after < Duration::from_secs(3),
        "answered after {after:?}"
    );
}

/// Issue 14: with `--max-connections 20` held by 20 clients in the middle
/// of their heads, the 21st connection is refused at once (503, then
/// closed); once one of the 20 leaves, a normal MCP client is served.
#[tokio::test]
async fn issue14_connections_beyond_the_cap_are_refused_at_once_while_a_client_is_served() {
    // A long header timeout, so the 20 stay held for the whole test.
    let server = Server::start(&["--max-connections", "20", "--header-timeout", "60"]);
    let addr = address(&server);
    let mut held = Vec::new();
    for _ in 0..20 {
        let mut tcp = TcpStream::connect(&addr).await.unwrap();
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .unwrap();
        held.push(tcp);
    }
    // Let the broker accept them all before the 21st.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut extra = TcpStream::connect(&addr).await.unwrap();
    let started = Instant::now();
    let (answer, closed) = read_until_closed(&mut extra, Duration::from_secs(5)).await;
    let closed = closed.expect("the 21st connection was held, not refused");
    assert!(
        closed - started < Duration::from_secs(1),
        "refused after {:?}",
        closed - started
    );
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 503"),
        "{answer}"
    );
    // One leaves: its place is free for a normal client.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c = Client::new(&server.url);
    c.initialize().await;
    let task = c.call_task("sleep", json!({"seconds": 0})).await;
    let task_id = task["taskId"].as_str().unwrap();
    let done = c.wait_terminal(task_id, Duration::from_secs(10)).await;
    assert_eq!(done["status"], "completed");
    // The held ones were never cut.
    for tcp in &mut held {
        let (_, closed) = read_until_closed(tcp, Duration::from_millis(10)).await;
        assert!(closed.is_none(), "a held connection was closed");
    }
}

/// Issue 14: an SSE `tasks/result` stream that carries nothing for 4 s,
/// longer than every timeout (1 s each), still delivers its result.
#[tokio::test]
async fn issue14_an_sse_result_stream_idle_beyond_every_timeout_delivers_its_result() {
    let server = Server::start(&[
        "--header-timeout",
        "1",
        "--body-timeout",
        "1",
        "--idle-timeout",
        "1",
    ]);
    let mut c = server.client().await;
    let task = c.call_task("sleep", json!({"seconds": 4})).await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let started = Instant::now();
    let (id, response) = c
        .post_stream("tasks/result", json!({"taskId": task_id}))
        .await;
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut sse = SseReader::new(response);
    // Status notifications may come first; the answer ends the stream.
    let result = loop {
        let (_, message) = sse.next_message().await.expect("stream closed early");
        if message.get("id").is_some() {
            break message;
        }
    };
    assert_eq!(result["id"], id, "{result}");
    assert!(result.get("result").is_some(), "{result}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "answered too soon"
    );
}

/// Issue 14: a kept-alive connection with no request in flight is closed
/// after the idle timeout (2 s), and not at the header timeout (1 s).
#[tokio::test]
async fn issue14_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let server = Server::start(&["--header-timeout", "1", "--idle-timeout", "2"]);
    let addr = address(&server);
    let mut tcp = TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = tcp.read(&mut buf).await.unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
        "{answer}"
    );
    let idle_since = Instant::now();
    let (_, closed) = read_until_closed(&mut tcp, Duration::from_secs(5)).await;
    let after = closed.expect("idle connection still open after 5 s") - idle_since;
    assert!(
        after >= Duration::from_millis(1800) && after < Duration::from_secs(4),
        "closed after {after:?}"
    );
}

/// Oversized request heads are still refused with 431.
#[tokio::test]
async fn issue14_oversized_headers_are_still_answered_431() {
    let server = Server::start(&[]);
    let addr = address(&server);
    let tcp = TcpStream::connect(&addr).await.unwrap();
    let (mut rd, mut wr) = tcp.into_split();
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1024 * 1024)
    );
    // The broker may answer and close before the head is all written.
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(head.as_bytes()).await;
        wr
    });
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), rd.read_to_end(&mut got)).await;
    let answer = String::from_utf8_lossy(&got);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    drop(writer.await);
}

/// Issue 14, shutdown with the new accept loop: on SIGTERM new connections
/// are refused, an idle kept-alive connection is closed at once, a
/// `tasks/result` stream in flight still delivers, and the broker exits.
#[tokio::test]
async fn issue14_sigterm_stops_accepting_closes_idle_connections_and_lets_streams_finish() {
    // The default worker --grace (10 s) lets the 2 s job finish.
    let mut server = Server::start(&[]);
    let addr = address(&server);
    let mut c = server.client().await;
    let task = c.call_task("sleep", json!({"seconds": 2})).await;
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let (id, response) = c
        .post_stream("tasks/result", json!({"taskId": task_id}))
        .await;
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    idle.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    assert!(idle.read(&mut buf).await.unwrap() > 0);
    let pid = nix::unistd::Pid::from_raw(server.child().id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let (_, closed) = read_until_closed(&mut idle, Duration::from_secs(2)).await;
    assert!(closed.is_some(), "idle connection still open after SIGTERM");
    // The listener closes as the accept loop sees the signal.
    let refused_by = Instant::now() + Duration::from_secs(1);
    while TcpStream::connect(&addr).await.is_ok() {
        assert!(
            Instant::now() < refused_by,
            "new connections still accepted 1 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut sse = SseReader::new(response);
    let result = loop {
        let (_, message) = sse.next_message().await.expect("stream cut by shutdown");
        if message.get("id").is_some() {
            break message;
        }
    };
    assert_eq!(result["id"], id, "{result}");
    assert!(result.get("result").is_some(), "{result}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = server.child().try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "broker still running 10 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
}
