"""Subagents: a `delegate` call runs as a child workflow, a turn of its own in a
sub-chat. Wait and background modes, parallel children, the depth and fan-out
bounds, a child's gate decided from its parent's chat (SIGKILLed workers among
it), Stop and Dismiss reaching children; real dev server, the demo model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import Stack, until, until_async
from turnkeeper import client as tk
from turnkeeper.models import Reason, TurnState, TurnStatus
from turnkeeper.subagents import SUBAGENT_SENDER, report_message_id


def _tools(stack: Stack, **extra: str) -> Path:
    ledger = stack.ws / "ledger.txt"
    stack.env_extra.update(
        {
            "TURNKEEPER_MODEL": "demo",
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
            "TURNKEEPER_TOOLS": "delegate,slow_write,guarded_write,write_file,read_file,list_dir",
            "TK_LEDGER": str(ledger),
            **extra,
        }
    )
    return ledger


def _starts(ledger: Path) -> list[str]:
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return [line for line in lines if line.startswith("start")]


def _slow(path: str, seconds: float) -> str:
    return "call slow_write " + json.dumps({"path": path, "content": path, "seconds": seconds})


def _waits_for_subagent(s: TurnState) -> bool:
    return s.status == TurnStatus.AWAITING_USER and s.reason == Reason.SUBAGENT_WAITING


async def _lists(stack: Stack, query: str, workflow_id: str) -> bool:
    return workflow_id in [w.id async for w in stack.client.list_workflows(query)]


async def _tool_rows(stack: Stack, chat: str) -> list[dict[str, object]]:
    return [m for m in await stack.history(chat) if m["role"] == "tool"]


async def test_wait_mode_returns_the_subagents_answer_as_the_calls_result(stack: Stack) -> None:
    _tools(stack)
    await stack.start_worker()
    chat = stack.chat("wait")
    await stack.send(chat, "delegate: write a.txt: hello")
    done = await stack.wait_turn_done(chat, 1)
    assert done.status == TurnStatus.COMPLETED
    (sub,) = done.subagents
    assert (sub.mode, sub.status, sub.task) == ("wait", TurnStatus.COMPLETED, "write a.txt: hello")
    assert (stack.ws / "a.txt").read_text() == "hello"
    # The sub-chat is a chat of its own: its transcript, its child workflow under the parent's.
    sub_history = await stack.history(sub.chat_id)
    assert sub_history[0]["role"] == "user" and sub_history[0]["content"] == "write a.txt: hello"
    (delegated,) = await _tool_rows(stack, chat)
    assert delegated["name"] == "delegate" and "write_file" in str(delegated["content"])
    described = await stack.client.get_workflow_handle(sub.workflow_id).describe()
    assert described.parent_id == tk.workflow_id(chat)
    assert await described.static_summary() == "subagent: write a.txt: hello"


async def test_background_mode_answers_later_as_one_message_in_the_parents_chat(stack: Stack) -> None:
    _tools(stack)
    await stack.start_worker()
    chat = stack.chat("bg")
    await stack.send(chat, "delegate in background: write b.txt: bye")
    # The call's result says where the answer will come; the answer starts the next turn, once.
    await stack.wait_turn_done(chat, 2, timeout=60)
    (started,) = await _tool_rows(stack, chat)
    assert "will arrive as a message" in str(started["content"])
    reports = [
        m for m in await stack.history(chat) if m["role"] == "user" and "Subagent" in str(m["content"])
    ]
    assert len(reports) == 1 and "b.txt" in str(reports[0]["content"])
    assert (stack.ws / "b.txt").read_text() == "bye"


async def test_a_report_the_full_parent_chat_refused_arrives_once_the_chat_has_room(stack: Stack) -> None:
    """The report comes while the parent's chat holds nearly its pending bound: refused,
    then sent again once the parent's turn has answered, and taken once."""
    ledger = _tools(stack, TURNKEEPER_MAX_PENDING_BYTES="4096")
    await stack.start_worker()
    chat = stack.chat("full")
    await stack.send(chat, 'delegate in background: call guarded_write {"path": "f.txt", "content": "f"}')
    (sub,) = (await stack.wait_turn_done(chat, 1)).subagents
    gate = await stack.wait_state(sub.chat_id, lambda s: s.reason == Reason.APPROVAL_REQUIRED)
    # The parent's next turn runs a slow tool while a follow-up fills its pending bound.
    await stack.send(chat, _slow("p.txt", 5))
    await until(lambda: bool(_starts(ledger)), what="the parent's tool started")
    await stack.send(chat, "x" * 3900, message_id="big")
    await stack.wait_state(chat, lambda s: "big" in s.pending_followups)
    await stack.decide(sub.chat_id, "continue", gate.recovery_id)  # the subagent answers now
    report = report_message_id(sub.chat_id, 1)
    store = await stack.store()

    async def refused() -> bool:
        return any(
            e.type == "message_rejected" and e.payload.get("message_id") == report
            for e in await store.events(chat)
        )

    async def reports() -> list[str]:
        return [r.message_id or "" for r in await store.transcript_rows(chat) if r.message_id == report]

    async def arrived() -> bool:
        return bool(await reports())

    await until_async(refused, 15, "the report refused by the full chat")
    await until_async(arrived, 20, "the report in the parent's chat")
    await stack.wait_state(chat, lambda s: s.status == TurnStatus.COMPLETED and not s.pending_followups)
    assert await reports() == [report]
    taken = [
        e for e in await store.events(chat) if e.type == "user_message" and e.payload["message_id"] == report
    ]
    assert [e.payload["sender"] for e in taken] == [SUBAGENT_SENDER]
    history = await stack.history(chat)
    assert f"A subagent reported back (chat {sub.chat_id})" in str(history[-1]["content"])


