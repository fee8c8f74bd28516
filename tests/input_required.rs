//! input_required across processes and restarts (T-24..T-27), task status
//! notifications (T-31), notifications/cancelled for plain calls (T-23),
//! and resumption of a plain call's stream with Last-Event-ID (H-4).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::{Client, Driver, Server, SseReader, WorkerProc, parse_time_ms};
use reqwest::header::HeaderValue;
use serde_json::{Value, json};

const RELATED: &str = "io.modelcontextprotocol/related-task";

async fn elicit_client(server: &Server) -> Client {
    let mut c = Client::new(&server.url);
    c.initialize_with(json!({"elicitation": {}})).await;
    c
}

async fn wait_status(c: &mut Client, task_id: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let t = c.ok("tasks/get", json!({"taskId": task_id})).await;
        if t["status"] == status {
            return t;
        }
        assert!(Instant::now() < deadline, "task never {status}: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Open tasks/result and read until the pending request arrives.
async fn open_result(c: &mut Client, task_id: &str) -> (SseReader, Value) {
    let (_, response) = c
        .post_stream("tasks/result", json!({"taskId": task_id}))
        .await;
    let mut sse = SseReader::new(response);
    loop {
        let (_, m) = sse
            .next_message()
            .await
            .expect("a request before the stream ends");
        if m.get("method").is_some() && m.get("id").is_some() {
            return (sse, m);
        }
    }
}

async fn answer(c: &Client, request: &Value, result: Value) {
    let body = json!({"jsonrpc": "2.0", "id": request["id"], "result": result});
    let raw = c.post_raw(c.headers(), body.to_string()).await;
    assert_eq!(raw.status, 202, "{}", raw.body);
}

/// The final response on a tasks/result stream, skipping notifications.
async fn final_response(sse: &mut SseReader) -> Value {
    loop {
        let (_, m) = sse.next_message().await.expect("the response");
        if m.get("result").is_some() || m.get("error").is_some() {
            return m;
        }
    }
}

/// Covers T-24, T-25, T-26, T-27 with the tool in a separate worker
/// process: input_required, the request on tasks/result with related-task
/// _meta, the answer by POST, back to working, completed.
async fn t24_t27_elicitation_round_trip_through_a_task_in_a_worker_process(driver: Driver) {
    let server = Server::start_on(driver, &["--workers", "0"]);
    let _w = WorkerProc::start(&server, 0, &["--lease", "5"]);
    let mut c = elicit_client(&server).await;
    let t = c
        .call_task("approve", json!({"question": "Deploy to production?"}))
        .await;
    let id = t["taskId"].as_str().unwrap().to_owned();
    let waiting = wait_status(&mut c, &id, "input_required").await;
    assert!(
        waiting["statusMessage"]
            .as_str()
            .unwrap()
            .contains("elicitation/create")
    );
    let (mut sse, request) = open_result(&mut c, &id).await;
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(request["params"]["message"], "Deploy to production?");
    assert_eq!(request["params"]["mode"], "form");
    assert_eq!(
        request["params"]["requestedSchema"]["properties"]["approved"]["type"],
        "boolean"
    );
    assert_eq!(request["params"]["_meta"][RELATED]["taskId"], json!(id)); // T-25
    answer(
        &c,
        &request,
        json!({"action": "accept", "content": {"approved": true}}),
    )
    .await;
    let response = final_response(&mut sse).await;
    assert_eq!(response["result"]["content"][0]["text"], "approved");
    assert_eq!(response["result"]["structuredContent"]["approved"], true);
    assert_eq!(response["result"]["_meta"][RELATED]["taskId"], json!(id));
    let db = server.db_reader().await;
    let history: Vec<String> = db
        .scalars(
            "SELECT to_status FROM v_task_history WHERE task_id = $1 ORDER BY id",
            &[(&id).into()],
        )
        .await;
    assert_eq!(
        history,
        ["working", "input_required", "working", "completed"]
    );
    let ran_by: String = db
        .scalar(
            "SELECT j.lease_owner FROM jobs j JOIN tasks t ON t.seq = j.task_seq WHERE t.task_id = $1",
            &[(&id).into()],
        )
        .await;
    assert!(
        ran_by.contains(&format!(":{}:", _w.pid())),
        "ran in the worker process: {ran_by}"
    );
}

both_drivers!(t24_t27_elicitation_round_trip_through_a_task_in_a_worker_process);

/// Covers T-26 across a restart: kill -9 the server while the task waits;
/// after restart tasks/result delivers the same request (same id) and the
/// answer reaches the tool in the worker process that never died.
async fn t26_pending_request_survives_a_server_restart(driver: Driver) {
    let mut server = Server::start_on(driver, &["--workers", "0"]);
    let w = WorkerProc::start(&server, 0, &["--lease", "5"]);
    let mut c = elicit_client(&server).await;
    let t = c
        .call_task("approve", json!({"question": "Restart-proof?"}))
        .await;
    let id = t["taskId"].as_str().unwrap().to_owned();
    wait_status(&mut c, &id, "input_required").await;
    let (sse, first) = open_result(&mut c, &id).await;
    drop(sse);
    server.kill_and_restart();
    c.reconnect(&server.url);
    assert_eq!(
        c.ok("tasks/get", json!({"taskId": id})).await["status"],
        "input_required"
    );
    let (mut sse, again) = open_result(&mut c, &id).await;
    assert_eq!(again["id"], first["id"], "same request id after restart");
    assert_eq!(again["params"], first["params"]);
    answer(
        &c,
        &again,
        json!({"action": "accept", "content": {"approved": false}}),
    )
    .await;
    let response = final_response(&mut sse).await;
    assert_eq!(response["result"]["content"][0]["text"], "not approved");
    assert!(w.log().contains("task asks the client"), "the worker asked");
}

both_drivers!(t26_pending_request_survives_a_server_restart);

/// Decline and cancel actions reach the tool as such.
async fn t27_decline_and_cancel_actions_reach_the_tool(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let mut c = elicit_client(&server).await;
    for (action, text) in [
        ("decline", "the user declined to answer"),
        ("cancel", "the user did not answer (cancel)"),
    ] {
        let t = c.call_task("approve", json!({"question": "?"})).await;
        let id = t["taskId"].as_str().unwrap().to_owned();
        let (mut sse, request) = open_result(&mut c, &id).await;
        answer(&c, &request, json!({"action": action})).await;
        let response = final_response(&mut sse).await;
        assert_eq!(response["result"]["content"][0]["text"], text);
        assert_eq!(response["result"]["structuredContent"]["action"], action);
    }
}

both_drivers!(t27_decline_and_cancel_actions_reach_the_tool);

/// H-12: a client that did not declare elicitation is never asked: the
/// tool hears so, and its task fails with the reason (T-12).
async fn h12_a_task_cannot_ask_a_client_without_the_capability(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let mut c = server.client().await;
    let t = c.call_task("approve", json!({"question": "?"})).await;
    let id = t["taskId"].as_str().unwrap();
    let done = c.wait_terminal(id, Duration::from_secs(10)).await;
    assert_eq!(done["status"], "failed");
    assert!(
        done["statusMessage"]
            .as_str()
            .unwrap()
            .contains("could not ask the user"),
        "{done}"
    );
}

both_drivers!(h12_a_task_cannot_ask_a_client_without_the_capability);

/// T-21/T-22 while input_required: cancel ends it at once, and a late answer
/// changes nothing.
async fn t21_cancel_while_input_required(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let mut c = elicit_client(&server).await;
    let t = c.call_task("approve", json!({"question": "?"})).await;
    let id = t["taskId"].as_str().unwrap().to_owned();
    let (sse, request) = open_result(&mut c, &id).await;
    drop(sse);
    assert_eq!(
        c.ok("tasks/cancel", json!({"taskId": id})).await["status"],
        "cancelled"
    );
    answer(
        &c,
        &request,
        json!({"action": "accept", "content": {"approved": true}}),
    )
    .await;
    // Its worker has stopped the job: nothing left that could act on the
    // answer.
    server
        .wait_for_log(
            &format!("job stopped: task cancelled task_id={id}"),
            Duration::from_secs(15),
        )
        .await;
    assert_eq!(
        c.ok("tasks/get", json!({"taskId": id})).await["status"],
        "cancelled"
    );
    assert_eq!(
        c.err("tasks/result", json!({"taskId": id})).await["code"],
        -32800
    );
}

both_drivers!(t21_cancel_while_input_required);

/// Covers T-31: notifications/tasks/status with the full Task on the
/// session's GET stream, for changes written by a worker process. Prints
/// the delay from the worker's status write (lastUpdatedAt) to receipt.
async fn t31_status_notifications_on_the_get_stream_from_a_worker_process(driver: Driver) {
    let server = Server::start_on(driver, &["--workers", "0"]);
    let _w = WorkerProc::start(&server, 0, &["--lease", "5"]);
    let mut c = server.client().await;
    let mut h = c.headers();
    h.insert("accept", HeaderValue::from_static("text/event-stream"));
    let r = c.http.get(&c.url).headers(h).send().await.unwrap();
    let mut get = SseReader::new(r);
    get.next_event().await.unwrap(); // priming
    let mut delays = Vec::new();
    for _ in 0..5 {
        let t = c.call_task("sleep", json!({"seconds": 0.2})).await;
        let id = t["taskId"].as_str().unwrap().to_owned();
        loop {
            let (_, m) = get.next_message().await.unwrap();
            assert_eq!(m["method"], "notifications/tasks/status");
            assert!(
                m["params"].get("_meta").is_none(),
                "T-30: no related-task _meta"
            );
            if m["params"]["taskId"] == json!(id) && m["params"]["status"] == "completed" {
                let written = parse_time_ms(m["params"]["lastUpdatedAt"].as_str().unwrap());
                let now = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
                delays.push(now - written);
                assert!(m["params"]["createdAt"].is_string() && m["params"]["ttl"].is_i64());
                break;
            }
        }
    }
    delays.sort();
    eprintln!(
        "worker status write -> GET stream notification: {delays:?} ms (median {} ms)",
        delays[2]
    );
    assert!(delays[2] < 500, "median delay {} ms", delays[2]);
}

both_drivers!(t31_status_notifications_on_the_get_stream_from_a_worker_process);

/// Covers T-23: notifications/cancelled stops a plain call in flight.
async fn t23_notifications_cancelled_stops_a_plain_call(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let mut c = server.client().await;
    let (id, response) = c
        .post_stream(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 30}}),
        )
        .await;
    let mut sse = SseReader::new(response);
    sse.next_event().await.unwrap(); // priming: the call is running
    let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": id, "reason": "test"}});
    let started = Instant::now();
    assert_eq!(c.post_raw(c.headers(), note.to_string()).await.status, 202);
    let (_, m) = sse.next_message().await.unwrap();
    assert_eq!(m["id"], id);
    assert_eq!(m["error"]["code"], -32800);
    // Stopped, not run out: well before the call's 30 s.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

