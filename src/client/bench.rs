//! `taskbroker bench`: a load generator that speaks MCP over HTTP. K
//! concurrent clients, each with its own session, create task-augmented
//! calls of a tool and wait for each result (blocking on tasks/result, or
//! polling tasks/get); it reports tasks/s and latency percentiles. Any URL,
//! tool and arguments: the same generator drives any MCP server with tasks.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::{Map, Value, json};

use super::cli::Connection;
use super::input::Answerer;
use super::stateless::StatelessClient;
use super::{EXIT_FAILURE, EXIT_OK, EXIT_UNREACHABLE, McpClient};

/// How a client learns that its task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WaitMode {
    /// Block on tasks/result (the server streams it when ready).
    Result,
    /// Poll tasks/get every --poll-ms, then fetch tasks/result.
    Poll,
}

/// `taskbroker bench ...`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Where the server is (and a token, if it needs one).
    #[command(flatten)]
    pub connection: Connection,
    /// The tool to call.
    #[arg(long, default_value = "sleep")]
    pub tool: String,
    /// Its arguments (a JSON object).
    #[arg(long, default_value = r#"{"seconds":0}"#)]
    pub args: String,
    /// Concurrent clients, each with its own session.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Tasks in all.
    #[arg(long, default_value_t = 2000)]
    pub tasks: usize,
    /// How a client waits for each result.
    #[arg(long, value_enum, default_value_t = WaitMode::Result)]
    pub wait: WaitMode,
    /// Poll interval with --wait poll.
    #[arg(long, default_value_t = 10)]
    pub poll_ms: u64,
    /// Call the tool plainly (no task) instead.
    #[arg(long)]
    pub plain: bool,
    /// Print one JSON object with the figures instead of text.
    #[arg(long)]
    pub json: bool,
    /// Instead: create this many tasks (of a tool that does not end soon),
    /// block in tasks/result on all of them at once, print `ready` once every
    /// stream is open, hold them for --hold-secs, then leave.
    #[arg(long, conflicts_with_all = ["plain", "wait"])]
    pub waiters: Option<usize>,
    /// With --waiters: wait the MCP 2026-07-28 way instead: the tasks are
    /// made without a session and each is followed by a
    /// `subscriptions/listen` stream of its own.
    #[arg(long, requires = "waiters")]
    pub listen: bool,
    /// How long --waiters holds its streams open.
    #[arg(long, default_value_t = 10)]
    pub hold_secs: u64,
    /// Instead: run this many tasks one after another and time, for each,
    /// its completion (its lastUpdatedAt, written by whichever process ran
    /// it) to the notifications/tasks/status on the session's GET stream.
    #[arg(long, conflicts_with_all = ["plain", "wait", "waiters"])]
    pub notify: Option<usize>,
}

