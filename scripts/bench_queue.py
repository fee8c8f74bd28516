#!/usr/bin/env python3
"""What the queue features cost when nobody uses them (scripts/bench-queue
runs this; issue 27): idempotency keys, priorities and delayed starts,
retry-after on refusals. Each run: a fresh database, `taskbroker serve`
with no flag but --db and --listen (the defaults a user gets), then
`taskbroker bench` (16 clients, 2,000 `sleep 0` tasks, each client waiting
in tasks/result; no call carries a key, a priority or a start). The head
binary and the base one (the commit before these features) run in the same
rounds in alternating order, on SQLite and on PostgreSQL; the ratios are
taken round by round. The broker's CPU time per task is read from
/proc/<pid>/stat.

Then the turns between principals (item 4): a tool that runs two at a time
for 0.1 s; principal A queues a backlog of N tasks (200, then 5,000), then
B queues 10; the figure is the time from B's first call to the end of B's
last run, which in turns does not depend on N (the base, first come first
served, is run with 200 only: behind 5,000 it would wait some 250 s). Calls
are MCP 2026-07-28 requests with each principal's token.

With --otlp-sink (scripts/bench-queue --traces), the head broker exports
its spans over OTLP/HTTP to a sink in this script that answers every POST
with 200 and counts the requests and bytes (--head-args names the flag):
what traces cost when on, against the same binary with them off.

Prints one JSON line per run, then a Markdown table (also written between
the "queue:start" and "queue:end" markers of --out).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench_scale import PGURL, cpu_seconds, psql, write_block


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fresh_db(driver: str, work: str, name: str) -> str:
    """A new empty database of `driver`: a file in `work`, or a database
    on the local PostgreSQL."""
    if driver == "sqlite":
        return os.path.join(work, f"{name}.db")
    name = f"tb_queue_{os.getpid()}_{name}"
    psql("postgres", f"CREATE DATABASE {name}")
    return f"{PGURL}/{name}"


def drop_db(driver: str, db: str) -> None:
    if driver == "postgres":
        psql("postgres", f"DROP DATABASE IF EXISTS {db.rsplit('/', 1)[1]} WITH (FORCE)")


def start_broker(binary: str, db: str, extra: list[str], err_path: str) -> tuple[subprocess.Popen, int]:
    """`taskbroker serve` on a free port, once it accepts connections."""
    port = free_port()
    err = open(err_path, "w")
    broker = subprocess.Popen([binary, "serve", "--db", db, "--listen", f"127.0.0.1:{port}", *extra],
                              stdout=subprocess.DEVNULL, stderr=err)
    err.close()
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return broker, port
        except OSError:
            if time.time() > deadline or broker.poll() is not None:
                broker.kill()
                raise RuntimeError(f"{binary} did not start; see {err_path}")
            time.sleep(0.05)


class OtlpSink:
    """An OTLP/HTTP endpoint that accepts everything (an empty protobuf
    answer) and counts requests and bytes."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("content-length", 0))
                self.rfile.read(length)
                with sink.lock:
                    sink.requests += 1
                    sink.bytes += length
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def run(binary: str, driver: str, clients: int, tasks: int, work: str, n: int,
        extra: list[str] | None = None, sink: OtlpSink | None = None) -> dict:
    """One broker on a fresh database, one bench against it."""
    db = fresh_db(driver, work, f"q{n}")
    broker, port = start_broker(binary, db, extra or [], os.path.join(work, f"serve{n}.log"))
    sent = (sink.requests, sink.bytes) if sink else None
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        before = cpu_seconds(broker.pid)
        out = subprocess.run([binary, "bench", "--url", url, "--clients", str(clients), "--tasks", str(tasks),
                              "--json"], capture_output=True, text=True, check=True).stdout
        cpu = cpu_seconds(broker.pid) - before
        r = json.loads(out)
        exported = {}
        if sink and sent:
            # What left after the bench: the batches of its last spans.
            broker.terminate()
            broker.wait(timeout=30)
            exported = {"otlp_requests": sink.requests - sent[0], "otlp_bytes": sink.bytes - sent[1]}
        return {
            **exported,
            "tasks_per_s": r["tasks_per_s"],
            "create_p50_ms": r["create"]["p50_ms"],
            "terminal_p50_ms": r["terminal"]["p50_ms"],
            "terminal_p99_ms": r["terminal"]["p99_ms"],
            "errors": r["errors"],
            "cpu_ms_per_task": 1000 * cpu / max(r["tasks"], 1),
        }
    finally:
        broker.terminate()
        broker.wait(timeout=30)
        drop_db(driver, db)


