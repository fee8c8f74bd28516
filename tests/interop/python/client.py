#!/usr/bin/env python3
"""Interoperability client: drives a running taskbroker with the official
Python MCP SDK (mcp==1.30.0, the last release with MCP 2025-11-25 tasks).

Usage:
    python client.py http://127.0.0.1:PORT/mcp      (or set TASKBROKER_URL)

Every check prints `ok - ...` or `not ok - ...` (with the request and the
response that disagreed, and what the spec / the SDK expects). The last line is
`N passed, M failed`; the exit status is 0 only when M is 0.

Only the SDK's public client API is used for the MCP traffic:
`mcp.client.streamable_http.streamable_http_client`, `mcp.ClientSession` and
`session.experimental.{call_tool_as_task, get_task, poll_task,
get_task_result, list_tasks, cancel_task}` (mcp/client/experimental/tasks.py).
The raw JSON-RPC messages are tapped between the transport and the session
only to print them when a check fails.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
import traceback
import uuid
import warnings
from datetime import datetime, timedelta, timezone
from typing import Any, Awaitable, Callable

import anyio
import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError

# mcp 1.30.0 marks `session.experimental` deprecated (tasks are to move to an
# extension in mcp 2.0); the API is what this client exists to exercise.
warnings.filterwarnings(
    "ignore",
    message="The experimental tasks API is deprecated",
    category=DeprecationWarning,
)

PROTOCOL_VERSION = "2025-11-25"
RELATED_TASK = "io.modelcontextprotocol/related-task"
VALID_STATUSES = {"working", "input_required", "completed", "failed", "cancelled"}
TERMINAL = {"completed", "failed", "cancelled"}
# Spec 2025-11-25, basic/utilities/tasks "Task Status Lifecycle".
ALLOWED_NEXT = {
    "working": {"working", "input_required", "completed", "failed", "cancelled"},
    "input_required": {"input_required", "working", "completed", "failed", "cancelled"},
}
INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601
REQUEST_CANCELLED = -32800  # taskbroker: tasks/result of a cancelled task

REQUEST_TIMEOUT_S = 30  # any single request (tasks/result included)
TOTAL_TIMEOUT_S = 240  # the whole run
TTL_MS = 120_000


class CheckFailed(Exception):
    pass


class Wire:
    """Keeps the last JSON-RPC messages seen between session and transport."""

    def __init__(self, keep: int = 12) -> None:
        self.log: collections.deque[str] = collections.deque(maxlen=keep)

    def record(self, direction: str, item: Any) -> None:
        if isinstance(item, Exception):
            text = f"{type(item).__name__}: {item}"
        else:
            try:
                text = json.dumps(
                    item.message.model_dump(by_alias=True, mode="json", exclude_none=True),
                    sort_keys=True,
                )
            except Exception:  # pragma: no cover - diagnostics only
                text = repr(item)
        if len(text) > 700:
            text = text[:700] + "...(cut)"
        self.log.append(f"{direction} {text}")

    def dump(self, last: int = 6) -> str:
        lines = list(self.log)[-last:]
        return "\n".join("    " + line for line in lines) or "    (no messages)"


class Run:
    def __init__(self, wire: Wire) -> None:
        self.passed = 0
        self.failed = 0
        self.wire = wire

    def ok(self, what: str) -> None:
        self.passed += 1
        print(f"ok - {what}", flush=True)

    def not_ok(self, what: str, details: str) -> None:
        self.failed += 1
        print(f"not ok - {what}", flush=True)
        for line in details.rstrip().splitlines():
            print(f"#   {line}", flush=True)
        print("#   last JSON-RPC messages (-> sent, <- received):", flush=True)
        for line in self.wire.dump().splitlines():
            print(f"#   {line}", flush=True)

    async def group(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Runs one group of checks; a failure ends that group only."""
        try:
            await body()
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


# ---------------------------------------------------------------- assertions


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