async def test_depth_is_bounded_a_subagent_below_the_limit_cannot_delegate(stack: Stack) -> None:
    _tools(stack, TURNKEEPER_SUBAGENT_MAX_DEPTH="1")
    await stack.start_worker()
    chat = stack.chat("depth")
    await stack.send(chat, "delegate: delegate: list")
    done = await stack.wait_turn_done(chat, 1)
    (sub,) = done.subagents
    child = await stack.state(sub.chat_id)
    assert child.status == TurnStatus.COMPLETED and child.subagents == []
    assert "not enabled" in str((await stack.history(sub.chat_id))[-1]["content"])


async def test_parallel_subagents_run_at_once_beyond_the_fanout_refused_in_words(stack: Stack) -> None:
    _tools(stack, TURNKEEPER_SUBAGENT_MAX_FANOUT="2")
    await stack.start_worker()
    chat = stack.chat("fan")
    await stack.send(chat, "delegate each: write p1.txt: 1 | write p2.txt: 2 | write p3.txt: 3")
    done = await stack.wait_turn_done(chat, 1, timeout=60)
    assert [s.status for s in done.subagents] == [TurnStatus.COMPLETED] * 2
    rows = await _tool_rows(stack, chat)
    assert len(rows) == 3 and "at most 2 delegate calls" in str(rows[2]["content"])
    assert (stack.ws / "p1.txt").exists() and (stack.ws / "p2.txt").exists()
    assert not (stack.ws / "p3.txt").exists()


@pytest.mark.crash
@pytest.mark.parametrize("action", ["continue", "dismiss"])
async def test_a_subagents_lost_tool_is_decided_from_the_parents_chat(stack: Stack, action: str) -> None:
    ledger = _tools(stack)
    worker = stack.spawn_worker()
    chat = stack.chat(f"lost-{action}")
    await stack.send(chat, f"delegate: {_slow('k.txt', 30)}")
    await until(lambda: bool(_starts(ledger)), timeout=60, what="the subagent's tool started")
    stack.kill(worker)
    worker = stack.spawn_worker()
    await stack.wait_serving(worker)
    shown = await stack.wait_state(chat, _waits_for_subagent, timeout=60)
    (sub,) = shown.subagents
    child = await stack.state(sub.chat_id)
    assert (child.status, child.reason) == (TurnStatus.AWAITING_USER, Reason.TOOL_STATE_UNKNOWN)
    assert shown.recovery_id == child.recovery_id and sub.chat_id in (shown.detail or "")
    # Where an operator looks: the waiting child under its parent, the parent by its reason.
    waiting_children = f"ParentWorkflowId = '{tk.workflow_id(chat)}' AND TurnStatus = 'awaiting_user'"
    waiting_parents = f"WorkflowId = '{tk.workflow_id(chat)}' AND RecoveryReason = 'subagent_waiting'"
    await until_async(lambda: _lists(stack, waiting_children, sub.workflow_id), what="the child listed")
    await until_async(lambda: _lists(stack, waiting_parents, tk.workflow_id(chat)), what="the parent listed")
    await stack.decide(chat, action, shown.recovery_id)
    ended = await stack.wait_state(
        chat, lambda s: s.status not in (TurnStatus.RUNNING, TurnStatus.AWAITING_USER)
    )
    child = await stack.wait_state(sub.chat_id, lambda s: s.status == TurnStatus.RECOVERED)
    if action == "continue":
        assert ended.status == TurnStatus.COMPLETED
        assert child.reason == Reason.CONTINUED
    else:
        assert (ended.status, ended.reason) == (TurnStatus.RECOVERED, Reason.DISMISSED)
        assert child.reason == Reason.DISMISSED
    assert len(_starts(ledger)) == 1  # never run twice, at any depth