TURNS_TOOL = """
[[tool]]
name = "work"
description = "two at a time, 0.1 s each"
command = ["sh", "-c", "args=$(cat); sleep 0.1; echo \\"$args $(date +%s%3N)\\" >> {log}; echo ok"]
task_support = "optional"
concurrency = 2
"""


def token(binary: str, db: str, principal: str) -> str:
    out = subprocess.run([binary, "token", "create", "--principal", principal, "--db", db],
                         capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def task_call(conn: http.client.HTTPConnection, tok: str, arguments: dict) -> None:
    """One MCP 2026-07-28 tools/call of `work` that makes a task."""
    body = json.dumps({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "work", "arguments": arguments, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        }},
    })
    conn.request("POST", "/mcp", body, {
        "content-type": "application/json", "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "work",
        "authorization": f"Bearer {tok}",
    })
    answer = json.loads(conn.getresponse().read())
    if answer.get("result", {}).get("resultType") != "task":
        raise RuntimeError(f"not a task: {answer}")


def turns(binary: str, driver: str, backlog: int, work: str, n: int) -> dict:
    """A's backlog, then B's 10 tasks: seconds from B's first call to B's last run's end."""
    db = fresh_db(driver, work, f"t{n}")
    subprocess.run([binary, "migrate", "--db", db], capture_output=True, check=True)
    log = os.path.join(work, f"turns{n}.log")
    config = os.path.join(work, f"turns{n}.toml")
    with open(config, "w") as f:
        f.write(TURNS_TOOL.format(log=log))
    a, b = token(binary, db, "a"), token(binary, db, "b")
    broker, port = start_broker(binary, db, ["--config", config], os.path.join(work, f"turns{n}.err"))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        for i in range(backlog):
            task_call(conn, a, {"who": "a", "n": i})
        start = time.time()
        for i in range(10):
            task_call(conn, b, {"who": "b", "n": i})
        while True:
            lines = open(log).read().splitlines() if os.path.exists(log) else []
            ends = [int(l.rsplit(" ", 1)[1]) for l in lines if '"who":"b"' in l.replace(" ", "")]
            if len(ends) == 10:
                return {"b_seconds": max(ends) / 1000 - start,
                        "a_before_b": sum(1 for l in lines if '"who":"a"' in l.replace(" ", ""))}
            if time.time() - start > 600:
                raise RuntimeError("B's tasks did not finish in 600 s")
            time.sleep(0.05)
    finally:
        broker.kill()
        broker.wait(timeout=30)
        drop_db(driver, db)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--base-rev", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--drivers", default="sqlite,postgres")
    ap.add_argument("--backlog", type=int, default=5000)
    ap.add_argument("--turn-rounds", type=int, default=3)
    ap.add_argument("--out")
    # What the base lacks, and the block of --out the table goes in (the
    # retention run of scripts/bench-queue --retention sets them).
    ap.add_argument("--lacks", default="idempotency keys, priorities and delayed starts, and retry-after")
    ap.add_argument("--block", default="queue")
    ap.add_argument("--title", default="The order of the queue (issue 27)")
    ap.add_argument("--command", default="scripts/bench-queue")
    # What `serve` of the head gets besides --db and --listen ({sink}: the
    # OTLP sink's URL), and how the base is named in the report.
    ap.add_argument("--head-args", default="")
    ap.add_argument("--otlp-sink", action="store_true")
    ap.add_argument("--versus")
    args = ap.parse_args()
    sink = OtlpSink() if args.otlp_sink else None
    head_args = [a.replace("{sink}", sink.url if sink else "") for a in args.head_args.split()]
    rows = []
    n = 0
    # The tool processes of a killed broker may still write for a moment.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as work:
        for rnd in range(args.rounds):
            for driver in args.drivers.split(","):
                order = [("head", args.bin), ("base", args.base)]
                if rnd % 2:
                    order.reverse()
                for label, binary in order:
                    n += 1
                    extra = head_args if label == "head" else []
                    r = run(binary, driver, args.clients, args.tasks, work, n, extra,
                            sink if label == "head" else None)
                    r.update({"round": rnd, "driver": driver, "bin": label})
                    print(json.dumps(r), flush=True)
                    rows.append(r)
        fair = []
        for rnd in range(args.turn_rounds):
            for driver in args.drivers.split(","):
                for label, binary, backlog in (("base", args.base, 200), ("head", args.bin, 200),
                                               ("head", args.bin, args.backlog)):
                    n += 1
                    r = turns(binary, driver, backlog, work, n)
                    r.update({"round": rnd, "driver": driver, "bin": label, "backlog": backlog})
                    print(json.dumps(r), flush=True)
                    fair.append(r)
    table = report(rows, args) + ("\n\n" + report_turns(fair, args) if fair else
                                  f"\n\nCommand: `{args.command}`.")
    print(table)
    if args.out:
        write_block(args.out, args.block, args.title, table)


