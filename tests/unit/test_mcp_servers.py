"""MCP tools against real servers, without a turn: what a worker serves, what a
call sends and what the model reads (the turn-level promises are in
tests/workflow/test_mcp_tools.py and tests/process/test_mcp_crash.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from tests.mcp_servers import GIT, TIME, commits, everything, git_repo, probe
from tests.support import free_port
from turnkeeper.activities.tools import ToolContext, ToolRegistry, default_registry
from turnkeeper.activities.tools.mcp import IDEMPOTENCY_KEY_META, McpTools
from turnkeeper.activities.tools.mcp_results import render
from turnkeeper.mcp_config import parse
from turnkeeper.models import EffectClass


def _ctx(tmp_path: Path, beats: list[Any] | None = None, call: str = "call_1") -> ToolContext:
    return ToolContext.for_call(
        workspace=tmp_path,
        chat_id="chat",
        turn=1,
        tool_call_id=call,
        exec_timeout=5,
        heartbeat=(lambda *details: beats.append(details)) if beats is not None else None,
    )


async def _serve(servers: dict[str, Any], builtins: ToolRegistry | None = None) -> McpTools:
    return await McpTools.start(parse({"mcpServers": servers}), builtins or default_registry())


@pytest.fixture
async def closing() -> AsyncIterator[list[McpTools]]:
    started: list[McpTools] = []
    yield started
    for tools in started:
        await tools.aclose()


async def _run(tools: McpTools, name: str, arguments: str, ctx: ToolContext, cap: int = 16384):
    return await tools.registry.run(name, arguments, ctx, enabled=tools.names, max_output_bytes=cap)


async def test_tools_are_served_with_their_classes_and_the_configured_overrides(
    closing: list[McpTools],
) -> None:
    tools = await _serve(
        {
            "time": {"command": TIME},
            "git": {
                "command": GIT,
                "turnkeeper": {
                    "tools": {
                        "git_reset": {"approval": False},
                        "git_commit": {"approval": True},
                        "git_log": {"enabled": False},
                        "git_status": {"effect": "write"},
                    }
                },
            },
            "everything": everything(),
        }
    )
    closing.append(tools)
    reg = tools.registry

    def cls(name: str) -> tuple[str, bool]:
        entry = reg.get(name)
        assert entry is not None, f"{name} is not served"
        return entry.effect.value, entry.confirm

    assert cls("time__get_current_time") == ("read", False)  # readOnlyHint
    assert cls("git__git_add") == ("idempotent", False)  # idempotentHint
    assert cls("git__git_create_branch") == ("write", False)  # neither
    assert cls("git__git_commit") == ("write", True)  # asked for in the configuration
    assert cls("git__git_reset") == ("idempotent", False)  # destructiveHint, but configured not to ask
    assert cls("git__git_status") == ("write", False)  # the configured class over the hint
    assert cls("everything__echo") == ("read", False)
    assert reg.get("git__git_log") is None and "git__git_log" not in tools.names
    assert reg.get("read_file") is not None  # the built-ins stay, and the shared registry is untouched
    assert default_registry().get("time__get_current_time") is None
    spec = reg.get("time__get_current_time").spec
    assert spec.effect == EffectClass.READ and spec.description == "Get current time in a specific timezone"
    assert spec.parameters["required"] == ["timezone"] and spec.parameters["type"] == "object"
    assert "$schema" not in reg.get("everything__echo").spec.parameters

    # Without the configuration, the destructive tool asks first.
    plain = await _serve({"git": {"command": GIT}})
    closing.append(plain)
    assert plain.registry.get("git__git_reset").confirm
    assert plain.registry.confirm_names(plain.names) == ["git__git_reset"]


async def test_a_server_that_does_not_start_is_reported_once_and_the_rest_are_served(
    closing: list[McpTools], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnkeeper.mcp")
    os.environ.pop("TK_MCP_UNSET_TOKEN", None)
    tools = await _serve(
        {
            "missing": {"command": "/nonexistent/mcp-server"},
            "exits": {"command": "false"},
            "secret": {"command": TIME, "env": {"TOKEN": "${TK_MCP_UNSET_TOKEN}"}},
            "time": {"command": TIME},
        }
    )
    closing.append(tools)
    assert tools.names == ("time__get_current_time", "time__convert_time")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "MCP server 'missing' (stdio) did not start; its tools are not served: "
        "no such command or directory: /nonexistent/mcp-server",
        "MCP server 'exits' (stdio) did not start; its tools are not served: "
        "the connection closed (a stdio server's own words are on the worker's stderr)",
        "MCP server 'secret' (stdio) did not start; its tools are not served: McpConfigError: "
        "MCP server 'secret': env TOKEN names ${TK_MCP_UNSET_TOKEN}, which is not set in the worker's environment",
    ]


async def test_names_a_model_cannot_call_or_that_collide_are_refused_in_words(
    closing: list[McpTools], caplog: pytest.LogCaptureFixture
) -> None:
    builtins = default_registry().copy()

    @builtins.tool(name="time__convert_time", effect="read")
    def taken() -> str:
        """A tool of the worker's own, under the name the server's would get."""
        return "mine"

    long = "s" * 55
    tools = await _serve({"time": {"command": TIME}, long: {"command": TIME}}, builtins)
    closing.append(tools)
    assert tools.names == ("time__get_current_time",)
    assert tools.registry.get("time__convert_time").fn is taken
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        "MCP server 'time': tool 'convert_time' is not served: tool 'time__convert_time' is already registered"
        in warnings
    )
    assert any(
        w.startswith(
            f"MCP server '{long}': tool 'get_current_time' is not served: '{long}__get_current_time' "
            "is not a valid tool name"
        )
        for w in warnings
    )


async def test_a_call_reads_text_and_is_checked_against_the_servers_schema_before_it_is_sent(
    closing: list[McpTools], tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    tools = await _serve({"time": {"command": TIME}, "probe": probe(ledger)})
    closing.append(tools)
    ctx = _ctx(tmp_path)
    done = await _run(tools, "time__get_current_time", '{"timezone": "Europe/Paris"}', ctx)
    assert done.status == "done" and '"timezone": "Europe/Paris"' in done.content

    bad = await _run(tools, "time__get_current_time", '{"timezone": 5}', ctx)
    assert (bad.status, bad.content) == (
        "error",
        "Error: invalid arguments for 'time__get_current_time': timezone: 5 is not of type 'string'",
    )
    missing = await _run(tools, "probe__wait", '{"second": 1}', ctx)
    assert missing.content == "Error: invalid arguments for 'probe__wait': 'seconds' is a required property"
    malformed = await _run(tools, "probe__wait", "{not json", ctx)
    assert malformed.content.startswith("Error: malformed arguments for 'probe__wait'")
    assert not ledger.exists()  # nothing that failed the schema reached the server

    refused = await _run(tools, "time__get_current_time", '{"timezone": "Mars/Olympus"}', ctx)
    assert refused.status == "error" and "Mars/Olympus" in refused.content


async def test_progress_beats_the_idempotency_key_travels_and_a_cancel_reaches_the_server(
    closing: list[McpTools], tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    tools = await _serve({"probe": probe(ledger)})
    closing.append(tools)
    beats: list[Any] = []
    done = await _run(tools, "probe__wait", '{"seconds": 0.4}', _ctx(tmp_path, beats, "call_a"))
    assert done.status == "done" and done.content.startswith("waited 0.4 s")
    assert beats == [
        ({"progress": 1.0, "total": 2.0, "message": "step 1"},),
        ({"progress": 2.0, "total": 2.0, "message": "step 2"},),
    ]
    assert ledger.read_text().splitlines() == ["start chat/1/call_a", "done chat/1/call_a"]
    assert IDEMPOTENCY_KEY_META == "turnkeeper/idempotencyKey"

    call = asyncio.create_task(_run(tools, "probe__wait", '{"seconds": 30}', _ctx(tmp_path, [], "call_b")))
    deadline = time.monotonic() + 10
    while "start chat/1/call_b" not in ledger.read_text() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    call.cancel()  # as Temporal cancels the activity on Stop or Dismiss
    with pytest.raises(asyncio.CancelledError):
        await call
    deadline = time.monotonic() + 5
    while "cancelled chat/1/call_b" not in ledger.read_text() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert ledger.read_text().splitlines()[2:] == ["start chat/1/call_b", "cancelled chat/1/call_b"]
    # The connection outlives the cancelled call.
    again = await _run(tools, "probe__wait", '{"seconds": 0.2}', _ctx(tmp_path, None, "call_c"))
    assert again.status == "done"


async def test_a_server_that_crashes_mid_call_is_reported_and_connected_again(
    closing: list[McpTools], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnkeeper.mcp")
    # The hook runs inside git_commit, as a child of the server: it kills the server mid-call.
    ran = tmp_path / "hook-ran.txt"
    repo = git_repo(tmp_path / "repo", hooks={"pre-commit": f"echo ran >> {ran}\nkill -9 $PPID\nsleep 5\n"})
    tools = await _serve({"git": {"command": GIT}})
    closing.append(tools)
    ctx = _ctx(tmp_path)
    crashed = await _run(tools, "git__git_commit", f'{{"repo_path": "{repo}", "message": "second"}}', ctx)
    assert crashed.status == "error"
    assert crashed.content == (
        "Error: MCP server 'git' went away during the call; the tool may have acted. "
        "Check its effect before calling it again."
    )
    assert ran.read_text() == "ran\n" and commits(repo) == ["first"]

    status = await _run(tools, "git__git_status", f'{{"repo_path": "{repo}"}}', ctx)
    assert status.status == "done" and "a.txt" in status.content
    messages = [r.getMessage() for r in caplog.records]
    assert "MCP server 'git' went away; it is connected again at its next call" in messages
    assert "MCP server 'git' connected again" in messages
    assert ran.read_text() == "ran\n"  # nothing was sent twice


def _http_everything(tmp_path: Path, port: int) -> subprocess.Popen[bytes]:
    entry = everything("streamableHttp")
    log_path = tmp_path / f"server-{time.monotonic_ns()}.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [entry["command"], *entry["args"]], env={**os.environ, "PORT": str(port)}, stdout=log, stderr=log
        )
    deadline = time.monotonic() + 20
    while b"listening on port" not in log_path.read_bytes():
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise AssertionError(log_path.read_text())
        time.sleep(0.1)
    return server


async def test_a_streamable_http_server_with_headers_from_the_environment_connected_again_after_it_went_away(
    closing: list[McpTools], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    server = _http_everything(tmp_path, port)
    try:
        monkeypatch.setenv("TK_MCP_TEST_TOKEN", "t0ken")
        tools = await _serve(
            {
                "web": {
                    "url": f"http://127.0.0.1:{port}/mcp",
                    "headers": {"Authorization": "Bearer ${TK_MCP_TEST_TOKEN}"},
                }
            }
        )
        closing.append(tools)
        assert "web__echo" in tools.names
        echo = '{"message": "over http"}'
        echoed = await _run(tools, "web__echo", echo, _ctx(tmp_path))
        assert (echoed.status, echoed.content) == ("done", "Echo: over http")

        server.kill()
        server.wait()
        lost = await _run(tools, "web__echo", echo, _ctx(tmp_path))
        assert lost.status == "error" and lost.content.startswith(
            ("Error: MCP server 'web' went away during the call", "Error: MCP server 'web' is not available")
        )
        server = _http_everything(tmp_path, port)
        again = await _run(tools, "web__echo", echo, _ctx(tmp_path))
        assert (again.status, again.content) == ("done", "Echo: over http")
    finally:
        server.kill()
        server.wait()


def test_what_the_model_reads_of_each_kind_of_content() -> None:
    result = types.CallToolResult(
        content=[
            types.TextContent(text="here"),
            types.ImageContent(data="aGVsbG8=", mime_type="image/png"),
            types.AudioContent(data="aGk=", mime_type="audio/wav"),
            types.ResourceLink(uri="file:///r.txt", name="r.txt"),
            types.EmbeddedResource(resource=types.TextResourceContents(uri="file:///t.txt", text="inline")),
            types.EmbeddedResource(
                resource=types.BlobResourceContents(
                    uri="file:///b.bin", blob="AAAA", mime_type="application/x"
                )
            ),
        ],
        structured_content={"ignored": "text came with it"},
    )
    assert render(result) == (
        "here\n[image: image/png, 5 bytes, not shown]\n[audio: audio/wav, 2 bytes, not shown]\n"
        "[resource link: file:///r.txt (r.txt)]\n[resource: file:///t.txt]\ninline\n"
        "[resource: file:///b.bin, application/x, 3 bytes, not shown]"
    )
    assert render(types.CallToolResult(content=[], structured_content={"t": 1})) == '{"t": 1}'
    assert (
        render(types.CallToolResult(content=[types.TextContent(text="boom")], is_error=True)) == "Error: boom"
    )
    assert render(types.CallToolResult(content=[], is_error=True)) == "Error: the tool reported an error"


async def test_images_and_structured_content_from_a_server(closing: list[McpTools], tmp_path: Path) -> None:
    tools = await _serve({"everything": everything()})
    closing.append(tools)
    image = await _run(tools, "everything__get-tiny-image", "{}", _ctx(tmp_path))
    assert (
        image.status == "done"
        and "[image: image/png, " in image.content
        and "bytes, not shown]" in image.content
    )
    assert len(image.content) < 300  # a reference, not the picture's bytes
    weather = await _run(
        tools, "everything__get-structured-content", '{"location": "Chicago"}', _ctx(tmp_path)
    )
    assert weather.status == "done" and '"temperature"' in weather.content
