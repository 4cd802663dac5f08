"""`turnkeeper.client.decide` on a real dev server: Continue, Dismiss and Stop go as
signals with a request id, and the answer is read back from the run's `state`:
the state it led to, a refusal in the recovery table's words, or `DecisionPending`
when no worker has judged it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import Stack, until_async
from turnkeeper import client as tk
from turnkeeper.models import Reason, TurnState, TurnStatus


def _call(name: str, **arguments: object) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def _asks(s: TurnState) -> bool:
    return s.status == TurnStatus.AWAITING_USER and s.reason == Reason.APPROVAL_REQUIRED


async def _approval_gate(stack: Stack, chat: str, *more: dict[str, Any]) -> TurnState:
    """A turn waiting for its user: the model asked for a tool that asks first."""
    stack.env_extra["TURNKEEPER_CONFIRM_TOOLS"] = "write_file"
    stack.script([{"tool_calls": [_call("write_file", path="a.txt", content="a")]}, *more])
    await stack.start_worker()
    await stack.send(chat, "write a")
    return await stack.wait_state(chat, _asks)


async def test_an_accepted_decision_answers_with_the_state_it_led_to(stack: Stack) -> None:
    chat = stack.chat("accepted")
    gate = await _approval_gate(stack, chat, {"text": "written"})
    approved = await tk.decide(stack.client, chat, "continue", gate.recovery_id)
    assert (approved.status, approved.reason, approved.approvals) == (TurnStatus.RUNNING, None, [])
    assert [(d.action, d.refusal) for d in approved.decisions] == [("continue", None)]
    done = await stack.wait_turn_done(chat, 1)
    assert done.status == TurnStatus.COMPLETED and (stack.ws / "a.txt").read_text() == "a"


async def test_an_accepted_stop_answers_at_once_and_a_later_one_is_refused(stack: Stack) -> None:
    """The answer stays true: the state says `stopped` before the closing row is
    written, and a Stop after it meets that state."""
    chat = stack.chat("stop")
    gate = await _approval_gate(stack, chat)
    run_id = (await stack.client.get_workflow_handle(tk.workflow_id(chat)).describe()).run_id
    stopped = await tk.decide(stack.client, chat, "stop", run_id=run_id)
    assert (stopped.turn, stopped.status, stopped.reason) == (gate.turn, TurnStatus.RECOVERED, Reason.STOPPED)
    with pytest.raises(tk.DecisionRefused, match="^no turn is running$"):
        await tk.decide(stack.client, chat, "stop", run_id=run_id)
    with pytest.raises(tk.DecisionRefused, match="^not waiting for confirmation$"):
        await tk.decide(stack.client, chat, "dismiss", gate.recovery_id, run_id=run_id)
    assert not (stack.ws / "a.txt").exists()


async def test_a_refusal_is_raised_in_the_tables_words_and_recorded(stack: Stack) -> None:
    chat = stack.chat("refused")
    gate = await _approval_gate(stack, chat)
    with pytest.raises(tk.DecisionRefused, match="^recovery id 'not-the-id' is stale$"):
        await tk.decide(stack.client, chat, "continue", "not-the-id")
    with pytest.raises(tk.DecisionRefused, match="^recovery id 'also-wrong' is stale$"):
        await tk.decide(stack.client, chat, "dismiss", "also-wrong")
    store = await stack.store()

    async def recorded() -> bool:
        return [
            (e.payload["action"], e.payload["recovery_id"])
            for e in await store.events(chat)
            if e.type == "recovery_action_rejected"
        ] == [("continue", "not-the-id"), ("dismiss", "also-wrong")]

    await until_async(recorded, what="both refusals in the event log")
    state = await stack.state(chat)
    assert (state.status, state.recovery_id) == (TurnStatus.AWAITING_USER, gate.recovery_id)
    assert [(d.action, d.refusal) for d in state.decisions] == [
        ("continue", "recovery id 'not-the-id' is stale"),
        ("dismiss", "recovery id 'also-wrong' is stale"),
    ]


async def test_a_malformed_decision_is_refused_in_words(stack: Stack) -> None:
    """No recovery id to send (no gate has opened): refused at once as malformed,
    not left unanswered."""
    chat = stack.chat("malformed")
    await _approval_gate(stack, chat)
    for action in ("continue", "dismiss"):
        with pytest.raises(tk.DecisionRefused, match=f"^malformed {action} payload"):
            await tk.decide(stack.client, chat, action, None, timeout=5)
    assert (await stack.state(chat)).status == TurnStatus.AWAITING_USER


async def test_a_decision_no_worker_judges_is_pending_and_judged_when_one_comes(stack: Stack) -> None:
    chat = stack.chat("pending")
    gate = await _approval_gate(stack, chat, {"text": "written"})
    await stack.stop_workers()
    with pytest.raises(tk.DecisionPending, match="no worker has judged it yet"):
        await tk.decide(stack.client, chat, "continue", gate.recovery_id, timeout=2)
    # The signal stays in the run's history: the next worker judges it.
    await stack.start_worker()
    done = await stack.wait_turn_done(chat, 1)
    assert done.status == TurnStatus.COMPLETED and (stack.ws / "a.txt").read_text() == "a"
    assert [(d.action, d.refusal) for d in done.decisions] == [("continue", None)]


async def test_a_closed_runs_signal_is_refused(stack: Stack) -> None:
    stack.script([{"text": "hello back"}])
    await stack.start_worker()
    chat = stack.chat("closed")
    handle = await stack.send(chat, "hello")
    final = await handle.result()
    assert final.status == TurnStatus.COMPLETED
    with pytest.raises(tk.DecisionRefused, match="^no turn is running$"):
        await tk.decide(stack.client, chat, "stop")
    with pytest.raises(tk.DecisionRefused, match="^not waiting for confirmation$"):
        await tk.decide(stack.client, chat, "continue", "any-id")
    with pytest.raises(tk.DecisionRefused, match="^not waiting for confirmation$"):
        await tk.decide(stack.client, chat, "dismiss", "any-id", run_id=handle.result_run_id)