async def test_stop_in_the_parent_stops_its_subagent(stack: Stack) -> None:
    ledger = _tools(stack)
    await stack.start_worker()
    chat = stack.chat("stop")
    await stack.send(chat, f"delegate: {_slow('s.txt', 30)}")
    await until(lambda: bool(_starts(ledger)), timeout=30, what="the subagent's tool started")
    stopped = await stack.decide(chat, "stop")
    assert stopped.status in (TurnStatus.RUNNING, TurnStatus.RECOVERED)
    ended = await stack.wait_state(chat, lambda s: s.status == TurnStatus.RECOVERED)
    assert ended.reason == Reason.STOPPED
    (sub,) = ended.subagents
    child = await stack.state(sub.chat_id)
    assert (child.status, child.reason) == (TurnStatus.RECOVERED, Reason.STOPPED)
    assert not (stack.ws / "s.txt").exists()


@pytest.mark.crash
async def test_a_subagents_approval_waits_through_sigkills_and_runs_once_approved(stack: Stack) -> None:
    """The parent's worker dies while its child waits: nothing of the child's answer is lost."""
    ledger = _tools(stack)
    worker = stack.spawn_worker()
    chat = stack.chat("approve")
    await stack.send(chat, 'delegate: call guarded_write {"path": "g.txt", "content": "g"}')
    gate = await stack.wait_state(chat, _waits_for_subagent, timeout=60)
    stack.kill(worker)
    worker = stack.spawn_worker()
    await stack.wait_serving(worker)
    assert _starts(ledger) == []
    await stack.decide(chat, "continue", gate.recovery_id)
    done = await stack.wait_turn_done(chat, 1, timeout=60)
    assert done.status == TurnStatus.COMPLETED and (stack.ws / "g.txt").read_text() == "g"
    assert len(_starts(ledger)) == 1
    (delegated,) = await _tool_rows(stack, chat)
    assert "guarded_write" in str(delegated["content"])


async def test_a_gate_two_levels_down_climbs_to_the_chat_and_is_decided_there(stack: Stack) -> None:
    ledger = _tools(stack)
    await stack.start_worker()
    chat = stack.chat("deep")
    await stack.send(chat, 'delegate: delegate: call guarded_write {"path": "d.txt", "content": "d"}')
    shown = await stack.wait_state(chat, _waits_for_subagent, timeout=60)
    (sub,) = shown.subagents
    (grandchild,) = (await stack.state(sub.chat_id)).subagents
    asks = await stack.state(grandchild.chat_id)
    assert (asks.status, asks.reason) == (TurnStatus.AWAITING_USER, Reason.APPROVAL_REQUIRED)
    assert shown.recovery_id == asks.recovery_id  # the chat's user decides the deepest gate
    assert _starts(ledger) == []
    await stack.decide(chat, "continue", shown.recovery_id)
    done = await stack.wait_turn_done(chat, 1, timeout=60)
    assert done.status == TurnStatus.COMPLETED and (stack.ws / "d.txt").read_text() == "d"
    assert len(_starts(ledger)) == 1
    events = await stack.event_types(chat)
    assert events.index("recovery_state") < events.index("turn_end")
    assert events.count("recovery_state") == 2  # the gate shown, then gone


async def test_a_dismiss_naming_a_waiting_subagents_gate_not_shown_is_taken(stack: Stack) -> None:
    """A turn waiting for two subagents at gates shows one at a time. A Dismiss naming
    the other (sent by a chat that saw it shown a moment before) ends the turn and both
    subagents, as one naming the shown gate does, instead of being refused as stale
    and leaving both waiting."""
    ledger = _tools(stack)
    await stack.start_worker()
    chat = stack.chat("two-deep")
    both = " | ".join(
        "call guarded_write " + json.dumps({"path": f"{name}.txt", "content": name}) for name in "ab"
    )
    await stack.send(chat, f"delegate: delegate each: {both}")
    top = await stack.wait_state(chat, lambda s: bool(s.subagents), timeout=60)
    middle = await stack.wait_state(
        top.subagents[0].chat_id,
        lambda s: len(s.subagents) == 2 and all(g.status == TurnStatus.AWAITING_USER for g in s.subagents),
        timeout=60,
    )
    hidden = next(g for g in middle.subagents if g.recovery_id != middle.recovery_id)
    await stack.decide(middle.chat_id, "dismiss", hidden.recovery_id)
    for below in middle.subagents:
        ended = await stack.wait_state(below.chat_id, lambda s: s.status == TurnStatus.RECOVERED)
        assert ended.reason == Reason.DISMISSED
    done = await stack.wait_turn_done(chat, 1, timeout=60)
    assert done.status == TurnStatus.COMPLETED
    assert _starts(ledger) == []  # dismissed: neither write ran
