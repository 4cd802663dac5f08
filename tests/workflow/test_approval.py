"""Tools that ask first: a call of a `confirm` tool waits at an approval gate
(`awaiting_user/approval_required`) before its activity is scheduled. Approve,
deny, a newer message, a gate handed on, and worker processes SIGKILLed while it
waits, on a real dev server with the scripted model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from tests.support import Stack, until_async
from turnkeeper import activity_io
from turnkeeper import client as tk
from turnkeeper.activities.tool_call import NOT_APPROVED_TEXT, ToolCallActivity
from turnkeeper.activities.tools import ToolRegistry, default_registry, load_tool_modules
from turnkeeper.config import Settings
from turnkeeper.models import (
    DENIED_TOOL_TEXT,
    DENIED_TURN_TEXT,
    DISMISSED_TEXT,
    SUPERSEDED_TEXT,
    UNAPPROVED_TOOL_TEXT,
    Reason,
    ToolCall,
    ToolCallStatus,
    TurnState,
    TurnStatus,
)
from turnkeeper.store import SQLiteStore


def _call(name: str, **arguments: object) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def _tools(stack: Stack, ledger: Path) -> None:
    stack.env_extra.update(
        {
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
            "TURNKEEPER_TOOLS": "guarded_write,write_file,list_dir",
            "TK_LEDGER": str(ledger),
        }
    )


def _asks(s: TurnState) -> bool:
    return s.status == TurnStatus.AWAITING_USER and s.reason == Reason.APPROVAL_REQUIRED


def _starts(ledger: Path) -> list[str]:
    return (
        [line for line in ledger.read_text().splitlines() if line.startswith("start")]
        if ledger.exists()
        else []
    )


async def test_approve_runs_the_waiting_calls_once_and_the_others_at_once(stack: Stack) -> None:
    ledger = stack.ws / "ledger.txt"  # where the tool writes it in-process too
    _tools(stack, ledger)
    stack.script(
        [
            {
                "tool_calls": [
                    _call("guarded_write", path="g.txt", content="approved"),
                    _call("write_file", path="free.txt", content="free"),
                ]
            },
            {"text": "both written"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat("approve")
    await stack.send(chat, "write both")
    gate = await stack.wait_state(chat, _asks)
    assert gate.can_continue and gate.recovery_id and gate.attempts == 0
    assert [(a.id, a.name, a.arguments, a.idempotency_key) for a in gate.approvals] == [
        ("call_0_0", "guarded_write", '{"path": "g.txt", "content": "approved"}', f"{chat}/1/call_0_0")
    ]
    # The call that needs no approval has run; the other is not even scheduled.
    assert (stack.ws / "free.txt").read_text() == "free" and not (stack.ws / "g.txt").exists()
    assert {c.id: c.status for c in gate.tool_calls} == {
        "call_0_0": ToolCallStatus.PENDING,
        "call_0_1": ToolCallStatus.DONE,
    }
    await asyncio.sleep(0.5)
    assert _starts(ledger) == []
    record = await (await stack.store()).get_turn(chat, 1)
    assert (record.status, record.reason) == (TurnStatus.AWAITING_USER, Reason.APPROVAL_REQUIRED)

    approved = await stack.decide(chat, "continue", gate.recovery_id)
    assert (approved.status, approved.reason, approved.approvals) == (TurnStatus.RUNNING, None, [])
    with pytest.raises(tk.DecisionRefused, match="not waiting for confirmation"):
        await stack.decide(chat, "continue", gate.recovery_id)
    done = await stack.wait_turn_done(chat, 1)
    assert (done.status, done.reason, done.attempts) == (TurnStatus.COMPLETED, None, 0)
    assert (stack.ws / "g.txt").read_text() == "approved"
    assert _starts(ledger) == [f"start {chat}/1/call_0_0"]
    hist = await stack.history(chat)
    assert [m["role"] for m in hist] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [m.get("tool_call_id") for m in hist[2:4]] == ["call_0_1", "call_0_0"]
    assert hist[-1]["content"] == "both written"


async def test_deny_answers_each_waiting_call_and_ends_the_turn_without_model_work(stack: Stack) -> None:
    ledger = stack.ws / "ledger.txt"  # where the tool writes it in-process too
    _tools(stack, ledger)
    stack.script(
        [
            {
                "tool_calls": [
                    _call("guarded_write", path="a.txt", content="a"),
                    _call("guarded_write", path="b.txt", content="b"),
                ]
            },
            # No second item: a model call after Deny would fail the turn (model_failed).
        ]
    )
    await stack.start_worker()
    chat = stack.chat("deny")
    await stack.send(chat, "write two", message_id="m1")
    gate = await stack.wait_state(chat, _asks)
    assert [a.name for a in gate.approvals] == ["guarded_write", "guarded_write"]
    # A Dismiss sent as a signal is judged where the turn waits, like any gate's.
    await stack.client.get_workflow_handle(tk.workflow_id(chat)).signal(
        "dismiss", {"recovery_id": gate.recovery_id}
    )
    done = await stack.wait_turn_done(chat, 1)
    assert (done.status, done.reason, done.approvals) == (TurnStatus.RECOVERED, Reason.DISMISSED, [])
    assert [c.status for c in done.tool_calls] == [ToolCallStatus.ERROR, ToolCallStatus.ERROR]

    async def stored() -> bool:  # `state` shows the ending before the store has written it
        return "turn_end" in await stack.event_types(chat)

    await until_async(stored, what="the turn's end stored")
    hist = await stack.history(chat)
    assert [(m["role"], m.get("content")) for m in hist[2:]] == [
        ("tool", DENIED_TOOL_TEXT),
        ("tool", DENIED_TOOL_TEXT),
        ("assistant", DENIED_TURN_TEXT),
    ]
    assert _starts(ledger) == [] and not (stack.ws / "a.txt").exists()
    types = await stack.event_types(chat)
    assert "tool_started" not in types and types.count("turn_end") == 1


async def test_a_continue_after_the_store_closed_the_turn_runs_nothing(stack: Stack) -> None:
    """A workflow task that takes a Dismiss can be discarded by the server after its
    store write went through (a signal arrived meanwhile: UnhandledCommand); its
    retry may then meet the user's Continue first. The store's ending stands: the
    held call never runs, and the chat answers its next message."""
    from turnkeeper.store.base import TurnUpdate

    ledger = stack.ws / "ledger.txt"  # where the tool writes it in-process too
    _tools(stack, ledger)
    stack.script(
        [
            {"tool_calls": [_call("guarded_write", path="a.txt", content="a")]},
            {"text": "never asked: the closing row of turn 1 counts as this call"},
            {"text": "next turn answered"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat("closed")
    await stack.send(chat, "write a", message_id="m1")
    gate = await stack.wait_state(chat, _asks)
    # What the discarded task's Dismiss wrote.
    store = await stack.store()
    await store.finish_turn(
        chat,
        gate.turn,
        TurnUpdate(status=TurnStatus.RECOVERED, reason=Reason.DISMISSED, recovery_id=gate.recovery_id),
        closing_text=DISMISSED_TEXT,
    )
    await stack.decide(chat, "continue", gate.recovery_id)
    done = await stack.wait_turn_done(chat, 1)
    assert (done.status, done.reason, done.approvals) == (TurnStatus.RECOVERED, Reason.DISMISSED, [])
    await asyncio.sleep(0.5)
    assert _starts(ledger) == [] and not (stack.ws / "a.txt").exists()
    await stack.send(chat, "and now?", message_id="m2")
    answered = await stack.wait_turn_done(chat, 2)
    assert answered.status == TurnStatus.COMPLETED
    assert _starts(ledger) == []


async def test_a_newer_message_supersedes_the_wait(stack: Stack) -> None:
    ledger = stack.ws / "ledger.txt"  # where the tool writes it in-process too
    _tools(stack, ledger)
    stack.script(
        [
            {"tool_calls": [_call("guarded_write", path="a.txt", content="a")]},
            {"text": "never asked: the closing row of turn 1 counts as this call"},
            {"text": "then not"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat("supersede")
    await stack.send(chat, "write a", message_id="m1")
    gate = await stack.wait_state(chat, _asks)
    await stack.send(chat, "no, never mind", message_id="m2")
    await stack.wait_turn_done(chat, 2)
    store = await stack.store()
    turn1 = await store.get_turn(chat, 1)
    assert (turn1.status, turn1.reason, turn1.recovery_id) == (
        TurnStatus.RECOVERED,
        Reason.SUPERSEDED,
        gate.recovery_id,
    )
    hist = await stack.history(chat)
    assert [m.get("content") for m in hist if m["role"] != "assistant" or not m.get("tool_calls")] == [
        "write a",
        UNAPPROVED_TOOL_TEXT,
        SUPERSEDED_TEXT,
        "no, never mind",
        "then not",
    ]
    assert _starts(ledger) == [] and not (stack.ws / "a.txt").exists()


async def test_a_waiting_approval_handed_on_keeps_its_calls(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gate whose history grows long goes on in a fresh run: the calls still wait."""
    from turnkeeper import long_history

    monkeypatch.setattr(long_history, "RUN_HISTORY_EVENTS", 60)
    ledger = stack.ws / "ledger.txt"  # where the tool writes it in-process too
    _tools(stack, ledger)
    stack.script([{"tool_calls": [_call("guarded_write", path="h.txt", content="h")]}, {"text": "written"}])
    await stack.start_worker(TURNKEEPER_WORKFLOW_SANDBOX="off")  # so the bound above applies
    chat = stack.chat("hand-on")
    first = await stack.send(chat, "write h")
    gate = await stack.wait_state(chat, _asks)
    for i in range(30):
        await first.signal("continue", {"recovery_id": f"stale-{i}"})
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
    for _ in range(100):
        if (await handle.describe()).run_id != first.first_execution_run_id:
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError("the gate was not handed on")
    again = await stack.wait_state(chat, _asks)
    assert (again.turn, again.recovery_id) == (1, gate.recovery_id)
    assert [a.model_dump() for a in again.approvals] == [a.model_dump() for a in gate.approvals]
    await stack.decide(chat, "continue", gate.recovery_id)
    done = await stack.wait_turn_done(chat, 1)
    assert done.status == TurnStatus.COMPLETED and (stack.ws / "h.txt").read_text() == "h"
    assert len(_starts(ledger)) == 1