both_drivers!(t23_notifications_cancelled_stops_a_plain_call);

/// Covers H-4: a client that drops a plain call's stream and reconnects
/// with Last-Event-ID gets exactly the messages it missed, in order, with
/// no duplicates.
async fn h4_resume_gets_exactly_the_missed_messages_in_order(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let mut c = server.client().await;
    let (id, response) = c
        .post_stream(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 3}, "_meta": {"progressToken": "r"}}),
        )
        .await;
    let mut sse = SseReader::new(response);
    sse.next_event().await.unwrap(); // priming
    let (first, m) = sse.next_message().await.unwrap();
    assert_eq!(m["params"]["progress"], 1.0);
    drop(sse); // the connection drops; the call goes on
    // Progress 2, 3 and the result pass: the broker logs the call's end.
    server
        .wait_for_log("request method=\"tools/call\"", Duration::from_secs(15))
        .await;
    let mut h = c.headers();
    h.insert("accept", HeaderValue::from_static("text/event-stream"));
    h.insert(
        "last-event-id",
        HeaderValue::from_str(first.id.as_deref().unwrap()).unwrap(),
    );
    let r = c.http.get(&c.url).headers(h).send().await.unwrap();
    let mut resumed = SseReader::new(r);
    let mut seen = Vec::new();
    while let Some((event, m)) = resumed.next_message().await {
        seen.push((event.id.unwrap(), m));
    }
    let progress: Vec<f64> = seen
        .iter()
        .filter(|(_, m)| m["method"] == "notifications/progress")
        .map(|(_, m)| m["params"]["progress"].as_f64().unwrap())
        .collect();
    assert_eq!(
        progress,
        vec![2.0, 3.0],
        "exactly the missed progress, in order"
    );
    assert_eq!(seen.last().unwrap().1["id"], id);
    let ids: std::collections::HashSet<_> = seen.iter().map(|(i, _)| i.clone()).collect();
    assert_eq!(ids.len(), seen.len(), "no duplicate event ids");
}

