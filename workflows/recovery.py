"""The recovery state machine of a turn: pure functions over `TurnState`.

No I/O and no Temporal calls: the workflow persists and announces what these
return. Kept apart so every rule can be read, and tested, in one place.
"""
from __future__ import annotations

from typing import Literal

from turnkeeper.models import Reason, TurnState, TurnStatus

Action = Literal["continue", "dismiss"]

NOT_WAITING = "not waiting for confirmation"
CONTEXT_UNAVAILABLE = "recovery context is unavailable"


def refusal(state: TurnState, action: Action, recovery_id: str | None) -> str | None:
    """Why `action` with `recovery_id` must be refused now, or None to accept it."""
    if not state.recovery_id or recovery_id != state.recovery_id:
        return f"recovery id {recovery_id!r} is stale"
    if action == "dismiss":
        # Dismiss is possible for the current id whatever the saved state is,
        # as long as the gate has not been decided yet.
        if state.status in (TurnStatus.AWAITING_USER, TurnStatus.RESUMING, TurnStatus.FAILED):
            return None
        return NOT_WAITING
    if state.status not in (TurnStatus.AWAITING_USER, TurnStatus.FAILED):
        return NOT_WAITING
    if not state.can_continue:
        return CONTEXT_UNAVAILABLE
    return None


def open_gate(state: TurnState, reason: Reason, recovery_id: str, can_continue: bool = True) -> None:
    """An interruption: the turn waits for its user. A step lost while resuming
    is a loop: never retried by itself, the user decides again. A reason that
    rules Continue out says more than `loop_guard`, and is kept."""
    if state.status == TurnStatus.RESUMING and can_continue:
        reason = Reason.LOOP_GUARD
    state.status = TurnStatus.AWAITING_USER
    state.reason = reason
    state.recovery_id = recovery_id
    state.can_continue = can_continue


def accept_continue(state: TurnState) -> None:
    state.status = TurnStatus.RESUMING
    state.reason = Reason.USER_CONFIRMED
    state.attempts += 1


def finish(state: TurnState) -> None:
    """The turn committed its answer: a plain completion, or a recovery that worked."""
    if state.status == TurnStatus.RESUMING:
        state.status = TurnStatus.RECOVERED
        state.reason = Reason.CONTINUED
    else:
        state.status = TurnStatus.COMPLETED
        state.reason = None


def end_recovered(state: TurnState, reason: Reason) -> None:
    state.status = TurnStatus.RECOVERED
    state.reason = reason
