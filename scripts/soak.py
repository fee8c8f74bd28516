#!/usr/bin/env python3
"""Soak test of a running-from-scratch taskbroker: careless and hostile
clients for a while, the broker's resources sampled every 10 s.

Load (all on 127.0.0.1, bounded in count and time):
  - churn: clients that initialize, run a few short tasks to the end, and go
    away without DELETE (their sessions must expire);
  - droppers: clients that drop tasks/result and GET streams mid-way and
    come back for the result;
  - slow connections: a few hundred that send half their request headers,
    and some that declare a body and send part of it (reopened when the
    broker closes them);
  - a well-behaved client polling tasks/get of its own task, whose latency
    and answers are the service level.
Tasks get a short ttl, so they expire and are purged during the run.

Sampled every 10 s: RSS, open file descriptors, database and WAL size,
sessions open in the database, p99 of the well-behaved client's tasks/get.
Fails (exit 1) on any refusal or 5xx seen by the well-behaved client, any
task of a churn client that did not complete, and (runs of 3 minutes or
more) on growth: the last third of the samples above the middle third by
more than the allowed margin.

usage: scripts/soak.py BIN [--seconds N] [--slow N] [--json FILE]
"""

import argparse
import http.client
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

STOP = threading.Event()
LOCK = threading.Lock()
COUNTS = {"retried_429": 0, "tasks_created": 0, "tasks_completed": 0, "tasks_lost": 0, "sessions_opened": 0,
          "stream_drops": 0, "slow_reopened": 0, "good_requests": 0, "good_errors": 0,
          "churn_errors": 0}
LATENCIES = []  # the well-behaved client's tasks/get, ms, this window


def bump(key, n=1):
    with LOCK:
        COUNTS[key] += n


class Mcp:
    """A minimal MCP client over one keep-alive HTTP connection."""

    def __init__(self, port):
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.session = None
        self.next_id = 0

    def headers(self):
        h = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if self.session:
            h["mcp-session-id"] = self.session
            h["mcp-protocol-version"] = "2025-11-25"
        return h

    def post(self, body):
        """POST; a 429 is waited out as its Retry-After says, as a polite
        client does (every local client shares 127.0.0.1, and the slow
        clients here spend that address's initialize budget)."""
        for _ in range(50):
            self.conn.request("POST", "/mcp", json.dumps(body), self.headers())
            r = self.conn.getresponse()
            data = r.read().decode()
            if r.status != 429 or STOP.is_set():
                return r.status, r.getheader("mcp-session-id"), data
            bump("retried_429")
            # The broker answered before reading the body, so it closes
            # this connection: retry on a new one.
            self.conn.close()
            time.sleep(min(float(r.getheader("retry-after") or 1), 5))
        return r.status, r.getheader("mcp-session-id"), data

    def request(self, method, params=None):
        self.next_id += 1
        status, sid, data = self.post({"jsonrpc": "2.0", "id": self.next_id, "method": method,
                                       "params": params or {}})
        if sid:
            self.session = sid
        if status != 200:
            raise RuntimeError(f"{method}: HTTP {status} {data[:200]}")
        for line in data.splitlines():  # an SSE answer: the last data line
            if line.startswith("data:") and line[5:].strip():
                data = line[5:].strip()
        msg = json.loads(data)
        if "error" in msg:
            raise RuntimeError(f"{method}: {msg['error']}")
        return msg["result"]

    def initialize(self):
        self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "soak", "version": "1"}})
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        bump("sessions_opened")

    def call_task(self, seconds, ttl_ms):
        r = self.request("tools/call", {"name": "sleep", "arguments": {"seconds": seconds},
                                        "task": {"ttl": ttl_ms}})
        bump("tasks_created")
        return r["task"]["taskId"]

    def wait_done(self, task_id, limit_s=60):
        deadline = time.time() + limit_s
        while time.time() < deadline:
            t = self.request("tasks/get", {"taskId": task_id})
            if t["status"] in ("completed", "failed", "cancelled"):
                return t["status"]
            time.sleep(0.1)
        return "timeout"

    def close(self):
        self.conn.close()


