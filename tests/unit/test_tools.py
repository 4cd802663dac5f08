"""The tool layer: schemas, registration, safe execution, workspace confinement, exec."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from tests.unit.test_exec_sandbox import SeenSleeping, host_sleeps, sleep_marker
from turnkeeper.activities.tools import (
    ToolContext,
    ToolLoadError,
    ToolOutcome,
    ToolRegistry,
    WorkspaceEscape,
    builtin,
    default_registry,
    load_tool_modules,
    resolve_in_workspace,
    sandbox,
    tool,
)
from turnkeeper.config import DEFAULT_TOOLS
from turnkeeper.models import EffectClass

CAP = 16 * 1024
WITH_EXEC = (*DEFAULT_TOOLS, "exec")


class Point(BaseModel):
    x: int
    y: int = 0


def make_ctx(workspace: Path, exec_timeout: float = 10, heartbeat=None) -> ToolContext:
    return ToolContext.for_call(
        workspace=workspace,
        chat_id="chat-1",
        turn=3,
        tool_call_id="call_9",
        exec_timeout=exec_timeout,
        heartbeat=heartbeat,
    )


async def run_builtin(
    ws: Path,
    name: str,
    args: dict | str,
    *,
    enabled=DEFAULT_TOOLS,
    cap: int = CAP,
    ctx: ToolContext | None = None,
) -> ToolOutcome:
    raw = args if isinstance(args, str) else json.dumps(args)
    return await default_registry().run(name, raw, ctx or make_ctx(ws), enabled=enabled, max_output_bytes=cap)


# --- context ------------------------------------------------------------------------


def test_context_idempotency_key(workspace: Path) -> None:
    ctx = make_ctx(workspace)
    assert ctx.idempotency_key == "chat-1/3/call_9"
    with pytest.raises(AttributeError):
        ctx.turn = 4  # type: ignore[misc]


# --- schemas and registration -----------------------------------------------------------


def test_schema_from_type_hints() -> None:
    reg = ToolRegistry()

    @reg.tool
    def search(
        query: str,
        limit: int = 10,
        threshold: float | None = None,
        exact: bool = False,
        tags: list[str] | None = None,
        options: dict | None = None,
        mode: Literal["fast", "thorough"] = "fast",
        *,
        ctx: ToolContext,
    ) -> str:
        """Search things.

        Longer explanation that is not part of the description.
        """
        return query

    spec = reg.specs(["search"])[0]
    params = spec.parameters
    assert params["type"] == "object"
    assert params["required"] == ["query"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert list(props) == ["query", "limit", "threshold", "exact", "tags", "options", "mode"]  # ctx excluded
    assert props["query"] == {"type": "string"}
    assert props["limit"] == {"type": "integer", "default": 10}
    assert {"type": "number"} in props["threshold"]["anyOf"]
    assert props["exact"]["type"] == "boolean"
    assert {"type": "array", "items": {"type": "string"}} in props["tags"]["anyOf"]
    assert {"type": "object", "additionalProperties": True} in props["options"]["anyOf"]
    assert props["mode"]["enum"] == ["fast", "thorough"]
    assert "title" not in json.dumps(params)
    assert spec.description == "Search things."
    assert spec.effect is EffectClass.WRITE


def test_schema_with_pydantic_model() -> None:
    reg = ToolRegistry()

    @reg.tool(effect="idempotent")
    def plot(point: Point, label: str = "") -> str:
        return f"{label}{point.x},{point.y}"

    params = reg.specs(["plot"])[0].parameters
    assert params["required"] == ["point"]
    assert params["properties"]["point"] == {"$ref": "#/$defs/Point"}
    assert params["$defs"]["Point"]["required"] == ["x"]


def test_decorator_bare_and_with_args() -> None:
    reg = ToolRegistry()

    def bare(a: int) -> int:
        """Double it."""
        return a * 2

    returned = tool(registry=reg)(bare)
    assert returned is bare and bare(2) == 4  # the function stays callable as is

    @tool(name="renamed", description="Custom text.", effect="read", registry=reg)
    def original(a: int) -> int:
        return a

    assert original(5) == 5
    assert reg.names() == ["bare", "renamed"]
    bare_spec, renamed_spec = reg.specs(["bare", "renamed"])
    assert (bare_spec.description, bare_spec.effect) == ("Double it.", EffectClass.WRITE)
    assert (renamed_spec.description, renamed_spec.effect) == ("Custom text.", EffectClass.READ)
    assert reg.get("renamed") is not None and reg.get("original") is None


def test_registry_method_decorator_bare_and_register() -> None:
    reg = ToolRegistry()

    @reg.tool
    async def ping() -> str:
        return "pong"

    reg.register(lambda: "x", name="lam", effect=EffectClass.IDEMPOTENT)
    assert reg.names() == ["lam", "ping"]
    assert reg.specs(["lam"])[0].effect is EffectClass.IDEMPOTENT
    assert reg.specs(["ping"])[0].parameters["properties"] == {}


def test_specs_respect_enabled_order_and_skip_unknown() -> None:
    names = [s.name for s in default_registry().specs(["list_dir", "nope", "read_file", "list_dir"])]
    assert names == ["list_dir", "read_file"]
    assert [s.name for s in default_registry().specs(DEFAULT_TOOLS)] == list(DEFAULT_TOOLS)
    effects = {s.name: s.effect for s in default_registry().specs(WITH_EXEC)}
    assert effects == {
        "read_file": EffectClass.READ,
        "write_file": EffectClass.WRITE,
        "list_dir": EffectClass.READ,
        "exec": EffectClass.WRITE,
    }


def test_register_rejects_bad_tools() -> None:
    reg = ToolRegistry()
    with pytest.raises(ValueError, match="invalid tool name"):
        reg.register(lambda: "x", name="has space")
    with pytest.raises(TypeError, match="keyword"):
        reg.register(lambda *args: "x", name="varargs")
    with pytest.raises(ValueError):
        reg.register(lambda: "x", name="bad_effect", effect="sometimes")  # type: ignore[arg-type]

    def one() -> str:
        return "1"

    def two() -> str:
        return "2"

    reg.register(one, name="same")
    with pytest.raises(ValueError, match="already registered"):
        reg.register(two, name="same")


# --- built-ins through run ---------------------------------------------------------------


async def test_write_then_read(workspace: Path) -> None:
    out = await run_builtin(workspace, "write_file", {"path": "sub/dir/a.txt", "content": "hi"})
    assert out == ToolOutcome(status="done", content="wrote 2 bytes to sub/dir/a.txt")
    assert (workspace / "sub/dir/a.txt").read_text() == "hi"
    assert [p.name for p in (workspace / "sub/dir").iterdir()] == ["a.txt"]  # no temp file left

    out = await run_builtin(workspace, "write_file", {"path": "sub/dir/a.txt", "content": "héllo"})
    assert out.content == "wrote 6 bytes to sub/dir/a.txt"
    out = await run_builtin(workspace, "read_file", {"path": "sub/dir/a.txt"})
    assert out == ToolOutcome(status="done", content="héllo")


async def test_read_missing_file_is_error(workspace: Path) -> None:
    out = await run_builtin(workspace, "read_file", {"path": "nope.txt"})
    assert out.status == "error"
    assert out.content == "Error: FileNotFoundError: no such file: 'nope.txt'"


async def test_read_replaces_invalid_utf8(workspace: Path) -> None:
    (workspace / "bin").write_bytes(b"ok\xff!")
    out = await run_builtin(workspace, "read_file", {"path": "bin"})
    assert out.content == "ok\ufffd!"


async def test_list_dir(workspace: Path) -> None:
    (workspace / "b.txt").write_text("b")
    (workspace / "a_dir").mkdir()
    (workspace / "a_dir" / "inner.txt").write_text("i")
    (workspace / "c.md").write_text("c")
    out = await run_builtin(workspace, "list_dir", {})
    assert out == ToolOutcome(status="done", content="a_dir/\nb.txt\nc.md")
    out = await run_builtin(workspace, "list_dir", {"path": "a_dir"})
    assert out.content == "inner.txt"
    out = await run_builtin(workspace, "list_dir", {"path": "b.txt"})
    assert out.status == "error" and "not a directory" in out.content


# --- bad calls become error outcomes ---------------------------------------------------------


async def test_unknown_tool(workspace: Path) -> None:
    out = await run_builtin(workspace, "frobnicate", {})
    assert out == ToolOutcome(
        status="error",
        content="Error: unknown tool 'frobnicate'. Available tools: read_file, write_file, list_dir",
    )


async def test_exec_not_enabled_by_default(workspace: Path) -> None:
    out = await run_builtin(workspace, "exec", {"command": "touch pwned"})
    assert out.status == "error"
    assert out.content.startswith("Error: unknown tool 'exec'.")
    assert "exec" not in out.content.split("Available tools:")[1]
    assert not (workspace / "pwned").exists()


async def test_malformed_json_arguments(workspace: Path) -> None:
    out = await run_builtin(workspace, "read_file", '{"path": "a.txt"')
    assert out.status == "error"
    assert out.content.startswith("Error: malformed arguments for 'read_file': ")


async def test_non_object_json_arguments(workspace: Path) -> None:
    out = await run_builtin(workspace, "read_file", '["a.txt"]')
    assert out == ToolOutcome(
        status="error",
        content="Error: malformed arguments for 'read_file': expected a JSON object, got array",
    )
    out = await run_builtin(workspace, "read_file", "null")
    assert out.content == "Error: malformed arguments for 'read_file': expected a JSON object, got null"


async def test_empty_arguments_mean_no_arguments(workspace: Path) -> None:
    (workspace / "x").write_text("")
    out = await run_builtin(workspace, "list_dir", "")
    assert out == ToolOutcome(status="done", content="x")


async def test_missing_required_argument(workspace: Path) -> None:
    out = await run_builtin(workspace, "write_file", {"path": "a.txt"})
    assert out == ToolOutcome(
        status="error", content="Error: invalid arguments for 'write_file': content: Field required"
    )
    assert not (workspace / "a.txt").exists()


async def test_wrong_type_and_unexpected_key(workspace: Path) -> None:
    out = await run_builtin(workspace, "read_file", {"path": 5})
    assert out.status == "error"
    assert out.content == "Error: invalid arguments for 'read_file': path: Input should be a valid string"
    out = await run_builtin(workspace, "read_file", {"path": "a", "mode": "rb"})
    assert out.content == "Error: invalid arguments for 'read_file': mode: Extra inputs are not permitted"


async def test_custom_tool_validation_and_injection(workspace: Path) -> None:
    reg = ToolRegistry()
    seen: list[ToolContext] = []

    @reg.tool
    def move(point: Point, steps: int, context: ToolContext) -> dict:
        seen.append(context)
        return {"x": point.x + steps, "y": point.y, "note": "→"}

    ctx = make_ctx(workspace)
    out = await reg.run(
        "move", '{"point": {"x": 1}, "steps": 2}', ctx, enabled=["move"], max_output_bytes=CAP
    )
    assert out == ToolOutcome(status="done", content='{"x": 3, "y": 0, "note": "→"}')
    assert seen == [ctx]
    out = await reg.run("move", '{"point": {}, "steps": "two"}', ctx, enabled=["move"], max_output_bytes=CAP)
    assert out.content == (
        "Error: invalid arguments for 'move': point.x: Field required; "
        "steps: Input should be a valid integer, unable to parse string as an integer"
    )
    assert len(seen) == 1
    out = await reg.run(
        "move", '{"point": {"x": 1}, "steps": 1, "context": "x"}', ctx, enabled=["move"], max_output_bytes=CAP
    )
    assert out.content == "Error: invalid arguments for 'move': context: Extra inputs are not permitted"


async def test_tool_that_raises(workspace: Path) -> None:
    reg = ToolRegistry()

    @reg.tool
    def boom(x: int) -> str:
        raise ValueError(f"bad x {x}")

    @reg.tool
    async def aboom() -> str:
        raise KeyError("k")

    ctx = make_ctx(workspace)
    out = await reg.run("boom", '{"x": 1}', ctx, enabled=["boom"], max_output_bytes=CAP)
    assert out == ToolOutcome(status="error", content="Error: ValueError: bad x 1")
    out = await reg.run("aboom", "{}", ctx, enabled=["aboom"], max_output_bytes=CAP)
    assert out == ToolOutcome(status="error", content="Error: KeyError: 'k'")


async def test_output_cap(workspace: Path) -> None:
    reg = ToolRegistry()

    @reg.tool
    def big(text: str, times: int) -> str:
        return text * times

    ctx = make_ctx(workspace)
    out = await reg.run("big", '{"text": "ab", "times": 10}', ctx, enabled=["big"], max_output_bytes=20)
    assert out.content == "ab" * 10  # exactly at the cap: untouched

    out = await reg.run("big", '{"text": "ab", "times": 100}', ctx, enabled=["big"], max_output_bytes=10)
    assert out == ToolOutcome(status="done", content="ababababab\n[output truncated: 10 of 200 bytes shown]")

    # "é" is two bytes: a cap of 5 bytes shows two characters (4 bytes), never half of one.
    out = await reg.run("big", '{"text": "é", "times": 10}', ctx, enabled=["big"], max_output_bytes=5)
    assert out.content == "éé\n[output truncated: 4 of 20 bytes shown]"
    out = await reg.run("big", '{"text": "😀", "times": 3}', ctx, enabled=["big"], max_output_bytes=7)
    assert out.content == "😀\n[output truncated: 4 of 12 bytes shown]"


async def test_sync_tool_does_not_block_the_loop(workspace: Path) -> None:
    reg = ToolRegistry()

    @reg.tool
    def slow() -> str:
        time.sleep(0.5)
        return "slept"

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        out = await reg.run("slow", "{}", make_ctx(workspace), enabled=["slow"], max_output_bytes=CAP)
    finally:
        task.cancel()
    assert out.content == "slept"
    assert ticks >= 10


async def test_sync_tool_heartbeat_runs_on_the_loop(workspace: Path) -> None:
    reg = ToolRegistry()
    beat_threads: list[int] = []

    @reg.tool
    def long_job(ctx: ToolContext) -> str:
        assert ctx.heartbeat is not None
        ctx.heartbeat()
        return "done" if threading.get_ident() != loop_thread else "ran on the loop"

    loop_thread = threading.get_ident()
    ctx = make_ctx(workspace, heartbeat=lambda: beat_threads.append(threading.get_ident()))
    out = await reg.run("long_job", "{}", ctx, enabled=["long_job"], max_output_bytes=CAP)
    await asyncio.sleep(0)  # let the scheduled heartbeat run
    assert out.content == "done"
    assert beat_threads == [loop_thread]


# --- workspace confinement -----------------------------------------------------------------------


def test_resolve_in_workspace(workspace: Path, outside: Path) -> None:
    assert resolve_in_workspace(workspace, "a/b.txt") == workspace.resolve() / "a" / "b.txt"
    assert resolve_in_workspace(workspace, ".") == workspace.resolve()
    (workspace / "inner_link").symlink_to(workspace / "real.txt")
    assert resolve_in_workspace(workspace, "inner_link") == workspace.resolve() / "real.txt"
    (workspace / "out_link").symlink_to(outside)
    for bad in [
        "",
        "  ",
        "a\x00b",
        "/etc/passwd",
        "../x",
        "a/../../x",
        "a/..",
        "out_link",
        "out_link/secret.txt",
    ]:
        with pytest.raises(WorkspaceEscape):
            resolve_in_workspace(workspace, bad)
    with pytest.raises(WorkspaceEscape, match=r"path '\.\./x' escapes the workspace"):
        resolve_in_workspace(workspace, "../x")


@pytest.mark.parametrize("path", ["../outside/pwned.txt", "sub/../../outside/pwned.txt"])
async def test_dotdot_escape(workspace: Path, outside: Path, path: str) -> None:
    out = await run_builtin(workspace, "write_file", {"path": path, "content": "x"})
    assert out.status == "error"
    assert out.content.startswith(f"Error: WorkspaceEscape: path {path!r} escapes the workspace")
    assert not (outside / "pwned.txt").exists()
    out = await run_builtin(workspace, "read_file", {"path": "../outside/secret.txt"})
    assert out.status == "error" and "top secret" not in out.content


async def test_absolute_path_escape(workspace: Path, outside: Path) -> None:
    target = outside / "pwned.txt"
    out = await run_builtin(workspace, "write_file", {"path": str(target), "content": "x"})
    assert out.status == "error" and "escapes the workspace" in out.content
    assert not target.exists()
    out = await run_builtin(workspace, "read_file", {"path": str(outside / "secret.txt")})
    assert out.status == "error" and "top secret" not in out.content
    out = await run_builtin(workspace, "list_dir", {"path": str(outside)})
    assert out.status == "error" and "secret.txt" not in out.content


async def test_symlinked_file_escape(workspace: Path, outside: Path) -> None:
    (workspace / "link.txt").symlink_to(outside / "secret.txt")
    out = await run_builtin(workspace, "read_file", {"path": "link.txt"})
    assert out.status == "error" and "escapes the workspace" in out.content
    assert "top secret" not in out.content
    out = await run_builtin(workspace, "write_file", {"path": "link.txt", "content": "overwritten"})
    assert out.status == "error"
    assert (outside / "secret.txt").read_text() == "top secret"
    assert (workspace / "link.txt").is_symlink()


async def test_symlinked_directory_escape(workspace: Path, outside: Path) -> None:
    (workspace / "linkdir").symlink_to(outside, target_is_directory=True)
    out = await run_builtin(workspace, "write_file", {"path": "linkdir/pwned.txt", "content": "x"})
    assert out.status == "error" and "escapes the workspace" in out.content
    assert not (outside / "pwned.txt").exists()
    out = await run_builtin(workspace, "write_file", {"path": "linkdir/new/pwned.txt", "content": "x"})
    assert out.status == "error"
    assert not (outside / "new").exists()
    out = await run_builtin(workspace, "read_file", {"path": "linkdir/secret.txt"})
    assert out.status == "error" and "top secret" not in out.content
    out = await run_builtin(workspace, "list_dir", {"path": "linkdir"})
    assert out.status == "error" and "secret.txt" not in out.content


async def test_read_file_refuses_what_is_not_a_regular_file(workspace: Path) -> None:
    os.mkfifo(workspace / "pipe")  # opening it for reading would wait for a writer
    start = time.monotonic()
    out = await run_builtin(workspace, "read_file", {"path": "pipe"})
    assert out.status == "error" and "not a regular file" in out.content
    assert time.monotonic() - start < 2


# --- exec ------------------------------------------------------------------------------------------


async def test_exec_runs_in_workspace(workspace: Path) -> None:
    (workspace / "here.txt").write_text("x")
    out = await run_builtin(
        workspace, "exec", {"command": "ls; echo out; echo err >&2; cat; exit 3"}, enabled=WITH_EXEC
    )
    assert out == ToolOutcome(status="done", content="exit code 3\nhere.txt\nout\nerr\n")


@pytest.fixture(params=["auto", "off"])
def exec_sandbox(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a command runs: in the sandbox (its pids are its own namespace's,
    so the tests look for its processes on the host's list) and without."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the host's process list is read from /proc")
    monkeypatch.setattr(sandbox, "MODE", request.param)
    return request.param


async def test_exec_timeout_kills_process_group(workspace: Path, exec_sandbox: str) -> None:
    ctx = make_ctx(workspace, exec_timeout=1)
    bg, fg = sleep_marker(30), sleep_marker(30)
    start = time.monotonic()
    async with SeenSleeping(bg, fg) as watch:
        out = await run_builtin(
            workspace,
            "exec",
            {"command": f"echo started; sleep {bg} & sleep {fg}"},
            enabled=WITH_EXEC,
            ctx=ctx,
        )
    elapsed = time.monotonic() - start
    assert elapsed < 3
    assert out.status == "error"
    assert out.content.startswith("Error: TimeoutError: command timed out after 1s and was killed")
    assert out.content.endswith("started\n")
    assert watch.seen == {bg, fg}
    await asyncio.sleep(0.2)
    assert not host_sleeps(bg) and not host_sleeps(fg)


async def test_exec_does_not_wait_for_leftover_background_processes(
    workspace: Path, exec_sandbox: str
) -> None:
    bg = sleep_marker(30)
    start = time.monotonic()
    async with SeenSleeping(bg) as watch:
        out = await run_builtin(workspace, "exec", {"command": f"sleep {bg} & echo done"}, enabled=WITH_EXEC)
    assert time.monotonic() - start < 5
    assert out == ToolOutcome(status="done", content="exit code 0\ndone\n")
    assert watch.seen == {bg}
    await asyncio.sleep(0.2)
    assert not host_sleeps(bg)


async def test_exec_heartbeats_while_running(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builtin, "HEARTBEAT_INTERVAL", 0.05)
    beats: list[float] = []
    ctx = make_ctx(workspace, heartbeat=lambda: beats.append(time.monotonic()))
    out = await run_builtin(workspace, "exec", {"command": "sleep 0.5"}, enabled=WITH_EXEC, ctx=ctx)
    assert out.content == "exit code 0\n"
    assert len(beats) >= 3


async def _until_sleeping(marker: str) -> None:
    for _ in range(250):
        if host_sleeps(marker):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"sleep {marker} never ran")


async def test_exec_cancellation_kills_the_command(workspace: Path, exec_sandbox: str) -> None:
    fg = sleep_marker(30)
    task = asyncio.create_task(run_builtin(workspace, "exec", {"command": f"sleep {fg}"}, enabled=WITH_EXEC))
    await _until_sleeping(fg)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.2)
    assert not host_sleeps(fg)


def _escape(marker: str) -> str:
    """A process that leaves the command's process group, as a daemon does."""
    return f"setsid sh -c 'sleep {marker}' </dev/null >/dev/null 2>&1 & "


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the exec guard needs Linux")
async def test_exec_timeout_kills_a_process_that_left_the_group(workspace: Path, exec_sandbox: str) -> None:
    ctx = make_ctx(workspace, exec_timeout=1)
    escaped = sleep_marker(30)
    async with SeenSleeping(escaped) as watch:
        out = await run_builtin(
            workspace, "exec", {"command": _escape(escaped) + "sleep 30"}, enabled=WITH_EXEC, ctx=ctx
        )
    assert out.content.startswith("Error: TimeoutError")
    assert watch.seen == {escaped}
    await asyncio.sleep(0.3)
    assert not host_sleeps(escaped)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the exec guard needs Linux")
