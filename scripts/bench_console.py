#!/usr/bin/env python3
"""The web console's reads at 1,000 and at 1,000,000 stored tasks.

usage: bench_console.py BINARY WORKDIR N [--postgres URL]

Fills a fresh database (SQLite in WORKDIR, or the empty PostgreSQL database
at URL) with N tasks through the real schema and its triggers: 8 tools,
100 principals, finished over the last 24 hours (about 1 in 1,000 failed,
1 in 100 cancelled), the newest 200 still working with queued jobs. Starts
`taskbroker serve` on it (no tokens, loopback: the console needs no login)
and times each console read, p50/p99 in ms over many requests:
the overview, the first and a deep page of the task list, the list
filtered by a rare status, by a tool, by an owner, by a tool no task has
(every row read), a task's page, and the shell page. Prints one JSON object.
"""
import http.client
import json
import os
import random
import sqlite3
import subprocess
import sys
import time

binary, workdir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
pg_url = sys.argv[sys.argv.index("--postgres") + 1] if "--postgres" in sys.argv else None
db = pg_url or os.path.join(workdir, f"console-{n}.db")
if not pg_url:
    for suffix in ("", "-wal", "-shm"):
        try:
            os.remove(db + suffix)
        except FileNotFoundError:
            pass

TOOLS = [f"tool_{i}" for i in range(8)]
OWNERS = [f"principal:p{i}" for i in range(100)]
WORKING = 200
DAY = 24 * 3600 * 1000
TTL = 7 * DAY

# The same two statements on both drivers: jobs for the newest tasks, then
# every other task finished (1 in 1,000 failed, 1 in 100 cancelled).
QUEUE_SQL = (f"INSERT INTO jobs (task_seq, run_after, tool, changed_at)"
             f" SELECT seq, created_at, tool, created_at FROM tasks WHERE seq > {n - WORKING}")
FINISH_SQL = f"""UPDATE tasks SET status = CASE WHEN seq % 1000 = 7 THEN 'failed'
                                   WHEN seq % 100 = 3 THEN 'cancelled'
                                   ELSE 'completed' END,
                     result = CASE WHEN seq % 100 = 3 AND seq % 1000 <> 7 THEN NULL
                                   ELSE '{{"content":[]}}' END,
                     result_kind = CASE WHEN seq % 100 = 3 AND seq % 1000 <> 7 THEN NULL
                                        ELSE 'result' END,
                     status_message = CASE WHEN seq % 1000 = 7 THEN 'Tool execution failed: bench' END,
                     updated_at = updated_at + 50
     WHERE seq <= {n - WORKING}"""

subprocess.run([binary, "migrate", "--db", db], check=True, stdout=subprocess.DEVNULL,
               stderr=subprocess.DEVNULL)
now = int(time.time() * 1000)
t0 = time.monotonic()
if pg_url:
    # One statement per step; the triggers write the history as for real tasks.
    fill = f"""
    SET synchronous_commit = off;
    INSERT INTO tasks (task_id, owner, tool, arguments, created_at, updated_at, ttl_ms, expires_at, poll_interval_ms)
    SELECT 'bench-' || lpad(i::text, 8, '0') || '-' || md5(i::text),
           'principal:p' || (i % 100), 'tool_' || (i % 8), '{{"n":' || i || '}}',
           {now} - {DAY} + i * ({DAY} / {n}), {now} - {DAY} + i * ({DAY} / {n}),
           {TTL}, {now} - {DAY} + i * ({DAY} / {n}) + {TTL}, 1000
      FROM generate_series(1, {n}) AS i;
    {QUEUE_SQL};
    {FINISH_SQL};
    VACUUM ANALYZE;
    """
    subprocess.run(["psql", pg_url, "-q", "-v", "ON_ERROR_STOP=1", "-f", "-"], input=fill, text=True,
                   check=True, stdout=subprocess.DEVNULL)
else:
    c = sqlite3.connect(db)
    c.execute("PRAGMA synchronous=OFF")
    step = DAY // n
    with c:
        rows = ((f"bench-{i:08d}-{random.getrandbits(64):016x}", OWNERS[i % 100], TOOLS[i % 8],
                 json.dumps({"n": i}), now - DAY + i * step, now - DAY + i * step, TTL,
                 now - DAY + i * step + TTL, 1000) for i in range(1, n + 1))
        c.executemany("INSERT INTO tasks (task_id, owner, tool, arguments, created_at, updated_at, ttl_ms,"
                      " expires_at, poll_interval_ms) VALUES (?,?,?,?,?,?,?,?,?)", rows)
        c.execute(QUEUE_SQL)
        c.execute(FINISH_SQL)
    c.execute("ANALYZE")
    c.close()
fill_s = time.monotonic() - t0

p = subprocess.Popen([binary, "serve", "--db", db, "--listen", "127.0.0.1:0", "--workers", "0"],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
# The server goes with this script, however it ends.
import atexit
atexit.register(p.kill)
line = p.stdout.readline()
url = line.strip().removeprefix("taskbroker listening on ")
host, port = url.removeprefix("http://").removesuffix("/mcp").split(":")
conn = http.client.HTTPConnection(host, int(port))


def fetch(path):
    conn.request("GET", path)
    r = conn.getresponse()
    body = r.read()
    assert r.status == 200, (path, r.status, body[:300])
    return json.loads(body) if r.getheader("content-type", "").startswith("application/json") else body


def timed(paths, count):
    for i in range(3):
        fetch(paths(i))
    lat = []
    for i in range(count):
        t = time.perf_counter()
        fetch(paths(i))
        lat.append((time.perf_counter() - t) * 1000)
    lat.sort()
    # Nearest rank: the smallest sample at or above 99% of them.
    p99 = lat[max(0, -(-len(lat) * 99 // 100) - 1)]
    return {"p50_ms": round(lat[len(lat) // 2], 2), "p99_ms": round(p99, 2), "n": count}


first = fetch("/ui/api/tasks")
assert len(first["tasks"]) == 50, first
overview = fetch("/ui/api/overview")
assert sum(t["finishedLastHour"] for t in overview["tools"]) > 0 or n < 100_000, overview
failed = fetch("/ui/api/tasks?status=failed")
assert failed["tasks"] and all(t["status"] == "failed" for t in failed["tasks"]), failed
ids = [t["taskId"] for t in fetch("/ui/api/tasks?limit=200&before=" + str(n // 2))["tasks"]]
assert len(ids) == 200
results = {
    "overview": timed(lambda i: "/ui/api/overview", 100),
    "list_first": timed(lambda i: "/ui/api/tasks", 200),
    "list_deep": timed(lambda i: f"/ui/api/tasks?before={n // 2}", 200),
    "list_failed": timed(lambda i: "/ui/api/tasks?status=failed", 100),
    "list_open": timed(lambda i: "/ui/api/tasks?status=input_required", 100),
    "list_none": timed(lambda i: "/ui/api/tasks?tool=no-such-tool", 10),
    "list_tool": timed(lambda i: "/ui/api/tasks?tool=tool_3", 100),
    "list_owner": timed(lambda i: "/ui/api/tasks?owner=principal:p42", 100),
    "task_page": timed(lambda i: f"/ui/api/tasks/{ids[i % len(ids)]}", 200),
    "shell": timed(lambda i: "/ui/tasks", 200),
}
p.kill()
p.wait()
print(json.dumps({"tasks": n, "driver": "postgres" if pg_url else "sqlite", "fill_s": round(fill_s, 1),
                  **results}))
