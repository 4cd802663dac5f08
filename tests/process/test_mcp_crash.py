"""A worker SIGKILLed while an MCP server's `write` tool acts: the turn waits at
`tool_state_unknown` like any tool's, and Continue never sends the call again."""

from __future__ import annotations

import asyncio

import pytest

from tests.mcp_servers import GIT, commits, git_repo, write_config
from tests.process.test_crash import _wait_for_line
from tests.support import Stack
from turnkeeper.models import INTERRUPTED_TOOL_TEXT, Reason, ToolCallStatus, TurnStatus

pytestmark = pytest.mark.crash

HOOK_SECONDS = 6


async def test_sigkill_mid_mcp_commit_never_sends_it_again(stack: Stack) -> None:
    # The repository's pre-commit hook runs inside git_commit: it notes each run, then
    # holds the commit long enough for the worker to be killed mid-call.
    ran = stack.dir / "hook-ran.txt"
    repo = git_repo(stack.ws / "repo", hooks={"pre-commit": f"echo ran >> {ran}\nsleep {HOOK_SECONDS}\n"})
    config = write_config(stack.dir / "mcp.json", {"git": {"command": GIT}})
    stack.env_extra["TURNKEEPER_MCP_SERVERS"] = str(config)
    stack.script(
        [
            {
                "tool_calls": [
                    {"name": "git__git_commit", "arguments": {"repo_path": str(repo), "message": "second"}}
                ]
            },
            {"text": "the commit may or may not have landed; check git log"},
        ]
    )
    first = stack.spawn_worker()
    chat = stack.chat("mcp-crash")
    await stack.send(chat, "commit the staged change")
    await _wait_for_line(ran, "ran")
    stack.kill(first)  # SIGKILL while the server commits
    stack.spawn_worker()

    gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER, timeout=45)
    assert gate.reason == Reason.TOOL_STATE_UNKNOWN and gate.can_continue
    assert [(c.name, c.status) for c in gate.tool_calls] == [("git__git_commit", ToolCallStatus.INTERRUPTED)]
    await asyncio.sleep(HOOK_SECONDS + 2)  # past the hook's end: nobody sent the call again
    assert ran.read_text() == "ran\n"

    await stack.decide(chat, "continue", gate.recovery_id)
    final = await stack.wait_turn_done(chat, 1, timeout=30)
    assert (final.status, final.reason) == (TurnStatus.RECOVERED, Reason.CONTINUED)
    hist = await stack.history(chat)
    assert [m["content"] for m in hist if m["role"] == "tool"] == [INTERRUPTED_TOOL_TEXT]
    assert hist[-1]["content"].startswith("the commit may or may not have landed")
    assert ran.read_text() == "ran\n"
    # Whether the orphaned server finished the commit is its own affair; twice it never is.
    assert commits(repo).count("second") <= 1 and commits(repo)[-1] == "first"