async def test_exec_cancellation_kills_a_process_that_left_the_group(
    workspace: Path, exec_sandbox: str
) -> None:
    escaped = sleep_marker(30)
    task = asyncio.create_task(
        run_builtin(workspace, "exec", {"command": _escape(escaped) + "sleep 30"}, enabled=WITH_EXEC)
    )
    await _until_sleeping(escaped)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.3)
    assert not host_sleeps(escaped)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the exec guard needs Linux")
async def test_exec_ends_what_the_command_left_running(workspace: Path, exec_sandbox: str) -> None:
    """Background jobs and daemons get a short grace when the shell exits, then die:
    nothing the call started acts after its result was reported."""
    bg, escaped = sleep_marker(30), sleep_marker(2)
    command = (
        "(sleep 0.2; echo quick > quick.txt) >/dev/null 2>&1 & "
        f"sleep {bg} >/dev/null 2>&1 & "
        f"setsid sh -c 'sleep {escaped}; echo late > late.txt' </dev/null >/dev/null 2>&1 & "
        "echo done"
    )
    start = time.monotonic()
    async with SeenSleeping(bg, escaped) as watch:
        out = await run_builtin(workspace, "exec", {"command": command}, enabled=WITH_EXEC)
    assert out == ToolOutcome(status="done", content="exit code 0\ndone\n")
    assert time.monotonic() - start < 5
    assert (workspace / "quick.txt").read_text() == "quick\n"  # finished within the grace
    assert watch.seen == {bg, escaped}
    assert not host_sleeps(bg) and not host_sleeps(escaped)
    await asyncio.sleep(2.5)
    assert not (workspace / "late.txt").exists()


