#!/usr/bin/env python3
"""Interoperability: the Python SDK 2.x generation (mcp 2.3, MCP 2026-07-28)
through FastMCP 4.1's client with the tasks extension package
(fastmcp-tasks, `io.modelcontextprotocol/tasks`), against a broker whose
tools run in a separate worker process.

Usage:
    python client.py path/to/taskbroker

Starts its own processes in a fresh temporary directory:
    taskbroker serve  --workers 0 --db DIR/b.db --listen 127.0.0.1:0
    taskbroker worker --db DIR/b.db --lease 5
(default settings: not --strict-headers) and kills them at the end.

MCP traffic goes only through the public client API: `fastmcp.Client(url)`
(mode "auto": it probes `server/discover` and speaks 2026-07-28),
`fastmcp_tasks.call_tool_task` and its `ToolTask` handle (`status`, `wait`,
`result`, `cancel`: `tasks/get`, `tasks/update`, `tasks/cancel`), and
`Client.call_tool` (which, with fastmcp_tasks imported, follows a task to
its end by itself). An httpx request hook records the headers the SDK
sends, to show what it leaves out.

Checks:
  1. server/discover negotiates 2026-07-28 and declares the tasks extension
  2. sleep as a task: CreateTaskResult, tasks/get polled to completed, the
     result; the same through plain call_tool (transparent task)
  3. cancel of a running task: tasks/cancel, the task ends cancelled
  4. approve as a task: input_required, the elicitation handler answers
     through tasks/update, result "approved"
  5. fail as a task: completed with isError true (2026-07-28 keeps a tool's
     isError result as the task's result); call_tool raises ToolError
  6. kill -9 of the server while a task runs in the worker, restart on the
     same database and port, a new Client gets the task's result

Every check prints `ok - ...` or `not ok - ...`; the last line is
`N passed, M failed`; exit status 0 only when M is 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Awaitable, Callable

import httpx2
import mcp_types
from fastmcp import Client
from fastmcp.client.elicitation import ElicitResult
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.exceptions import ToolError
from fastmcp_tasks import ToolTask, call_tool_task

PROTOCOL_VERSION = "2026-07-28"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
LEASE_S = 5
TOTAL_TIMEOUT_S = 90


class CheckFailed(Exception):
    pass


def expect(cond: bool, what: str, details: Any = "") -> None:
    if not cond:
        raise CheckFailed(what, details if isinstance(details, str) else show(details))


def show(value: Any) -> str:
    if hasattr(value, "model_dump"):
        value = value.model_dump(by_alias=True, mode="json", exclude_none=True)
    return json.dumps(value, sort_keys=True, default=str)


# ---------------------------------------------------------------- processes


class Broker:
    """`serve --workers 0` and one `worker` on one SQLite file in a temp dir."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix="taskbroker-python2-")
        self.db = os.path.join(self.dir, "b.db")
        self.server: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.url = ""
        self.starts = 0

    def _log(self, name: str) -> Any:
        return open(os.path.join(self.dir, f"{name}.log"), "ab")

    async def start_server(self, port: int = 0) -> str:
        """Starts the server; on a fixed port, retries while the old socket lingers."""
        deadline = time.monotonic() + 10
        while True:
            self.starts += 1
            out = os.path.join(self.dir, f"server-{self.starts}.out")
            with open(out, "wb") as stdout, self._log("server") as stderr:
                proc = subprocess.Popen(
                    [self.binary, "serve", "--workers", "0", "--db", self.db, "--listen", f"127.0.0.1:{port}"],
                    stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                )
            self.server = proc
            while proc.poll() is None and time.monotonic() < deadline:
                with open(out, "rb") as f:
                    for line in f.read().decode(errors="replace").splitlines():
                        if line.startswith("taskbroker listening on "):
                            self.url = line[len("taskbroker listening on "):].strip()
                            self.port = int(self.url.split(":")[2].split("/")[0])
                            return self.url
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if port == 0 or time.monotonic() >= deadline:
                raise CheckFailed("the server did not start", self.tail("server"))
            await asyncio.sleep(0.2)

    async def start_worker(self) -> None:
        with self._log("worker") as log:
            self.worker = subprocess.Popen(
                [self.binary, "worker", "--db", self.db, "--lease", str(LEASE_S)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            expect(self.worker.poll() is None, "the worker exited at start", self.tail("worker"))
            if db_query(self.db, "SELECT 1 FROM workers WHERE pid = ?", (self.worker.pid,)):
                return
            await asyncio.sleep(0.05)
        raise CheckFailed("the worker did not register within 10 s", self.tail("worker"))

    def kill_server(self) -> None:
        if self.server and self.server.poll() is None:
            self.server.send_signal(signal.SIGKILL)
            self.server.wait()

    def stop(self) -> None:
        for proc in (self.server, self.worker):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()

    def tail(self, name: str, lines: int = 15) -> str:
        try:
            with open(os.path.join(self.dir, f"{name}.log"), "rb") as f:
                text = f.read().decode(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"({name} log unreadable)"
        return f"last lines of the {name} log:\n" + "\n".join("  " + t for t in text)

    def cleanup(self) -> None:
        self.stop()
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


def db_query(db: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read-only look at the broker's database, to show where a tool ran."""
    if not os.path.exists(db):
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []  # the schema is not there yet
    finally:
        conn.close()


# ---------------------------------------------------------------- the client


class Headers:
    """What the SDK sent: (Mcp-Method, the MCP headers) per POST."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, str]]] = []

    async def hook(self, request: httpx2.Request) -> None:
        if request.method == "POST":
            mcp = {k.lower(): v for k, v in request.headers.items() if k.lower().startswith("mcp")}
            self.sent.append((mcp.get("mcp-method", "?"), mcp))

    def for_method(self, method: str) -> list[dict[str, str]]:
        return [h for m, h in self.sent if m == method]


class Asker:
    """The elicitation handler: records each question, answers as told."""

    def __init__(self) -> None:
        self.questions: list[tuple[str, dict[str, Any]]] = []
        self.answer: Any = {"approved": True}

    async def handler(self, message: str, response_type: Any, params: Any, context: Any) -> Any:
        self.questions.append((message, params.model_dump(by_alias=True, mode="json", exclude_none=True)))
        return self.answer


def make_client(url: str, headers: Headers, asker: Asker) -> Client:
    def factory(**kwargs: Any) -> httpx2.AsyncClient:
        kwargs.setdefault("timeout", httpx2.Timeout(30.0, read=30.0))
        return httpx2.AsyncClient(event_hooks={"request": [headers.hook]}, **kwargs)

    transport = StreamableHttpTransport(url, httpx_client_factory=factory)
    return Client(transport, elicitation_handler=asker.handler, timeout=30)


def texts(result: Any) -> list[str]:
    return [getattr(c, "text", "") for c in result.content]


class Run:
    def __init__(self, broker: Broker, headers: Headers) -> None:
        self.broker = broker
        self.headers = headers
        self.passed = 0
        self.failed = 0

    def ok(self, what: str) -> None:
        self.passed += 1
        print(f"ok - {what}", flush=True)

    def not_ok(self, what: str, details: str) -> None:
        self.failed += 1
        print(f"not ok - {what}", flush=True)
        for line in details.rstrip().splitlines():
            print(f"#   {line}", flush=True)
        for name in ("server", "worker"):
            for line in self.broker.tail(name, 8).splitlines():
                print(f"#   {line}", flush=True)

    async def group(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Runs one group of checks; a failure ends that group only."""
        try:
            await asyncio.wait_for(body(), 40)
        except CheckFailed as e:
            self.not_ok(f"{name}: {e.args[0]}", e.args[1] if len(e.args) > 1 else "")
        except Exception as e:  # noqa: BLE001 - the SDK's own errors
            self.not_ok(f"{name}: {type(e).__name__}", "".join(traceback.format_exception(e))[-3000:])

    def job_runs_in_worker(self, task_id: str, what: str) -> None:
        assert self.broker.worker is not None
        rows = db_query(
            self.broker.db,
            "SELECT j.state, w.kind, w.pid FROM jobs j JOIN tasks t ON t.seq = j.task_seq"
            " LEFT JOIN workers w ON w.worker_id = j.lease_owner WHERE t.task_id = ?",
            (task_id,),
        )
        expect(rows == [("running", "process", self.broker.worker.pid)],
               f"{what}: the job runs under a lease of the `taskbroker worker` process (the server has --workers 0)",
               f"jobs: {rows}, worker pid {self.broker.worker.pid}")


async def main(binary: str) -> int:
    broker = Broker(binary)
    headers = Headers()
    run = Run(broker, headers)
    asker = Asker()
    try:
        url = await broker.start_server()
        await broker.start_worker()
        run.ok(f"serve --workers 0 at {url}, worker pid {broker.worker.pid if broker.worker else '?'}")
        async with make_client(url, headers, asker) as client:
            await run.group("discover", lambda: discover(run, client))
            await run.group("task polled to the end", lambda: completed(run, client))
            await run.group("cancel", lambda: cancel(run, client))
            await run.group("input request", lambda: input_request(run, client, asker))
            await run.group("failing tool", lambda: failing(run, client))
            await run.group("headers", lambda: sent_headers(run))
        await run.group("kill -9 and restart", lambda: restart(run, headers, asker))
    except CheckFailed as e:
        run.not_ok(f"start: {e.args[0]}", e.args[1] if len(e.args) > 1 else "")
    except Exception as e:  # noqa: BLE001
        run.not_ok(f"the run could not go on: {type(e).__name__}", "".join(traceback.format_exception(e))[-3000:])
    finally:
        broker.cleanup()
    print(f"{run.passed} passed, {run.failed} failed", flush=True)
    return 0 if run.failed == 0 and run.passed > 0 else 1


async def discover(run: Run, client: Client) -> None:
    expect(client.protocol_version == PROTOCOL_VERSION, "the client negotiated 2026-07-28", str(client.protocol_version))
    expect(client.initialize_result is None, "no initialize (server/discover)", client.initialize_result)
    caps = client.server_capabilities
    extensions = (caps.model_dump(by_alias=True, mode="json", exclude_none=True) if caps else {}).get("extensions", {})
    expect(TASKS_EXTENSION in extensions, "server/discover declares the tasks extension", caps)
    tools = {t.name: t for t in await client.list_tools()}
    expect({"sleep", "approve", "fail"} <= set(tools), "tools/list has sleep, approve, fail", sorted(tools))
    run.ok(f"server/discover: {client.protocol_version}, extensions {sorted(extensions)}; tools/list {len(tools)} tools")


async def completed(run: Run, client: Client) -> None:
    task = await call_tool_task(client, "sleep", {"seconds": 1, "message": "python2"})
    created = task.create_result
    expect(created.result_type == "task" and created.status == "working",
           "tools/call answers a CreateTaskResult, working", created)
    expect(created.ttl_ms is not None and created.poll_interval_ms is not None, "ttlMs and pollIntervalMs", created)
    run.ok(f"call_tool_task(sleep 1 s): task {task.task_id} working, ttlMs {created.ttl_ms},"
           f" pollIntervalMs {created.poll_interval_ms}")
    polls_before = len(run.headers.for_method("tasks/get"))
    status = await task.status()
    expect(status.status in ("working", "completed"), "tasks/get while it runs", status)
    final = await task.wait(timeout=20)
    polls = len(run.headers.for_method("tasks/get")) - polls_before
    expect(final.status == "completed", "the task ends completed", final)
    expect(final.result is not None and final.result.get("content") == [{"type": "text", "text": "python2"}],
           "tasks/get carries the result inline", final)
    result = await task.result()
    expect(not result.is_error and texts(result) == ["python2"], "the handle's result", result)
    run.ok(f"tasks/get polled {polls} times to completed; result {texts(result)}")
    transparent = await client.call_tool("sleep", {"seconds": 1})
    expect(texts(transparent) and "slept" in texts(transparent)[0], "call_tool follows the task to its result",
           transparent)
    run.ok(f"call_tool(sleep) without a handle: the tasks extension followed the task, {texts(transparent)}")


async def cancel(run: Run, client: Client) -> None:
    task = await call_tool_task(client, "sleep", {"seconds": 30})
    await task.wait(state="working", timeout=10)
    await wait_job_running(run, task.task_id)
    run.job_runs_in_worker(task.task_id, "cancel")
    await task.cancel()
    final = await task.wait(timeout=10)
    expect(final.status == "cancelled", "tasks/cancel: the task ends cancelled", final)
    try:
        await task.result()
    except ToolError as e:
        expect("cancelled" in str(e), "result() of a cancelled task raises 'cancelled'", str(e))
    else:
        raise CheckFailed("result() of a cancelled task raises ToolError")
    await asyncio.sleep(1)
    again = await task.status()
    expect(again.status == "cancelled" and again.last_updated_at == final.last_updated_at,
           "still cancelled, unchanged, a second later", again)
    run.ok(f"task {task.task_id} (sleep 30 s) running in the worker: tasks/cancel -> cancelled, stays cancelled")


async def wait_job_running(run: Run, task_id: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        rows = db_query(run.broker.db,
                        "SELECT j.state FROM jobs j JOIN tasks t ON t.seq = j.task_seq WHERE t.task_id = ?",
                        (task_id,))
        if rows and rows[0][0] == "running":
            return
        await asyncio.sleep(0.05)
    raise CheckFailed("the worker did not start the job within 10 s", run.broker.tail("worker"))


async def input_request(run: Run, client: Client, asker: Asker) -> None:
    asker.answer = {"approved": True}
    before = len(asker.questions)
    task = await call_tool_task(client, "approve", {"question": "Ship python2?"})
    parked = await task.wait(state="input_required", timeout=15)
    requests = parked.input_requests or {}
    expect(len(requests) == 1, "tasks/get shows one input request", parked)
    (key, request), = requests.items()
    expect(request.get("method") == "elicitation/create", "the request is elicitation/create", request)
    run.ok(f"approve as a task: input_required, inputRequests {{{key!r}: elicitation/create}}")
    updates_before = len(run.headers.for_method("tasks/update"))
    result = await task.result()
    expect(len(asker.questions) == before + 1 and asker.questions[-1][0] == "Ship python2?",
           "the elicitation handler got the question", asker.questions)
    expect(len(run.headers.for_method("tasks/update")) == updates_before + 1, "one tasks/update sent")
    expect(texts(result) == ["approved"], "the result is 'approved'", result)
    run.ok(f"the handler answered {{approved: true}} through tasks/update; result {texts(result)}")
    asker.answer = ElicitResult(action="decline")
    declined = await client.call_tool("approve", {"question": "Drop python2?"})
    expect(texts(declined) == ["the user declined to answer"], "a decline reaches the tool", declined)
    run.ok(f"call_tool(approve) answered decline by the handler: {texts(declined)}")


async def failing(run: Run, client: Client) -> None:
    task = await call_tool_task(client, "fail", {"message": "python2 asked for it"}, raise_on_error=False)
    final = await task.wait(timeout=15)
    expect(final.status == "completed", "a tool's isError result: the task is completed (2026-07-28)", final)
    expect(final.result is not None and final.result.get("isError") is True, "result.isError is true", final)
    result = await task.result()
    expect(result.is_error and texts(result) == ["python2 asked for it"], "the handle's result is the error", result)
    run.ok(f"fail as a task: completed, result.isError true, {texts(result)}")
    try:
        await client.call_tool("fail", {"message": "again"})
    except ToolError as e:
        expect("again" in str(e), "ToolError carries the message", str(e))
        run.ok(f"call_tool(fail) raises ToolError({str(e)!r})")
    else:
        raise CheckFailed("call_tool(fail) raises ToolError")


async def sent_headers(run: Run) -> None:
    """What the SDK puts on the wire; the broker (default settings) accepts it."""
    calls = run.headers.for_method("tools/call")
    gets = run.headers.for_method("tasks/get")
    expect(bool(calls) and all(h.get("mcp-protocol-version") == PROTOCOL_VERSION for _, h in run.headers.sent),
           "MCP-Protocol-Version on every POST", run.headers.sent[:5])
    expect(all("mcp-name" in h for h in calls), "Mcp-Name on every tools/call", calls[:3])
    missing = sorted({m for m, h in run.headers.sent if m.startswith("tasks/") and "mcp-name" not in h})
    run.ok(f"headers: MCP-Protocol-Version and Mcp-Method on all {len(run.headers.sent)} POSTs, Mcp-Name on"
           f" tools/call; no Mcp-Name on {missing or 'none'} ({len(gets)} tasks/get), accepted by default")


async def restart(run: Run, headers: Headers, asker: Asker) -> None:
    broker = run.broker
    async with make_client(broker.url, headers, asker) as client:
        task = await call_tool_task(client, "sleep", {"seconds": 4, "message": "survived"})
        await wait_job_running(run, task.task_id)
        run.job_runs_in_worker(task.task_id, "restart")
        created = task.create_result
    port = broker.port
    broker.kill_server()
    run.ok(f"task {task.task_id} running in the worker; server SIGKILLed")
    url = await broker.start_server(port)
    expect(broker.port == port, "the server came back on the same port", url)
    assert broker.worker is not None
    expect(broker.worker.poll() is None, "the worker process is still alive")
    async with make_client(url, headers, asker) as client:
        handle = ToolTask(client, "sleep", created)  # the id kept across the restart
        result = await handle.result()
        expect(texts(result) == ["survived"], "the result after the restart", result)
        final = await handle.status()
        expect(final.status == "completed", "completed", final)
    jobs = db_query(broker.db,
                    "SELECT j.state, j.attempt FROM jobs j JOIN tasks t ON t.seq = j.task_seq WHERE t.task_id = ?",
                    (task.task_id,))
    expect(jobs == [("done", 1)], "the job finished in its first attempt, in the worker that never died", jobs)
    run.ok(f"restarted on the same db and port: a new Client's ToolTask(result) got {texts(result)},"
           " job done in attempt 1")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isfile(sys.argv[1]):
        print("usage: client.py path/to/taskbroker", file=sys.stderr)
        sys.exit(2)
    sys.exit(asyncio.run(asyncio.wait_for(main(os.path.abspath(sys.argv[1])), TOTAL_TIMEOUT_S)))
