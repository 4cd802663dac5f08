"""Crash tests: real worker processes, killed with SIGKILL mid-tool."""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from tests.support import Stack, until
from tests.unit.test_exec_sandbox import host_sleeps, sleep_marker
from turnkeeper import client as tk
from turnkeeper.activities.heartbeat import beat_interval
from turnkeeper.models import INTERRUPTED_TOOL_TEXT, ToolCallStatus, TurnStatus

pytestmark = pytest.mark.crash


async def _wait_for_line(path, word: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and word in path.read_text():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never got {word!r}")


def _slow_write(stack: Stack, path: str, seconds: int, answer: str) -> Path:
    """Workers get `slow_write`, logging to a ledger; the model asks for it once, then
    answers `answer`. Returns the ledger."""
    ledger = stack.dir / "ledger.txt"
    stack.env_extra.update(
        {
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
            "TURNKEEPER_TOOLS": "slow_write",
            "TK_LEDGER": str(ledger),
        }
    )
    stack.script(
        [
            {
                "tool_calls": [
                    {"name": "slow_write", "arguments": {"path": path, "content": "x", "seconds": seconds}}
                ]
            },
            {"text": answer},
        ]
    )
    return ledger


async def test_sigkill_mid_write_tool_never_runs_it_again(stack: Stack) -> None:
    tool_s = 6
    ledger = _slow_write(stack, "k.txt", tool_s, "I could not confirm the write; please check k.txt")
    first = stack.spawn_worker()
    chat = stack.chat("crash")
    await stack.send(chat, "write k.txt slowly")
    await _wait_for_line(ledger, "start")
    started = time.monotonic()
    stack.kill(first)  # SIGKILL while the tool is acting
    stack.spawn_worker()

    state = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER, timeout=45)
    assert state.reason.value == "tool_state_unknown" and state.can_continue
    assert [c.status for c in state.tool_calls] == [ToolCallStatus.INTERRUPTED]
    hist = await stack.history(chat)
    assert hist[-1] == {
        "role": "tool",
        "content": INTERRUPTED_TOOL_TEXT,
        "tool_call_id": hist[1]["tool_calls"][0]["id"],
        "name": "slow_write",
    }
    # Past the time the tool would have taken, with 2 s to spare: nobody re-ran it.
    await asyncio.sleep(started + tool_s + 2 - time.monotonic())
    assert ledger.read_text().split("\n")[:-1] == [f"start {chat}/1/{hist[1]['tool_calls'][0]['id']}"]

    resumed = await stack.decide(chat, "continue", state.recovery_id)
    assert resumed.status == TurnStatus.RESUMING and resumed.attempts == 1
    final = await stack.wait_turn_done(chat, 1, timeout=30)
    assert final.status == TurnStatus.RECOVERED and final.reason.value == "continued"
    assert ledger.read_text().count("start") == 1 and "done" not in ledger.read_text()
    assert not (stack.ws / "k.txt").exists()
    assert (await stack.history(chat))[-1]["content"].startswith("I could not confirm")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the exec guard needs Linux")
@pytest.mark.parametrize("sandbox", ["auto", "off"])
async def test_sigkill_mid_exec_kills_the_command_with_the_worker(stack: Stack, sandbox: str) -> None:
    """In the sandbox a command's pids are its own namespace's: its processes are
    looked for on the host's process list, by a `sleep` argument no other has."""
    stack.env_extra.update({"TURNKEEPER_TOOLS": "exec", "TURNKEEPER_EXEC_SANDBOX": sandbox})
    escaped, waited = sleep_marker(4), sleep_marker(4)
    stack.script(
        [
            {
                "tool_calls": [
                    {
                        "name": "exec",
                        "arguments": {
                            # The setsid'ed part leaves the process group, as a daemon would.
                            "command": f"setsid sh -c 'sleep {escaped}; echo late >> after.txt' </dev/null >/dev/null 2>&1 & "
                            f"sleep {waited} & wait; echo late >> after.txt"
                        },
                    }
                ]
            },
            {"text": "the command was interrupted"},
        ]
    )
    worker = stack.spawn_worker()
    chat = stack.chat("exec-crash")
    await stack.send(chat, "run the slow command")
    await until(lambda: bool(host_sleeps(escaped) and host_sleeps(waited)), what="the command to start")
    started = time.monotonic()
    stack.kill(worker)

    # What the command started dies with the worker, not when the command would have ended.
    await until(
        lambda: not host_sleeps(escaped) and not host_sleeps(waited),
        timeout=2,
        what="the command to die with its worker",
    )
    stack.spawn_worker()
    state = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER, timeout=45)
    assert state.reason.value == "tool_state_unknown"
    await asyncio.sleep(max(0.0, started + 5 - time.monotonic()))  # past the command's own end
    assert not (stack.ws / "after.txt").exists()


async def test_every_heartbeat_reaches_the_server_and_a_kill_after_one_is_noticed_within_the_timeout(
    stack: Stack,
) -> None:
    """A SIGKILL just after a beat is the worst point of the heartbeat cycle: the
    server notices it up to timeout + 1 s - one beat later (it re-arms its timer
    no sooner than 1 s after the last one fired), 2.33 s by default. That needs
    every beat to reach the server when it is made, not held back by the SDK's
    throttle."""
    timeout = stack.settings().heartbeat_timeout
    every = beat_interval(timedelta(seconds=timeout)).total_seconds()
    worst = timeout + 1 - every
    assert worst + 0.15 <= 2.5, "by default a SIGKILL must show as awaiting_user within 2.5 s"
    ledger = _slow_write(stack, "h.txt", 20, "unused")
    victim = stack.spawn_worker()
    chat = stack.chat("beats")
    await stack.send(chat, "write h.txt slowly")
    await _wait_for_line(ledger, "start")
    spare = stack.spawn_worker()
    await stack.wait_serving(spare)
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))

    async def last_beat() -> float | None:
        for act in (await handle.describe()).raw_description.pending_activities:
            if act.HasField("last_heartbeat_time"):
                return act.last_heartbeat_time.ToNanoseconds() / 1e9
        return None

    beats: list[float] = []
    deadline = time.monotonic() + 6 * every + 2
    while len(beats) < 6 and time.monotonic() < deadline:
        beat = await last_beat()
        if beat is not None and (not beats or beat != beats[-1]):
            beats.append(beat)
        await asyncio.sleep(0.02)
    killed_at = time.time()
    stack.kill(victim)  # just after a beat: the worst point of the cycle
    gaps = [b - a for a, b in zip(beats, beats[1:], strict=False)]
    assert len(beats) == 6, f"the server saw {len(beats)} heartbeats in {6 * every + 2:.1f} s"
    assert max(gaps) < 1.6 * every, f"heartbeats reached the server {gaps} s apart; they go every {every} s"

    # Read from the history, not a `state` query: this test is about the server's
    # timer, and a query waits on the worker that replays the run.
    timed_out = None
    deadline = time.monotonic() + 30
    while timed_out is None and time.monotonic() < deadline:
        history = await handle.fetch_history()
        timed_out = next(
            (e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT), None
        )
        await asyncio.sleep(0.1)
    assert timed_out is not None, "the killed worker's step never timed out"
    noticed = timed_out.event_time.ToNanoseconds() / 1e9 - killed_at
    assert noticed < worst + 0.25, f"the kill was noticed {noticed:.2f} s later; at worst {worst:.2f} s"
