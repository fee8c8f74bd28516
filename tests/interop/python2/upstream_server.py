#!/usr/bin/env python3
"""An MCP server written with the Python SDK 2.x generation (mcp==2.3.0,
FastMCP 4.1.4 from fastmcp-slim, the tasks extension from fastmcp-tasks
4.1.4), served over Streamable HTTP, as people write them. It knows nothing
of the broker; it is the upstream a 2026-07-28 client (the broker) talks to.

Usage:
    python upstream_server.py PORT        # serves http://127.0.0.1:PORT/mcp

Environment:
    RUN_LOG   if set, long_task appends one line ("long_task PID") to this
              file each time its body starts, so a test can count runs
    STEP_LOG  if set, slow appends "slow step I/N" after each step's sleep
              (a cancelled call stops stepping), and ask_name_task appends
              "ask_name_task leg" each time its body runs (once per leg)
    NO_LISTEN if "1", do not serve `subscriptions/listen` (stock FastMCP
              4.1.4 does not: it answers -32601 / HTTP 404)

The SDK is dual-era by default: a request whose `MCP-Protocol-Version`
header names 2026-07-28 goes to the stateless per-request path (no
initialize, no Mcp-Session-Id, `_meta` envelope on every request, routing
headers checked); anything else (no header, or 2025-11-25 and older) goes to
the handshake-era streamable HTTP transport (initialize, Mcp-Session-Id).

Tools:
  add {a:int, b:int}        "The sum of {a} and {b} is {a+b}."
  slow {seconds, steps}     per step: ctx.report_progress + ctx.info, then
                            "slow done after {steps} steps"
  ask_name                  asks for a `name` string. On 2026-07-28 this is
                            the multi-round-trip guard pattern (SEP-2322): the
                            first call returns InputRequiredResult
                            (resultType "input_required", inputRequests,
                            requestState); the retry carries inputResponses +
                            requestState. On 2025-11-25 it uses ctx.elicit()
                            (server-initiated elicitation/create).
                            Answers "Hello, {name}!".
  long_task {seconds}       task-capable (mode optional) through the
                            `io.modelcontextprotocol/tasks` extension: a
                            client that declares the extension in the
                            request's clientCapabilities gets a
                            CreateTaskResult, else it runs inline. Appends to
                            RUN_LOG, sleeps, answers "long_task done".
  ask_name_task             like ask_name but task-only (mode required: -32021
                            without the extension): the ask shows up on
                            tasks/get as status `input_required` with
                            inputRequests (keys re-minted by the extension)
                            and is answered with tasks/update; the body
                            re-runs from the top on every leg.
  fail                      raises ToolError: an isError result
  toggle_extra              adds or removes a tool named `extra` and
                            publishes tools list-changed to every open
                            `subscriptions/listen` stream

Tasks use Docket's in-memory backend (FASTMCP_DOCKET_URL defaults to
memory://), so they live only as long as this process.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import anyio
import mcp_types
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

mcp = FastMCP("py2-upstream")
mcp.add_extension(TasksExtension())

bus = InMemorySubscriptionBus()
if os.environ.get("NO_LISTEN") != "1":
    # FastMCP 4.1.4 does not register the SDK's listen handler (the bare
    # mcp.server.MCPServer does); wire it onto FastMCP's low-level server.
    # With it served, server/discover advertises tools.listChanged: true.
    mcp._mcp_server.add_request_handler(
        "subscriptions/listen",
        mcp_types.SubscriptionsListenRequestParams,
        ListenHandler(bus),
    )


@dataclass
class NameForm:
    name: str


NAME_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "description": "Your name"}},
    "required": ["name"],
}


def _log_run(what: str) -> None:
    path = os.environ.get("RUN_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{what} {os.getpid()}\n")


def _log_line(line: str) -> None:
    path = os.environ.get("STEP_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{line}\n")


def _modern(ctx: Context) -> bool:
    rc = ctx.request_context
    return rc is None or rc.protocol_version in MODERN_PROTOCOL_VERSIONS


def _ask_or_answer(ctx: Context) -> str | mcp_types.InputRequiredResult:
    """The guard pattern: ask on the first round, answer once responses come."""
    responses = ctx.input_responses or {}
    answer = responses.get("name")
    if answer is None:
        return mcp_types.InputRequiredResult(
            input_requests={
                "name": mcp_types.ElicitRequest(
                    params=mcp_types.ElicitRequestFormParams(
                        message="What is your name?", requested_schema=NAME_SCHEMA
                    )
                )
            },
            request_state="asked-name",
        )
    if not isinstance(answer, mcp_types.ElicitResult) or answer.action != "accept":
        return "No name given."
    return f"Hello, {(answer.content or {}).get('name')}!"


@mcp.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return f"The sum of {a} and {b} is {a + b}."


@mcp.tool()
async def slow(seconds: float, steps: int, ctx: Context) -> str:
    """Take `seconds` in `steps` steps, reporting progress and logging each."""
    for i in range(1, steps + 1):
        await anyio.sleep(seconds / max(steps, 1))
        _log_line(f"slow step {i}/{steps}")
        await ctx.report_progress(i, steps, f"step {i}")
        await ctx.info(f"step {i} of {steps}")
    return f"slow done after {steps} steps"


@mcp.tool()
async def ask_name(ctx: Context) -> str | mcp_types.InputRequiredResult:
    """Ask the user for their name and greet them."""
    if not _modern(ctx):
        result = await ctx.elicit("What is your name?", NameForm)
        if result.action != "accept":
            return "No name given."
        return f"Hello, {result.data.name}!"
    return _ask_or_answer(ctx)


@mcp.tool(task=TaskConfig(mode="optional"))
async def long_task(seconds: float, ctx: Context) -> str:
    """Sleep `seconds`; runs as a background task when the client asks."""
    _log_run("long_task")
    await ctx.report_progress(0, 1, "sleeping")
    await anyio.sleep(seconds)
    return "long_task done"


@mcp.tool(task=TaskConfig(mode="required"))
async def ask_name_task(ctx: Context) -> str | mcp_types.InputRequiredResult:
    """Ask for a name from inside a background task."""
    _log_line("ask_name_task leg")
    return _ask_or_answer(ctx)


@mcp.tool()
def fail() -> str:
    """Always fails with a tool error."""
    raise ToolError("this tool always fails")


def _extra() -> str:
    """A tool that comes and goes."""
    return "extra"


@mcp.tool()
async def toggle_extra() -> str:
    """Add or remove the tool `extra`, then publish tools list-changed."""
    names = {t.name for t in await mcp.list_tools()}
    if "extra" in names:
        mcp.local_provider.remove_tool("extra")
        state = "removed"
    else:
        mcp.tool(name="extra")(_extra)
        state = "added"
    await bus.publish(ToolsListChanged())
    return f"extra {state}"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: upstream_server.py PORT")
    # No banner: it also runs an update check against the package index.
    mcp.run(
        transport="http",
        host="127.0.0.1",
        port=int(sys.argv[1]),
        path="/mcp",
        show_banner=False,
    )
