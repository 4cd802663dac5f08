"""The tool of the chaos harness (tests/chaos/harness.py): a slow side effect that
leaves a trace in a ledger file before and after it acts, so that the harness
can count executions across worker processes, SIGKILLs included.

    TURNKEEPER_TOOL_MODULES=tests.chaos.tools TURNKEEPER_TOOLS=ledger_write,ledger_confirm CHAOS_LEDGER=/path/ledger.txt

`ledger_confirm` is the same side effect from a tool that asks first
(`confirm=True`): a call runs only once its user approved it; its lines name it.

Each line is written with one `write(2)` on an `O_APPEND` descriptor and
fsynced, so concurrent workers never interleave lines and a line written
before a SIGKILL is on disk:

    start <idempotency key> pid=<worker pid> t=<unix time> [tool=ledger_confirm]
    done <idempotency key> pid=<worker pid> t=<unix time> [tool=ledger_confirm]
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from turnkeeper.activities.tools import ToolContext, tool


def _ledger(ctx: ToolContext) -> Path:
    return Path(os.environ.get("CHAOS_LEDGER") or ctx.workspace / "ledger.txt")


def append_line(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def _act(note: str, seconds: float, ctx: ToolContext, mark: str = "") -> str:
    ledger = _ledger(ctx)
    append_line(ledger, f"start {ctx.idempotency_key} pid={os.getpid()} t={time.time():.3f}{mark}")
    await asyncio.sleep(max(0.0, min(float(seconds), 30.0)))
    append_line(ledger, f"done {ctx.idempotency_key} pid={os.getpid()} t={time.time():.3f}{mark}")
    return f"noted {note!r}"


@tool(effect="write")
async def ledger_write(note: str, seconds: float, ctx: ToolContext) -> str:
    """Record a note in the ledger; takes `seconds` to act."""
    return await _act(note, seconds, ctx)


@tool(effect="write", confirm=True)
async def ledger_confirm(note: str, seconds: float, ctx: ToolContext) -> str:
    """Record a note in the ledger once the user approves; takes `seconds` to act."""
    return await _act(note, seconds, ctx, mark=f" tool={CONFIRM_TOOL}")


CONFIRM_TOOL = ledger_confirm.__name__
