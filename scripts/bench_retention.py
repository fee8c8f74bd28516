#!/usr/bin/env python3
"""The purge of many tasks past their ttl, with and without retention rules
(scripts/bench-queue --retention runs this; issue 27 item 3).

For each driver and rule: a fresh database migrated by the binary, N
completed tasks past their ttl written straight with SQL (each with its two
status-history rows, written by the schema's triggers), then `taskbroker
prune` timed from the outside. Rules: none (deleted), `archive` (moved to
tasks_archive with their history), and `retain_completed` far in the future
(kept: each gets keep_until). A prune goes in transactions of at most 500
tasks; the mean time per transaction is the write lock a running broker
waits behind. After the keep case, a second prune times what kept rows
cost a later pass (they have left the ttl index: nothing to read).

Prints one JSON line per case, then a Markdown table (also written between
the "retention-purge:start" and "retention-purge:end" markers of --out).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import tempfile
import time

from bench_scale import PGURL, psql, write_block

BATCH = 500
# A retention that keeps every row for centuries.
FOREVER_MS = 10**13

RULES = {
    "none (deleted)": ("NULL", "0", "false"),
    "archive": ("NULL", "1", "true"),
    "retain_completed (kept)": (str(FOREVER_MS), "0", "false"),
}


def fill_sqlite(db: str, rows: int, keep: str, archive: str) -> None:
    sql = f"""
    WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows})
    INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at, ttl_ms,
                       expires_at, retain_completed_ms, archive)
    SELECT 'bench-' || i, 'alice', 'sleep', '{{}}', 'working', 1000, 1000, 1000, 2000, {keep}, {archive}
      FROM n;
    UPDATE tasks SET status = 'completed', updated_at = 1500, result = '{{"content":[]}}',
                     result_kind = 'result';
    """
    subprocess.run(["sqlite3", db], input=sql, text=True, check=True)


def fill_postgres(dbname: str, rows: int, keep: str, archive: str) -> None:
    psql(dbname, f"""
    INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at, ttl_ms,
                       expires_at, retain_completed_ms, archive)
    SELECT 'bench-' || i, 'alice', 'sleep', '{{}}', 'working', 1000, 1000, 1000, 2000, {keep}, {archive}
      FROM generate_series(1, {rows}) AS i;
    UPDATE tasks SET status = 'completed', updated_at = 1500, result = '{{"content":[]}}',
                     result_kind = 'result';
    """)
    psql(dbname, "VACUUM ANALYZE tasks")


def prune(binary: str, db: str) -> tuple[float, dict]:
    start = time.perf_counter()
    out = subprocess.run([binary, "prune", "--json", "--db", db], capture_output=True, text=True, check=True)
    return time.perf_counter() - start, json.loads(out.stdout)


def case(binary: str, driver: str, rule: str, rows: int, work: str) -> dict:
    keep, sqlite_archive, pg_archive = RULES[rule]
    if driver == "postgres":
        name = f"tb_retention_{os.getpid()}"
        psql("postgres", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        psql("postgres", f"CREATE DATABASE {name}")
        db = f"{PGURL}/{name}"
    else:
        db = os.path.join(tempfile.mkdtemp(dir=work), "retention.db")
    subprocess.run([binary, "migrate", "--db", db], capture_output=True, check=True)
    if driver == "postgres":
        fill_postgres(name, rows, keep, pg_archive)
    else:
        fill_sqlite(db, rows, keep, sqlite_archive)
    seconds, report = prune(binary, db)
    again, second = prune(binary, db)
    if driver == "postgres":
        psql("postgres", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    return {
        "driver": driver, "rule": rule, "rows": rows, "seconds": seconds, "report": report,
        "transactions": math.ceil(rows / BATCH), "second_seconds": again, "second": second,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--drivers", default="sqlite,postgres")
    ap.add_argument("--out")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.rounds):
            for driver in args.drivers.split(","):
                for rule in RULES:
                    r = case(args.bin, driver, rule, args.rows, work)
                    print(json.dumps(r), flush=True)
                    results.append(r)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"Measured by `scripts/bench-queue --retention` (`scripts/bench_retention.py`) at commit `{commit}`: "
        f"{os.cpu_count()} cores, release build, {args.rows:,} completed tasks past their ttl (each with two "
        f"status-history rows) written with SQL, then `taskbroker prune` timed as a whole (process start "
        f"included), then a second `prune`; median of {args.rounds} rounds (min-max). A prune goes in "
        f"transactions of at most {BATCH} tasks, as the brokers' purge does.",
        "",
        "| driver | rule | prune s | tasks/s | ms per transaction (mean) | what it did | second prune s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for driver in args.drivers.split(","):
        for rule in RULES:
            v = [r for r in results if (r["driver"], r["rule"]) == (driver, rule)]
            secs = [r["seconds"] for r in v]
            again = [r["second_seconds"] for r in v]
            med = statistics.median(secs)
            rep = v[0]["report"]
            did = ", ".join(f"{rep[k]:,} {k}" for k in ("deleted", "archived", "kept") if rep[k])
            lines.append(
                f"| {driver} | {rule} | {med:.2f} ({min(secs):.2f}-{max(secs):.2f}) | {args.rows / med:,.0f} "
                f"| {1000 * med / v[0]['transactions']:.1f} | {did} | {statistics.median(again):.3f} |"
            )
    lines += ["", "Command: `scripts/bench-queue --retention` (`--quick`: 20,000 rows)."]
    table = "\n".join(lines)
    print(table)
    if args.out:
        write_block(args.out, "retention-purge", "Retention: purging many expired tasks (issue 27)", table)


if __name__ == "__main__":
    main()