def report(rows: list[dict], args) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    errors = sum(r["errors"] for r in rows)
    versus = args.versus or f"against `{args.base_rev}` (before {args.lacks})"
    shown = args.head_args.replace("{sink}", "<the sink>")
    serve = (f"`serve` with no flag but `--db`, `--listen` and, for the head, `{shown}`" if args.head_args
             else "`serve` with no flag but `--db` and `--listen`")
    exported = [r for r in rows if "otlp_requests" in r]
    sent = (f" The head's spans went out in {statistics.median(r['otlp_requests'] for r in exported):.0f} OTLP requests "
            f"of {statistics.median(r['otlp_bytes'] for r in exported) / 1e6:.1f} MB per run (median), counted by the sink."
            if exported else "")
    lines = [
        f"Measured by `{args.command}` at commit `{commit}` {versus}, "
        f"alternately in the same rounds: {os.cpu_count()} cores, "
        f"release build, {serve}, `taskbroker bench` with {args.clients} clients "
        f"and {args.tasks} `sleep 0` tasks per run (no call uses a key, a priority or a start; no retention rule), median of "
        f"{args.rounds} rounds (min-max); head/base ratios taken round by round; errors in all runs: {errors}.{sent}",
        "",
        "| driver | tasks/s head | tasks/s base | head / base | terminal p50 ms head / base | broker CPU ms/task head / base |",
        "| --- | --- | --- | --- | --- | --- |",
    ]

    def med(v):
        return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"

    for driver in args.drivers.split(","):
        by = {(r["round"], r["bin"]): r for r in rows if r["driver"] == driver}
        rounds = sorted({k[0] for k in by})
        pick = lambda label, key: [by[(i, label)][key] for i in rounds]
        ratio = lambda key: [by[(i, "head")][key] / by[(i, "base")][key] for i in rounds]
        lines.append(
            f"| {driver} | {statistics.median(pick('head', 'tasks_per_s')):.0f} "
            f"| {statistics.median(pick('base', 'tasks_per_s')):.0f} | {med(ratio('tasks_per_s'))} "
            f"| {statistics.median(pick('head', 'terminal_p50_ms')):.2f} / "
            f"{statistics.median(pick('base', 'terminal_p50_ms')):.2f} "
            f"| {statistics.median(pick('head', 'cpu_ms_per_task')):.3f} / "
            f"{statistics.median(pick('base', 'cpu_ms_per_task')):.3f} |"
        )
    return "\n".join(lines)


def report_turns(fair: list[dict], args) -> str:
    lines = [
        "Turns between principals (item 4): a tool that runs two at a time for 0.1 s; principal A queues a "
        f"backlog, then B queues 10 tasks; time from B's first call to the end of B's last run, median of "
        f"{args.turn_rounds} rounds (min-max), and how many of A's tasks had started by then.",
        "",
        "| driver | binary | A's backlog | B's 10 tasks done in s | A's tasks run by then |",
        "| --- | --- | --- | --- | --- |",
    ]
    for driver in args.drivers.split(","):
        for label, backlog in (("base", 200), ("head", 200), ("head", args.backlog)):
            v = [r for r in fair if (r["driver"], r["bin"], r["backlog"]) == (driver, label, backlog)]
            secs = [r["b_seconds"] for r in v]
            ran = [r["a_before_b"] for r in v]
            lines.append(f"| {driver} | {label} | {backlog:,} | {statistics.median(secs):.2f} "
                         f"({min(secs):.2f}-{max(secs):.2f}) | {statistics.median(ran):.0f} |")
    lines += ["", "Command: `scripts/bench-queue` (`--quick` for one short round)."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