def churn(port):
    """Sessions that come, run tasks to the end, and go without DELETE."""
    while not STOP.is_set():
        c = Mcp(port)
        try:
            c.initialize()
            ids = [c.call_task(0.2, 8000) for _ in range(3)]
            for i in ids:
                status = c.wait_done(i)
                bump("tasks_completed" if status == "completed" else "tasks_lost")
        except Exception as e:  # noqa: BLE001 - counted, the run goes on
            if not STOP.is_set():
                bump("churn_errors")
                print(f"churn: {e}", file=sys.stderr)
        finally:
            c.close()


def dropper(port):
    """Drop tasks/result and GET streams mid-way, then come back."""
    while not STOP.is_set():
        c = Mcp(port)
        try:
            c.initialize()
            task = c.call_task(1, 8000)
            for method, body in (("POST", {"jsonrpc": "2.0", "id": 99, "method": "tasks/result",
                                          "params": {"taskId": task}}), ("GET", None)):
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                payload = json.dumps(body) if body else ""
                s.sendall((f"{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           "Accept: application/json, text/event-stream\r\n"
                           "Content-Type: application/json\r\n"
                           f"Mcp-Session-Id: {c.session}\r\nMcp-Protocol-Version: 2025-11-25\r\n"
                           f"Content-Length: {len(payload)}\r\n\r\n{payload}").encode())
                s.recv(256)
                s.close()
                bump("stream_drops")
            status = c.wait_done(task)
            c.request("tasks/result", {"taskId": task})
            bump("tasks_completed" if status == "completed" else "tasks_lost")
        except Exception as e:  # noqa: BLE001
            if not STOP.is_set():
                bump("churn_errors")
                print(f"dropper: {e}", file=sys.stderr)
        finally:
            c.close()


def slow_connections(port, n, body):
    """Hold n connections that never finish their request; reopen those
    the broker closes."""
    socks = []
    half = (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"jsonrpc\"") if body else b"POST /mcp HTTP/1.1\r\nHost: 12"
    while not STOP.is_set():
        while len(socks) < n and not STOP.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(half)
                s.setblocking(False)
                socks.append(s)
            except OSError:
                time.sleep(0.2)
                break
        time.sleep(1)
        alive = []
        for s in socks:
            try:
                if s.recv(4096) == b"":
                    s.close()
                    bump("slow_reopened")
                    continue
                s.close()  # answered (408): done with it
                bump("slow_reopened")
                continue
            except BlockingIOError:
                alive.append(s)
            except OSError:
                s.close()
                bump("slow_reopened")
        socks = alive
    for s in socks:
        s.close()


def well_behaved(port):
    """One session polling its own long task: the service level."""
    c = Mcp(port)
    c.initialize()
    task = c.call_task(3600, 3_600_000)
    while not STOP.is_set():
        t0 = time.perf_counter()
        try:
            t = c.request("tasks/get", {"taskId": task})
            assert t["status"] == "working", t
            with LOCK:
                LATENCIES.append((time.perf_counter() - t0) * 1000)
            bump("good_requests")
        except Exception as e:  # noqa: BLE001
            bump("good_errors")
            print(f"well-behaved client: {e}", file=sys.stderr)
            c.close()
            c = Mcp(port)
            c.session = None
            c.initialize()
            task = c.call_task(3600, 3_600_000)
        time.sleep(0.1)
    c.close()


