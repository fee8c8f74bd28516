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
    ap.add_argument("--base", help="a baseline binary, run alternately in the same rounds")
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
    bins = [("new", args.bin)] + ([("base", args.base)] if args.base else [])
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
                        for label, binary in (bins if r % 2 == 0 else list(reversed(bins))):
                            m = measure(binary, "postgres", workers, brokers, args, work, pg_via=via)
                            row = dict(m, bin=label, rtt_ms=rtt, brokers=brokers, workers=workers, round=r)
                            rows.append(row)
                            print(json.dumps(row), flush=True)
                for brokers, workers in SHAPES:
                    for label, binary in bins:
                        c = count_statements(binary, "postgres", workers, args, work, brokers=brokers, pg_via=via)
                        counts[(label, rtt, brokers, workers)] = c
                        print(json.dumps(dict(c, bin=label, rtt_ms=rtt, brokers=brokers, workers=workers,
                                              count=True)), flush=True)
            finally:
                proxy.kill()
                proxy.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = report(rows, counts, bins, args)
    print(table)
    if args.out:
        write_block(args.out, "netdelay", "PostgreSQL across a network round trip (issue 26)", table)
    return 0 if all(r["errors"] == 0 for r in rows) else 1


def report(rows, counts, bins, args) -> str:
    def pick(label, rtt, b, w, key):
        v = [r[key] for r in rows if (r["bin"], r["rtt_ms"], r["brokers"], r["workers"]) == (label, rtt, b, w)]
        return statistics.median(v), min(v), max(v)

    def ratios(rtt, b, w):
        """Round by round, new / base tasks/s: median (min-max)."""
        pairs = {}
        for r in rows:
            if (r["rtt_ms"], r["brokers"], r["workers"]) == (rtt, b, w):
                pairs.setdefault(r["round"], {})[r["bin"]] = r["tasks_per_s"]
        v = [p["new"] / p["base"] for p in pairs.values() if "new" in p and p.get("base")]
        return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else ""

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    errors = sum(r["errors"] for r in rows)
    paired = len(bins) > 1
    lines = [
        f"Measured by `scripts/bench-netdelay` at commit `{commit}`: {os.cpu_count()} cores, release build, "
        "PostgreSQL on the same machine reached through a relay that delays each direction by half the "
        f"round-trip time (this kernel has no `netem`); `serve --workers 0` + `worker --concurrency 8`, "
        f"{args.clients} clients split over the brokers, {args.tasks} `sleep 0` tasks per run, median of "
        f"{args.rounds} runs (min-max); errors in all runs: {errors}. Round trips per task are the statements "
        "of the sqlx log (one round trip each), by the process that ran them"
        + ("; `base` is the baseline build, run alternately in the same rounds (new / base taken round by round)."
           if paired else "."),
        "",
        "| round trip | brokers | workers | binary | tasks/s | vs 1 broker + 1 worker |"
        + (" new / base |" if paired else "")
        + " p50 ms | p99 ms | CPU ms/task | round trips/task: broker (create, result) | workers (claim, run, complete) |",
    ]
    lines.append("|" + " --- |" * (lines[-1].count("|") - 1))
    for rtt in sorted({r["rtt_ms"] for r in rows}):
        for b, w in SHAPES:
            for label, _ in bins:
                base = pick(label, rtt, 1, 1, "tasks_per_s")[0]
                tps = pick(label, rtt, b, w, "tasks_per_s")
                c = counts.get((label, rtt, b, w), {})
                lines.append(
                    f"| {rtt:g} ms | {b} | {w} | {label} | {tps[0]:.0f} ({tps[1]:.0f}-{tps[2]:.0f}) | "
                    f"{tps[0] / base:.2f} |"
                    + (f" {ratios(rtt, b, w) if label == 'new' else ''} |" if paired else "")
                    + f" {pick(label, rtt, b, w, 'p50_ms')[0]:.1f} | {pick(label, rtt, b, w, 'p99_ms')[0]:.1f} | "
                    f"{pick(label, rtt, b, w, 'cpu_ms_per_task')[0]:.2f} | {c.get('broker', float('nan')):.1f} | "
                    f"{c.get('worker', float('nan')):.1f} |"
                )
    lines += ["", "Command: `scripts/bench-netdelay` (`--quick` for a short smoke run, `--base REV` for a baseline)."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
