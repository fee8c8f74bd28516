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

fn summary(mut v: Vec<f64>) -> Value {
    v.sort_by(|a, b| a.total_cmp(b));
    json!({
        "n": v.len(),
        "p50_ms": percentile(&v, 50.0),
        "p90_ms": percentile(&v, 90.0),
        "p99_ms": percentile(&v, 99.0),
        "max_ms": v.last().copied().unwrap_or(f64::NAN),
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
    local.run_until(drive(args, arguments, left)).await
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
    let report = json!({
        "url": args.connection.url.as_str(),
        "tool": args.tool,
        "clients": args.clients,
        "mode": if args.plain { "plain" } else if args.wait == WaitMode::Poll { "poll" } else { "result" },
        "tasks": done,
        "errors": all.errors,
        "seconds": wall,
        "tasks_per_s": done as f64 / wall,
        "create": summary(all.create),
        "terminal": summary(all.terminal),
        "result": summary(all.result),
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "{} tasks in {:.2} s: {:.0} tasks/s ({} clients, {}), {} errors",
            done, wall, report["tasks_per_s"], args.clients, report["mode"], all.errors
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