async def expect_error(
    call: Awaitable[Any], code: int, what: str, request: str, why: str
) -> types.ErrorData:
    try:
        result = await call
    except McpError as e:
        if e.error.code != code:
            raise CheckFailed(
                what,
                f"request: {request}\nexpected JSON-RPC error {code} ({why})\n"
                f"got error: code={e.error.code} message={e.error.message!r} data={e.error.data!r}",
            )
        return e.error
    raise CheckFailed(
        what,
        f"request: {request}\nexpected JSON-RPC error {code} ({why})\ngot result: {show(result)}",
    )


def text_blocks(result: types.CallToolResult) -> list[dict[str, Any]]:
    return [c.model_dump(by_alias=True, mode="json", exclude_none=True) for c in result.content]


def check_task_shape(task: types.Task, what: str, *, now: datetime | None = None) -> None:
    """Fields every Task must carry (spec: Data Types / TTL and Resource Management)."""
    expect(isinstance(task.taskId, str) and task.taskId != "", f"{what}: taskId is a non-empty string", show(task))
    expect(task.status in VALID_STATUSES, f"{what}: status {task.status!r} is a valid status", show(task))
    for field in ("createdAt", "lastUpdatedAt"):
        value = getattr(task, field)
        expect(
            isinstance(value, datetime) and value.tzinfo is not None,
            f"{what}: {field} is an ISO 8601 timestamp with a UTC offset",
            show(task),
        )
    expect(task.lastUpdatedAt >= task.createdAt, f"{what}: lastUpdatedAt >= createdAt", show(task))
    if now is not None:
        skew = abs((task.createdAt - now).total_seconds())
        expect(skew < 60, f"{what}: createdAt is within 60 s of the client clock ({skew:.1f} s)", show(task))
    expect(
        task.ttl is None or (isinstance(task.ttl, int) and task.ttl > 0),
        f"{what}: ttl is a positive integer or null",
        show(task),
    )
    expect(
        task.pollInterval is None or (isinstance(task.pollInterval, int) and task.pollInterval > 0),
        f"{what}: pollInterval, when present, is a positive integer",
        show(task),
    )


def check_related_task(result: types.Result, task_id: str, what: str) -> None:
    meta = result.meta or {}
    expect_eq(
        meta.get(RELATED_TASK),
        {"taskId": task_id},
        f"{what}: tasks/result carries _meta[{RELATED_TASK!r}] = {{taskId}}"
        " (spec: 'The tasks/result operation MUST include this metadata in its response')",
        f"request: tasks/result {{taskId: {task_id}}}\nresult _meta: {show(meta)}",
    )


def check_no_related_task(result: types.Result, what: str) -> None:
    meta = result.meta or {}
    expect(
        RELATED_TASK not in meta,
        f"{what}: no related-task _meta (spec: for tasks/get, tasks/list and tasks/cancel receivers"
        " SHOULD NOT include it, the taskId is in the result)",
        f"result _meta: {show(meta)}",
    )