@pytest.mark.crash
async def test_a_wait_survives_sigkilled_workers_and_runs_once_approved(stack: Stack) -> None:
    ledger = stack.ws / "ledger.txt"  # where the tool writes it in-process too
    _tools(stack, ledger)
    stack.script([{"tool_calls": [_call("guarded_write", path="k.txt", content="k")]}, {"text": "written"}])
    worker = stack.spawn_worker()
    chat = stack.chat("kill-wait")
    await stack.send(chat, "write k")
    gate = await stack.wait_state(chat, _asks, timeout=60)
    for _ in range(2):  # any number of restarts: the wait is the workflow's, no worker holds it
        stack.kill(worker)
        worker = stack.spawn_worker()
        await stack.wait_serving(worker)
        state = await stack.wait_state(chat, _asks, timeout=30)
        assert (state.recovery_id, [a.id for a in state.approvals]) == (gate.recovery_id, ["call_0_0"])
    assert _starts(ledger) == []
    approved = await stack.decide(chat, "continue", gate.recovery_id)
    assert approved.status == TurnStatus.RUNNING
    done = await stack.wait_turn_done(chat, 1, timeout=30)
    assert done.status == TurnStatus.COMPLETED
    assert _starts(ledger) == [f"start {chat}/1/call_0_0"]


