"""The recovery rules of `turnkeeper/recovery.py`, as plain functions over a
`TurnState`: no Temporal here. tests/workflow/test_recovery.py runs them in real turns."""

from __future__ import annotations

import pytest

from turnkeeper import models as rows
from turnkeeper import recovery
from turnkeeper.models import Reason, ToolCall, ToolCallStatus, TurnState, TurnStatus

GATE_ID = "rec-1"


def gated(
    reason: Reason = Reason.TOOL_STATE_UNKNOWN,
    can_continue: bool = True,
    status: TurnStatus = TurnStatus.RUNNING,
) -> TurnState:
    state = TurnState(chat_id="c", turn=1, status=status)
    recovery.open_gate(state, reason, GATE_ID, can_continue)
    return state


def test_open_gate_waits_for_the_user_with_a_fresh_id() -> None:
    state = gated()
    assert (state.status, state.reason, state.recovery_id, state.can_continue) == (
        TurnStatus.AWAITING_USER,
        Reason.TOOL_STATE_UNKNOWN,
        GATE_ID,
        True,
    )


def test_a_step_lost_while_resuming_is_a_loop_guard_never_a_retry() -> None:
    state = gated(status=TurnStatus.RESUMING, reason=Reason.RESTART_REQUIRES_CONFIRMATION)
    assert (state.status, state.reason) == (TurnStatus.AWAITING_USER, Reason.LOOP_GUARD)


def test_a_reason_that_rules_out_continue_is_kept_while_resuming() -> None:
    state = gated(status=TurnStatus.RESUMING, reason=Reason.CHECKPOINT_INVALID, can_continue=False)
    assert (state.reason, state.can_continue) == (Reason.CHECKPOINT_INVALID, False)


@pytest.mark.parametrize("recovery_id", [None, "", "rec-0"])
def test_a_stale_or_missing_id_is_refused_for_both_actions(recovery_id: str | None) -> None:
    state = gated()
    for action in ("continue", "dismiss"):
        assert recovery.refusal(state, action, recovery_id) == f"recovery id {recovery_id!r} is stale"


def test_continue_needs_a_waiting_gate_that_can_continue() -> None:
    assert recovery.refusal(gated(), "continue", GATE_ID) is None
    assert recovery.refusal(gated(can_continue=False), "continue", GATE_ID) == recovery.CONTEXT_UNAVAILABLE
    resuming = gated()
    recovery.accept_continue(resuming)
    assert recovery.refusal(resuming, "continue", GATE_ID) == recovery.NOT_WAITING


def test_dismiss_is_possible_for_the_current_id_whatever_the_saved_state() -> None:
    assert recovery.refusal(gated(can_continue=False), "dismiss", GATE_ID) is None
    resuming = gated()
    recovery.accept_continue(resuming)
    assert recovery.refusal(resuming, "dismiss", GATE_ID) is None
    failed = gated(reason=Reason.RECOVERY_FAILED, can_continue=False)
    failed.status = TurnStatus.FAILED
    assert recovery.refusal(failed, "dismiss", GATE_ID) is None
    ended = gated()
    recovery.end_recovered(ended, Reason.DISMISSED)
    assert recovery.refusal(ended, "dismiss", GATE_ID) == recovery.NOT_WAITING


def test_continue_counts_attempts_and_a_committed_resume_is_recovered() -> None:
    state = gated()
    recovery.accept_continue(state)
    assert (state.status, state.reason, state.attempts) == (TurnStatus.RESUMING, Reason.USER_CONFIRMED, 1)
    recovery.finish(state)
    assert (state.status, state.reason, state.recovery_id) == (
        TurnStatus.RECOVERED,
        Reason.CONTINUED,
        GATE_ID,
    )


def test_a_turn_without_a_gate_finishes_completed() -> None:
    state = TurnState(chat_id="c", turn=1)
    recovery.finish(state)
    assert (state.status, state.reason) == (TurnStatus.COMPLETED, None)


