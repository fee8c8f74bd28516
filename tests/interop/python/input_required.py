#!/usr/bin/env python3
"""Interoperability: tasks that need the user (input_required), driven with
the official Python MCP SDK (mcp==1.30.0) against a broker whose tool runs in
a separate worker process.

Usage:
    python input_required.py path/to/taskbroker

Starts its own processes in a fresh temporary directory:
    taskbroker serve  --workers 0 --db DIR/b.db --listen 127.0.0.1:0
    taskbroker worker --db DIR/b.db --lease 5
and kills them at the end (also on failure).

The demo tool `approve {question}` asks the client through
`elicitation/create`. Run as a task, the task goes `input_required`; the SDK
calls `tasks/result` (`session.experimental.get_task_result`), the broker
sends the elicitation request on that SSE stream, the SDK routes it to the
`elicitation_callback` (mcp/client/session.py, ClientSession._received_request)
and POSTs the callback's answer back to /mcp; the tool, in the worker process,
gets the answer and the task completes.

Checks:
  1. round trip: accept {approved: true} -> "approved"
  2. decline -> "the user declined to answer"; cancel -> "the user did not answer (cancel)"
  3. no elicitation capability (no callback) -> task failed, "could not ask the user"
  4. tasks/cancel while input_required -> cancelled, and stays cancelled
  5. server SIGKILLed and restarted (same db, same port) while the task waits:
     the reconnected client (same Mcp-Session-Id) gets the same request again
     on tasks/result, the answer reaches the tool in the worker that never
     died, the task completes "approved"

MCP traffic goes only through the SDK's public client API
(`streamable_http_client`, `ClientSession(elicitation_callback=...)`,
`session.experimental.*`). To show that the tool ran in the worker process
and what the broker stored, the broker's SQLite file is read (read-only).

Every check prints `ok - ...` or `not ok - ...`; the last line is
`N passed, M failed`; exit status 0 only when M is 0.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import McpError

# mcp 1.30.0 marks `session.experimental` deprecated (tasks are to move to an
# extension in mcp 2.0); the API is what this test exists to exercise.
warnings.filterwarnings("ignore", message="The experimental tasks API is deprecated", category=DeprecationWarning)

PROTOCOL_VERSION = "2025-11-25"
RELATED_TASK = "io.modelcontextprotocol/related-task"
TERMINAL = {"completed", "failed", "cancelled"}
REQUEST_CANCELLED = -32800  # taskbroker README: tasks/result of a cancelled task
TTL_MS = 120_000
REQUEST_TIMEOUT_S = 20
TOTAL_TIMEOUT_S = 60
LEASE_S = 5


class CheckFailed(Exception):
    pass


def show(value: Any) -> str:
    if hasattr(value, "model_dump"):
        value = value.model_dump(by_alias=True, mode="json", exclude_none=True)
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except TypeError:
        return repr(value)


def expect(cond: bool, what: str, details: str = "") -> None:
    if not cond:
        raise CheckFailed(what, details)


def expect_eq(actual: Any, expected: Any, what: str, context: str = "") -> None:
    if actual != expected:
        details = f"expected: {show(expected)}\ngot:      {show(actual)}"
        if context:
            details = f"{context}\n{details}"
        raise CheckFailed(what, details)


def text_blocks(result: types.CallToolResult) -> list[dict[str, Any]]:
    return [c.model_dump(by_alias=True, mode="json", exclude_none=True) for c in result.content]


# ---------------------------------------------------------------- processes


BROKERS: list["Broker"] = []  # stopped on SIGTERM too


class Broker:
    """The server and the worker process, on one database in a temp dir."""

    def __init__(self, binary: str) -> None:
        BROKERS.append(self)
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix="taskbroker-input-required-")
        self.db = os.path.join(self.dir, "b.db")
        self.server: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.url = ""
        self.starts = 0

    def _log(self, name: str) -> Any:
        return open(os.path.join(self.dir, f"{name}.log"), "ab")

    async def start_server(self, port: int = 0, bind_retry_s: float = 5.0) -> str:
        """Starts `serve --workers 0`; with a fixed port, retries the bind briefly."""
        deadline = time.monotonic() + bind_retry_s
        while True:
            self.starts += 1
            out = os.path.join(self.dir, f"server-{self.starts}.out")
            with open(out, "wb") as stdout, self._log("server") as stderr:
                proc = subprocess.Popen(
                    [self.binary, "serve", "--workers", "0", "--db", self.db, "--listen", f"127.0.0.1:{port}"],
                    stdin=subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                )
            self.server = proc
            started = time.monotonic()
            while time.monotonic() - started < 10:
                with open(out, "rb") as f:
                    for line in f.read().decode(errors="replace").splitlines():
                        if line.startswith("taskbroker listening on "):
                            self.url = line[len("taskbroker listening on ") :].strip()
                            self.port = int(self.url.split(":")[2].split("/")[0])
                            return self.url
                if proc.poll() is not None:
                    break
                await anyio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                raise CheckFailed("server did not print its listening line within 10 s", self.tail("server"))
            if port == 0 or time.monotonic() > deadline:
                raise CheckFailed(f"server exited at start (status {proc.returncode})", self.tail("server"))
            await anyio.sleep(0.2)  # the port may still be held: try the bind again

    async def start_worker(self) -> None:
        with self._log("worker") as stderr:
            self.worker = subprocess.Popen(
                [self.binary, "worker", "--db", self.db, "--lease", str(LEASE_S)],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
            )
        # The worker registers itself in the workers table.
        for _ in range(100):
            if self.worker.poll() is not None:
                raise CheckFailed(f"worker exited at start (status {self.worker.returncode})", self.tail("worker"))
            rows = db_query(self.db, "SELECT kind, state FROM workers WHERE pid = ?", (self.worker.pid,))
            if rows:
                return
            await anyio.sleep(0.05)
        raise CheckFailed("worker did not register in the workers table within 5 s", self.tail("worker"))

    def kill_server(self) -> None:
        if self.server and self.server.poll() is None:
            self.server.send_signal(signal.SIGKILL)
            self.server.wait()

    def stop(self) -> None:
        for proc in (self.server, self.worker):
            if proc and proc.poll() is None:
                proc.kill()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:  # pragma: no cover
                    pass

    def tail(self, name: str, lines: int = 25) -> str:
        try:
            with open(os.path.join(self.dir, f"{name}.log"), "rb") as f:
                text = f.read().decode(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"({name} log unreadable)"
        return f"last {len(text)} lines of the {name} log:\n" + "\n".join("  " + t for t in text)

    def cleanup(self) -> None:
        self.stop()
        for name in os.listdir(self.dir):
            try:
                os.unlink(os.path.join(self.dir, name))
            except OSError:
                pass
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


def db_query(db: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read-only look at the broker's database (WAL: readers never block it)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


# ---------------------------------------------------------------- SDK plumbing


class Wire:
    """Every JSON-RPC message between the SDK session and its transport."""

    def __init__(self) -> None:
        self.messages: collections.deque[tuple[str, dict[str, Any] | str]] = collections.deque(maxlen=400)

    def record(self, direction: str, item: Any) -> None:
        if isinstance(item, Exception):
            self.messages.append((direction, f"{type(item).__name__}: {item}"))
        else:
            try:
                self.messages.append(
                    (direction, item.message.model_dump(by_alias=True, mode="json", exclude_none=True))
                )
            except Exception:  # pragma: no cover - diagnostics only
                self.messages.append((direction, repr(item)))

    def dump(self, last: int = 8) -> str:
        lines = []
        for direction, msg in list(self.messages)[-last:]:
            text = msg if isinstance(msg, str) else json.dumps(msg, sort_keys=True)
            lines.append(f"{direction} {text[:600]}{'...(cut)' if len(text) > 600 else ''}")
        return "\n".join(lines) or "(no messages)"

    def sent(self, method: str) -> list[dict[str, Any]]:
        return [m for d, m in self.messages if d == "->" and isinstance(m, dict) and m.get("method") == method]

    def received(self, method: str) -> list[dict[str, Any]]:
        return [m for d, m in self.messages if d == "<-" and isinstance(m, dict) and m.get("method") == method]


async def tap(src: Any, dst: Any, wire: Wire, direction: str) -> None:
    async with src, dst:
        async for item in src:
            wire.record(direction, item)
            await dst.send(item)


class Asker:
    """The elicitation_callback: records every request, answers as told."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[dict[str, Any]] = []
        self.answer: types.ElicitResult | None = types.ElicitResult(action="accept", content={"approved": True})
        self.asked = anyio.Event()

    def expect_answer(self, answer: types.ElicitResult | None) -> None:
        """The next answer; None: record the request and hang without answering."""
        self.answer = answer
        self.asked = anyio.Event()

    async def callback(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        meta = context.meta.model_dump(by_alias=True, mode="json", exclude_none=True) if context.meta else {}
        self.calls.append({"request_id": context.request_id, "params": params, "meta": meta})
        self.asked.set()
        if self.answer is None:
            await anyio.sleep_forever()
        return self.answer


@asynccontextmanager
async def connect(
    url: str,
    wire: Wire,
    *,
    asker: Asker | None = None,
    session_id: str | None = None,
    terminate_on_close: bool = True,
) -> AsyncIterator[tuple[ClientSession, str | None]]:
    """An SDK session. With session_id: no initialize, the existing session's
    id (and the protocol version) go as default headers of the httpx client
    (the SDK's documented way to set headers: pass your own httpx client)."""
    headers = None
    if session_id is not None:
        headers = {"mcp-session-id": session_id, "mcp-protocol-version": PROTOCOL_VERSION}
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http, terminate_on_close=terminate_on_close) as (
            read,
            write,
            get_session_id,
        ):
            async with anyio.create_task_group() as tg:
                to_session, session_read = anyio.create_memory_object_stream(0)
                session_write, from_session = anyio.create_memory_object_stream(0)
                tg.start_soon(tap, read, to_session, wire, "<-")
                tg.start_soon(tap, from_session, write, wire, "->")
                async with ClientSession(
                    session_read,
                    session_write,
                    read_timeout_seconds=timedelta(seconds=REQUEST_TIMEOUT_S),
                    elicitation_callback=asker.callback if asker else None,
                    client_info=types.Implementation(name="taskbroker-interop-input-required", version="1"),
                ) as session:
                    if session_id is None:
                        init = await session.initialize()
                        expect_eq(init.protocolVersion, PROTOCOL_VERSION, "initialize negotiates 2025-11-25")
                        yield session, get_session_id()
                    else:
                        yield session, session_id
                tg.cancel_scope.cancel()