both_drivers!(h4_resume_gets_exactly_the_missed_messages_in_order);

/// Covers H-4 and T-31 for the session's GET stream: event ids are feed
/// positions; a client that reconnects with Last-Event-ID, even after a
/// kill -9 and restart of the server, gets exactly the status changes it
/// missed, in order, without duplicates (they are read from the database).
async fn h4_get_stream_resumes_from_the_database_after_a_restart(driver: Driver) {
    let mut server = Server::start_on(driver, &[]);
    let mut c = server.client().await;
    let open_get = |c: &Client, last: Option<String>| {
        let mut h = c.headers();
        h.insert("accept", HeaderValue::from_static("text/event-stream"));
        if let Some(last) = last {
            h.insert("last-event-id", HeaderValue::from_str(&last).unwrap());
        }
        c.http.get(&c.url).headers(h).send()
    };
    let mut get = SseReader::new(open_get(&c, None).await.unwrap());
    let priming = get.next_event().await.unwrap();
    assert!(priming.id.as_deref().unwrap().starts_with("g-"));
    let first = c.call_task("sleep", json!({"seconds": 0})).await;
    let last_id = loop {
        let (event, m) = get.next_message().await.unwrap();
        if m["params"]["taskId"] == first["taskId"] && m["params"]["status"] == "completed" {
            break event.id.unwrap();
        }
    };
    drop(get);
    // Missed while away: two more tasks, start to end.
    let mut missed = Vec::new();
    for _ in 0..2 {
        let t = c.call_task("sleep", json!({"seconds": 0})).await;
        c.wait_terminal(t["taskId"].as_str().unwrap(), Duration::from_secs(10))
            .await;
        missed.push(t["taskId"].clone());
    }
    server.kill_and_restart();
    c.reconnect(&server.url);
    let mut get = SseReader::new(open_get(&c, Some(last_id.clone())).await.unwrap());
    get.next_event().await.unwrap(); // priming
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let (event, m) = get.next_message().await.unwrap();
        seen.push((
            event.id.unwrap(),
            m["params"]["taskId"].clone(),
            m["params"]["status"].clone(),
        ));
    }
    let expected: Vec<(Value, Value)> = missed
        .iter()
        .flat_map(|id| {
            [
                (id.clone(), json!("working")),
                (id.clone(), json!("completed")),
            ]
        })
        .collect();
    let got: Vec<(Value, Value)> = seen
        .iter()
        .map(|(_, t, s)| (t.clone(), s.clone()))
        .collect();
    assert_eq!(got, expected, "exactly the missed changes, in order");
    let positions: Vec<i64> = seen
        .iter()
        .map(|(id, _, _)| id.trim_start_matches("g-").parse().unwrap())
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "increasing, no duplicates: {positions:?}"
    );
    assert!(positions[0] > last_id.trim_start_matches("g-").parse::<i64>().unwrap());
}