def test_an_approval_gate_is_no_loss_and_goes_on_as_the_turn_was() -> None:
    running = TurnState(chat_id="c", turn=1)
    recovery.open_gate(running, Reason.APPROVAL_REQUIRED, GATE_ID, can_continue=False)
    assert (running.status, running.reason, running.can_continue) == (
        TurnStatus.AWAITING_USER,
        Reason.APPROVAL_REQUIRED,
        True,
    )
    recovery.accept_continue(running)
    assert (running.status, running.reason, running.attempts) == (TurnStatus.RUNNING, None, 0)

    # A continued turn that asks keeps its reason (no loop guard), and resumes once approved.
    resuming = gated()
    recovery.accept_continue(resuming)
    recovery.open_gate(resuming, Reason.APPROVAL_REQUIRED, "other-id")
    assert resuming.reason == Reason.APPROVAL_REQUIRED and resuming.recovery_id == GATE_ID
    recovery.accept_continue(resuming)
    assert (resuming.status, resuming.reason, resuming.attempts) == (
        TurnStatus.RESUMING,
        Reason.USER_CONFIRMED,
        1,
    )


def test_deny_ends_the_turn_dismissed() -> None:
    state = TurnState(chat_id="c", turn=1)
    recovery.open_gate(state, Reason.APPROVAL_REQUIRED, GATE_ID)
    outcome = recovery.decide(state.status, recovery.Input.DISMISS, reason=state.reason)
    assert outcome.effect == recovery.Effect.DENY and recovery.ending_of(outcome.effect) == Reason.DISMISSED
    recovery.end_recovered(state, Reason.DISMISSED)
    assert (state.status, state.reason, state.approvals) == (TurnStatus.RECOVERED, Reason.DISMISSED, [])
    assert recovery.refusal(state, "continue", GATE_ID) == recovery.NOT_WAITING


def test_held_calls_show_pending_with_their_approvals_then_run_in_the_same_views() -> None:
    state = TurnState(chat_id="c", turn=3)
    held = [ToolCall(id="t1", name="deploy", arguments='{"s": "web"}')]
    recovery.ask_approval(state, held)
    assert [(v.id, v.status) for v in state.tool_calls] == [("t1", ToolCallStatus.PENDING)]
    assert [(a.id, a.idempotency_key) for a in state.approvals] == [("t1", "c/3/t1")]
    views = recovery.show_running(state, [*held, ToolCall(id="t2", name="read", arguments="{}")])
    assert views[0] is state.tool_calls[0]  # the approved call keeps its view
    assert [v.id for v in state.tool_calls] == ["t1", "t2"] and views[1].status == ToolCallStatus.RUNNING


def test_held_calls_of_a_turn_ended_otherwise_show_as_errors() -> None:
    state = TurnState(chat_id="c", turn=1)
    held = [ToolCall(id="t1", name="deploy", arguments="{}")]
    recovery.ask_approval(state, held)
    recovery.refuse_held(state, held)
    assert [(v.id, v.status) for v in state.tool_calls] == [("t1", ToolCallStatus.ERROR)]
    assert state.approvals == []


@pytest.mark.parametrize(
    ("reason", "denied", "text"),
    [
        (Reason.DISMISSED, False, rows.DISMISSED_TEXT),
        (Reason.DISMISSED, True, rows.DENIED_TURN_TEXT),
        (Reason.SUPERSEDED, False, rows.SUPERSEDED_TEXT),
        (Reason.STOPPED, False, rows.STOPPED_TEXT),
    ],
)
def test_a_turn_its_user_ended_closes_with_the_row_for_how(reason: Reason, denied: bool, text: str) -> None:
    assert rows.closing_text(reason, denied) == text


def test_the_latest_answers_to_decisions_are_kept_and_one_without_a_request_id_is_not() -> None:
    state = TurnState(chat_id="c", turn=1)
    for i in range(recovery.DECISIONS_KEPT + 3):
        recovery.record_decision(state, f"r{i}", "continue", None if i % 2 else "stale")
    recovery.record_decision(state, None, "stop", recovery.NOT_RUNNING)
    kept = [(d.request_id, d.refusal) for d in state.decisions]
    assert len(kept) == recovery.DECISIONS_KEPT and kept[0] == ("r3", None) and kept[-1] == ("r18", "stale")
