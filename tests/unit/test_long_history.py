"""What a long turn's fresh run is given (turnkeeper/long_history.py); the hand-on
itself runs in tests/workflow/test_no_wedge.py and test_approval.py."""

from __future__ import annotations

from turnkeeper import long_history, recovery
from turnkeeper.models import (
    DecisionRecord,
    Reason,
    SubagentLink,
    ToolCall,
    ToolCallStatus,
    ToolCallView,
    TurnState,
    UserMessage,
)

PENDING = [UserMessage(message_id="m2", text="and then?")]


def test_the_bound_or_temporals_suggestion_hands_on() -> None:
    bound = long_history.RUN_HISTORY_EVENTS
    assert not long_history.too_long(bound, suggested=False)
    assert long_history.too_long(bound + 1, suggested=False)
    assert long_history.too_long(10, suggested=True)


def test_between_steps_the_running_turn_goes_on_with_its_latest_tool_calls() -> None:
    views = [ToolCallView(id=f"t{i}", name="read", status=ToolCallStatus.DONE) for i in range(300)]
    state = TurnState(chat_id="c", turn=4, tool_calls=views, pending_followups=["m2"])
    state.decisions = [DecisionRecord(request_id="r", action="stop", refusal="no turn is running")]
    link = SubagentLink(
        parent_chat_id="p",
        parent_workflow_id="chat-p",
        parent_turn=1,
        tool_call_id="d",
        depth=1,
        mode="wait",
        profile=None,
        task="t",
    )
    nxt = long_history.next_run(state, PENDING, link, step=7, held=[])
    assert nxt.recovery is None and nxt.carry_on is not None and nxt.parent == link
    carried = nxt.carry_on.state
    assert (nxt.carry_on.step, carried.turn, nxt.pending) == (7, 4, PENDING)
    assert len(carried.tool_calls) == long_history.CARRIED_TOOL_CALLS
    assert carried.tool_calls[-1].id == "t299"
    assert (carried.pending_followups, carried.decisions) == ([], [])
    assert len(state.tool_calls) == 300  # the running run's own state is untouched


def test_at_a_gate_the_same_gate_goes_on_with_the_calls_it_holds() -> None:
    state = TurnState(chat_id="c", turn=2, attempts=1, detail="the model failed")
    recovery.open_gate(state, Reason.APPROVAL_REQUIRED, "rec-1")
    held = [ToolCall(id="t1", name="deploy", arguments="{}")]
    nxt = long_history.next_run(state, PENDING, None, step=None, held=held)
    gate = nxt.recovery
    assert nxt.carry_on is None and gate is not None
    assert (gate.turn, gate.reason, gate.recovery_id, gate.attempts) == (
        2,
        Reason.APPROVAL_REQUIRED,
        "rec-1",
        1,
    )
    assert (gate.can_continue, gate.detail, gate.approvals) == (True, "the model failed", held)