async def test_confirm_tools_from_the_environment_and_the_decorator(stack: Stack) -> None:
    """TURNKEEPER_CONFIRM_TOOLS makes a built-in ask first; the CLI's status lists the call."""
    from turnkeeper.cli.output import describe_gate

    stack.env_extra["TURNKEEPER_CONFIRM_TOOLS"] = "write_file"
    stack.script([{"tool_calls": [_call("write_file", path="e.txt", content="e")]}, {"text": "ok"}])
    await stack.start_worker()
    chat = stack.chat("env")
    await stack.send(chat, "write e")
    gate = await stack.wait_state(chat, _asks)
    shown = describe_gate(gate)
    assert 'write_file {"path": "e.txt", "content": "e"}' in shown
    assert f"turnkeeper continue {chat}" in shown and f"turnkeeper dismiss {chat}" in shown
    await stack.decide(chat, "dismiss", gate.recovery_id)
    assert not (stack.ws / "e.txt").exists()

    load_tool_modules(["tests.ledger_tools"])
    registry = default_registry()
    assert registry.needs_approval("guarded_write") and not registry.needs_approval("write_file")
    assert registry.confirm_names(["guarded_write", "read_file"], ["exec"]) == ["exec", "guarded_write"]


async def test_the_tool_activity_refuses_an_unapproved_call(tmp_path: Path) -> None:
    """Should a run's settings know fewer such tools than its worker, the call still never runs."""
    ran: list[str] = []
    registry = ToolRegistry()

    @registry.tool(confirm=True)
    def launch(target: str) -> str:
        """Launch."""
        ran.append(target)
        return "launched"

    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    try:
        await store.begin_turn("c", "run", ["m"])
        activity = ToolCallActivity(Settings(tools=("launch",), workspace=tmp_path), store, registry)
        call = ToolCall(id="t1", name="launch", arguments='{"target": "moon"}')
        refused = await ActivityEnvironment().run(
            activity.tool_call, activity_io.ToolCallInput(chat_id="c", turn=1, call=call)
        )
        assert (refused.status, refused.content, ran) == ("error", NOT_APPROVED_TEXT, [])
        call2 = call.model_copy(update={"id": "t2"})
        ok = await ActivityEnvironment().run(
            activity.tool_call, activity_io.ToolCallInput(chat_id="c", turn=1, call=call2, approved=True)
        )
        assert (ok.status, ran) == ("done", ["moon"])
        assert [e.type for e in await store.events("c")].count("tool_started") == 1
    finally:
        await store.close()