both_drivers!(h4_get_stream_resumes_from_the_database_after_a_restart);

/// A status change goes on one stream only (the transport forbids
/// broadcasting): the task's open tasks/result stream, not the GET stream.
async fn t31_a_status_notification_is_sent_on_one_stream_only(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let mut c = server.client().await;
    let mut h = c.headers();
    h.insert("accept", HeaderValue::from_static("text/event-stream"));
    let mut get = SseReader::new(c.http.get(&c.url).headers(h).send().await.unwrap());
    get.next_event().await.unwrap(); // priming
    let t = c.call_task("sleep", json!({"seconds": 1})).await;
    let id = t["taskId"].clone();
    // The creation (working) goes to the GET stream: nobody waits yet.
    let (_, created) = get.next_message().await.unwrap();
    assert_eq!(
        (
            created["params"]["taskId"].clone(),
            created["params"]["status"].clone()
        ),
        (id.clone(), json!("working"))
    );
    let messages = c
        .request_messages("tasks/result", json!({"taskId": id}))
        .await;
    let on_result: Vec<_> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/tasks/status")
        .map(|m| m["params"]["status"].clone())
        .collect();
    assert_eq!(
        on_result,
        [json!("completed")],
        "the change went to the tasks/result stream"
    );
    // Nothing about it reached the GET stream: the next thing there is the
    // creation of another task.
    let other = c.call_task("sleep", json!({"seconds": 0})).await;
    let (_, next) = get.next_message().await.unwrap();
    assert_eq!(
        next["params"]["taskId"], other["taskId"],
        "no duplicate on the GET stream: {next}"
    );
}

