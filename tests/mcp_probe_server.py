"""A small stdio MCP server on the SDK's own `MCPServer`, for what the reference
servers do not show a test: it appends what it receives to a ledger file
(TK_MCP_LEDGER), so a test can read each call's `_meta` and whether the call was
cancelled by the protocol's notification.

    python tests/mcp_probe_server.py
"""

from __future__ import annotations

import asyncio
import os

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("turnkeeper-probe")


def _ledger(line: str) -> None:
    with open(os.environ["TK_MCP_LEDGER"], "a") as f:
        f.write(line + "\n")


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False))
async def wait(seconds: float, ctx: Context) -> str:
    """Wait, reporting progress every 0.2 s; the ledger records the start, the end or the cancel."""
    meta = ctx.request_context.meta or {}
    key = meta.get("turnkeeper/idempotencyKey")
    _ledger(f"start {key}")
    try:
        steps = max(1, int(seconds / 0.2))
        for step in range(steps):
            await ctx.report_progress(step + 1, steps, f"step {step + 1}")
            await asyncio.sleep(seconds / steps)
    except BaseException:
        _ledger(f"cancelled {key}")
        raise
    _ledger(f"done {key}")
    return f"waited {seconds} s"


if __name__ == "__main__":
    server.run("stdio")