async def test_a_store_write_held_by_a_killed_worker_is_made_again_within_seconds(stack: Stack) -> None:
    """Store writes heartbeat like steps: the gate's closing write, held by a worker
    SIGKILLed in the middle of it, runs again on the next worker once the heartbeat
    timeout has passed, not after the write's 30 s timeout."""
    ledger = stack.ws / "ledger.txt"
    _tools(stack, ledger)
    held = stack.dir / "hold-store-writes"
    stack.env_extra.update(
        {
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools,tests.slow_store",
            "TK_SLOW_STORE": str(held),
            "TURNKEEPER_HEARTBEAT_TIMEOUT": "2",
        }
    )
    stack.script([{"tool_calls": [_call("guarded_write", path="h.txt", content="h")]}, {"text": "written"}])
    worker = stack.spawn_worker()
    chat = stack.chat("held-write")
    await stack.send(chat, "write h")
    gate = await stack.wait_state(chat, _asks, timeout=60)
    held.touch()
    await stack.decide(chat, "continue", gate.recovery_id)  # its write now hangs in `worker`
    await asyncio.sleep(0.5)
    stack.kill(worker)
    held.unlink()
    killed = asyncio.get_running_loop().time()
    worker = stack.spawn_worker()
    await stack.wait_serving(worker)
    done = await stack.wait_turn_done(chat, 1, timeout=60)
    took = asyncio.get_running_loop().time() - killed
    assert done.status == TurnStatus.COMPLETED and _starts(ledger) == [f"start {chat}/1/call_0_0"]
    assert took < 20, f"the turn ended {took:.1f} s after the kill"