async def poll_to_end(
    session: ClientSession, created: types.Task, what: str
) -> tuple[types.GetTaskResult, list[tuple[float, types.GetTaskResult]]]:
    """poll_task until terminal, checking every status seen and the SDK's pacing."""
    seen: list[tuple[float, types.GetTaskResult]] = []
    previous = created.status
    async for status in session.experimental.poll_task(created.taskId):
        seen.append((time.monotonic(), status))
        check_task_shape(status, f"{what}: tasks/get #{len(seen)}")
        check_no_related_task(status, f"{what}: tasks/get #{len(seen)}")
        expect_eq(status.taskId, created.taskId, f"{what}: tasks/get answers for the task asked about")
        expect_eq(status.createdAt, created.createdAt, f"{what}: createdAt never changes")
        expect_eq(status.ttl, created.ttl, f"{what}: ttl never changes")
        expect(
            status.status in ALLOWED_NEXT.get(previous, set()),
            f"{what}: transition {previous} -> {status.status} is allowed by the lifecycle",
            f"statuses seen: {[s.status for _, s in seen]}",
        )
        previous = status.status
        if len(seen) > 200:
            raise CheckFailed(f"{what}: task never reached a terminal status", show(status))
    expect(len(seen) > 0, f"{what}: poll_task yielded at least one status")
    final = seen[-1][1]
    expect(final.status in TERMINAL, f"{what}: poll_task stopped on a terminal status", show(final))
    for earlier in seen[:-1]:
        expect(earlier[1].status not in TERMINAL, f"{what}: only the last status polled is terminal")
    for (t0, s0), (t1, s1) in zip(seen, seen[1:]):
        expect(s1.lastUpdatedAt >= s0.lastUpdatedAt, f"{what}: lastUpdatedAt never goes back")
        interval = (s0.pollInterval if s0.pollInterval is not None else 500) / 1000
        gap = t1 - t0
        expect(
            gap >= interval * 0.95,
            f"{what}: poll_task waited pollInterval between polls ({gap:.3f} s >= {interval:.3f} s)",
        )
        expect(
            gap <= interval + 5.0,
            f"{what}: poll_task polled again within pollInterval + 5 s ({gap:.3f} s)",
        )
    return final, seen


# ---------------------------------------------------------------- the checks