def sample(pid, db):
    rss = fds = 0
    try:
        rss = int(re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{pid}/status").read()).group(1)) / 1024
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    size = lambda p: os.path.getsize(p) / 1e6 if os.path.exists(p) else 0.0  # noqa: E731
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    open_sessions = con.execute("SELECT count(*) FROM sessions WHERE ended_at IS NULL").fetchone()[0]
    tasks = con.execute("SELECT count(*) FROM tasks").fetchone()[0]
    con.close()
    with LOCK:
        lat = sorted(LATENCIES)
        LATENCIES.clear()
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")
    return {"t": 0, "rss_mb": round(rss, 1), "fds": fds, "db_mb": round(size(db), 2),
            "wal_mb": round(size(db + "-wal"), 2), "open_sessions": open_sessions,
            "tasks": tasks, "get_p99_ms": round(p99, 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--slow", type=int, default=300, help="slow-header connections held")
    ap.add_argument("--json", help="write samples and counts here")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="taskbroker-soak-")
    db = os.path.join(work, "soak.db")
    log = open(os.path.join(work, "serve.log"), "w")
    flags = ["--session-idle", "5", "--default-ttl", "10", "--max-ttl", "3600"]
    help_text = subprocess.run([args.bin, "serve", "--help"], capture_output=True, text=True).stdout
    for flag, value in (("--header-timeout", "2"), ("--body-timeout", "2")):
        if flag in help_text:
            flags += [flag, value]
    server = subprocess.Popen([args.bin, "serve", "--db", db, "--listen", "127.0.0.1:0", *flags],
                              stdout=subprocess.PIPE, stderr=log, text=True)
    line = server.stdout.readline()
    port = int(line.strip().rsplit(":", 1)[1].split("/")[0])
    print(f"soak: broker pid {server.pid} on port {port}, {args.seconds} s, flags {' '.join(flags)}")
    threads = [threading.Thread(target=well_behaved, args=(port,))]
    threads += [threading.Thread(target=churn, args=(port,)) for _ in range(4)]
    threads += [threading.Thread(target=dropper, args=(port,)) for _ in range(2)]
    threads += [threading.Thread(target=slow_connections, args=(port, args.slow, False)),
                threading.Thread(target=slow_connections, args=(port, max(args.slow // 6, 1), True))]
    for t in threads:
        t.daemon = True
        t.start()
    samples = []
    start = time.time()
    print(f"{'t':>5} {'rss_mb':>7} {'fds':>5} {'db_mb':>6} {'wal_mb':>6} {'sessions':>8} {'tasks':>6} {'get_p99':>8}")
    while time.time() - start < args.seconds:
        time.sleep(min(10, max(0.0, args.seconds - (time.time() - start))))
        s = sample(server.pid, db)
        s["t"] = round(time.time() - start)
        samples.append(s)
        print(f"{s['t']:>5} {s['rss_mb']:>7} {s['fds']:>5} {s['db_mb']:>6} {s['wal_mb']:>6} "
              f"{s['open_sessions']:>8} {s['tasks']:>6} {s['get_p99_ms']:>8}", flush=True)
    STOP.set()
    for t in threads:
        t.join(timeout=40)
    server.terminate()
    server.wait(timeout=30)
    print("soak:", json.dumps(COUNTS))
    failures = []
    if COUNTS["good_errors"]:
        failures.append(f"the well-behaved client saw {COUNTS['good_errors']} errors")
    if COUNTS["tasks_lost"]:
        failures.append(f"{COUNTS['tasks_lost']} tasks did not complete")
    if COUNTS["good_requests"] == 0 or COUNTS["tasks_completed"] == 0:
        failures.append("no load went through")
    if len(samples) >= 18:  # 3 minutes: trends mean something
        third = len(samples) // 3
        mid, last = samples[third:2 * third], samples[2 * third:]
        for key, margin in (("rss_mb", 1.25), ("fds", 1.25), ("open_sessions", 1.5)):
            a = sum(s[key] for s in mid) / len(mid)
            b = sum(s[key] for s in last) / len(last)
            if b > a * margin + 5:
                failures.append(f"{key} grew: {a:.1f} in the middle third, {b:.1f} in the last")
        db_mid = max(s["db_mb"] + s["wal_mb"] for s in mid)
        db_last = max(s["db_mb"] + s["wal_mb"] for s in last)
        if db_last > db_mid * 1.5 + 1:
            failures.append(f"database grew: {db_mid:.2f} MB to {db_last:.2f} MB")
    if args.json:
        json.dump({"samples": samples, "counts": COUNTS, "flags": flags}, open(args.json, "w"), indent=1)
    for f in failures:
        print(f"soak: FAIL: {f}")
    print("soak: " + ("1 passed, 0 failed" if not failures else "0 passed, 1 failed"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