# --- loading tool modules -------------------------------------------------------------------------


@pytest.fixture
def restore_default_registry() -> Iterator[None]:
    reg = default_registry()
    saved = dict(reg._tools)
    modules = set(sys.modules)
    try:
        yield
    finally:
        reg._tools.clear()
        reg._tools.update(saved)
        for name in set(sys.modules) - modules:
            if name.startswith("tk_test_"):
                del sys.modules[name]


async def test_load_tool_modules(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch, restore_default_registry: None
) -> None:
    mod_dir = tmp_path / "mods"
    mod_dir.mkdir()
    (mod_dir / "tk_test_shout.py").write_text(
        "from turnkeeper.activities.tools import tool\n"
        "\n"
        "@tool\n"
        "def tk_shout(text: str) -> str:\n"
        '    """Shout the text."""\n'
        "    return text.upper()\n"
    )
    monkeypatch.syspath_prepend(str(mod_dir))
    (module,) = load_tool_modules(["tk_test_shout"])
    assert module.__name__ == "tk_test_shout"
    reg = default_registry()
    assert "tk_shout" in reg.names()
    spec = reg.specs(["tk_shout"])[0]
    assert (spec.description, spec.effect) == ("Shout the text.", EffectClass.WRITE)
    out = await reg.run(
        "tk_shout", '{"text": "hi"}', make_ctx(workspace), enabled=["tk_shout"], max_output_bytes=CAP
    )
    assert out == ToolOutcome(status="done", content="HI")


def test_load_tool_modules_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_default_registry: None
) -> None:
    with pytest.raises(ToolLoadError, match="tk_test_no_such_module"):
        load_tool_modules(["tk_test_no_such_module"])
    (tmp_path / "tk_test_broken.py").write_text("raise RuntimeError('kaput')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ToolLoadError, match=r"'tk_test_broken'.*RuntimeError: kaput"):
        load_tool_modules(["tk_test_broken"])


async def test_exec_does_not_see_the_worker_secrets(tmp_path, monkeypatch) -> None:
    from turnkeeper.activities.tools import ToolContext, default_registry

    monkeypatch.setenv("OPENAI_API_KEY", "sk-very-secret")
    ctx = ToolContext(
        workspace=tmp_path, chat_id="c", turn=1, tool_call_id="t", idempotency_key="c/1/t", exec_timeout=10
    )
    out = await default_registry().run(
        "exec", '{"command": "env"}', ctx, enabled={"exec"}, max_output_bytes=16384
    )
    assert out.status == "done" and "PATH=" in out.content
    assert "sk-very-secret" not in out.content
