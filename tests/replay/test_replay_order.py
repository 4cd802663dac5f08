"""A lost step and a user's input handled in one workflow task, after the worker
that held the turn died: the run must replay as it ran, whichever order the
SDK applies the two in."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.support import Stack, until, until_async
from turnkeeper import client as tk
from turnkeeper.models import Reason, RecoveryAction, TurnStatus
from turnkeeper.workflows.chat_turn import ChatTurn

pytestmark = pytest.mark.crash

SLOW_TOOL = {
    "tool_calls": [{"name": "slow_write", "arguments": {"path": "k.txt", "content": "x", "seconds": 30}}]
}


def _slow_tool(stack: Stack, script: list[dict]) -> Path:
    ledger = stack.dir / "ledger.txt"
    stack.env_extra.update(
        {
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
            "TURNKEEPER_TOOLS": "slow_write",
            "TK_LEDGER": str(ledger),
        }
    )
    stack.script(script)
    return ledger


async def _kill_the_worker_running_the_tool(stack: Stack, name: str) -> tuple[str, Any]:
    """Two workers; a turn whose slow tool runs on one of them, which is SIGKILLed."""
    ledger = _slow_tool(stack, [SLOW_TOOL, {"text": "done"}, {"text": "done again"}])
    first = stack.spawn_worker()
    second = stack.spawn_worker()
    await stack.wait_serving(first, second)
    chat = stack.chat(name)
    await stack.send(chat, "write slowly")
    await until(lambda: ledger.exists() and "start" in ledger.read_text(), 60, "the tool to start")
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
    desc = await handle.describe()
    running_on = desc.raw_description.pending_activities[0].last_worker_identity
    stack.kill(first if running_on.startswith(f"{first.pid}@") else second)
    return chat, handle


async def _turn_1_is(stack: Stack, chat: str, status: TurnStatus, reason: Reason) -> None:
    """The store's row of turn 1 reaches `status`/`reason` (a newer message's turn may follow)."""
    store = await stack.store()

    async def reached() -> bool:
        record = await store.get_turn(chat, 1)
        return record is not None and (record.status, record.reason) == (status, reason)

    await until_async(reached, timeout=60, what=f"turn 1 {status.value}/{reason.value}")


async def _replays(stack: Stack, chat: str) -> list[str]:
    failures = []
    replayer = Replayer(workflows=[ChatTurn], data_converter=pydantic_data_converter)
    async for wf in stack.client.list_workflows(f"WorkflowId='{tk.workflow_id(chat)}'"):
        history = await stack.client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if os.environ.get("TK_DEBUG_HISTORY"):
            for e in history.events:
                print(e.event_id, e.WhichOneof("attributes"))
        if result.replay_failure is not None:
            failures.append(f"{wf.run_id}: {result.replay_failure!r}")
    return failures


@pytest.mark.parametrize("action", ["stop", "message", "dismiss-stale"])
async def test_input_and_loss_in_one_task_replay(stack: Stack, action: str) -> None:
    ledger = _slow_tool(stack, [SLOW_TOOL, {"text": "done"}, {"text": "done again"}])
    first = stack.spawn_worker()
    chat = stack.chat("order")
    await stack.send(chat, "write slowly")
    await until(lambda: ledger.exists() and "start" in ledger.read_text(), 60, "the tool to start")
    stack.kill(first)
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
    await asyncio.sleep(5)  # past a lost step's detection (at most 2.4 s) and the sticky timeout (1 s)
    if action == "stop":
        await handle.signal("stop", {})
    elif action == "message":
        await stack.send(chat, "a newer message")
    else:
        await handle.signal("dismiss", RecoveryAction(recovery_id="made-up"))
    stack.spawn_worker()
    # The loss is taken first, then the input, while the gate is being written: Stop
    # ends the turn, a newer message waits behind the gate, a stale Dismiss is refused.
    if action == "stop":
        await _turn_1_is(stack, chat, TurnStatus.RECOVERED, Reason.STOPPED)
    else:
        gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER, timeout=60)
        assert gate.reason == Reason.TOOL_STATE_UNKNOWN
        assert len(gate.pending_followups) == (1 if action == "message" else 0)
    await asyncio.sleep(1)
    assert await _replays(stack, chat) == []


@pytest.mark.parametrize("action", ["dismiss", "message"])
async def test_input_and_lost_continuation_in_one_task_replay(stack: Stack, action: str) -> None:
    """As above, for a step of a continued turn: the input meets a `resuming` turn."""
    ledger = _slow_tool(stack, [SLOW_TOOL, SLOW_TOOL, {"text": "done"}, {"text": "done again"}])
    first = stack.spawn_worker()
    chat = stack.chat("order")
    await stack.send(chat, "write slowly")
    await until(lambda: ledger.exists() and ledger.read_text().count("start") == 1, 60, "the tool to start")
    stack.kill(first)
    second = stack.spawn_worker()
    gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER, timeout=60)
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
    await stack.decide(chat, "continue", gate.recovery_id)
    await until(lambda: ledger.read_text().count("start") == 2, 60, "the continued tool to start")
    stack.kill(second)
    await asyncio.sleep(5)  # past a lost step's detection and the sticky timeout
    if action == "dismiss":
        await handle.signal("dismiss", RecoveryAction(recovery_id=gate.recovery_id))
    else:
        await stack.send(chat, "a newer message")
    stack.spawn_worker()
    await _turn_1_is(
        stack, chat, TurnStatus.RECOVERED, Reason.DISMISSED if action == "dismiss" else Reason.SUPERSEDED
    )
    await asyncio.sleep(1)
    assert await _replays(stack, chat) == []


@pytest.mark.parametrize("signal", ["dismiss", "stop", "message"])
async def test_a_signal_during_a_store_call_replays(stack: Stack, signal: str) -> None:
    """A signal reaches the server while the run's first model call waits on the store
    (which numbers the turn there). Whatever it did, every message is answered once."""
    import sqlite3

    stack.script([{"text": "hello"}, {"text": "again"}])
    await stack.start_worker()
    warm = stack.chat("warm")
    await (await stack.send(warm, "warm up")).result()
    chat = stack.chat("la")
    blocker = sqlite3.connect(stack.data / "sessions.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    handle = await stack.send(chat, "one")
    await asyncio.sleep(0.3)
    if signal == "dismiss":
        await handle.signal("dismiss", RecoveryAction(recovery_id="made-up"))
    elif signal == "stop":
        await handle.signal("stop", {})
    else:
        await stack.send(chat, "two")
    await asyncio.sleep(0.2)
    blocker.execute("ROLLBACK")
    blocker.close()
    sent = ["one", "two"] if signal == "message" else ["one"]

    async def answered() -> bool:
        rows = await stack.history(chat)
        return [r["role"] for r in rows] == ["user", "assistant"] * len(sent) and [
            r["content"] for r in rows if r["role"] == "user"
        ] == sent

    await until_async(answered, what="every message answered once")
    await stack.wait_state(
        chat, lambda s: s.status not in (TurnStatus.RUNNING, TurnStatus.RESUMING), timeout=60
    )
    if signal == "dismiss":  # nothing waited for a decision: refused, in words
        assert "recovery_action_rejected" in await stack.event_types(chat)
    await asyncio.sleep(2)
    assert await _replays(stack, chat) == []


async def _until_event(handle, attribute: str, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        history = await handle.fetch_history()
        if any(e.HasField(attribute) for e in history.events):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {attribute} in {timeout} s")


@pytest.mark.parametrize("action", ["stop", "message", "dismiss-stale"])
async def test_a_signal_while_the_lost_steps_task_waits_for_a_dead_worker_replays(
    stack: Stack, action: str
) -> None:
    """The step is lost, its workflow task goes to the dead worker's sticky queue, and
    the signal lands before that task times out there: one task takes both."""
    ledger = _slow_tool(stack, [SLOW_TOOL, {"text": "done"}, {"text": "done again"}])
    first = stack.spawn_worker()
    chat = stack.chat("sticky")
    await stack.send(chat, "write slowly")
    await until(lambda: ledger.exists() and "start" in ledger.read_text(), 60, "the tool to start")
    stack.kill(first)
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
    await _until_event(handle, "activity_task_timed_out_event_attributes")
    if action == "stop":
        await handle.signal("stop", {})
    elif action == "message":
        await stack.send(chat, "a newer message")
    else:
        await handle.signal("dismiss", RecoveryAction(recovery_id="made-up"))
    await asyncio.sleep(1.5)  # past the sticky queue's timeout: the task goes to the shared queue
    stack.spawn_worker()
    await stack.wait_state(
        chat, lambda s: s.status not in (TurnStatus.RUNNING, TurnStatus.RESUMING), timeout=60
    )
    await asyncio.sleep(1)
    assert await _replays(stack, chat) == []


@pytest.mark.parametrize("action", ["stop", "message"])
async def test_a_signal_after_a_query_cached_the_run_on_the_next_worker_replays(
    stack: Stack, action: str
) -> None:
    """As above, and the next worker has the run in its cache from a `state` query it
    answered before the step was lost: it applies the new events from there."""
    chat, handle = await _kill_the_worker_running_the_tool(stack, "cached")
    with contextlib.suppress(Exception):  # may time out on the dead worker's queue: then no cache
        await stack.state(chat)  # answered by the other worker, which caches the run
    await _until_event(handle, "activity_task_timed_out_event_attributes")
    if action == "stop":
        await handle.signal("stop", {})
    else:
        await stack.send(chat, "a newer message")
    await stack.wait_state(
        chat, lambda s: s.status not in (TurnStatus.RUNNING, TurnStatus.RESUMING), timeout=60
    )
    await asyncio.sleep(1)
    assert await _replays(stack, chat) == []


async def test_a_decision_on_the_gate_a_query_showed_before_its_task_ran_replays(stack: Stack) -> None:
    """The step is lost and its task waits on the dead worker's sticky queue; a `state`
    query on the other worker already shows the gate, and the user dismisses it."""
    chat, handle = await _kill_the_worker_running_the_tool(stack, "shown")
    await _until_event(handle, "activity_task_timed_out_event_attributes")
    try:
        shown = await stack.state(chat)
    except Exception:
        shown = None
    await handle.signal("dismiss", RecoveryAction(recovery_id=(shown and shown.recovery_id) or "none"))
    await stack.wait_state(
        chat, lambda s: s.status not in (TurnStatus.RUNNING, TurnStatus.RESUMING), timeout=60
    )
    await asyncio.sleep(1)
    assert await _replays(stack, chat) == []
