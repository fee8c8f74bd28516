#!/usr/bin/env python3
"""Read-path benchmarks of a taskbroker database with many stored tasks.

usage: bench_reads.py BINARY WORKDIR N [--quick]

Creates a session through a running-then-stopped broker, fills the database
with N completed tasks of that session (one transaction, through the same
schema, with the triggers that write history), then:
  - restart-to-ready: time from spawning `serve` to its "listening" line,
    and its RSS after 200 requests;
  - tasks/get latency (random tasks) and tasks/list latency (first page and
    a deep page reached by its cursor), p50/p99 over 500 requests.
Prints one JSON object.
"""
import base64
import http.client
import json
import os
import random
import sqlite3
import struct
import subprocess
import sys
import time

binary, workdir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
db = os.path.join(workdir, f"reads-{n}.db")
for suffix in ("", "-wal", "-shm"):
    try:
        os.remove(db + suffix)
    except FileNotFoundError:
        pass


def start():
    t0 = time.monotonic()
    p = subprocess.Popen([binary, "serve", "--db", db, "--listen", "127.0.0.1:0", "--workers", "0",
                          "--durability", "normal"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    ready = time.monotonic() - t0
    url = line.strip().removeprefix("taskbroker listening on ")
    host, port = url.removeprefix("http://").removesuffix("/mcp").split(":")
    return p, host, int(port), ready


def rpc(conn, session, method, params, rid=[0]):
    rid[0] += 1
    body = json.dumps({"jsonrpc": "2.0", "id": rid[0], "method": method, "params": params})
    headers = {"content-type": "application/json", "accept": "application/json"}
    if session:
        headers["mcp-session-id"] = session
    conn.request("POST", "/mcp", body, headers)
    r = conn.getresponse()
    data = r.read()
    return r, json.loads(data) if data else None


# A session, made by the broker itself.
p, host, port, _ = start()
conn = http.client.HTTPConnection(host, port)
r, _ = rpc(conn, None, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                      "clientInfo": {"name": "bench", "version": "0"}})
session = r.getheader("mcp-session-id")
p.kill()
p.wait()

# Fill: N completed tasks of that session.
owner = "session:" + session
c = sqlite3.connect(db)
c.execute("PRAGMA synchronous=OFF")
now = int(time.time() * 1000)
ttl = 7 * 24 * 3600 * 1000
t0 = time.monotonic()
with c:
    rows = ((f"bench-{i:08d}-{random.getrandbits(64):016x}", owner, "sleep", '{"seconds":0}', now - n + i,
             now - n + i, ttl, now - n + i + ttl, 1000) for i in range(n))
    c.executemany("INSERT INTO tasks (task_id, owner, tool, arguments, created_at, updated_at, ttl_ms, expires_at,"
                  " poll_interval_ms) VALUES (?,?,?,?,?,?,?,?,?)", rows)
    c.execute("UPDATE tasks SET status='completed', result='{\"content\":[]}', result_kind='result', "
              "updated_at=updated_at+1")
fill_s = time.monotonic() - t0
ids = [row[0] for row in c.execute("SELECT task_id FROM tasks ORDER BY random() LIMIT 500")]
c.close()

p, host, port, ready = start()
conn = http.client.HTTPConnection(host, port)


def timed(method, params, count):
    lat = []
    for i in range(count):
        t = time.perf_counter()
        r, body = rpc(conn, session, method, params(i))
        lat.append((time.perf_counter() - t) * 1000)
        assert r.status == 200 and "result" in body, (r.status, body)
    lat.sort()
    return {"p50_ms": lat[len(lat) // 2], "p99_ms": lat[int(len(lat) * 0.99) - 1], "n": count}


get = timed("tasks/get", lambda i: {"taskId": ids[i % len(ids)]}, 500)
first = timed("tasks/list", lambda i: {}, 200)
# A deep page: the cursor of the row in the middle of the table.
seq = n // 2
tag = 0xcbf29ce484222325
for b in owner.encode():
    tag ^= b
    tag = (tag * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
cursor = base64.urlsafe_b64encode(bytes([1]) + struct.pack(">q", seq) + struct.pack(">Q", tag)).rstrip(b"=").decode()
deep = timed("tasks/list", lambda i: {"cursor": cursor}, 200)
rss_kb = 0
with open(f"/proc/{p.pid}/status") as f:
    for line in f:
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
p.kill()
p.wait()
print(json.dumps({"tasks": n, "fill_s": round(fill_s, 2), "ready_s": round(ready, 3), "rss_mb": round(rss_kb / 1024, 1),
                  "get": get, "list_first": first, "list_deep": deep}))