class Checks:
    def __init__(self, session: ClientSession, run: Run, url: str) -> None:
        self.s = session
        self.run = run
        self.url = url
        self.created: list[str] = []
        self.init: types.InitializeResult | None = None

    async def create(self, tool: str, args: dict[str, Any], what: str, ttl: int = TTL_MS) -> types.Task:
        now = datetime.now(timezone.utc)
        res = await self.s.experimental.call_tool_as_task(tool, args, ttl=ttl)
        expect(isinstance(res, types.CreateTaskResult), f"{what}: tools/call with task answers CreateTaskResult")
        task = res.task
        check_task_shape(task, f"{what}: CreateTaskResult.task", now=now)
        expect_eq(
            task.status,
            "working",
            f"{what}: a new task starts 'working' (spec: Tasks MUST begin in the working status)",
            f"request: tools/call {tool} {show(args)} task.ttl={ttl}",
        )
        expect_eq(task.ttl, ttl, f"{what}: the task carries the requested ttl", show(task))
        self.created.append(task.taskId)
        return task

    # -- initialize / tools/list
    async def handshake(self) -> None:
        init = self.init
        assert init is not None
        expect_eq(init.protocolVersion, PROTOCOL_VERSION, "initialize negotiates the tasks protocol version")
        tasks_cap = init.capabilities.tasks
        expect(tasks_cap is not None, "server declares capabilities.tasks", show(init.capabilities))
        assert tasks_cap is not None
        expect(tasks_cap.list is not None, "server declares tasks.list", show(tasks_cap))
        expect(tasks_cap.cancel is not None, "server declares tasks.cancel", show(tasks_cap))
        expect(
            tasks_cap.requests is not None
            and tasks_cap.requests.tools is not None
            and tasks_cap.requests.tools.call is not None,
            "server declares tasks.requests.tools.call",
            show(tasks_cap),
        )
        self.run.ok(
            f"initialize: protocolVersion {init.protocolVersion}, capabilities tasks.list, tasks.cancel,"
            " tasks.requests.tools.call"
        )
        tools = await self.s.list_tools()
        support = {t.name: (t.execution.taskSupport if t.execution else None) for t in tools.tools}
        expected = {"echo": "forbidden", "sleep": "optional", "sleep_as_task": "required", "fail": "optional"}
        for name, mode in expected.items():
            expect_eq(support.get(name, "<missing>"), mode, f"tools/list: {name} has execution.taskSupport {mode}")
        self.run.ok("tools/list: echo forbidden, sleep optional, sleep_as_task required, fail optional")

    # -- sleep as a task, polled, then its result
    async def sleep_task(self) -> None:
        task = await self.create("sleep", {"seconds": 2, "message": "interop hello"}, "sleep task")
        self.run.ok(f"call_tool_as_task sleep(2 s, ttl {TTL_MS}): task {task.taskId} working, ttl {task.ttl}")
        started = time.monotonic()
        final, seen = await poll_to_end(self.s, task, "sleep task")
        statuses = [s.status for _, s in seen]
        expect_eq(seen[0][1].status, "working", "sleep task: first poll (well before 2 s) sees 'working'")
        expect_eq(final.status, "completed", "sleep task: ends 'completed'", f"statuses seen: {statuses}")
        expect(
            time.monotonic() - started >= 1.5,
            "sleep task: did not complete before its 2 s sleep could have run",
        )
        self.run.ok(
            f"poll_task sleep: {len(seen)} polls {statuses}, each status valid, gaps honour pollInterval"
            f" {task.pollInterval} ms"
        )
        result = await self.s.experimental.get_task_result(task.taskId, types.CallToolResult)
        expect_eq(
            text_blocks(result),
            [{"type": "text", "text": "interop hello"}],
            "sleep task: tasks/result content is the tool's text",
        )
        expect_eq(result.isError, False, "sleep task: tasks/result isError is false")
        self.run.ok("get_task_result sleep: CallToolResult text 'interop hello', isError false")
        check_related_task(result, task.taskId, "sleep task")
        self.run.ok("get_task_result sleep: _meta related-task names the task")
        again = await self.s.experimental.get_task(task.taskId)
        expect_eq(again.status, "completed", "sleep task: stays 'completed' after its result was fetched")
        expect_eq(again.lastUpdatedAt, final.lastUpdatedAt, "sleep task: a terminal task does not change")
        self.run.ok("get_task after the result: still completed, unchanged")

    # -- tasks/result blocks until the task ends
    async def blocking_result(self) -> None:
        task = await self.create("sleep", {"seconds": 1.5}, "blocking result")
        started = time.monotonic()
        result = await self.s.experimental.get_task_result(task.taskId, types.CallToolResult)
        waited = time.monotonic() - started
        expect(
            waited >= 1.0,
            f"blocking result: tasks/result on a working task blocks until it ends (returned after {waited:.2f} s)",
        )
        expect_eq(text_blocks(result), [{"type": "text", "text": "slept 1.5 s"}], "blocking result: text")
        expect_eq(result.isError, False, "blocking result: isError is false")
        check_related_task(result, task.taskId, "blocking result")
        status = await self.s.experimental.get_task(task.taskId)
        expect_eq(status.status, "completed", "blocking result: task is completed once tasks/result answered")
        self.run.ok(f"get_task_result on a working task blocks ({waited:.1f} s) and returns 'slept 1.5 s'")

    # -- tasks/list
    async def listing(self) -> None:
        mine = []
        for i in range(3):
            mine.append(await self.create("sleep", {"seconds": 0, "message": f"list {i}"}, f"list task {i}"))
        finals = {}
        for t in mine:
            final, _ = await poll_to_end(self.s, t, f"list task {t.taskId}")
            expect_eq(final.status, "completed", f"list task {t.taskId}: completed")
            finals[t.taskId] = final
        listed: dict[str, types.Task] = {}
        pages = 0
        cursor: str | None = None
        cursors_seen: set[str] = set()
        while True:
            page = await self.s.experimental.list_tasks(cursor=cursor)
            pages += 1
            check_no_related_task(page, f"tasks/list page {pages}")
            for t in page.tasks:
                check_task_shape(t, f"tasks/list page {pages}: task {t.taskId}")
                expect(t.taskId not in listed, f"tasks/list: task {t.taskId} appears only once across pages")
                listed[t.taskId] = t
            if not page.nextCursor:
                break
            expect(page.nextCursor not in cursors_seen, "tasks/list: nextCursor never repeats", page.nextCursor)
            cursors_seen.add(page.nextCursor)
            expect(pages < 1000, "tasks/list: paging ends")
            cursor = page.nextCursor
        missing = [tid for tid in self.created if tid not in listed]
        expect(
            not missing,
            f"tasks/list contains every task this session created ({len(self.created)})",
            f"missing: {missing}\nlisted: {sorted(listed)}",
        )
        for tid, final in finals.items():
            got = listed[tid].model_dump(by_alias=True, mode="json")
            want = types.Task.model_validate(final.model_dump(by_alias=True)).model_dump(by_alias=True, mode="json")
            got.pop("_meta", None)
            want.pop("_meta", None)
            expect_eq(got, want, f"tasks/list entry of terminal task {tid} equals its tasks/get")
        self.run.ok(
            f"list_tasks: {len(listed)} tasks in {pages} page(s), all {len(self.created)} created tasks present,"
            " entries equal tasks/get"
        )
        await expect_error(
            self.s.experimental.list_tasks(cursor="not-a-cursor"),
            INVALID_PARAMS,
            "tasks/list with a bad cursor is rejected",
            'tasks/list {cursor: "not-a-cursor"}',
            "spec: invalid or nonexistent cursor in tasks/list -> -32602",
        )
        self.run.ok("list_tasks with an invalid cursor: error -32602")

    # -- cancel a long sleep
    async def cancel(self) -> None:
        task = await self.create("sleep", {"seconds": 60}, "cancel")
        status = await self.s.experimental.get_task(task.taskId)
        expect_eq(status.status, "working", "cancel: the 60 s sleep is working before the cancel")
        res = await self.s.experimental.cancel_task(task.taskId)
        check_task_shape(res, "cancel: CancelTaskResult")
        check_no_related_task(res, "cancel: CancelTaskResult")
        expect_eq(res.taskId, task.taskId, "cancel: CancelTaskResult names the task")
        expect_eq(
            res.status,
            "cancelled",
            "cancel: CancelTaskResult status is 'cancelled' (spec: MUST transition before sending the response)",
        )
        expect_eq(res.createdAt, task.createdAt, "cancel: createdAt unchanged")
        self.run.ok(f"cancel_task on a 60 s sleep: status cancelled ({res.statusMessage!r})")
        await anyio.sleep(1.5)  # let the worker notice; the status must not move
        status = await self.s.experimental.get_task(task.taskId)
        expect_eq(status.status, "cancelled", "cancel: get_task still 'cancelled' 1.5 s later")
        expect_eq(status.lastUpdatedAt, res.lastUpdatedAt, "cancel: the cancelled task does not change afterwards")
        self.run.ok("get_task after cancel: still cancelled, unchanged")
        err = await expect_error(
            self.s.experimental.get_task_result(task.taskId, types.CallToolResult),
            REQUEST_CANCELLED,
            "cancel: tasks/result of a cancelled task fails",
            f"tasks/result {{taskId: {task.taskId}}}",
            "taskbroker README: cancelled tasks have no result",
        )
        expect(
            isinstance(err.data, dict) and err.data.get("taskId") == task.taskId and err.data.get("status") == "cancelled",
            "cancel: the -32800 error's data is {taskId, status: cancelled}",
            f"data: {err.data!r}",
        )
        self.run.ok(f"get_task_result of the cancelled task: error -32800 ({err.message!r})")
        await expect_error(
            self.s.experimental.cancel_task(task.taskId),
            INVALID_PARAMS,
            "cancel: cancelling a terminal task is rejected",
            f"tasks/cancel {{taskId: {task.taskId}}} (already cancelled)",
            "spec: MUST reject cancellation of a terminal task with -32602",
        )
        self.run.ok("cancel_task on the already cancelled task: error -32602")

    # -- fail as a task
    async def fail_task(self) -> None:
        task = await self.create("fail", {"message": "interop boom"}, "fail task")
        final, seen = await poll_to_end(self.s, task, "fail task")
        expect_eq(final.status, "failed", "fail task: ends 'failed'", f"statuses: {[s.status for _, s in seen]}")
        expect(
            bool(final.statusMessage) and "interop boom" in (final.statusMessage or ""),
            "fail task: statusMessage gives the diagnostic (spec: tasks/get SHOULD include a statusMessage)",
            show(final),
        )
        self.run.ok(f"fail as a task: ends failed, statusMessage {final.statusMessage!r}")
        result = await self.s.experimental.get_task_result(task.taskId, types.CallToolResult)
        expect_eq(result.isError, True, "fail task: tasks/result is the tool result with isError true")
        expect_eq(text_blocks(result), [{"type": "text", "text": "interop boom"}], "fail task: result text")
        check_related_task(result, task.taskId, "fail task")
        self.run.ok("get_task_result of the failed task: CallToolResult isError true, text 'interop boom'")

    # -- sleep_as_task
    async def required_task(self) -> None:
        task = await self.create("sleep_as_task", {"seconds": 1}, "sleep_as_task")
        final, seen = await poll_to_end(self.s, task, "sleep_as_task")
        expect_eq(final.status, "completed", "sleep_as_task: ends 'completed'")
        result = await self.s.experimental.get_task_result(task.taskId, types.CallToolResult)
        expect_eq(text_blocks(result), [{"type": "text", "text": "slept 1 s"}], "sleep_as_task: result text")
        expect_eq(result.isError, False, "sleep_as_task: isError false")
        check_related_task(result, task.taskId, "sleep_as_task")
        self.run.ok(f"sleep_as_task as a task: completed after {len(seen)} polls, result 'slept 1 s'")
        await expect_error(
            self.s.call_tool("sleep_as_task", {"seconds": 0}),
            METHOD_NOT_FOUND,
            "sleep_as_task without a task is rejected",
            'tools/call sleep_as_task {"seconds": 0} (no task)',
            "spec: taskSupport 'required' -> servers MUST return -32601 for a plain call",
        )
        self.run.ok("sleep_as_task as a plain call: error -32601")

    # -- unknown task ids
    async def unknown(self) -> None:
        tid = str(uuid.uuid4())
        why = "spec: invalid or nonexistent taskId -> -32602"
        await expect_error(self.s.experimental.get_task(tid), INVALID_PARAMS, "tasks/get unknown id", f"tasks/get {tid}", why)
        await expect_error(
            self.s.experimental.get_task_result(tid, types.CallToolResult),
            INVALID_PARAMS,
            "tasks/result unknown id",
            f"tasks/result {tid}",
            why,
        )
        await expect_error(
            self.s.experimental.cancel_task(tid), INVALID_PARAMS, "tasks/cancel unknown id", f"tasks/cancel {tid}", why
        )
        self.run.ok("unknown task id: tasks/get, tasks/result, tasks/cancel all answer -32602")

    # -- plain calls
    async def plain(self) -> None:
        args = {"text": "héllo", "n": 3, "nested": {"list": [1, 2.5, None, True]}}
        result = await self.s.call_tool("echo", args)
        expect_eq(result.isError, False, "echo: isError false")
        expect_eq(result.structuredContent, args, "echo: structuredContent equals the arguments")
        self.run.ok("call_tool echo: structuredContent equals its arguments")
        await expect_error(
            self.s.experimental.call_tool_as_task("echo", args, ttl=TTL_MS),
            METHOD_NOT_FOUND,
            "echo as a task is rejected",
            "tools/call echo with task",
            "spec: taskSupport 'forbidden' -> servers SHOULD return -32601",
        )
        self.run.ok("call_tool_as_task echo (forbidden): error -32601")
        result = await self.s.call_tool("sleep", {"seconds": 0.2, "message": "plain"})
        expect_eq(text_blocks(result), [{"type": "text", "text": "plain"}], "plain sleep: result text")
        expect_eq(result.isError, False, "plain sleep: isError false")
        self.run.ok("call_tool sleep (optional) without a task: result 'plain'")

    # -- another session sees none of this session's tasks
    async def isolation(self) -> None:
        expect(bool(self.created), "isolation: this session created tasks")
        async with streamable_http_client(self.url) as (r, w, _):
            async with ClientSession(r, w, read_timeout_seconds=timedelta(seconds=REQUEST_TIMEOUT_S)) as other:
                await other.initialize()
                page = await other.experimental.list_tasks()
                leaked = [t.taskId for t in page.tasks if t.taskId in self.created]
                expect(not leaked, "isolation: tasks/list of another session lists none of ours", f"leaked: {leaked}")
                tid = self.created[0]
                await expect_error(
                    other.experimental.get_task(tid),
                    INVALID_PARAMS,
                    "isolation: tasks/get of another session's task",
                    f"tasks/get {tid} from a second session",
                    "taskbroker README: another session's task answers 'Task not found'",
                )
        self.run.ok("a second session: tasks/list shows none of our tasks, tasks/get of ours answers -32602")