both_drivers!(t31_a_status_notification_is_sent_on_one_stream_only);

/// Covers T-26: a task with two requests out at once (the second made
/// while it is already input_required, which changes no status) gets both
/// to the client on its tasks/result stream; with the tool in the server
/// and in a worker process.
async fn t26_two_requests_at_once_both_reach_the_waiting_client(driver: Driver) {
    for flags in [&["--workers", "2"][..], &["--workers", "0"][..]] {
        let server = Server::start_on(driver, flags);
        let _w = (flags[1] == "0").then(|| WorkerProc::start(&server, 0, &["--lease", "5"]));
        let mut c = elicit_client(&server).await;
        let t = c
            .call_task(
                "approve",
                json!({"question": "Deploy?", "also": "Migrate?"}),
            )
            .await;
        let id = t["taskId"].as_str().unwrap().to_owned();
        let (mut sse, first) = open_result(&mut c, &id).await;
        let second = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let (_, m) = sse
                    .next_message()
                    .await
                    .expect("the second request before the stream ends");
                if m.get("method").is_some() && m.get("id").is_some() && m["id"] != first["id"] {
                    break m;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{flags:?}: the second request never reached the stream"));
        let mut questions = vec![
            first["params"]["message"].as_str().unwrap().to_owned(),
            second["params"]["message"].as_str().unwrap().to_owned(),
        ];
        questions.sort();
        assert_eq!(questions, ["Deploy?", "Migrate?"], "{flags:?}");
        for request in [&first, &second] {
            answer(
                &c,
                request,
                json!({"action": "accept", "content": {"approved": true}}),
            )
            .await;
        }
        let response = final_response(&mut sse).await;
        assert_eq!(
            response["result"]["content"][0]["text"], "approved",
            "{flags:?}"
        );
    }
}

both_drivers!(t26_two_requests_at_once_both_reach_the_waiting_client);
