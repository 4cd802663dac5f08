"""Tools from MCP servers in real turns (an in-process worker with
TURNKEEPER_MCP_SERVERS, the scripted model, the real servers): each call is one
tool activity with the built-in tools' promises. A worker SIGKILLed mid-call:
tests/process/test_mcp_crash.py."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType

from tests.mcp_servers import GIT, TIME, commits, git_repo, probe, write_config
from tests.support import Stack, until
from turnkeeper import client as tk
from turnkeeper.models import Reason, ToolCallStatus, TurnStatus


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def _serve(stack: Stack, servers: dict[str, dict[str, Any]], **env: str) -> None:
    stack.env_extra.update(
        {"TURNKEEPER_MCP_SERVERS": str(write_config(stack.dir / "mcp.json", servers)), **env}
    )


async def _tool_summaries(stack: Stack, chat: str) -> list[str]:
    """The summaries the Temporal UI shows for the turn's tool activities."""
    history = await stack.client.get_workflow_handle(tk.workflow_id(chat)).fetch_history()
    converter = stack.client.data_converter.payload_converter
    return [
        converter.from_payload(e.user_metadata.summary, str)
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "turnkeeper.tool_call"
    ]


async def test_a_read_call_runs_in_a_turn_beside_the_built_in_tools(stack: Stack) -> None:
    _serve(stack, {"time": {"command": TIME}, "missing": {"command": str(stack.dir / "no-such-server")}})
    stack.script(
        [
            {
                "tool_calls": [
                    _call("time__get_current_time", timezone="Asia/Tokyo"),
                    _call("write_file", path="note.txt", content="built-in"),
                ]
            },
            {"text": "it is late in Tokyo"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat("mcp-read")
    await stack.send(chat, "what time is it in Tokyo?")
    done = await stack.wait_turn_done(chat, 1)
    assert done.status == TurnStatus.COMPLETED
    assert [(c.name, c.status) for c in done.tool_calls] == [
        ("time__get_current_time", ToolCallStatus.DONE),
        ("write_file", ToolCallStatus.DONE),
    ]
    hist = await stack.history(chat)
    tool_row = next(m for m in hist if m.get("name") == "time__get_current_time")
    assert json.loads(tool_row["content"])["timezone"] == "Asia/Tokyo"
    assert (stack.ws / "note.txt").read_text() == "built-in"
    assert hist[-1]["content"] == "it is late in Tokyo"
    assert sorted(await _tool_summaries(stack, chat)) == [
        'time__get_current_time({"timezone": "Asia/Tokyo"})',
        'write_file({"path": "note.txt", "content": "built-in"})',
    ]


async def test_the_worker_logs_a_server_that_does_not_start_once_and_serves_the_rest(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    missing = stack.dir / "no-such-server"
    _serve(stack, {"missing": {"command": str(missing)}, "time": {"command": TIME}})
    stack.script([{"tool_calls": [_call("missing__anything")]}, {"text": "that tool is not here"}])
    await stack.start_worker()
    chat = stack.chat("mcp-missing")
    await stack.send(chat, "use the missing server")
    done = await stack.wait_turn_done(chat, 1)
    assert done.status == TurnStatus.COMPLETED
    hist = await stack.history(chat)
    assert hist[2]["content"].startswith("Error: unknown tool 'missing__anything'. Available tools: ")
    assert "time__get_current_time" in hist[2]["content"]
    lines = [r.getMessage() for r in caplog.records if r.name == "turnkeeper.mcp"]
    assert (
        lines.count(
            f"MCP server 'missing' (stdio) did not start; its tools are not served: no such command or directory: {missing}"
        )
        == 1
    )
    serving = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("worker serving"))
    assert "time__get_current_time,time__convert_time" in serving


async def test_arguments_that_fail_the_schema_reach_the_model_as_an_error_and_the_turn_goes_on(
    stack: Stack,
) -> None:
    _serve(stack, {"time": {"command": TIME}})
    stack.script(
        [
            {"tool_calls": [_call("time__get_current_time", timezone=9)]},
            {"tool_calls": [_call("time__get_current_time", timezone="Etc/UTC")]},
            {"text": "fixed my arguments"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat("mcp-schema")
    await stack.send(chat, "time please")
    done = await stack.wait_turn_done(chat, 1)
    assert done.status == TurnStatus.COMPLETED
    assert [c.status for c in done.tool_calls] == [ToolCallStatus.ERROR, ToolCallStatus.DONE]
    tools = [m["content"] for m in await stack.history(chat) if m["role"] == "tool"]
    assert (
        tools[0]
        == "Error: invalid arguments for 'time__get_current_time': timezone: 9 is not of type 'string'"
    )
    assert json.loads(tools[1])["timezone"] == "Etc/UTC"


async def test_a_destructive_tool_waits_for_approval_and_runs_once_approved(stack: Stack) -> None:
    repo = git_repo(stack.ws / "repo")
    _serve(stack, {"git": {"command": GIT}})
    stack.script(
        [
            {"tool_calls": [_call("git__git_reset", repo_path=str(repo))]},
            {"text": "unstaged"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat("mcp-approve")
    await stack.send(chat, "unstage everything")
    gate = await stack.wait_state(
        chat, lambda s: s.status == TurnStatus.AWAITING_USER and s.reason == Reason.APPROVAL_REQUIRED
    )
    assert [(a.name, a.arguments) for a in gate.approvals] == [
        ("git__git_reset", json.dumps({"repo_path": str(repo)}))
    ]
    staged = ["git", "diff", "--cached", "--name-only"]
    assert subprocess.run(staged, cwd=repo, capture_output=True, text=True).stdout == "a.txt\n"

    await stack.decide(chat, "continue", gate.recovery_id)
    done = await stack.wait_turn_done(chat, 1)
    assert done.status == TurnStatus.COMPLETED and [c.status for c in done.tool_calls] == [
        ToolCallStatus.DONE
    ]
    assert subprocess.run(staged, cwd=repo, capture_output=True, text=True).stdout == ""
    assert [m["content"] for m in await stack.history(chat) if m["role"] == "tool"] == [
        "All staged changes reset"
    ]


async def test_a_huge_result_is_capped_like_any_tools(stack: Stack) -> None:
    repo = git_repo(stack.ws / "repo")
    (repo / "a.txt").write_text("".join(f"line {n}\n" for n in range(20_000)))
    _serve(stack, {"git": {"command": GIT}}, TURNKEEPER_MAX_TOOL_OUTPUT_BYTES="2048")
    stack.script(
        [{"tool_calls": [_call("git__git_diff_unstaged", repo_path=str(repo))]}, {"text": "a big diff"}]
    )
    await stack.start_worker()
    chat = stack.chat("mcp-huge")
    await stack.send(chat, "show the diff")
    await stack.wait_turn_done(chat, 1)
    (row,) = [m["content"] for m in await stack.history(chat) if m["role"] == "tool"]
    head, note = row.rsplit("\n", 1)
    assert len(head.encode()) <= 2048 and head.startswith("Unstaged changes:")
    assert note.startswith("[output truncated: ") and note.endswith(" bytes shown]")
    assert int(note.split(" of ")[1].split()[0]) > 200_000


async def test_a_server_that_crashes_mid_call_gives_the_model_an_error_and_is_connected_again(
    stack: Stack,
) -> None:
    ran = stack.dir / "hook-ran.txt"
    repo = git_repo(stack.ws / "repo", hooks={"pre-commit": f"echo ran >> {ran}\nkill -9 $PPID\n"})
    _serve(stack, {"git": {"command": GIT}})
    stack.script(
        [
            {"tool_calls": [_call("git__git_commit", repo_path=str(repo), message="second")]},
            {"tool_calls": [_call("git__git_status", repo_path=str(repo))]},
            {"text": "the server died during the commit; nothing was committed"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat("mcp-server-crash")
    await stack.send(chat, "commit")
    done = await stack.wait_turn_done(chat, 1)
    assert done.status == TurnStatus.COMPLETED
    assert [c.status for c in done.tool_calls] == [ToolCallStatus.ERROR, ToolCallStatus.DONE]
    tools = [m["content"] for m in await stack.history(chat) if m["role"] == "tool"]
    assert tools[0] == (
        "Error: MCP server 'git' went away during the call; the tool may have acted. "
        "Check its effect before calling it again."
    )
    assert "a.txt" in tools[1]  # a new server process answered
    assert ran.read_text() == "ran\n" and commits(repo) == ["first"]


async def test_stop_cancels_a_running_call_with_the_protocols_notification(stack: Stack) -> None:
    ledger = stack.dir / "probe.txt"
    _serve(stack, {"probe": probe(ledger)})
    stack.script([{"tool_calls": [_call("probe__wait", seconds=60)]}])
    await stack.start_worker()
    chat = stack.chat("mcp-stop")
    handle = await stack.send(chat, "wait a minute")
    await until(
        lambda: ledger.exists() and "start" in ledger.read_text(), what="the call to reach the server"
    )
    await stack.decide(chat, "stop")
    stopped = await asyncio.wait_for(handle.result(), 30)
    assert (stopped.status, stopped.reason) == (TurnStatus.RECOVERED, Reason.STOPPED)
    await until(lambda: "cancelled" in ledger.read_text(), timeout=10, what="the server to see the cancel")
    key = f"{chat}/1/call_0_0"
    assert ledger.read_text().splitlines() == [f"start {key}", f"cancelled {key}"]
    assert [c.status for c in stopped.tool_calls] == [ToolCallStatus.INTERRUPTED]
    (row,) = [m["content"] for m in await stack.history(chat) if m["role"] == "tool"]
    assert "interrupted" in row
