"""What reaches a turn, the queue it waits in, and how the loop judges each input.

Signal handlers only append inputs; an activity or timer the turn watches appends
one as it ends. The loop waits in the queue and nowhere else (so that is also where
a cancelled run's Stop is noticed), takes inputs one at a time, in the order the
run's history holds them, and judges each against the state the inputs before it
left: what an input does comes from `recovery.decide`, and its answer (accepted,
or refused in the table's words) is final. The turn then acts on the state it was
left in. (A query's catch-up never reaches the run: turnkeeper/worker/catch_up.py
refuses it.)
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from turnkeeper import recovery
    from turnkeeper.models import NewEvent, Reason, TurnStatus
    from turnkeeper.payloads.raw import Malformed, read_decision, read_message
    from turnkeeper.recovery import Effect, Input
    from turnkeeper.subagents import SUBAGENT_SENDER

if TYPE_CHECKING:
    from turnkeeper.workflows.turn_loop import Turn

Action = Literal["continue", "dismiss", "stop"]

# Before the worker's configuration reaches a new run (with its first model call),
# messages up to this size are taken; the call refuses those over the configured limit.
MESSAGE_BYTES_CEILING = 1024 * 1024


@dataclass(frozen=True)
class Signal:
    """A signal as it came: `user_message`, a decision (`continue`, `dismiss`,
    `stop`), or `subagent` (a subagent this turn waits for: its gate opened or closed)."""

    name: str
    payload: RawValue | None


@dataclass(frozen=True)
class Done:
    """An activity or timer of the turn's has ended."""

    future: asyncio.Future[Any]


TurnInput = Signal | Done


class InputQueue:
    def __init__(self) -> None:
        self.items: deque[TurnInput] = deque()
        self.ended: set[asyncio.Future[Any]] = set()  # watched futures whose end was taken
        self.cancel_requested = False
        self._then: dict[asyncio.Future[Any], Callable[[asyncio.Future[Any]], None] | None] = {}

    def append(self, inp: TurnInput) -> None:
        self.items.append(inp)

    async def next(self) -> TurnInput:
        try:
            await workflow.wait_condition(lambda: bool(self.items))
        except asyncio.CancelledError:
            # Cancelling the run (the UI's "Request Cancellation") is the user's Stop.
            self.cancel_requested = True
            return Signal("stop", None)
        return self.items.popleft()

    def watch(
        self, future: asyncio.Future[Any], then: Callable[[asyncio.Future[Any]], None] | None = None
    ) -> None:
        """`future`'s end becomes an input (and `then` runs as it is taken)."""
        if future not in self._then:
            future.add_done_callback(lambda f: self.items.append(Done(f)))
        self._then[future] = then or self._then.get(future)

    def take_end(self, done: Done) -> None:
        self.ended.add(done.future)
        then = self._then.pop(done.future, None)
        if then is not None:
            then(done.future)


def take_message(turn: Turn, payload: RawValue | None) -> None:
    try:
        message = read_message(payload)
    except Malformed as err:
        refuse_message(turn, err.message_id, f"malformed user_message payload: {err}")
        return
    limit = turn.settings.max_message_bytes if turn.settings_known else MESSAGE_BYTES_CEILING
    why = turn.inbox.refusal(message, limit, turn.settings.max_pending_bytes)
    if why is not None:
        refuse_message(turn, message.message_id, why)
        return
    if not turn.inbox.offer(message) or message.sender == SUBAGENT_SENDER:
        return  # the client's retry is one message; a background subagent's answer decides no gate
    if recovery.decide(recovery.shown(turn.state).status, Input.USER_MESSAGE).effect == Effect.SUPERSEDE:
        # Newer input beats the recovery, unless it is a late retry of a message the
        # chat already holds: the store tells (the check's end is an input too).
        turn.check_superseding(message.message_id)


def refuse_message(turn: Turn, message_id: str | None, why: str) -> None:
    workflow.logger.warning("user_message refused for chat %s: %s", turn.state.chat_id, why)
    turn.store.announce(NewEvent(type="message_rejected", payload={"message_id": message_id, "reason": why}))


def take_decision(turn: Turn, action: Action, payload: RawValue | None) -> None:
    request_id, recovery_id, well_formed = read_decision(action, payload)
    malformed = f'malformed {action} payload; expected {{"recovery_id": "..."}}'
    why = judge(turn, action, recovery_id) if well_formed else malformed
    if why is not None:
        workflow.logger.warning("%s refused for chat %s: %s", action, turn.state.chat_id, why)
        refused = {"turn": turn.state.turn, "action": action, "recovery_id": recovery_id, "reason": why}
        turn.store.announce(NewEvent(type="recovery_action_rejected", payload=refused))
    recovery.record_decision(turn.state, request_id, action, why)


def judge(turn: Turn, action: Action, recovery_id: str | None) -> str | None:
    """Accept `action` (the state changes at once: a later input meets it) or say why not."""
    state = turn.state
    if action == "stop":
        # A run that has taken no message yet has no turn to stop.
        if not turn.under_way or not recovery.decide(state.status, Input.STOP).accepted:
            return recovery.NOT_RUNNING
        turn.end_by_user(Reason.STOPPED)
        return None
    shown = recovery.shown(state, recovery_id)  # a waiting subagent's gate is decided here too
    why = recovery.refusal(shown, action, recovery_id)
    if why is not None:
        return why
    effect = recovery.decide(
        shown.status, Input(action), can_continue=shown.can_continue, reason=shown.reason
    ).effect
    if effect == Effect.FORWARD:
        turn.delegations.forward(action, recovery_id)
    elif effect in (Effect.RESUME, Effect.APPROVE):
        recovery.accept_continue(state)
        state.detail = None
        turn.decided = True
    else:  # DISMISS, DENY, CANCEL_AND_DISMISS
        turn.end_by_user(Reason.DISMISSED)
    return None


def supersedes(turn: Turn) -> bool:
    return recovery.shown(turn.state).status in (TurnStatus.AWAITING_USER, TurnStatus.RESUMING)
