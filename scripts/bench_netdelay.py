#!/usr/bin/env python3
"""PostgreSQL on "another machine" (scripts/bench-netdelay runs this).

Every connection of the brokers and workers to PostgreSQL goes through a
relay that holds each byte for a fixed time in each direction
(benches/delay_proxy.rs), so each statement costs a network round trip:
0.5 ms and 2 ms. For each round-trip time, 1 and 3 brokers (`serve
--workers 0`, defaults otherwise) with 1 and 4 worker processes
(`--concurrency 8`), 16 clients split over the brokers, `sleep 0` tasks:
throughput and p50/p99 of a task's end as its client saw it, and round trips per task
counted from the sqlx statement log, split by step (the broker: creation
and tasks/result; the workers: claim, run, completion).

Prints one JSON line per run and a Markdown table at the end (also written
between the "netdelay:start" and "netdelay:end" markers of --out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_scale import count_statements, measure, write_block  # noqa: E402

SHAPES = [(1, 1), (1, 4), (3, 1), (3, 4)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--proxy", required=True, help="the delay_proxy executable")
    ap.add_argument("--rtt-ms", default="0.5,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=48)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--count-tasks", type=int, default=500)
    ap.add_argument("--out")
    args = ap.parse_args()
    pg = os.environ.get("PGURL", "postgres://postgres@127.0.0.1:5432")
    host_port = pg.rsplit("@", 1)[1]
    user = pg.split("://", 1)[1].rsplit("@", 1)[0]
    work = tempfile.mkdtemp(prefix="tb-netdelay-")
    rows, counts = [], {}
    try:
        for rtt in [float(x) for x in args.rtt_ms.split(",")]:
            proxy = subprocess.Popen(
                [args.proxy, "--listen", "127.0.0.1:0", "--to", host_port, "--delay-us", str(int(rtt * 500))],
                stdout=subprocess.PIPE, text=True,
            )
            try:
                line = proxy.stdout.readline()
                port = line.strip().rsplit(":", 1)[1]
                via = f"postgres://{user}@127.0.0.1:{port}"
                for r in range(args.rounds):
                    for brokers, workers in (SHAPES if r % 2 == 0 else list(reversed(SHAPES))):
                        m = measure(args.bin, "postgres", workers, brokers, args, work, pg_via=via)
                        row = dict(m, rtt_ms=rtt, brokers=brokers, workers=workers, round=r)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                for brokers, workers in SHAPES:
                    c = count_statements(args.bin, "postgres", workers, args, work, brokers=brokers, pg_via=via)
                    counts[(rtt, brokers, workers)] = c
                    print(json.dumps(dict(c, rtt_ms=rtt, brokers=brokers, workers=workers, count=True)), flush=True)
            finally:
                proxy.kill()
                proxy.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = report(rows, counts, args)
    print(table)
    if args.out:
        write_block(args.out, "netdelay", "PostgreSQL across a network round trip (issue 26)", table)
    return 0 if all(r["errors"] == 0 for r in rows) else 1


def report(rows, counts, args) -> str:
    def pick(rtt, b, w, key):
        v = [r[key] for r in rows if (r["rtt_ms"], r["brokers"], r["workers"]) == (rtt, b, w)]
        return statistics.median(v), min(v), max(v)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    errors = sum(r["errors"] for r in rows)
    lines = [
        f"Measured by `scripts/bench-netdelay` at commit `{commit}`: {os.cpu_count()} cores, release build, "
        "PostgreSQL on the same machine reached through a relay that delays each direction by half the "
        f"round-trip time (this kernel has no `netem`); `serve --workers 0` + `worker --concurrency 8`, "
        f"{args.clients} clients split over the brokers, {args.tasks} `sleep 0` tasks per run, median of "
        f"{args.rounds} runs (min-max); errors in all runs: {errors}. Round trips per task are the statements "
        "of the sqlx log (one round trip each), by the process that ran them.",
        "",
        "| round trip | brokers | workers | tasks/s | vs 1 broker + 1 worker | p50 ms | p99 ms | CPU ms/task | round trips/task: broker (create, result) | workers (claim, run, complete) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rtt in sorted({r["rtt_ms"] for r in rows}):
        base = pick(rtt, 1, 1, "tasks_per_s")[0]
        for b, w in SHAPES:
            tps = pick(rtt, b, w, "tasks_per_s")
            c = counts.get((rtt, b, w), {})
            lines.append(
                f"| {rtt:g} ms | {b} | {w} | {tps[0]:.0f} ({tps[1]:.0f}-{tps[2]:.0f}) | {tps[0] / base:.2f} | "
                f"{pick(rtt, b, w, 'p50_ms')[0]:.1f} | {pick(rtt, b, w, 'p99_ms')[0]:.1f} | "
                f"{pick(rtt, b, w, 'cpu_ms_per_task')[0]:.2f} | {c.get('broker', float('nan')):.1f} | "
                f"{c.get('worker', float('nan')):.1f} |"
            )
    lines += ["", "Command: `scripts/bench-netdelay` (`--quick` for a short smoke run)."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
