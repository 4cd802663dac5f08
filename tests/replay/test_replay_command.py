"""`turnkeeper replay`, the deploy gate (docs/operations.md, "Before a deploy"): the
histories of real turns replay on this code, and fail on an incompatible one."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.incompatible_workflows import MessageFailingChatTurn
from tests.support import ROOT, Stack, until_async
from turnkeeper import client as tk
from turnkeeper import replay
from turnkeeper.models import TurnStatus
from turnkeeper.workflows.reconcile import Reconcile

TURNKEEPER = str(Path(sys.executable).parent / "turnkeeper")
# The CLI as installed, with the worker's ChatTurn swapped for an incompatible one.
_INCOMPATIBLE = """
import os, sys
from tests.incompatible_workflows import IncompatibleChatTurn
from turnkeeper import cli, replay
from turnkeeper.workflows.reconcile import Reconcile
replay.registered_workflows = lambda: [IncompatibleChatTurn, Reconcile]
os._exit(cli.run(sys.argv[1:]))
"""


async def run(stack: Stack, *command: str) -> subprocess.CompletedProcess[str]:
    proc = await asyncio.create_subprocess_exec(
        *command,
        env=stack.env(),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(command, proc.returncode, out.decode(), err.decode())


async def test_recent_histories_replay_and_an_incompatible_workflow_fails_the_gate(stack: Stack) -> None:
    # Each chat: a tool call, then a model call that fails: the turn waits at a gate.
    stack.script(
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}]},
            {"error": "the provider refused"},
        ]
    )
    await stack.start_worker()
    closed, waiting = stack.chat("closed"), stack.chat("waiting")
    for chat in (closed, waiting):
        await stack.send(chat, "write a.txt")
        await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
    state = await stack.state(closed)
    await stack.decide(closed, "dismiss", state.recovery_id)
    await stack.wait_turn_done(closed, 1)

    query = replay.visibility_query(
        replay.WORKFLOW_TYPES, stack.task_queue, datetime.now(UTC) - timedelta(hours=1)
    )

    async def listed() -> bool:  # visibility is eventually consistent
        runs = {(w.id, w.status.name) async for w in stack.client.list_workflows(query)}
        return {(tk.workflow_id(closed), "COMPLETED"), (tk.workflow_id(waiting), "RUNNING")} <= runs

    await until_async(listed, what="both runs are listed")

    passed = await run(stack, TURNKEEPER, "replay", "--since", "1h", "--json")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    summary = json.loads(passed.stdout)
    assert (
        summary["ok"] and summary["failures"] == [] and summary["replayed"] >= 2 and summary["running"] >= 1
    )
    text = await run(stack, TURNKEEPER, "replay", "--limit", "5")
    assert text.returncode == 0 and "all replay on this code" in text.stdout, text.stdout + text.stderr

    failed = await run(stack, sys.executable, "-c", _INCOMPATIBLE, "replay", "--since", "1h")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    lines = failed.stdout.splitlines()
    for chat, status in ((closed, "closed"), (waiting, "running")):
        [line] = [x for x in lines if f"does not replay: {tk.workflow_id(chat)} run " in x]
        assert f"(ChatTurn, {status}): " in line and "Nondeterminism" in line, line
    assert "do not replay on this code" in lines[-1] and "deployment version" in lines[-1], lines[-1]

    usage = await run(stack, TURNKEEPER, "replay", "--since", "soon")
    assert usage.returncode == 2 and "--since: must be a number and a unit" in usage.stderr, usage.stderr


async def test_a_running_turn_whose_next_task_fails_on_this_code_fails_the_gate(stack: Stack) -> None:
    """A message sent while no worker serves the turn waits in the task after the
    history's last completed one: the first the new code takes. The SDK's replayer
    runs that task but reports no failure in it; the gate does."""
    stack.script([{"error": "the provider refused"}])
    await stack.start_worker()
    chat = stack.chat("waiting")
    await stack.send(chat, "hello")
    await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
    await stack.stop_workers()
    await stack.send(chat, "are you there?")  # acknowledged; its workflow task waits for a worker
    settings, since = stack.settings(), timedelta(hours=1)
    query = replay.visibility_query(replay.WORKFLOW_TYPES, stack.task_queue, datetime.now(UTC) - since)

    async def listed() -> bool:  # visibility is eventually consistent
        runs = {(w.id, w.status.name) async for w in stack.client.list_workflows(query)}
        return (tk.workflow_id(chat), "RUNNING") in runs

    await until_async(listed, what="the waiting run is listed")
    ok = await replay.replay_recent(stack.client, settings, limit=20, since=since)
    assert ok.ok, ok.failures
    failed = await replay.replay_recent(
        stack.client, settings, limit=20, since=since, workflows=[MessageFailingChatTurn, Reconcile]
    )
    [failure] = failed.failures
    assert (failure.workflow_id, failure.running) == (tk.workflow_id(chat), True)
    assert failure.error == "its next workflow task fails: this code cannot take the message", failure.error
