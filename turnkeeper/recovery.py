"""The recovery machine: one outcome for every pair of turn status and input.

`decide` is the table; the workflow, the reconciler, the store activities and the
CLI ask it what an input does and never pick a status themselves. The mutators
below it (`open_gate`, `accept_continue`, `approve`, `finish`, `end_recovered`) are the only
code that writes a status. Pure: no I/O, no Temporal calls, safe in workflow code.
turnkeeper/recovery_table.py renders the whole table for the docs;
tests/unit/test_recovery_machine.py drives it with Hypothesis.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from turnkeeper.models import (
    OPEN_STATUSES,
    ApprovalRequest,
    DecisionRecord,
    Reason,
    ToolCall,
    ToolCallStatus,
    ToolCallView,
    TurnState,
    TurnStatus,
)

Action = Literal["continue", "dismiss"]
# A client reads the answer to its decision back from `state`: the latest ones are kept.
DECISIONS_KEPT = 16

NOT_WAITING = "not waiting for confirmation"
CONTEXT_UNAVAILABLE = "recovery context is unavailable"
NOT_RUNNING = "no turn is running"


class Input(str, Enum):
    """Everything that can happen to a turn."""

    USER_MESSAGE = "user_message"
    CONTINUE = "continue"
    DISMISS = "dismiss"
    STOP = "stop"
    STEP_LOST = "step_lost"
    """A model or tool activity was lost: its worker died, or none took it up in time."""
    SHUTDOWN = "graceful_shutdown"
    RUN_ENDED = "run_ended_abnormally"
    """The run was terminated, timed out or failed; the reconciler finds it."""
    RECONCILE = "reconcile_pass"
    """A reconcile pass while the turn's run is alive."""
    STORE_OUTAGE = "store_outage"
    APPROVAL_NEEDED = "tool_needs_approval"
    """The model asked for a tool that must be approved before it runs (`confirm`)."""


class Effect(str, Enum):
    JOIN = "join"
    NEXT_TURN = "next_turn"
    SUPERSEDE = "supersede"
    RESUME = "resume"
    DISMISS = "dismiss"
    CANCEL_AND_DISMISS = "cancel_and_dismiss"
    STOP = "stop"
    OPEN_GATE = "open_gate"
    RESCHEDULE = "reschedule"
    JUDGE = "judge"
    WAIT_FOR_STORE = "wait_for_store"
    ASK_APPROVAL = "ask_approval"
    APPROVE = "approve"
    DENY = "deny"
    FORWARD = "forward"
    """Continue at a subagent's gate shown in its parent's chat: the subagent takes it."""
    REFUSE = "refuse"
    NOTHING = "nothing"


@dataclass(frozen=True)
class Outcome:
    effect: Effect
    refusal: str | None = None
    """Why the input is refused (REFUSE); updates are rejected with these words."""

    @property
    def accepted(self) -> bool:
        return self.effect != Effect.REFUSE


_AWAITING, _RESUMING, _RUNNING, _FAILED = (
    TurnStatus.AWAITING_USER,
    TurnStatus.RESUMING,
    TurnStatus.RUNNING,
    TurnStatus.FAILED,
)


