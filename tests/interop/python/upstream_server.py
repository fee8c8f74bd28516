#!/usr/bin/env python3
"""An MCP server written with the official Python SDK (mcp==1.30.0,
FastMCP), as people write them: run over stdio by taskbroker as an
`[[upstream]]` in tests/interop/python/upstream.py. It knows nothing of
tasks or of the broker.

Tools:
  slow_report {steps}  reports progress and logs a line per step (0.3 s
                       each), then answers "report of N steps"
  fail_always          raises, which the SDK turns into an isError result
  wait_for {path}      reports progress, logs "waiting for <path>", then
                       waits until that file exists and answers "opened"
"""

import os

import anyio
from mcp.server.fastmcp import Context, FastMCP

mcp = FastMCP("py-upstream")


@mcp.tool()
async def slow_report(steps: int, ctx: Context) -> str:
    """Write a report in `steps` steps, saying how far it got."""
    for i in range(1, steps + 1):
        await ctx.report_progress(i, steps, f"step {i}")
        await ctx.info(f"step {i} of {steps}")
        await anyio.sleep(0.3)
    return f"report of {steps} steps"


@mcp.tool()
async def fail_always() -> str:
    """Always fails."""
    raise RuntimeError("this tool always fails")


@mcp.tool()
async def wait_for(path: str, ctx: Context) -> str:
    """Wait until a file exists, saying what it waits for."""
    await ctx.report_progress(0, 1, "started")
    await ctx.info(f"waiting for {path}")
    while not os.path.exists(path):
        await anyio.sleep(0.05)
    return "opened"


if __name__ == "__main__":
    mcp.run()
