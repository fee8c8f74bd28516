#!/usr/bin/env python3
"""The work per task as processes are added (scripts/bench-scale runs this).

For each driver and each number N of worker processes: a fresh database,
one `taskbroker serve --workers 0` (no other flag: the defaults a user
gets), N `taskbroker worker --concurrency 8`, and `taskbroker bench`
(16 clients, `sleep 0` tasks, each client waiting in tasks/result). The
CPU time of every process involved (the broker, the workers and, on
PostgreSQL, every `postgres` process of the server: backends, WAL writer,
checkpointer) is read from /proc/<pid>/stat before and after the load,
and divided by the tasks completed. The load generator is not counted.

With --base, a second binary (the baseline) runs the same cases in the
same rounds, in alternating order, so the machine's drift cancels out of
the ratios.

Then, with --count, one more pass per case with the sqlx statement log
on (`RUST_LOG=sqlx::query=debug`), counting statements per task in the
broker and the workers (not timed: logging costs CPU).

Prints one JSON line per run and, at the end, a Markdown table (also
written between the "scale:start" and "scale:end" markers of --out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

TICK = os.sysconf("SC_CLK_TCK")
PGURL = os.environ.get("PGURL", "postgres://postgres@127.0.0.1:5432")


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, in seconds (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def postgres_pids() -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/comm") as f:
                if f.read().strip() == "postgres":
                    pids.append(int(name))
        except OSError:
            pass
    return pids


def postgres_cpu() -> dict[int, float]:
    return {pid: cpu_seconds(pid) for pid in postgres_pids()}


def psql(db: str, sql: str) -> None:
    subprocess.run(["psql", f"{PGURL}/{db}", "-qAtc", sql], check=True, capture_output=True)


class Case:
    """One broker setup on a fresh database; processes killed on close."""

    def __init__(self, binary: str, driver: str, workers: int, brokers: int, work: str, env: dict | None = None,
                 pg_via: str | None = None):
        self.binary, self.driver, self.work = binary, driver, work
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.env = dict(os.environ, **(env or {}))
        if driver == "postgres":
            self.dbname = f"tb_scale_{os.getpid()}"
            psql("postgres", f"DROP DATABASE IF EXISTS {self.dbname} WITH (FORCE)")
            psql("postgres", f"CREATE DATABASE {self.dbname}")
            # The broker's processes may reach the server another way (a
            # latency relay); the database is made and dropped directly.
            self.db = f"{pg_via or PGURL}/{self.dbname}"
        else:
            self.dbname = None
            folder = tempfile.mkdtemp(dir=work)
            self.db = os.path.join(folder, "scale.db")
        self.urls = [self.serve(i) for i in range(brokers)]
        for i in range(workers):
            self.spawn(f"worker{i}", [self.binary, "worker", "--db", self.db, "--concurrency", "8"])
        time.sleep(0.5 + 0.1 * workers)
        for name, p in self.procs:
            if p.poll() is not None:
                raise SystemExit(f"{name} exited: {open(self.log(name)).read()[-2000:]}")

    def log(self, name: str) -> str:
        return os.path.join(self.work, f"{name}.log")

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        out = open(os.path.join(self.work, f"{name}.out"), "w")
        p = subprocess.Popen(argv, stdout=out, stderr=open(self.log(name), "w"), env=self.env, start_new_session=True)
        self.procs.append((name, p))
        return p

    def serve(self, i: int) -> str:
        name = f"broker{i}"
        self.spawn(name, [self.binary, "serve", "--db", self.db, "--listen", "127.0.0.1:0", "--workers", "0"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = open(os.path.join(self.work, f"{name}.out")).read()
            m = re.search(r"taskbroker listening on (\S+)", text)
            if m:
                return m.group(1)
            time.sleep(0.05)
        raise SystemExit(f"broker did not start: {open(self.log(name)).read()[-2000:]}")

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(p.pid) for name, p in self.procs}

    def close(self) -> None:
        for _, p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for _, p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if self.dbname:
            psql("postgres", f"DROP DATABASE IF EXISTS {self.dbname} WITH (FORCE)")


def load(binary: str, urls: list[str], clients: int, tasks: int) -> dict:
    """The load generator, clients and tasks split over the brokers."""
    gens = [
        subprocess.Popen(
            [binary, "bench", "--url", u, "--clients", str(clients // len(urls)), "--tasks", str(tasks // len(urls)), "--json"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for u in urls
    ]
    runs = [json.loads(g.communicate()[0]) for g in gens]
    done = sum(r["tasks"] for r in runs)
    secs = max(r["seconds"] for r in runs)
    return {
        "tasks": done,
        "errors": sum(r["errors"] for r in runs),
        "tasks_per_s": done / secs if secs else 0.0,
        "p50_ms": max(r["terminal"]["p50_ms"] or 0 for r in runs),
        "p99_ms": max(r["terminal"]["p99_ms"] or 0 for r in runs),
    }


def measure(binary: str, driver: str, workers: int, brokers: int, args, work: str, pg_via: str | None = None,
            loaded: int | None = None) -> dict:
    """One run; the clients split over the first `loaded` brokers (all by
    default), the others idle but running."""
    case = Case(binary, driver, workers, brokers, work, pg_via=pg_via)
    try:
        before, pg_before = case.cpu(), postgres_cpu() if driver == "postgres" else {}
        got = load(binary, case.urls[: loaded or brokers], args.clients, args.tasks)
        after, pg_after = case.cpu(), postgres_cpu() if driver == "postgres" else {}
    finally:
        case.close()
    broker = sum(after[n] - before[n] for n in after if n.startswith("broker"))
    worker = sum(after[n] - before[n] for n in after if n.startswith("worker"))
    pg = sum(v - pg_before.get(pid, 0.0) for pid, v in pg_after.items())
    n = max(got["tasks"], 1)
    return dict(
        got,
        cpu_ms_per_task=1000 * (broker + worker + pg) / n,
        broker_ms=1000 * broker / n,
        workers_ms=1000 * worker / n,
        postgres_ms=1000 * pg / n,
    )


def count_statements(binary: str, driver: str, workers: int, args, work: str, brokers: int = 1,
                     pg_via: str | None = None) -> dict[str, float]:
    """Statements per task from the sqlx query log of every process: in
    the brokers (a task's creation and its tasks/result) and in the
    workers (claim, run, completion). On PostgreSQL each is one round
    trip."""
    case = Case(binary, driver, workers, brokers, work, env={"RUST_LOG": "warn,sqlx::query=debug"}, pg_via=pg_via)
    try:
        marks = {name: os.path.getsize(case.log(name)) for name, _ in case.procs}
        got = load(binary, case.urls, args.clients, args.count_tasks)
        time.sleep(0.3)
        counted = {"broker": 0, "worker": 0}
        for name, _ in case.procs:
            with open(case.log(name), errors="replace") as f:
                f.seek(marks[name])
                counted["broker" if name.startswith("broker") else "worker"] += sum(
                    1 for line in f if "sqlx::query" in line
                )
    finally:
        case.close()
    n = max(got["tasks"], 1)
    return {"broker": counted["broker"] / n, "worker": counted["worker"] / n,
            "total": (counted["broker"] + counted["worker"]) / n}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--base", help="a baseline binary, run alternately in the same rounds")
    ap.add_argument("--drivers", default="sqlite,postgres")
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--brokers", default="1,2,3", help="PostgreSQL only, with 2 worker processes; '' to skip; "
                    "the most brokers are also run with every client on one of them (the others idle)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--count", action="store_true", help="also count statements per task")
    ap.add_argument("--count-tasks", type=int, default=500)
    ap.add_argument("--out")
    args = ap.parse_args()
    bins = [("new", args.bin)] + ([("base", args.base)] if args.base else [])
    drivers = args.drivers.split(",")
    ns = [int(x) for x in args.workers.split(",")]
    bs = [int(x) for x in args.brokers.split(",")] if args.brokers else []
    # (driver, workers, brokers, brokers with clients)
    cases = [(d, n, 1, 1) for d in drivers for n in ns] + [("postgres", 2, b, b) for b in bs if "postgres" in drivers]
    if "postgres" in drivers and bs and max(bs) > 1:
        cases.append(("postgres", 2, max(bs), 1))
    cases = list(dict.fromkeys(cases))
    work = tempfile.mkdtemp(prefix="tb-scale-")
    rows = []
    try:
        for r in range(args.rounds):
            for driver, n, b, loaded in cases:
                order = bins if r % 2 == 0 else list(reversed(bins))
                for label, binary in order:
                    m = measure(binary, driver, n, b, args, work, loaded=loaded)
                    row = dict(m, bin=label, driver=driver, workers=n, brokers=b, loaded=loaded, round=r)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        counts = {}
        if args.count:
            for driver, n, b, _ in cases:
                if b != 1:
                    continue
                for label, binary in bins:
                    counts[(label, driver, n)] = count_statements(binary, driver, n, args, work)["total"]
                    print(json.dumps({"count": label, "driver": driver, "workers": n,
                                      "statements_per_task": counts[(label, driver, n)]}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = report(rows, counts, bins, cases, args)
    print(table)
    if args.out:
        write_block(args.out, "scale", "Work per task as processes are added (issue 26)", table)
    return 0 if all(r["errors"] == 0 for r in rows) else 1


def write_block(out: str, marker: str, title: str, table: str) -> None:
    """Put `table` between the `<marker>:start` and `<marker>:end` comments of
    `out`, or, the first time, at its end under a heading `title`."""
    text = open(out).read()
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    block = f"{start}\n{table}\n{end}"
    if start in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n## {title}\n\n{block}\n"
    open(out, "w").write(text)


def report(rows, counts, bins, cases, args) -> str:
    def pick(label, driver, n, b, loaded, key):
        v = [r[key] for r in rows
             if (r["bin"], r["driver"], r["workers"], r["brokers"], r["loaded"]) == (label, driver, n, b, loaded)]
        return statistics.median(v), min(v), max(v)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    errors = sum(r["errors"] for r in rows)
    lines = [
        f"Measured by `scripts/bench-scale` at commit `{commit}`: {os.cpu_count()} cores, release build, "
        f"`serve --workers 0` (defaults otherwise) + N `worker --concurrency 8`, {args.clients} clients, "
        f"{args.tasks} `sleep 0` tasks per run, median of {args.rounds} runs (min-max); errors in all runs: {errors}. "
        "CPU is user + system time of the broker(s), the workers and every `postgres` process, per completed task"
        + ("; `base` is the commit before this work, run alternately in the same rounds." if len(bins) > 1 else "."),
        "",
    ]
    head = "| driver | brokers | workers | binary | tasks/s | CPU ms/task (broker + workers + postgres) | CPU vs 1 process | tasks/s vs 1 process |"
    if counts:
        head += " statements/task |"
    lines += [head, "|" + " --- |" * (head.count("|") - 1)]
    for driver, n, b, loaded in cases:
        for label, _ in bins:
            tps = pick(label, driver, n, b, loaded, "tasks_per_s")
            cpu = pick(label, driver, n, b, loaded, "cpu_ms_per_task")
            parts = [pick(label, driver, n, b, loaded, k)[0] for k in ("broker_ms", "workers_ms", "postgres_ms")]
            ref = (1, 1, 1) if b == 1 else (2, 1, 1)
            cpu1 = pick(label, driver, *ref, "cpu_ms_per_task")[0] if (driver, *ref) in cases else cpu[0]
            tps1 = pick(label, driver, *ref, "tasks_per_s")[0] if (driver, *ref) in cases else tps[0]
            split = f"{parts[0]:.2f} + {parts[1]:.2f}" + (f" + {parts[2]:.2f}" if driver == "postgres" else "")
            brokers = f"{b}" if loaded == b else f"{b} (clients on {loaded})"
            line = (f"| {driver} | {brokers} | {n} | {label} | {tps[0]:.0f} ({tps[1]:.0f}-{tps[2]:.0f}) | "
                    f"{cpu[0]:.2f} ({split}) | {cpu[0] / cpu1:.2f} | {tps[0] / tps1:.2f} |")
            if counts:
                c = counts.get((label, driver, n)) if b == 1 else None
                line += f" {c:.1f} |" if c is not None else " |"
            lines.append(line)
    lines += ["", "Command: `scripts/bench-scale` (`--quick` for a short smoke run)."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
