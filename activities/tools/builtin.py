"""Built-in tools: files in the workspace, an opt-in shell (sandboxed, sandbox.py),
and `delegate`, whose calls the turn's workflow runs as child workflows.

All paths go through `resolve_in_workspace`. Registered into the default
registry at import; which ones a model may call is the caller's `enabled` list
(by default read_file, write_file and list_dir; `exec` and `delegate` only when
configured).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from turnkeeper.subagents import DELEGATE_DESCRIPTION, DELEGATE_TOOL, DelegateArgs

from . import sandbox
from .registry import default_registry, tool
from .schema import ToolContext, arguments_schema, external_tool
from .workspace import resolve_in_workspace

# read_file reads at most this much: a huge file must not exhaust the worker's
# memory, and the output cap shows far less anyway.
READ_LIMIT = 16 * 1024 * 1024
# exec keeps at most this much output for the same reason; the rest is counted.
EXEC_CAPTURE_LIMIT = 4 * 1024 * 1024
# How often exec calls ctx.heartbeat while the command runs.
HEARTBEAT_INTERVAL = 5.0
# After the shell exits (or is killed), how long to wait for the output pipe to close.
PIPE_GRACE = 1.0
# How often to check whether the shell has exited while its output pipe stays open.
POLL_INTERVAL = 0.1
# On Linux the shell runs under a guard that kills it (and what it started) when
# the worker dies; elsewhere it runs directly.
EXEC_GUARD = Path(__file__).with_name("exec_guard.py") if sys.platform.startswith("linux") else None


@tool(effect="read")
def read_file(path: str, *, ctx: ToolContext) -> str:
    """Read a UTF-8 text file in the workspace and return its contents.

    `path` is relative to the workspace. Undecodable bytes are replaced.
    """
    target = resolve_in_workspace(ctx.workspace, path)
    if not target.exists():
        raise FileNotFoundError(f"no such file: {path!r}")
    if target.is_dir():
        raise IsADirectoryError(f"{path!r} is a directory; use list_dir")
    if not target.is_file():
        # A FIFO or a socket would block the read until the tool timed out.
        raise OSError(f"{path!r} is not a regular file")
    with target.open("rb") as f:
        return f.read(READ_LIMIT).decode("utf-8", errors="replace")


@tool
def write_file(path: str, content: str, *, ctx: ToolContext) -> str:
    """Write text to a file in the workspace, replacing it if it exists.

    `path` is relative to the workspace; missing parent directories are created.
    """
    target = resolve_in_workspace(ctx.workspace, path)
    if target.is_dir():
        raise IsADirectoryError(f"{path!r} is a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode("utf-8")
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    # Temp file + os.replace: a reader (or a crash) never sees a half-written file.
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return f"wrote {len(data)} bytes to {path}"


@tool(effect="read")
def list_dir(path: str = ".", *, ctx: ToolContext) -> str:
    """List a directory in the workspace, sorted; directories end with '/'.

    `path` is relative to the workspace (default: the workspace itself).
    """
    target = resolve_in_workspace(ctx.workspace, path)
    if not target.exists():
        raise FileNotFoundError(f"no such directory: {path!r}")
    if not target.is_dir():
        raise NotADirectoryError(f"{path!r} is not a directory")
    entries = sorted(e.name + ("/" if e.is_dir() else "") for e in target.iterdir())
    return "\n".join(entries) if entries else "(empty directory)"


@tool(name="exec")
async def exec_command(command: str, *, ctx: ToolContext) -> str:
    """Run a shell command in the workspace and return its exit code and output.

    The command runs with `/bin/sh -c` in the workspace directory, stdin empty,
    stdout and stderr combined. It is killed (with any processes it started)
    after the configured timeout; background processes it leaves behind are
    killed shortly after it exits. Unless the worker turned it off, it runs in a
    sandbox: the workspace is the only directory it can write, it sees only the
    system's programs and libraries besides, a private /tmp, and no network. It
    gets PATH and the locale only, never the worker's environment (API keys,
    database URLs).
    """
    root = resolve_in_workspace(ctx.workspace, ".")
    if not root.is_dir():
        raise FileNotFoundError(f"the workspace {str(root)!r} does not exist")
    if sandbox.enabled():
        # Refuses (SandboxUnavailable) rather than run the command unconfined.
        await sandbox.ensure_available()
        argv = sandbox.argv(command, root)
    else:
        argv = ["/bin/sh", "-c", command]
    code, output, dropped = await _run_shell(argv, root, ctx.exec_timeout, ctx.heartbeat)
    text = output.decode("utf-8", errors="replace")
    if dropped:
        text += f"\n[{dropped} more bytes of output were discarded]"
    if code is None:
        raise TimeoutError(
            f"command timed out after {ctx.exec_timeout:g}s and was killed; output so far:\n{text}"
        )
    return f"exit code {_describe_code(code)}\n{text}"


DELEGATE_NOT_HERE_TEXT = (
    "Error: delegate runs as a child workflow of the turn, never as a tool activity; this call did not "
    "start a subagent."
)


class _Delegate:
    """`delegate` as the model sees it (its schema is `DelegateArgs`'). The turn's workflow
    runs its calls as child workflows (docs/subagents.md); should the tool activity
    be asked to run one, it refuses in words instead."""

    def check(self, arguments: dict[str, Any]) -> str | None:
        return None  # the refusal below says more than a schema error would

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> tuple[bool, str]:
        return True, DELEGATE_NOT_HERE_TEXT


default_registry().add(
    external_tool(
        _Delegate(),
        name=DELEGATE_TOOL,
        description=DELEGATE_DESCRIPTION,
        parameters=arguments_schema(DelegateArgs),
        effect="write",
        confirm=False,
    )
)


# Only these reach a command: the worker's environment holds API keys and
# database URLs, and the command was written by a model.
_EXEC_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ")


def _exec_env(cwd: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in _EXEC_ENV_KEEP if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["HOME"] = str(cwd)
    return env


async def _run_shell(
    argv: list[str], cwd: Path, timeout: float, heartbeat: Callable[[], None] | None
) -> tuple[int | None, bytes, int]:
    """Run `argv` (the shell, or the sandbox's shell); return (exit code or None on
    timeout, captured output, bytes dropped)."""
    proc = await asyncio.create_subprocess_exec(
        *_guarded(argv),
        cwd=cwd,
        env=_exec_env(cwd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so a kill reaches its children too
    )
    assert proc.stdout is not None
    stdout = proc.stdout
    captured = bytearray()
    dropped = 0

    async def drain() -> None:
        nonlocal dropped
        while chunk := await stdout.read(64 * 1024):
            keep = max(EXEC_CAPTURE_LIMIT - len(captured), 0)
            captured.extend(chunk[:keep])
            dropped += len(chunk) - min(len(chunk), keep)

    reader = asyncio.create_task(drain())
    # wait() resolves only once the pipe is closed too; returncode is set at exit.
    waiter = asyncio.create_task(proc.wait())
    timed_out = False
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_beat = loop.time() + HEARTBEAT_INTERVAL
        while proc.returncode is None:
            now = loop.time()
            if now >= deadline:
                timed_out = True
                break
            if heartbeat is not None and now >= next_beat:
                heartbeat()
                next_beat = now + HEARTBEAT_INTERVAL
            pending = {t for t in (reader, waiter) if not t.done()}
            # Wakes on EOF or exit; the poll catches a shell that exited while a
            # background child still holds the pipe.
            await asyncio.wait(
                pending, timeout=min(POLL_INTERVAL, deadline - now), return_when=asyncio.FIRST_COMPLETED
            )
        if timed_out:
            _stop_command(proc.pid)
        await asyncio.wait({reader}, timeout=PIPE_GRACE)
        if not reader.done():
            # Leftover background processes would hold the pipe (and the workspace): kill them.
            _kill_group(proc.pid)
            await asyncio.wait({reader}, timeout=PIPE_GRACE)
        await asyncio.wait({waiter}, timeout=PIPE_GRACE)
    finally:
        # Also reached on cancellation: never leave the command running behind us.
        if not (reader.done() and waiter.done()):
            _stop_command(proc.pid)
            # Should the guard not get to it, the group goes all the same.
            asyncio.get_running_loop().call_later(PIPE_GRACE, _kill_group, proc.pid)
        reader.cancel()
        waiter.cancel()
    return (None if timed_out else proc.returncode), bytes(captured), dropped


def _guarded(argv: list[str]) -> list[str]:
    if EXEC_GUARD is None:
        return argv
    return [sys.executable, "-I", "-S", str(EXEC_GUARD), str(os.getpid()), *argv]


def _stop_command(pid: int) -> None:
    """Kill a running command: through its guard, which also finds the processes
    that left the group, or else the group itself."""
    if EXEC_GUARD is None:
        _kill_group(pid)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _describe_code(code: int) -> str:
    if code >= 0:
        return str(code)
    try:
        return f"{code} (killed by {signal.Signals(-code).name})"
    except ValueError:
        return str(code)