# ---------------------------------------------------------------- plumbing


def leaves(e: BaseException) -> list[BaseException]:
    """The innermost exceptions of (nested) exception groups."""
    if isinstance(e, BaseExceptionGroup):
        return [leaf for sub in e.exceptions for leaf in leaves(sub)]
    if isinstance(e, TimeoutError) and not str(e):
        return [TimeoutError(f"the whole run took longer than {TOTAL_TIMEOUT_S} s")]
    return [e]


async def tap(src: Any, dst: Any, wire: Wire, direction: str) -> None:
    async with src, dst:
        async for item in src:
            wire.record(direction, item)
            await dst.send(item)


async def main(url: str) -> int:
    wire = Wire()
    run = Run(wire)
    try:
        with anyio.fail_after(TOTAL_TIMEOUT_S):
            async with streamable_http_client(url) as (read, write, _):
                async with anyio.create_task_group() as tg:
                    to_session, session_read = anyio.create_memory_object_stream(0)
                    session_write, from_session = anyio.create_memory_object_stream(0)
                    tg.start_soon(tap, read, to_session, wire, "<-")
                    tg.start_soon(tap, from_session, write, wire, "->")
                    async with ClientSession(
                        session_read,
                        session_write,
                        read_timeout_seconds=timedelta(seconds=REQUEST_TIMEOUT_S),
                        client_info=types.Implementation(name="taskbroker-interop-python", version="1"),
                    ) as session:
                        checks = Checks(session, run, url)
                        checks.init = await session.initialize()
                        await run.group("initialize", checks.handshake)
                        await run.group("sleep task", checks.sleep_task)
                        await run.group("blocking tasks/result", checks.blocking_result)
                        await run.group("fail task", checks.fail_task)
                        await run.group("sleep_as_task", checks.required_task)
                        await run.group("cancel", checks.cancel)
                        await run.group("unknown task id", checks.unknown)
                        await run.group("plain calls", checks.plain)
                        await run.group("tasks/list", checks.listing)
                        await run.group("session isolation", checks.isolation)
                    tg.cancel_scope.cancel()
    except BaseException as e:  # noqa: BLE001 - transport crash, timeout, Ctrl-C
        if isinstance(e, KeyboardInterrupt):
            raise
        traceback.print_exception(e, file=sys.stderr)
        causes = "\n".join(f"{type(x).__name__}: {x}" for x in leaves(e))
        run.not_ok("session: the run could not go on (traceback on stderr)", causes)
    print(f"{run.passed} passed, {run.failed} failed", flush=True)
    return 0 if run.failed == 0 and run.passed > 0 else 1


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TASKBROKER_URL", "")
    if not target:
        print("usage: client.py URL   (or set TASKBROKER_URL), e.g. http://127.0.0.1:8808/mcp", file=sys.stderr)
        sys.exit(2)
    sys.exit(anyio.run(main, target))
