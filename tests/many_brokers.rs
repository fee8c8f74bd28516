//! Many brokers on one PostgreSQL database: two `taskbroker serve`
//! processes (`--workers 0`) and two `taskbroker worker` processes share a
//! database, and a client's requests alternate between the two servers, as
//! behind a round-robin load balancer, with one Mcp-Session-Id. Sessions,
//! tasks, results, waits, cancellations and notifications must not depend
//! on which server a request reaches; a server killed -9 loses nothing.
//!
//! PostgreSQL only: skipped (one line on stderr) where no PostgreSQL server
//! answers, failed when TASKBROKER_REQUIRE_POSTGRES=1.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{Client, Driver, Server, SseReader, WorkerProc, pg};
use reqwest::header::HeaderValue;
use serde_json::{Value, json};

/// Two servers and two worker processes on one PostgreSQL database.
struct Cluster {
    // Declared first, dropped first: the workers go before the database.
    workers: Vec<WorkerProc>,
    a: Server,
    b: Server,
}

impl Cluster {
    /// None (the skip line printed) where PostgreSQL is not available.
    /// `extra` goes to both servers.
    fn start(extra: &[&str]) -> Option<Self> {
        if !pg::available() {
            return None;
        }
        let mut flags = vec!["--workers", "0"];
        flags.extend_from_slice(extra);
        let a = Server::start_on(Driver::Postgres, &flags);
        let b = Server::start_sharing(&a, &flags);
        // A lease of 30 s: no test here kills a worker, and a job must not
        // lose its lease to a busy machine (a rerun would be no fault of
        // the servers, and the kill -9 test counts attempts); its heartbeat
        // (10 s) is slower than every bound on the change signal here.
        let workers = (0..2)
            .map(|n| WorkerProc::start(&a, n, &["--lease", "30", "--concurrency", "16"]))
            .collect();
        Some(Self { workers, a, b })
    }

    /// A client behind the balancer, its session opened on A.
    async fn client(&self) -> Balanced {
        let mut c = Client::new(&self.a.url);
        c.initialize().await;
        Balanced {
            c,
            urls: [self.a.url.clone(), self.b.url.clone()],
            k: 0,
        }
    }

    /// The workers' logs together.
    fn worker_logs(&self) -> String {
        self.workers.iter().map(WorkerProc::log).collect()
    }
}

/// A client whose request k goes to server k % 2 (a round-robin load
/// balancer), or to the one named, always with the same session.
struct Balanced {
    c: Client,
    urls: [String; 2],
    k: usize,
}

const A: usize = 0;
const B: usize = 1;

impl Balanced {
    /// The client, pointed at the next server in turn.
    fn next(&mut self) -> &mut Client {
        let i = self.k % 2;
        self.k += 1;
        self.on(i)
    }

    /// A ping to server `i`, whatever the HTTP status of the answer.
    async fn raw_ping(&mut self, i: usize) -> common::Raw {
        let c = self.on(i);
        let body = json!({"jsonrpc": "2.0", "id": 0, "method": "ping"});
        c.post_raw(c.headers(), body.to_string()).await
    }

    /// The client, pointed at server `i` (A or B).
    fn on(&mut self, i: usize) -> &mut Client {
        self.c.url.clone_from(&self.urls[i]);
        &mut self.c
    }
}

fn id(task: &Value) -> String {
    task["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{task}"))
        .to_owned()
}

/// Every page of tasks/list through `pick` (which server serves page n).
async fn pages(c: &mut Balanced, pick: impl Fn(usize) -> usize) -> Vec<Value> {
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let params = match &cursor {
            Some(cur) => json!({ "cursor": cur }),
            None => json!({}),
        };
        let page = c.on(pick(pages.len())).ok("tasks/list", params).await;
        cursor = page["nextCursor"].as_str().map(str::to_owned);
        pages.push(page);
        match cursor {
            Some(_) => assert!(pages.len() < 100, "tasks/list never ends"),
            None => return pages,
        }
    }
}

