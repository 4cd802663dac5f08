"""Tools for crash tests: each run appends to a ledger file before and after it
acts, so a test can count executions across worker processes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from turnkeeper.activities.tools import ToolContext, tool


def _ledger(ctx: ToolContext) -> Path:
    return Path(os.environ.get("TK_LEDGER") or ctx.workspace / "ledger.txt")


def _append(ctx: ToolContext, line: str) -> None:
    with open(_ledger(ctx), "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@tool(effect="write")
async def slow_write(path: str, content: str, seconds: float, ctx: ToolContext) -> str:
    """Write a file slowly: the ledger records the start, then the tool waits."""
    _append(ctx, f"start {ctx.idempotency_key}")
    await asyncio.sleep(seconds)
    (ctx.workspace / path).write_text(content)
    _append(ctx, f"done {ctx.idempotency_key}")
    return f"wrote {path}"


@tool(effect="write", confirm=True)
async def guarded_write(path: str, content: str, ctx: ToolContext) -> str:
    """Write a file once the user has approved the call; the ledger records the run."""
    _append(ctx, f"start {ctx.idempotency_key}")
    (ctx.workspace / path).write_text(content)
    _append(ctx, f"done {ctx.idempotency_key}")
    return f"wrote {path}"
