#!/usr/bin/env python3
"""The measurement of scripts/bench-waiters (read it first): for each round
and each kind (the HTTP floor, tasks/result waiters, subscriptions/listen
streams), a fresh server holds first 10 and then N waiting clients; its RSS
is read from /proc before and while they wait, and, for the broker, the SQL
statements it runs per second while they wait (from its sqlx debug log).
Rounds rotate the order of the kinds so the machine's noise falls on all."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from bench_scale import write_block

KINDS = {
    "floor": "HTTP floor: hyper HTTP/1 connection, an SSE head and no body (benches/http_floor.rs)",
    "result": "taskbroker: clients blocked in 2025-11-25 tasks/result (one session)",
    "listen": "taskbroker: 2026-07-28 subscriptions/listen streams, one task each (no session)",
}


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def wait_for(path, pattern, timeout, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            m = re.search(pattern, open(path).read())
            if m:
                return m
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"{pattern!r} never appeared in {path}")


def count_queries(log):
    return sum(1 for line in open(log) if "sqlx::query" in line)


def one(args, kind, n, work):
    out, log = f"{work}/{kind}-{n}.out", f"{work}/{kind}-{n}.log"
    env = dict(os.environ, RUST_LOG="warn,sqlx::query=debug")
    if kind == "floor":
        cmd = [args.floor, "--listen", "127.0.0.1:0"]
        pattern = r"listening on (\S+)"
    else:
        cmd = [args.bin, "serve", "--db", f"{work}/{kind}-{n}.db", "--listen", "127.0.0.1:0",
               "--rate", "0", "--initialize-rate", "0", "--max-sse-streams", str(2 * n + 100),
               "--workers", "0"]
        pattern = r"taskbroker listening on (\S+)"
    server = subprocess.Popen(cmd, stdout=open(out, "w"), stderr=open(log, "w"), env=env)
    holder = None
    try:
        addr = wait_for(out, pattern, 30, server).group(1)
        time.sleep(0.5)
        rss0 = rss_kb(server.pid)
        held = f"{work}/{kind}-{n}.held"
        if kind == "floor":
            hcmd = [sys.executable, os.path.join(os.path.dirname(__file__), "hold_posts.py"), addr, str(n),
                    "--hold-secs", "20"]
        else:
            hcmd = [args.bin, "bench", "--url", addr, "--tool", "sleep", "--args", '{"seconds":3600}',
                    "--waiters", str(n), "--hold-secs", "20"] + (["--listen"] if kind == "listen" else [])
        holder = subprocess.Popen(hcmd, stdout=open(held, "w"), stderr=subprocess.STDOUT)
        wait_for(held, r"ready", 120, holder)
        open_s = None
        if kind != "floor":
            # `taskbroker bench` says {"ready": N, "open_s": ...}.
            b = json.loads(open(held).readline())
            if b["ready"] != n:
                raise RuntimeError(f"{kind}: {b['ready']} of {n} waiting")
            open_s = b["open_s"]
        time.sleep(1)
        q0 = count_queries(log)
        time.sleep(5)
        q1 = count_queries(log)
        rss = rss_kb(server.pid)
        if holder.poll() is not None:
            raise RuntimeError(f"{kind}: the holder ended early: {open(held).read()[-500:]}")
        return {"kind": kind, "n": n, "rss0_mb": rss0 / 1024, "rss_mb": rss / 1024,
                "queries_per_s": (q1 - q0) / 5, "open_s": open_s}
    finally:
        for p in (holder, server):
            if p is not None:
                p.kill()
                p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--floor", required=True)
    ap.add_argument("--waiters", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    kinds = list(KINDS)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for r in range(a.rounds):
            order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
            for kind in order:
                for n in (10, a.waiters):
                    row = one(a, kind, n, work)
                    row["round"] = r
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    table = report(rows, a)
    print(table)
    if a.out:
        write_block(a.out, "waiters", "Waiting clients (issue 26, item 4)", table)


def report(rows, a):
    def med(kind, n, key):
        v = [r[key] for r in rows if (r["kind"], r["n"]) == (kind, n)]
        return statistics.median(v), min(v), max(v)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    n = a.waiters
    lines = [
        f"Measured by `scripts/bench-waiters` at commit `{commit}`: {os.cpu_count()} cores, release build, "
        f"SQLite, `serve --workers 0` (defaults but `--rate 0 --initialize-rate 0 --max-sse-streams`), tasks of "
        f"`sleep 3600` that stay queued; RSS of the server process read from /proc while the clients wait, "
        f"median of {a.rounds} rounds (min-max). KB per waiter: (RSS with {n:,} - RSS with 10) / {n - 10:,}.",
        "",
        f"| waiting clients | RSS with 10 MB | RSS with {n:,} MB | KB per waiter | above the floor KB per waiter | SQL statements/s while {n:,} wait | streams opened in s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    floor_kb = None
    for kind, name in KINDS.items():
        small, big = med(kind, 10, "rss_mb"), med(kind, n, "rss_mb")
        per = [(b["rss_mb"] - s["rss_mb"]) * 1024 / (n - 10)
               for s in rows if (s["kind"], s["n"]) == (kind, 10)
               for b in rows if (b["kind"], b["n"], b["round"]) == (kind, n, s["round"])]
        kb = statistics.median(per)
        if kind == "floor":
            floor_kb = kb
        above = "" if kind == "floor" else f"{kb - floor_kb:.1f}"
        q = "" if kind == "floor" else f"{med(kind, n, 'queries_per_s')[0]:.1f}"
        o = "" if kind == "floor" else f"{med(kind, n, 'open_s')[0]:.2f}"
        lines.append(f"| {name} | {small[0]:.1f} | {big[0]:.1f} ({big[1]:.1f}-{big[2]:.1f}) | {kb:.1f} | {above} | {q} | {o} |")
    lines += ["", "Command: `scripts/bench-waiters` (`--quick`: 1,000 waiters, one round, writes nothing)."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
