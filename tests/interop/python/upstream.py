#!/usr/bin/env python3
"""Interoperability: an MCP server written with the official Python SDK
(tests/interop/python/upstream_server.py, FastMCP of mcp==1.30.0) behind the
broker as an `[[upstream]]`, driven by the same SDK's client.

Usage:
    python upstream.py path/to/taskbroker

Starts its own broker in a fresh temporary directory, with this config:
    [[upstream]]
    name = "py"
    command = ["<this python>", "<upstream_server.py>"]
and kills it at the end (also on failure).

Checks:
  1. tools/list shows the server's tools with their input schema
  2. a task call of slow_report (3 steps): polled to completed, its
     progress was kept with the task, tasks/result is the server's answer;
     a task call of wait_for: the server's log line (said after its
     progress) is the task's statusMessage while it waits, then it
     completes once the test creates the file
  3. a plain call answers at once with the server's answer
  4. a tool that raises: the task fails, with the server's error text
  5. tasks/cancel of a long slow_report: cancelled, and stays cancelled

MCP traffic goes only through the SDK's public client API
(`streamable_http_client`, `ClientSession`, `session.experimental.*`). The
broker's SQLite file is read (read-only) to show the kept progress.

Every check prints `ok - ...` or `not ok - ...`; the last line is
`N passed, M failed`; exit status 0 only when M is 0.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import timedelta

import anyio
import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

# mcp 1.30.0 marks `session.experimental` deprecated; it is the tasks API.
warnings.filterwarnings("ignore", category=DeprecationWarning)

HERE = os.path.dirname(os.path.abspath(__file__))
TTL_MS = 600_000


class Run:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, cond: bool, what: str, detail: object = "") -> None:
        if cond:
            self.passed += 1
            print(f"ok - {what}", flush=True)
        else:
            self.failed += 1
            print(f"not ok - {what}\n    {detail}", flush=True)


def start_broker(binary: str, folder: str) -> tuple[subprocess.Popen, str]:
    config = os.path.join(folder, "taskbroker.toml")
    with open(config, "w") as f:
        f.write(
            '[[upstream]]\nname = "py"\n'
            f'command = ["{sys.executable}", "{os.path.join(HERE, "upstream_server.py")}"]\n'
        )
    out = open(os.path.join(folder, "serve.out"), "w")
    log = open(os.path.join(folder, "serve.log"), "w")
    proc = subprocess.Popen(
        [binary, "serve", "--config", config, "--db", os.path.join(folder, "b.db"), "--listen", "127.0.0.1:0"],
        stdout=out,
        stderr=log,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = open(os.path.join(folder, "serve.out")).read()
        if "taskbroker listening on " in text:
            url = text.split("taskbroker listening on ", 1)[1].split()[0]
            return proc, url
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise SystemExit("the broker did not start:\n" + open(os.path.join(folder, "serve.log")).read())


async def poll(session: ClientSession, task_id: str) -> tuple[types.GetTaskResult, list[str]]:
    """Poll until terminal; every statusMessage seen on the way."""
    messages: list[str] = []
    final = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        final = await session.experimental.get_task(task_id)
        if final.statusMessage:
            messages.append(final.statusMessage)
        if final.status in ("completed", "failed", "cancelled"):
            return final, messages
        await anyio.sleep(0.1)
    raise AssertionError(f"task {task_id} never ended: {final}")


def text_of(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def checks(run: Run, url: str, db: str) -> None:
    async with streamable_http_client(url) as (read, write, _):
        async with ClientSession(
            read,
            write,
            read_timeout_seconds=timedelta(seconds=60),
            client_info=types.Implementation(name="taskbroker-interop-upstream", version="1"),
        ) as s:
            await s.initialize()

            tools = {t.name: t for t in (await s.list_tools()).tools}
            run.check("slow_report" in tools and "fail_always" in tools, "1. the upstream's tools are listed", list(tools))
            schema = tools.get("slow_report").inputSchema if "slow_report" in tools else {}
            run.check(
                schema.get("properties", {}).get("steps", {}).get("type") == "integer",
                "1. with the server's input schema",
                schema,
            )

            created = await s.experimental.call_tool_as_task("slow_report", {"steps": 3}, ttl=TTL_MS)
            task_id = created.task.taskId
            final, _ = await poll(s, task_id)
            run.check(final.status == "completed", "2. the task call completes", final)
            result = await s.experimental.get_task_result(task_id, types.CallToolResult)
            run.check(text_of(result) == "report of 3 steps", "2. tasks/result is the server's answer", result)
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                (progress,) = conn.execute(
                    "SELECT count(*) FROM task_progress p JOIN tasks t ON t.seq = p.task_seq WHERE t.task_id = ?",
                    (task_id,),
                ).fetchone()
            run.check(progress >= 1, "2. the server's progress was kept with the task", progress)

            gate = os.path.join(os.path.dirname(db), "gate")
            created = await s.experimental.call_tool_as_task("wait_for", {"path": gate}, ttl=TTL_MS)
            waiting, seen = None, []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                waiting = await s.experimental.get_task(created.task.taskId)
                seen.append(waiting.statusMessage)
                if waiting.statusMessage == f"waiting for {gate}" or waiting.status != "working":
                    break
                await anyio.sleep(0.1)
            run.check(
                waiting is not None and waiting.status == "working" and waiting.statusMessage == f"waiting for {gate}",
                "2. the server's log line is the task's statusMessage",
                {"last": waiting, "statusMessages seen": seen[-10:]},
            )
            open(gate, "w").close()
            final, _ = await poll(s, created.task.taskId)
            opened = await s.experimental.get_task_result(created.task.taskId, types.CallToolResult)
            run.check(
                final.status == "completed" and text_of(opened) == "opened",
                "2. and it completes once the file exists",
                (final, opened),
            )

            plain = await s.call_tool("slow_report", {"steps": 1})
            run.check(text_of(plain) == "report of 1 steps" and not plain.isError, "3. a plain call answers", plain)

            created = await s.experimental.call_tool_as_task("fail_always", {}, ttl=TTL_MS)
            final, _ = await poll(s, created.task.taskId)
            run.check(final.status == "failed", "4. a tool that raises fails its task", final)
            failed = await s.experimental.get_task_result(created.task.taskId, types.CallToolResult)
            run.check(
                failed.isError and "this tool always fails" in text_of(failed),
                "4. with the server's error text",
                failed,
            )

            created = await s.experimental.call_tool_as_task("slow_report", {"steps": 100}, ttl=TTL_MS)
            long_id = created.task.taskId
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                status = await s.experimental.get_task(long_id)
                if status.statusMessage:
                    break
                await anyio.sleep(0.1)
            await s.experimental.cancel_task(long_id)
            status = await s.experimental.get_task(long_id)
            run.check(status.status == "cancelled", "5. tasks/cancel cancels the running upstream call", status)
            await anyio.sleep(1.0)
            status = await s.experimental.get_task(long_id)
            run.check(status.status == "cancelled", "5. and it stays cancelled", status)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: upstream.py path/to/taskbroker", file=sys.stderr)
        return 2
    run = Run()
    with tempfile.TemporaryDirectory(prefix="taskbroker-upstream-") as folder:
        proc, url = start_broker(sys.argv[1], folder)
        try:
            anyio.run(checks, run, url, os.path.join(folder, "b.db"))
        except Exception as e:  # noqa: BLE001 - a crash is a failed check
            run.check(False, "the run could not go on", repr(e))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            if run.failed:
                print("--- broker log (last 40 lines)")
                print("".join(open(os.path.join(folder, "serve.log")).readlines()[-40:]))
    print(f"{run.passed} passed, {run.failed} failed", flush=True)
    return 0 if run.failed == 0 and run.passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