#[derive(Debug, Default)]
struct Samples {
    create: Vec<f64>,
    terminal: Vec<f64>,
    result: Vec<f64>,
    errors: usize,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// `x` rounded to `decimals` places: figures are printed to what a clock
/// of this kind can tell (milliseconds to 0.01, seconds to 0.001), not to
/// the last bit of a float.
fn round(x: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (x * scale).round() / scale
}

/// Milliseconds to hundredths (10 µs).
fn round_ms(ms: f64) -> f64 {
    round(ms, 2)
}

fn summary(mut v: Vec<f64>) -> Value {
    v.sort_by(|a, b| a.total_cmp(b));
    json!({
        "n": v.len(),
        "p50_ms": round_ms(percentile(&v, 50.0)),
        "p90_ms": round_ms(percentile(&v, 90.0)),
        "p99_ms": round_ms(percentile(&v, 99.0)),
        "max_ms": round_ms(v.last().copied().unwrap_or(f64::NAN)),
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One client's share of the load.
async fn client_loop(
    args: Arc<BenchArgs>,
    arguments: Value,
    left: Arc<AtomicUsize>,
) -> Result<Samples, String> {
    let client = McpClient::open(&args.connection)
        .await
        .map_err(|e| e.to_string())?;
    let mut samples = Samples::default();
    while left
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
    {
        let t0 = Instant::now();
        if args.plain {
            match client
                .request(
                    "tools/call",
                    json!({ "name": args.tool, "arguments": arguments }),
                )
                .await
            {
                Ok(_) => samples.result.push(ms(t0.elapsed())),
                Err(_) => samples.errors += 1,
            }
            continue;
        }
        let created = client
            .request(
                "tools/call",
                json!({ "name": args.tool, "arguments": arguments, "task": {} }),
            )
            .await;
        let task_id = match created
            .as_ref()
            .ok()
            .and_then(|r| r.pointer("/task/taskId"))
            .and_then(Value::as_str)
        {
            Some(id) => id.to_owned(),
            None => {
                samples.errors += 1;
                continue;
            }
        };
        let t1 = Instant::now();
        samples.create.push(ms(t1 - t0));
        if args.wait == WaitMode::Poll {
            loop {
                match client
                    .request("tasks/get", json!({ "taskId": task_id }))
                    .await
                {
                    Ok(t)
                        if matches!(
                            t["status"].as_str(),
                            Some("completed" | "failed" | "cancelled")
                        ) =>
                    {
                        break;
                    }
                    Ok(_) => tokio::time::sleep(Duration::from_millis(args.poll_ms)).await,
                    Err(_) => {
                        samples.errors += 1;
                        break;
                    }
                }
            }
        }
        let t2 = Instant::now();
        match client
            .request("tasks/result", json!({ "taskId": task_id }))
            .await
        {
            Ok(_) => {
                let t3 = Instant::now();
                samples.terminal.push(ms(t3 - t0));
                samples.result.push(ms(t3 - t2));
            }
            Err(_) => samples.errors += 1,
        }
    }
    client.close().await;
    Ok(samples)
}

/// Run the benchmark; the exit code.
pub async fn run(args: BenchArgs) -> u8 {
    let arguments: Value = match serde_json::from_str::<Map<String, Value>>(&args.args) {
        Ok(m) => Value::Object(m),
        Err(e) => {
            eprintln!("taskbroker bench: --args is not a JSON object: {e}");
            return super::EXIT_USAGE;
        }
    };
    let args = Arc::new(args);
    let left = Arc::new(AtomicUsize::new(args.tasks));
    // The MCP client is not Send: every client runs on this thread.
    let local = tokio::task::LocalSet::new();
    if let Some(n) = args.waiters {
        if args.listen {
            return hold_listeners(&args, arguments, n).await;
        }
        return local.run_until(hold_waiters(args, arguments, n)).await;
    }
    if let Some(n) = args.notify {
        return local.run_until(notify_latency(args, arguments, n)).await;
    }
    local.run_until(drive(args, arguments, left)).await
}

/// `--waiters N`: N tasks, N tasks/result streams open at once.
async fn hold_waiters(args: Arc<BenchArgs>, arguments: Value, n: usize) -> u8 {
    let client = match McpClient::open(&args.connection).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("taskbroker bench: {e}");
            return EXIT_UNREACHABLE;
        }
    };
    let create = || async {
        let task = client
            .request(
                "tools/call",
                json!({ "name": args.tool, "arguments": arguments, "task": {} }),
            )
            .await
            .map_err(|e| e.to_string())?;
        task.pointer("/task/taskId")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("not a task: {task}"))
    };
    let open = |id: String| {
        let client = &client;
        async move {
            client
                .open_request("tasks/result", json!({ "taskId": id }))
                .await
                .map_err(|e| e.to_string())
        }
    };
    let code = hold_streams(n, args.hold_secs, "tasks/result", create, open).await;
    client.close().await;
    code
}

/// `--waiters N --listen`: N tasks of MCP 2026-07-28, each followed by a
/// `subscriptions/listen` stream; a stream counts as open once its
/// acknowledgement has arrived.
async fn hold_listeners(args: &BenchArgs, arguments: Value, n: usize) -> u8 {
    let client = match StatelessClient::new(&args.connection, Answerer::new(None)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("taskbroker bench: {e}");
            return EXIT_FAILURE;
        }
    };
    let create = || async {
        let task = client
            .request(
                "tools/call",
                json!({ "name": args.tool, "arguments": arguments }),
                true,
            )
            .await
            .map_err(|e| e.to_string())?;
        task.get("taskId")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("not a task: {task}"))
    };
    let open = |id: String| {
        let client = &client;
        async move {
            let params = json!({ "notifications": { "taskIds": [id] } });
            let (_, mut response) = client
                .open("subscriptions/listen", params, true)
                .await
                .map_err(|e| e.to_string())?;
            if !response.status().is_success() {
                return Err(format!("HTTP {}", response.status()));
            }
            match response.chunk().await {
                Ok(Some(first)) if contains(&first, b"acknowledged") => Ok(response),
                Ok(first) => Err(format!(
                    "it did not open with its acknowledgement: {:?}",
                    first.map(|b| String::from_utf8_lossy(&b).into_owned())
                )),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    hold_streams(n, args.hold_secs, "subscriptions/listen", create, open).await
}

/// Make `n` tasks with `create`, then open a stream on each with `open`
/// (a `method` stream); print `ready` with the timings once all are open,
/// hold them for `hold_secs`, then let go.
async fn hold_streams<C, CF, O, OF>(
    n: usize,
    hold_secs: u64,
    method: &str,
    create: C,
    open: O,
) -> u8
where
    C: Fn() -> CF,
    CF: Future<Output = Result<String, String>>,
    O: Fn(String) -> OF,
    OF: Future<Output = Result<reqwest::Response, String>>,
{
    use futures_util::{StreamExt, TryStreamExt, stream};
    let started = Instant::now();
    let created: Result<Vec<String>, String> = stream::iter(0..n)
        .map(|_| create())
        .buffer_unordered(32)
        .try_collect()
        .await;
    let ids = match created {
        Ok(ids) => ids,
        Err(e) => {
            eprintln!("taskbroker bench: creating tasks failed: {e}");
            return EXIT_FAILURE;
        }
    };
    let create_s = started.elapsed().as_secs_f64();
    let opened = Instant::now();
    let streams: Result<Vec<reqwest::Response>, String> = stream::iter(ids)
        .map(open)
        .buffer_unordered(256)
        .try_collect()
        .await;
    let streams = match streams {
        Ok(s) => s,
        Err(e) => {
            eprintln!("taskbroker bench: opening {method} streams failed: {e}");
            return EXIT_FAILURE;
        }
    };
    println!(
        "{}",
        json!({ "ready": streams.len(), "create_s": round(create_s, 3),
                "open_s": round(opened.elapsed().as_secs_f64(), 3) })
    );
    tokio::time::sleep(Duration::from_secs(hold_secs)).await;
    drop(streams);
    EXIT_OK
}

/// Whether `haystack` holds `needle`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

async fn drive(args: Arc<BenchArgs>, arguments: Value, left: Arc<AtomicUsize>) -> u8 {
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..args.clients.max(1) {
        handles.push(tokio::task::spawn_local(client_loop(
            args.clone(),
            arguments.clone(),
            left.clone(),
        )));
    }
    let mut all = Samples::default();
    for h in handles {
        match h.await {
            Ok(Ok(s)) => {
                all.create.extend(s.create);
                all.terminal.extend(s.terminal);
                all.result.extend(s.result);
                all.errors += s.errors;
            }
            Ok(Err(e)) => {
                eprintln!("taskbroker bench: a client could not connect: {e}");
                return EXIT_UNREACHABLE;
            }
            Err(e) => {
                eprintln!("taskbroker bench: a client failed: {e}");
                return EXIT_FAILURE;
            }
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let done = if args.plain {
        all.result.len()
    } else {
        all.terminal.len()
    };
    let mode = if args.plain {
        "plain"
    } else if args.wait == WaitMode::Poll {
        "poll"
    } else {
        "result"
    };
    let per_second = round(done as f64 / wall, 1);
    let report = json!({
        "url": args.connection.url.as_str(),
        "tool": args.tool,
        "clients": args.clients,
        "mode": mode,
        "tasks": done,
        "errors": all.errors,
        "seconds": round(wall, 3),
        "tasks_per_s": per_second,
        "create": summary(all.create),
        "terminal": summary(all.terminal),
        "result": summary(all.result),
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "{done} tasks in {wall:.2} s: {per_second:.0} tasks/s ({} clients, {mode}), {} errors",
            args.clients, all.errors
        );
        for part in ["create", "terminal", "result"] {
            let s = &report[part];
            if s["n"].as_u64().unwrap_or(0) > 0 {
                println!(
                    "  {part:<8} p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
                    s["p50_ms"].as_f64().unwrap_or(f64::NAN),
                    s["p90_ms"].as_f64().unwrap_or(f64::NAN),
                    s["p99_ms"].as_f64().unwrap_or(f64::NAN),
                    s["max_ms"].as_f64().unwrap_or(f64::NAN)
                );
            }
        }
    }
    if all.errors > 0 {
        EXIT_FAILURE
    } else {
        EXIT_OK
    }
}

/// `--notify N`: completion to status notification, N times.
async fn notify_latency(args: Arc<BenchArgs>, arguments: Value, n: usize) -> u8 {
    use futures_util::StreamExt;
    let client = match McpClient::open(&args.connection).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("taskbroker bench: {e}");
            return EXIT_UNREACHABLE;
        }
    };
    let stream = match client.open_get_stream().await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("taskbroker bench: the GET stream: {e}");
            return EXIT_FAILURE;
        }
    };
    // (task id, ms from its lastUpdatedAt to receipt) of each terminal status.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, f64)>();
    let reader = tokio::task::spawn_local(async move {
        let mut parser = super::sse::SseParser::new();
        let mut body = stream.bytes_stream();
        while let Some(Ok(bytes)) = body.next().await {
            for event in parser.push(&bytes) {
                let Ok(m) = serde_json::from_str::<Value>(&event.data) else {
                    continue;
                };
                let p = &m["params"];
                if m["method"] != "notifications/tasks/status"
                    || !matches!(p["status"].as_str(), Some("completed" | "failed"))
                {
                    continue;
                }
                let written = p["lastUpdatedAt"].as_str().and_then(|t| {
                    time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                        .ok()
                });
                if let (Some(id), Some(written)) = (p["taskId"].as_str(), written) {
                    let delay = time::OffsetDateTime::now_utc() - written;
                    let _ = tx.send((id.to_owned(), delay.as_seconds_f64() * 1000.0));
                }
            }
        }
    });
    let mut delays = Vec::with_capacity(n);
    let mut errors = 0;
    for _ in 0..n {
        let created = client
            .request(
                "tools/call",
                json!({ "name": args.tool, "arguments": arguments, "task": {} }),
            )
            .await;
        let Some(id) = created
            .ok()
            .and_then(|t| t.pointer("/task/taskId")?.as_str().map(str::to_owned))
        else {
            errors += 1;
            continue;
        };
        let got = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some((task, delay)) = rx.recv().await {
                if task == id {
                    return Some(delay);
                }
            }
            None
        })
        .await;
        match got {
            Ok(Some(delay)) => delays.push(delay),
            _ => errors += 1,
        }
    }
    reader.abort();
    client.close().await;
    let report = json!({ "url": args.connection.url.as_str(), "tool": args.tool,
                         "errors": errors, "notify": summary(delays) });
    println!("{report}");
    if errors > 0 { EXIT_FAILURE } else { EXIT_OK }
}