def decide(
    status: TurnStatus,
    input: Input,
    *,
    id_matches: bool = True,
    can_continue: bool = True,
    reason: Reason | None = None,
) -> Outcome:
    """What `input` does to a turn in `status`. `id_matches`: Continue or Dismiss
    carries the turn's current recovery id; `can_continue`: the turn's flag;
    `reason`: the turn's reason (an approval gate is `awaiting_user/approval_required`)."""
    asks_approval = status == _AWAITING and reason == Reason.APPROVAL_REQUIRED
    if input == Input.USER_MESSAGE:
        if status == _RUNNING:
            return Outcome(Effect.JOIN)
        if status in (_AWAITING, _RESUMING):
            return Outcome(Effect.SUPERSEDE)  # newer input beats a waiting or running recovery
        return Outcome(Effect.NEXT_TURN)
    if input in (Input.CONTINUE, Input.DISMISS):
        if not id_matches:
            return Outcome(Effect.REFUSE, "stale")
        if asks_approval:
            return Outcome(Effect.APPROVE if input == Input.CONTINUE else Effect.DENY)
        if input == Input.DISMISS:
            # Possible for the current id whatever the saved state is.
            if status == _RESUMING:
                return Outcome(Effect.CANCEL_AND_DISMISS)
            if status in (_AWAITING, _FAILED):
                return Outcome(Effect.DISMISS)
            return Outcome(Effect.REFUSE, NOT_WAITING)
        if status not in (_AWAITING, _FAILED):
            return Outcome(Effect.REFUSE, NOT_WAITING)
        if not can_continue:
            return Outcome(Effect.REFUSE, CONTEXT_UNAVAILABLE)
        if status == _AWAITING and reason == Reason.SUBAGENT_WAITING:
            return Outcome(Effect.FORWARD)
        return Outcome(Effect.RESUME)
    if input == Input.STOP:
        return Outcome(Effect.STOP) if status in OPEN_STATUSES else Outcome(Effect.REFUSE, NOT_RUNNING)
    if input == Input.STEP_LOST:
        return Outcome(Effect.OPEN_GATE) if status in (_RUNNING, _RESUMING) else Outcome(Effect.NOTHING)
    if input == Input.SHUTDOWN:
        # A gate holds no worker: a shutdown changes nothing for it.
        return Outcome(Effect.RESCHEDULE) if status in (_RUNNING, _RESUMING) else Outcome(Effect.NOTHING)
    if input == Input.RUN_ENDED:
        return Outcome(Effect.JUDGE) if status in OPEN_STATUSES else Outcome(Effect.NOTHING)
    if input == Input.STORE_OUTAGE:
        return Outcome(Effect.WAIT_FOR_STORE) if status in OPEN_STATUSES else Outcome(Effect.NOTHING)
    if input == Input.APPROVAL_NEEDED:
        # Only a turn that runs asks the model; its answer may name such a tool.
        return Outcome(Effect.ASK_APPROVAL) if status in (_RUNNING, _RESUMING) else Outcome(Effect.NOTHING)
    return Outcome(Effect.NOTHING)  # RECONCILE: a live run is left alone, a closed turn too


def refusal(state: TurnState, action: Action, recovery_id: str | None) -> str | None:
    """Why `action` with `recovery_id` must be refused now, or None to accept it."""
    outcome = decide(
        state.status,
        Input(action),
        can_continue=state.can_continue,
        reason=state.reason,
        id_matches=bool(state.recovery_id) and recovery_id == state.recovery_id,
    )
    if outcome.refusal == "stale":
        return f"recovery id {recovery_id!r} is stale"
    return outcome.refusal


def shown(state: TurnState, recovery_id: str | None = None) -> TurnState:
    """The turn as its user sees and decides it: a turn waiting for a subagent
    that is at a gate of its own shows that gate (`subagent_waiting`, the
    subagent's recovery id). Its own status is unchanged underneath. Several
    waiting subagents' gates are shown one at a time, and each is this turn's:
    with `recovery_id`, the one it names, if one does."""
    if state.status not in (_RUNNING, _RESUMING):
        return state
    gates = [v for v in state.subagents if v.mode == "wait" and v.status == _AWAITING]
    if not gates:
        return state
    waiting = next((v for v in gates if recovery_id is not None and v.recovery_id == recovery_id), gates[0])
    why = waiting.reason.value if waiting.reason else "waiting"
    return state.model_copy(
        update={
            "status": _AWAITING,
            "reason": Reason.SUBAGENT_WAITING,
            "recovery_id": waiting.recovery_id,
            "can_continue": waiting.can_continue,
            "detail": f"subagent {waiting.chat_id} waits for the user: {why}",
        }
    )


# -- the only code that writes a status ------------------------------------------