/// A session opened on A is served by B: requests alternate from the
/// first one on, a task created through one is seen, listed and answered
/// through the other; a session kept busy through B stays live on A (no
/// idle expiry from A's stale view of it); a session ended through B is
/// gone on A too (within a second: A caches sessions).
#[tokio::test]
async fn a_session_opened_on_one_server_is_served_by_the_other() {
    let Some(cluster) = Cluster::start(&["--session-idle", "3"]) else {
        return;
    };
    let mut c = cluster.client().await;
    // Every request of the session's life alternates between A and B.
    assert_eq!(c.on(B).ok("ping", json!({})).await, json!({}));
    let tools = c.next().ok("tools/list", json!({})).await;
    assert!(tools["tools"].as_array().unwrap().len() >= 4, "{tools}");
    let t = c
        .on(B)
        .call_task("sleep", json!({ "seconds": 0, "message": "via B" }))
        .await;
    let task_id = id(&t);
    let done = c
        .on(A)
        .wait_terminal(&task_id, Duration::from_secs(20))
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    for i in [A, B] {
        let r = c
            .on(i)
            .ok("tasks/result", json!({ "taskId": task_id }))
            .await;
        assert_eq!(r["content"][0]["text"], "via B", "server {i}: {r}");
        let list = c.on(i).ok("tasks/list", json!({})).await;
        assert_eq!(list["tasks"][0]["taskId"], json!(task_id), "server {i}");
    }
    // Another session sees none of it, on either server.
    let mut other = cluster.client().await;
    for i in [A, B] {
        let e = other
            .on(i)
            .err("tasks/get", json!({ "taskId": task_id }))
            .await;
        assert_eq!(e["code"], -32602, "server {i}: {e}");
    }

    // A second session, without tasks (so only its use keeps it live):
    // used once on A, then only through B for longer than --session-idle.
    let mut busy = cluster.client().await;
    busy.on(A).ok("ping", json!({})).await;
    let until = Instant::now() + Duration::from_millis(4500);
    while Instant::now() < until {
        busy.on(B).ok("ping", json!({})).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let raw = busy.raw_ping(A).await;
    assert_eq!(
        raw.status, 200,
        "a session in use through B expired on A: {}",
        raw.body
    );

    // DELETE through B ends the session for A as well.
    let on_b = c.on(B);
    let r = on_b
        .http
        .delete(&on_b.url)
        .headers(on_b.headers())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let raw = c.raw_ping(B).await;
    assert_eq!(
        raw.status, 404,
        "B serves the session it ended: {}",
        raw.body
    );
    // A trusts its cache of the session for at most a second (3 s allows
    // for a loaded machine; a cache that never expired would fail).
    let ended = Instant::now();
    loop {
        let raw = c.raw_ping(A).await;
        if raw.status == 404 {
            break;
        }
        assert!(
            ended.elapsed() < Duration::from_secs(3),
            "A still serves a session ended through B {:?} later: {} {}",
            ended.elapsed(),
            raw.status,
            raw.body
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "session ended through B: 404 on A after {:?}",
        ended.elapsed()
    );
}

/// tasks/result waiting on A returns as soon as a worker process completes
/// the task, which was created through B.
#[tokio::test]
async fn a_result_waiting_on_one_server_returns_when_a_worker_completes_the_task() {
    let Some(cluster) = Cluster::start(&[]) else {
        return;
    };
    let mut c = cluster.client().await;
    for round in 0..3 {
        let t = c
            .on(B)
            .call_task(
                "sleep",
                json!({ "seconds": 1, "message": format!("r{round}") }),
            )
            .await;
        let task_id = id(&t);
        let started = Instant::now();
        let messages = c
            .on(A)
            .request_messages("tasks/result", json!({ "taskId": task_id }))
            .await;
        let waited = started.elapsed();
        let result = &messages.last().unwrap()["result"];
        assert_eq!(
            result["content"][0]["text"],
            format!("r{round}"),
            "{result}"
        );
        assert!(
            waited >= Duration::from_millis(700),
            "returned before the task could end: {waited:?}"
        );
        // The sleep is 1 s; the worker's completion reaches A through the
        // database's change signal, not a poll of seconds (4 s allows for a
        // loaded machine).
        assert!(waited < Duration::from_secs(4), "woken late: {waited:?}");
        eprintln!("round {round}: tasks/result on A returned after {waited:?}");
    }
    let ran: Vec<_> = cluster
        .worker_logs()
        .lines()
        .filter(|l| l.contains("job started"))
        .map(str::to_owned)
        .collect();
    assert_eq!(ran.len(), 3, "the worker processes ran them: {ran:?}");
}

/// tasks/list pages are the same whichever server serves them: a walk on
/// A, a walk on B and a walk alternating between them (cursors from one
/// used on the other) give identical pages.
#[tokio::test]
async fn tasks_list_pages_are_identical_from_either_server() {
    let Some(cluster) = Cluster::start(&["--page-size", "4"]) else {
        return;
    };
    let mut c = cluster.client().await;
    let mut ids = Vec::new();
    for n in 0..22 {
        let t = c
            .next()
            .call_task("sleep", json!({ "seconds": 0, "message": format!("n{n}") }))
            .await;
        ids.push(id(&t));
    }
    for task_id in &ids {
        let t = c
            .next()
            .wait_terminal(task_id, Duration::from_secs(30))
            .await;
        assert_eq!(t["status"], "completed", "{t}");
    }
    let on_a = pages(&mut c, |_| A).await;
    let on_b = pages(&mut c, |_| B).await;
    let alternating = pages(&mut c, |n| n % 2).await;
    assert_eq!(on_a.len(), 6, "22 tasks in pages of 4");
    assert_eq!(on_a, on_b, "pages from A and from B differ");
    assert_eq!(on_a, alternating, "a walk across both servers differs");
    let listed: Vec<String> = on_a
        .iter()
        .flat_map(|p| p["tasks"].as_array().unwrap().iter().map(id))
        .collect();
    ids.reverse();
    assert_eq!(listed, ids, "every task once, newest first");
}

/// tasks/cancel through B stops a tool running in a worker process: the
/// worker drops it at once, the job is closed without a retry, and a
/// tasks/result waiting on A gets the cancellation.
#[tokio::test]
async fn cancel_through_one_server_stops_the_tool_in_a_worker_process() {
    let Some(cluster) = Cluster::start(&[]) else {
        return;
    };
    let mut c = cluster.client().await;
    let task_id = id(&c.on(A).call_task("sleep", json!({ "seconds": 60 })).await);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cluster.worker_logs().contains("job started") {
        assert!(Instant::now() < deadline, "no worker started the tool");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A waiter on A for the task's result.
    let mut waiter = Client::new(&cluster.a.url);
    waiter.session = c.c.session.clone();
    let wait_id = task_id.clone();
    let waiting = tokio::spawn(async move {
        waiter
            .request("tasks/result", json!({ "taskId": wait_id }))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let cancelled = c
        .on(B)
        .ok("tasks/cancel", json!({ "taskId": task_id }))
        .await;
    let t0 = Instant::now();
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    while !cluster
        .worker_logs()
        .contains("job stopped: task cancelled")
    {
        // The heartbeat (lease/3 = 10 s) is the fallback; the change
        // signal is faster (5 s allows for a loaded machine).
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the worker did not stop the tool within 5 s:\n{}",
            cluster.worker_logs()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!(
        "cancel through B -> tool stopped in a worker in {:?}",
        t0.elapsed()
    );
    let msg = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter on A was woken")
        .unwrap();
    assert_eq!(msg["error"]["code"], -32800, "{msg}");
    // Not retried: still cancelled a while later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for i in [A, B] {
        let t = c.on(i).ok("tasks/get", json!({ "taskId": task_id })).await;
        assert_eq!(t["status"], "cancelled", "server {i}: {t}");
    }
    let db = cluster.a.db_reader().await;
    let job: (String, i64, i64) = db
        .one(
            "SELECT j.state, j.attempt, j.cancel_requested FROM jobs j JOIN tasks t ON t.seq = j.task_seq WHERE t.task_id = $1",
            &[(&task_id).into()],
        )
        .await;
    assert_eq!(job, ("done".to_owned(), 1, 1), "job closed, not retried");
}

/// notifications/tasks/status reach a GET stream held on A for tasks
/// created through B and run by worker processes.
#[tokio::test]
async fn status_notifications_reach_a_get_stream_on_one_server_for_tasks_created_on_the_other() {
    let Some(cluster) = Cluster::start(&[]) else {
        return;
    };
    let mut c = cluster.client().await;
    let on_a = c.on(A);
    let mut h = on_a.headers();
    h.insert("accept", HeaderValue::from_static("text/event-stream"));
    let r = on_a.http.get(&on_a.url).headers(h).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut get = SseReader::new(r);
    get.next_event().await.unwrap(); // priming
    for _ in 0..3 {
        let task_id = id(&c.on(B).call_task("sleep", json!({ "seconds": 0.2 })).await);
        let mut statuses = Vec::new();
        while statuses.last() != Some(&json!("completed")) {
            let (_, m) = tokio::time::timeout(Duration::from_secs(10), get.next_message())
                .await
                .unwrap_or_else(|_| panic!("no notification on A for {task_id}: {statuses:?}"))
                .expect("the GET stream stays open");
            assert_eq!(m["method"], "notifications/tasks/status", "{m}");
            if m["params"]["taskId"] == json!(task_id) {
                statuses.push(m["params"]["status"].clone());
            }
        }
        assert_eq!(statuses, [json!("working"), json!("completed")]);
    }
}

/// kill -9 of server A while 50 tasks, created alternately through A and
/// B, are in flight in the worker processes: every task reaches a terminal
/// status, each result is served by B, and by A once it is back, the same.
#[tokio::test]
async fn kill9_of_one_server_mid_run_loses_no_task() {
    let Some(mut cluster) = Cluster::start(&["--rate", "0"]) else {
        return;
    };
    let mut c = cluster.client().await;
    let mut ids = Vec::new();
    for n in 0..50 {
        let seconds = 2.0 + f64::from(n % 5) * 0.25;
        let t = c
            .next()
            .call_task(
                "sleep",
                json!({ "seconds": seconds, "message": format!("n{n}") }),
            )
            .await;
        ids.push(id(&t));
    }
    cluster.a.kill9();
    // In flight: most were still working when A went.
    let db = cluster.b.db_reader().await;
    let open: i64 = db
        .scalar("SELECT count(*) FROM tasks WHERE status = 'working'", &[])
        .await;
    eprintln!("server A killed with {open} of 50 tasks working");
    assert!(
        open >= 10,
        "too few tasks in flight to prove anything: {open}"
    );

    // B serves every result; a new task through B still runs.
    let mut results = Vec::new();
    for (n, task_id) in ids.iter().enumerate() {
        let msg = c
            .on(B)
            .request("tasks/result", json!({ "taskId": task_id }))
            .await;
        let r = msg["result"].clone();
        assert_eq!(r["content"][0]["text"], format!("n{n}"), "{msg}");
        results.push(r);
    }
    let late = id(&c.on(B).call_task("sleep", json!({ "seconds": 0 })).await);
    let t = c.on(B).wait_terminal(&late, Duration::from_secs(20)).await;
    assert_eq!(t["status"], "completed");

    // A back on the same database answers the same.
    cluster.a.kill_and_restart();
    c.urls[A].clone_from(&cluster.a.url);
    for (task_id, result) in ids.iter().zip(&results) {
        let t = c.on(A).ok("tasks/get", json!({ "taskId": task_id })).await;
        assert_eq!(t["status"], "completed", "{t}");
        let again = c
            .on(A)
            .ok("tasks/result", json!({ "taskId": task_id }))
            .await;
        assert_eq!(&again, result);
    }
    // Each ran once (killing a server reran nothing) and ended once.
    let ends: Vec<(String, i64)> = db
        .all(
            "SELECT task_id, count(*) FROM task_events WHERE to_status IN ('completed', 'failed', 'cancelled') GROUP BY task_id",
            &[],
        )
        .await;
    assert_eq!(ends.len(), 51);
    assert!(ends.iter().all(|(_, n)| *n == 1), "a task ended twice");
    let attempts: HashSet<i64> = db
        .scalars("SELECT attempt FROM jobs", &[])
        .await
        .into_iter()
        .collect();
    assert_eq!(attempts, HashSet::from([1]));
}