# ---------------------------------------------------------------- the checks


class Run:
    def __init__(self, broker: Broker, wire: Wire) -> None:
        self.broker = broker
        self.wire = wire
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
        print("#   last JSON-RPC messages (-> sent by the SDK, <- received):", flush=True)
        for line in self.wire.dump().splitlines():
            print(f"#     {line}", flush=True)
        for name in ("server", "worker"):
            for line in self.broker.tail(name, 12).splitlines():
                print(f"#   {line}", flush=True)

    async def group(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Runs one group of checks; a failure ends that group only."""
        try:
            try:
                await body()
            except BaseExceptionGroup as group:
                # anyio task groups (the SDK's and ours) wrap what they pass on.
                found = leaves(group)
                if len(found) == 1 and isinstance(found[0], Exception):
                    raise found[0] from group
                raise
        except CheckFailed as e:
            what = e.args[0] if e.args[0].startswith(name) else f"{name}: {e.args[0]}"
            self.not_ok(what, e.args[1] if len(e.args) > 1 else "")
        except McpError as e:
            self.not_ok(
                f"{name}: unexpected JSON-RPC error",
                f"error: code={e.error.code} message={e.error.message!r} data={e.error.data!r}",
            )
        except Exception as e:  # noqa: BLE001 - report anything, go on
            traceback.print_exc(file=sys.stderr)
            self.not_ok(f"{name}: unexpected exception (traceback on stderr)", f"{type(e).__name__}: {e}")


def leaves(e: BaseException) -> list[BaseException]:
    """The innermost exceptions of (nested) exception groups."""
    if isinstance(e, BaseExceptionGroup):
        return [leaf for sub in e.exceptions for leaf in leaves(sub)]
    return [e]


class Checks:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.broker = run.broker
        self.wire = run.wire

    # -- helpers

    def ok(self, what: str) -> None:
        self.run.ok(what)

    async def create(self, s: ClientSession, question: str, what: str) -> types.Task:
        res = await s.experimental.call_tool_as_task("approve", {"question": question}, ttl=TTL_MS)
        expect(isinstance(res, types.CreateTaskResult), f"{what}: tools/call approve with task answers CreateTaskResult")
        expect_eq(res.task.status, "working", f"{what}: the new task starts 'working'", show(res.task))
        return res.task

    async def wait_status(self, s: ClientSession, task_id: str, want: set[str], what: str, limit: float = 10) -> types.GetTaskResult:
        """get_task every 100 ms until the status is in `want`."""
        seen: list[str] = []
        started = time.monotonic()
        while True:
            status = await s.experimental.get_task(task_id)
            if not seen or seen[-1] != status.status:
                seen.append(status.status)
            if status.status in want:
                return status
            expect(
                status.status not in TERMINAL,
                f"{what}: task reached {status.status!r} before {sorted(want)}",
                f"statuses seen: {seen}\nlast tasks/get: {show(status)}",
            )
            expect(
                time.monotonic() - started < limit,
                f"{what}: task not {sorted(want)} within {limit} s",
                f"statuses seen: {seen}",
            )
            await anyio.sleep(0.1)

    def check_runs_in_worker(self, task_id: str, what: str) -> None:
        """The task's job is running under a lease of the worker process."""
        rows = db_query(
            self.broker.db,
            "SELECT j.state, j.attempt, w.kind, w.pid FROM tasks t JOIN jobs j ON j.task_seq = t.seq"
            " LEFT JOIN workers w ON w.worker_id = j.lease_owner WHERE t.task_id = ?",
            (task_id,),
        )
        assert self.broker.worker is not None
        expect_eq(
            rows,
            [("running", 1, "process", self.broker.worker.pid)],
            f"{what}: the job runs (attempt 1) under a lease of the `taskbroker worker` process"
            f" (pid {self.broker.worker.pid}); the server has --workers 0",
            "db: SELECT j.state, j.attempt, w.kind, w.pid FROM jobs j JOIN workers w ON w.worker_id = j.lease_owner",
        )

    def pending_requests(self, task_id: str) -> list[tuple[str, str, str]]:
        return db_query(
            self.broker.db,
            "SELECT request_id, method, state FROM task_messages WHERE task_id = ? ORDER BY id",
            (task_id,),
        )

    def history(self, task_id: str) -> list[str]:
        rows = db_query(self.broker.db, "SELECT to_status FROM task_events WHERE task_id = ? ORDER BY id", (task_id,))
        out: list[str] = []
        for (status,) in rows:
            if not out or out[-1] != status:
                out.append(status)
        return out

    def check_elicitation(self, call: dict[str, Any], question: str, task_id: str, what: str) -> None:
        params = call["params"]
        expect(
            isinstance(params, types.ElicitRequestFormParams),
            f"{what}: the SDK parsed the request as form-mode elicitation",
            f"params: {show(params)} ({type(params).__name__})",
        )
        expect_eq(params.mode, "form", f"{what}: elicitation mode is 'form'")
        expect_eq(params.message, question, f"{what}: the elicitation message is the question")
        schema = params.requestedSchema
        expect_eq(schema.get("type"), "object", f"{what}: requestedSchema is an object schema", show(schema))
        expect_eq(
            (schema.get("properties") or {}).get("approved", {}).get("type"),
            "boolean",
            f"{what}: requestedSchema has property 'approved' of type boolean",
            show(schema),
        )
        expect_eq(schema.get("required"), ["approved"], f"{what}: requestedSchema requires 'approved'", show(schema))
        expect_eq(
            call["meta"].get(RELATED_TASK),
            {"taskId": task_id},
            f"{what}: the request's _meta[{RELATED_TASK!r}] names the task (RequestContext.meta in the callback)",
            f"meta: {show(call['meta'])}",
        )

    async def answered_round(
        self, s: ClientSession, asker: Asker, answer: types.ElicitResult, question: str, text: str,
        structured: dict[str, Any], what: str,
    ) -> None:
        task = await self.create(s, question, what)
        status = await self.wait_status(s, task.taskId, {"input_required"}, what)
        self.check_runs_in_worker(task.taskId, what)
        pending = self.pending_requests(task.taskId)
        expect(
            len(pending) == 1 and pending[0][1:] == ("elicitation/create", "pending"),
            f"{what}: the broker stored one pending elicitation/create request",
            f"task_messages: {pending}",
        )
        self.ok(
            f"{what}: task {task.taskId} went input_required ({status.statusMessage!r}) with its job running"
            f" in the worker process (pid {self.broker.worker.pid if self.broker.worker else '?'})"
        )
        asker.expect_answer(answer)
        before = len(asker.calls)
        result = await s.experimental.get_task_result(task.taskId, types.CallToolResult)
        calls = asker.calls[before:]
        expect_eq(len(calls), 1, f"{what}: the elicitation_callback ran once during tasks/result")
        self.check_elicitation(calls[0], question, task.taskId, what)
        expect_eq(
            str(calls[0]["request_id"]),
            pending[0][0],
            f"{what}: the request id the callback saw is the one the broker stored",
        )
        self.ok(
            f"{what}: get_task_result delivered elicitation/create (id {calls[0]['request_id']!r}) to the callback:"
            " message = question, requestedSchema {approved: boolean}, _meta related-task = the task;"
            f" answered {answer.action}"
        )
        expect_eq(text_blocks(result), [{"type": "text", "text": text}], f"{what}: result text")
        expect_eq(result.structuredContent, structured, f"{what}: result structuredContent")
        expect_eq(result.isError, False, f"{what}: result isError false")
        expect_eq(
            (result.meta or {}).get(RELATED_TASK),
            {"taskId": task.taskId},
            f"{what}: tasks/result carries _meta related-task",
            show(result.meta),
        )
        final = await s.experimental.get_task(task.taskId)
        expect_eq(final.status, "completed", f"{what}: task completed", show(final))
        expect_eq(
            self.history(task.taskId),
            ["working", "input_required", "working", "completed"],
            f"{what}: status history (task_events) working -> input_required -> working -> completed",
        )
        stored = self.pending_requests(task.taskId)
        expect_eq(
            [(r, st) for r, _, st in stored],
            [(pending[0][0], "answered")],
            f"{what}: the stored request is answered",
        )
        attempts = db_query(
            self.broker.db,
            "SELECT j.state, j.attempt FROM jobs j JOIN tasks t ON t.seq = j.task_seq WHERE t.task_id = ?",
            (task.taskId,),
        )
        expect_eq(attempts, [("done", 1)], f"{what}: the job is done after one attempt")
        self.ok(
            f"{what}: result {text!r}, structuredContent {json.dumps(structured)}, task completed;"
            " history working -> input_required -> working -> completed, one attempt"
        )

    # -- 1 and 2: one session that declares elicitation

    async def with_elicitation(self) -> None:
        asker = Asker("main")
        async with connect(self.broker.url, self.wire, asker=asker) as (s, sid):
            init = self.wire.sent("initialize")[-1]
            caps = init["params"]["capabilities"]
            expect("form" in (caps.get("elicitation") or {}), "the SDK declares elicitation.form", show(caps))
            self.ok(f"session {sid}: the SDK declared capabilities.elicitation {json.dumps(caps['elicitation'])}")
            tools = await s.list_tools()
            approve = next((t for t in tools.tools if t.name == "approve"), None)
            expect(approve is not None, "tools/list has approve", show([t.name for t in tools.tools]))
            assert approve is not None
            expect_eq(
                approve.execution.taskSupport if approve.execution else None,
                "optional",
                "approve has taskSupport optional",
            )
            self.ok("tools/list: approve, taskSupport optional")

            await self.run.group(
                "accept",
                lambda: self.answered_round(
                    s, asker, types.ElicitResult(action="accept", content={"approved": True}),
                    "Deploy build 4711 to production?", "approved", {"action": "accept", "approved": True},
                    "accept",
                ),
            )
            await self.run.group(
                "decline",
                lambda: self.answered_round(
                    s, asker, types.ElicitResult(action="decline"), "Delete the staging database?",
                    "the user declined to answer", {"action": "decline", "approved": False}, "decline",
                ),
            )
            await self.run.group(
                "cancel action",
                lambda: self.answered_round(
                    s, asker, types.ElicitResult(action="cancel"), "Rotate the signing keys?",
                    "the user did not answer (cancel)", {"action": "cancel", "approved": False}, "cancel action",
                ),
            )
            await self.run.group("tasks/cancel while input_required", lambda: self.cancel_waiting(s, asker))

    # -- 5 (run inside the session above)

    async def cancel_waiting(self, s: ClientSession, asker: Asker) -> None:
        what = "tasks/cancel while input_required"
        task = await self.create(s, "Shut down the cluster?", what)
        await self.wait_status(s, task.taskId, {"input_required"}, what)
        self.check_runs_in_worker(task.taskId, what)
        res = await s.experimental.cancel_task(task.taskId)
        expect_eq(res.taskId, task.taskId, f"{what}: CancelTaskResult names the task")
        expect_eq(res.status, "cancelled", f"{what}: CancelTaskResult status is cancelled", show(res))
        self.ok(f"{what}: cancel_task answers status cancelled ({res.statusMessage!r})")
        await anyio.sleep(1.5)  # the worker notices and drops the tool; the status must not move
        again = await s.experimental.get_task(task.taskId)
        expect_eq(again.status, "cancelled", f"{what}: still cancelled 1.5 s later", show(again))
        expect_eq(again.lastUpdatedAt, res.lastUpdatedAt, f"{what}: the cancelled task does not change")
        jobs = db_query(
            self.broker.db,
            "SELECT j.state, j.attempt FROM jobs j JOIN tasks t ON t.seq = j.task_seq WHERE t.task_id = ?",
            (task.taskId,),
        )
        expect_eq(jobs, [("done", 1)], f"{what}: the worker closed the job without retrying it")
        self.ok(f"{what}: get_task 1.5 s later still cancelled, unchanged; job done after one attempt")
        asker.expect_answer(types.ElicitResult(action="accept", content={"approved": True}))
        before = len(asker.calls)
        try:
            result = await s.experimental.get_task_result(task.taskId, types.CallToolResult)
        except McpError as e:
            expect_eq(
                e.error.code,
                REQUEST_CANCELLED,
                f"{what}: tasks/result of the cancelled task answers -32800",
                f"message={e.error.message!r} data={e.error.data!r}",
            )
        else:
            raise CheckFailed(f"{what}: tasks/result of the cancelled task answers an error", show(result))
        expect_eq(asker.calls[before:], [], f"{what}: no elicitation request is delivered for a cancelled task")
        final = await s.experimental.get_task(task.taskId)
        expect_eq(final.status, "cancelled", f"{what}: still cancelled after tasks/result")
        self.ok(f"{what}: get_task_result answers -32800, no elicitation delivered, task stays cancelled")

    # -- 3: a client without the elicitation capability

    async def without_elicitation(self) -> None:
        what = "no elicitation capability"
        async with connect(self.broker.url, self.wire) as (s, sid):
            caps = self.wire.sent("initialize")[-1]["params"]["capabilities"]
            expect("elicitation" not in caps, f"{what}: the SDK declares no elicitation without a callback", show(caps))
            task = await self.create(s, "Anyone there?", what)
            final = await self.wait_status(s, task.taskId, TERMINAL, what)
            expect_eq(final.status, "failed", f"{what}: the task ends failed", show(final))
            self.ok(f"{what}: session {sid} (capabilities {json.dumps(caps)}): approve as a task ends failed"
                    f" ({final.statusMessage!r})")
            result = await s.experimental.get_task_result(task.taskId, types.CallToolResult)
            expect_eq(result.isError, True, f"{what}: the result has isError true", show(result))
            texts = [b.get("text", "") for b in text_blocks(result)]
            expect(
                len(texts) == 1 and "could not ask the user" in texts[0],
                f"{what}: the result text says 'could not ask the user'",
                show(result),
            )
            self.ok(f"{what}: get_task_result isError true, {texts[0]!r}")

    # -- 4: server killed and restarted while the task waits for the user

    async def restart(self) -> None:
        what = "restart while input_required"
        question = "Approve after the restart?"
        first = Asker("before restart")
        first.expect_answer(None)  # record the request, never answer
        async with connect(self.broker.url, self.wire, asker=first, terminate_on_close=False) as (s, sid):
            expect(bool(sid), f"{what}: the SDK transport has the session id", repr(sid))
            assert sid is not None
            task = await self.create(s, question, what)
            await self.wait_status(s, task.taskId, {"input_required"}, what)
            self.check_runs_in_worker(task.taskId, what)
            pending = self.pending_requests(task.taskId)
            expect(len(pending) == 1, f"{what}: one stored pending request", f"task_messages: {pending}")
            errors: list[BaseException] = []

            async def result_call() -> None:
                try:
                    await s.experimental.get_task_result(task.taskId, types.CallToolResult)
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

            async with anyio.create_task_group() as tg:
                tg.start_soon(result_call)
                with anyio.move_on_after(10):
                    await first.asked.wait()
                expect_eq(len(first.calls), 1, f"{what}: the first tasks/result delivered the request", str(errors))
                self.check_elicitation(first.calls[0], question, task.taskId, what)
                first_id = first.calls[0]["request_id"]
                expect_eq(str(first_id), pending[0][0], f"{what}: callback request id = stored request id")
                self.ok(f"{what}: task {task.taskId} input_required, request {first_id!r} seen by the callback,"
                        " left unanswered")
                old_port = self.broker.port
                self.broker.kill_server()
                tg.cancel_scope.cancel()
        # The first connection is gone (no DELETE: terminate_on_close=False).
        expect_eq(
            self.pending_requests(task.taskId),
            [(pending[0][0], "elicitation/create", "pending")],
            f"{what}: the request is still pending in the database after the SIGKILL",
        )
        assert self.broker.worker is not None
        expect(self.broker.worker.poll() is None, f"{what}: the worker process is still alive")
        url = await self.broker.start_server(port=old_port or 0)
        expect_eq(self.broker.port, old_port, f"{what}: the server came back on the same port")
        self.ok(f"{what}: server SIGKILLed and restarted on the same db and port ({url})")

        second = Asker("after restart")
        second.expect_answer(types.ElicitResult(action="accept", content={"approved": True}))
        async with connect(url, self.wire, asker=second, session_id=sid) as (s, _):
            status = await s.experimental.get_task(task.taskId)
            expect_eq(
                status.status,
                "input_required",
                f"{what}: the old session id (sent as mcp-session-id by the SDK's httpx client) sees the task,"
                " still input_required",
                show(status),
            )
            self.check_runs_in_worker(task.taskId, what)
            self.ok(f"{what}: reconnected with session {sid} (no initialize): get_task input_required,"
                    f" job still leased to worker pid {self.broker.worker.pid}")
            result = await s.experimental.get_task_result(task.taskId, types.CallToolResult)
            expect_eq(len(second.calls), 1, f"{what}: tasks/result after the restart delivered the request again")
            self.check_elicitation(second.calls[0], question, task.taskId, what + " (after restart)")
            expect_eq(
                second.calls[0]["request_id"],
                first_id,
                f"{what}: the request delivered after the restart has the same JSON-RPC id",
            )
            self.ok(f"{what}: get_task_result after the restart delivered the same request (id {first_id!r});"
                    " the callback answered accept {approved: true}")
            expect_eq(text_blocks(result), [{"type": "text", "text": "approved"}], f"{what}: result text")
            expect_eq(result.structuredContent, {"action": "accept", "approved": True}, f"{what}: structuredContent")
            expect_eq(result.isError, False, f"{what}: isError false")
            final = await s.experimental.get_task(task.taskId)
            expect_eq(final.status, "completed", f"{what}: task completed", show(final))
        expect(self.broker.worker.poll() is None, f"{what}: the worker process never died")
        jobs = db_query(
            self.broker.db,
            "SELECT j.state, j.attempt FROM jobs j JOIN tasks t ON t.seq = j.task_seq WHERE t.task_id = ?",
            (task.taskId,),
        )
        expect_eq(jobs, [("done", 1)], f"{what}: the job finished in its first attempt (the answer reached"
                  " the same tool run)")
        expect_eq(
            self.history(task.taskId),
            ["working", "input_required", "working", "completed"],
            f"{what}: status history working -> input_required -> working -> completed",
        )
        self.ok(f"{what}: result 'approved', task completed in attempt 1 of the worker that never died")


async def main(binary: str) -> int:
    broker = Broker(binary)
    wire = Wire()
    run = Run(broker, wire)
    checks = Checks(run)
    try:
        with anyio.fail_after(TOTAL_TIMEOUT_S):
            try:
                url = await broker.start_server()
                await broker.start_worker()
            except CheckFailed as e:
                run.not_ok(f"start: {e.args[0]}", e.args[1] if len(e.args) > 1 else "")
            else:
                run.ok(f"serve --workers 0 at {url}, worker pid {broker.worker.pid if broker.worker else '?'}"
                       f" (--lease {LEASE_S}) on {broker.db}")
                await run.group("elicitation session", checks.with_elicitation)
                await run.group("no elicitation capability", checks.without_elicitation)
                await run.group("restart while input_required", checks.restart)
    except BaseException as e:  # noqa: BLE001 - transport crash, timeout, Ctrl-C
        if isinstance(e, KeyboardInterrupt):
            raise
        traceback.print_exception(e, file=sys.stderr)
        msg = f"the whole run took longer than {TOTAL_TIMEOUT_S} s" if isinstance(e, TimeoutError) else repr(e)
        run.not_ok("the run could not go on (traceback on stderr)", msg)
    finally:
        broker.cleanup()
    print(f"{run.passed} passed, {run.failed} failed", flush=True)
    return 0 if run.failed == 0 and run.passed > 0 else 1


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isfile(sys.argv[1]):
        print("usage: input_required.py path/to/taskbroker", file=sys.stderr)
        sys.exit(2)

    def on_sigterm(signum: int, frame: Any) -> None:
        for broker in BROKERS:
            broker.cleanup()
        os._exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        sys.exit(anyio.run(main, os.path.abspath(sys.argv[1])))
    except KeyboardInterrupt:
        sys.exit(130)