def open_gate(
    state: TurnState, reason: Reason, new_id: str, can_continue: bool = True, keep_id: bool = True
) -> None:
    """An interruption: the turn waits for its user. A step lost while resuming
    is a loop: never retried by itself, the user decides again. A reason that
    rules Continue out says more than `loop_guard`, and is kept. The recovery id
    is minted at the turn's first gate and kept until the turn ends. An approval
    gate is no loss: it keeps its reason, and Continue is always possible there."""
    if reason == Reason.APPROVAL_REQUIRED:
        can_continue = True
    elif state.status == _RESUMING and can_continue:
        reason = Reason.LOOP_GUARD
    state.status = _AWAITING
    state.reason = reason
    if not (keep_id and state.recovery_id):
        state.recovery_id = new_id
    state.can_continue = can_continue


def accept_continue(state: TurnState) -> None:
    if state.status == _AWAITING and state.reason == Reason.APPROVAL_REQUIRED:
        approve(state)
        return
    state.status = _RESUMING
    state.reason = Reason.USER_CONFIRMED
    state.attempts += 1


def approve(state: TurnState) -> None:
    """Continue at an approval gate: the turn goes on as it was before it asked. A
    turn is resuming from its first accepted Continue on (attempts >= 1) until it ends."""
    if state.attempts:
        state.status = _RESUMING
        state.reason = Reason.USER_CONFIRMED
    else:
        state.status = _RUNNING
        state.reason = None
    state.approvals = []


def finish(state: TurnState) -> None:
    """The turn committed its answer: a plain completion, or a recovery that worked."""
    if state.status == _RESUMING:
        state.status = TurnStatus.RECOVERED
        state.reason = Reason.CONTINUED
    else:
        state.status = TurnStatus.COMPLETED
        state.reason = None


def end_recovered(state: TurnState, reason: Reason) -> None:
    state.status = TurnStatus.RECOVERED
    state.reason = reason
    state.approvals = []


def mark_failed(state: TurnState) -> None:
    """The reconciler could not recover the turn; only Dismiss (or a newer message) closes it."""
    state.status = _FAILED
    state.reason = Reason.RECOVERY_FAILED
    state.can_continue = False


def ending_of(effect: Effect) -> Reason | None:
    """The `recovered` reason a closing effect ends the turn with."""
    return {
        Effect.SUPERSEDE: Reason.SUPERSEDED,
        Effect.DISMISS: Reason.DISMISSED,
        Effect.CANCEL_AND_DISMISS: Reason.DISMISSED,
        Effect.DENY: Reason.DISMISSED,
        Effect.STOP: Reason.STOPPED,
    }.get(effect)


# -- the turn's tool calls as `state` shows them -------------------------------------


def show_running(state: TurnState, calls: list[ToolCall]) -> list[ToolCallView]:
    """The views of a tool step's calls, each running; an approved call keeps the
    view it showed as pending."""
    shown = {v.id: v for v in state.tool_calls}
    views = [
        shown.get(c.id) or ToolCallView(id=c.id, name=c.name, status=ToolCallStatus.RUNNING) for c in calls
    ]
    state.tool_calls.extend(v for v in views if v.id not in shown)
    return views


def ask_approval(state: TurnState, held: list[ToolCall]) -> None:
    """The held calls show as pending, each with the approval it waits for."""
    known = {v.id for v in state.tool_calls}
    pending = [
        ToolCallView(id=c.id, name=c.name, status=ToolCallStatus.PENDING) for c in held if c.id not in known
    ]
    state.tool_calls.extend(pending)
    state.approvals = [
        ApprovalRequest(
            id=c.id,
            name=c.name,
            arguments=c.arguments,
            idempotency_key=f"{state.chat_id}/{state.turn}/{c.id}",
        )
        for c in held
    ]


def refuse_held(state: TurnState, held: list[ToolCall]) -> None:
    """The turn ended with calls still waiting for approval: they never ran."""
    ids = {c.id for c in held}
    for view in state.tool_calls:
        if view.id in ids:
            view.status = ToolCallStatus.ERROR
    state.approvals = []


def record_decision(
    state: TurnState,
    request_id: str | None,
    action: Literal["continue", "dismiss", "stop"],
    refusal: str | None,
) -> None:
    """The answer to a decision that named a request id: accepted (`refusal` None) or refused."""
    if request_id:
        kept = state.decisions[-(DECISIONS_KEPT - 1) :]
        state.decisions = [*kept, DecisionRecord(request_id=request_id, action=action, refusal=refusal)]
