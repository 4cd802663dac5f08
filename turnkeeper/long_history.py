"""A long history goes on in a fresh run of the same turn (continue-as-new): when
it is long enough, and what the fresh run is given. Pure: the turn loop decides
where it may hand on (between steps, or at a gate, with nothing under way)."""

from __future__ import annotations

from typing import Any

from turnkeeper.models import (
    CarryOn,
    ChatTurnInput,
    RecoveryStart,
    SubagentLink,
    ToolCall,
    TurnState,
    UserMessage,
)

# A worker without the run cached replays its history within TURN_TASK_TIMEOUT:
# about 0.45 s for this many events on an idle 2-core machine (bench/cold_replay.py).
RUN_HISTORY_EVENTS = 1_000
# The latest tool calls a handed-on turn keeps showing in `state` (the store keeps all).
CARRIED_TOOL_CALLS = 256


def too_long(history_length: int, suggested: bool) -> bool:
    """Temporal suggests a new run, or the history is past what a cold worker replays in time."""
    return suggested or history_length > RUN_HISTORY_EVENTS


def next_run(
    state: TurnState,
    pending: list[UserMessage],
    link: SubagentLink | None,
    step: int | None,
    held: list[ToolCall],
) -> ChatTurnInput:
    """The fresh run's input: between steps (`step`) the running turn, carried on;
    at a gate the same gate, with the calls it holds for approval."""
    carry_on, gate = None, None
    if step is not None:
        kept: dict[str, Any] = {"pending_followups": [], "approvals": [], "decisions": []}
        carried = state.model_copy(update={**kept, "tool_calls": state.tool_calls[-CARRIED_TOOL_CALLS:]})
        carry_on = CarryOn(state=carried, step=step)
    else:
        assert state.reason is not None  # a gate always has one
        gate = RecoveryStart(
            turn=state.turn,
            reason=state.reason,
            can_continue=state.can_continue,
            recovery_id=state.recovery_id,
            attempts=state.attempts,
            detail=state.detail,
            approvals=list(held),
        )
    return ChatTurnInput(
        chat_id=state.chat_id, pending=pending, carry_on=carry_on, recovery=gate, parent=link
    )
