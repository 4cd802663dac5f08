"""The turn's gates and the user's decisions, as a mixin of `ChatTurn`.

A gate waits, visibly, for Continue or Dismiss; Stop or a newer message may end
the turn instead. The handlers take decisions here and only change state: what
is allowed comes from `recovery.decide`, and the gate acts on it.
"""
from __future__ import annotations

from collections.abc import Callable

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from turnkeeper import activity_io
    from turnkeeper import metrics
    from turnkeeper.models import (
        DISMISSED_TEXT,
        STOPPED_TEXT,
        SUPERSEDED_TEXT,
        TURN_TASK_TIMEOUT,
        ChatTurnInput,
        NewEvent,
        Reason,
        RecoveryAction,
        RecoveryStart,
        ToolCall,
        TurnState,
    )
    from turnkeeper.workflows import recovery
    from turnkeeper.workflows.history_bound import history_long
    from turnkeeper.workflows.inbox import Inbox
    from turnkeeper.workflows.patches import REFUSE_UNDECODABLE, SUPERSEDE_CHECKS_STORE
    from turnkeeper.workflows.payloads import Undecodable, decode_payload, first_error
    from turnkeeper.workflows.recovery import Effect, Input
    from turnkeeper.workflows.turn_persistence import TurnPersistence

# A gate whose history grows this long (refused signals, say) hands itself on to a
# fresh run of the same turn, long before Temporal's own limits. Runs recorded
# before RECOVERY_MACHINE_5; later ones use the shorter RUN_HISTORY_EVENTS.
GATE_HISTORY_EVENTS = 10_000


class TurnGate(TurnPersistence):
    """Needs the inbox, the decision and interrupt fields and the patch flags from the workflow."""

    _inbox: Inbox
    _decision: recovery.Action | None
    _decision_id: str | None
    _interrupt: Reason | None
    _superseding: list[str]
    _dismissed_pending: set[str]
    _complete: bool
    _machine_4: bool
    _machine_8: bool
    _machine_10: bool
    _at_wait_points: bool
    _signals_at_wait_points: bool
    _signalled: list[tuple[recovery.Action, str | None]]
    _before_turn: bool
    _count_gate: bool = True  # false for the first gate of a run that continues one
    _held: list[ToolCall]  # calls waiting for approval: a gate handed on keeps them
    state: Callable[[], TurnState]  # the workflow's `state` query

    async def _interrupt_stands(self) -> bool:
        """A client's late retry of a message the chat already holds is not newer
        input: it must not supersede the gate. Drop such retries, keep waiting."""
        if self._interrupt != Reason.SUPERSEDED or not (self._complete or workflow.patched(SUPERSEDE_CHECKS_STORE)):
            return True
        ids, self._superseding = self._superseding, []
        asked, held = await self._held_ids(ids)
        if self._machine_10:
            # Only what the recorded answer covers is judged; the rest waits, as it did
            # live (patches.RECOVERY_MACHINE_10, chaos seed 567).
            self._superseding = [i for i in ids if i not in asked] + self._superseding
            ids = asked
            # Judged once an event has woken the run: live, the check's result can come
            # a task late, with the step's own end.
            await self._wake_on_an_event()
        if self._machine_8:
            # Only what was asked is judged: whether messages that came meanwhile
            # are in `_superseding` yet depends on how the SDK groups the answer
            # with them, which a replay may do otherwise. They wait for the next pass.
            self._inbox.drop(held)
            if self._interrupt != Reason.SUPERSEDED or any(i not in held for i in ids):
                return True
            self._interrupt = Reason.SUPERSEDED if self._superseding else None
            return False
        if self._interrupt != Reason.SUPERSEDED or any(i not in held for i in ids) or self._superseding:
            return True
        self._inbox.drop(held)
        self._interrupt = None
        return False

    async def _held_ids(self, message_ids: list[str]) -> tuple[list[str], set[str]]:
        """The ids the store's answer is about, and which of them it holds already."""
        answer: activity_io.HeldMessagesResult | list[str] = await self._store_call(
            activity_io.HELD_MESSAGES,
            activity_io.HeldMessagesInput(chat_id=self._state.chat_id, message_ids=message_ids),
            activity_io.HeldMessagesResult | list[str])
        if isinstance(answer, list):  # recorded by an earlier release: about the ids sent
            return message_ids, set(answer)
        return answer.asked, set(answer.held)

    async def _end_by_user(self) -> None:
        """Stop, Dismiss or a superseding message ended the turn: keep what is known,
        add one closing row. Dismiss commits the follow-ups that were pending when
        it came as user rows; every other message becomes the next turn, in order."""
        reason = self._interrupt or Reason.STOPPED
        self._inbox.return_in_flight()
        recovery.end_recovered(self._state, reason)
        if reason == Reason.DISMISSED:
            committed = [m for m in self._inbox.waiting if m.message_id in self._dismissed_pending]
            self._inbox.drop(self._dismissed_pending)
            await self._finish_turn(closing_text=DISMISSED_TEXT, commit_messages=committed)
            return
        await self._finish_turn(closing_text=SUPERSEDED_TEXT if reason == Reason.SUPERSEDED else STOPPED_TEXT)

    async def _gate(self, reason: Reason, can_continue: bool = True, detail: str | None = None) -> str:
        """Wait for the user's decision. Returns "continue" (resuming), "dismiss",
        or "ended" (Stop or a newer message closed the turn)."""
        new_id = str(workflow.uuid4())  # drawn at every gate, so recorded runs replay
        recovery.open_gate(self._state, reason, new_id, can_continue, keep_id=self._complete)
        self._state.detail = detail
        if self._decision_id != self._state.recovery_id:
            # A decision is for its gate only. (A replay can meet an update accepted
            # at this gate before the gate opens: it is kept for it.)
            self._decision = None
        if not await self._persist_state():
            # The store had closed the turn: the lost call committed the final answer,
            # or a task that timed out (its worker killed) wrote the turn's end before
            # its retry got here.
            if self._machine_5:
                await self._hand_on_what_the_store_lacks()
            return "ended"
        if self._count_gate:
            metrics.gate_opened(workflow.metric_meter(), reason.value)
        self._count_gate = True
        while True:
            await workflow.wait_condition(
                lambda: self._decision is not None or self._interrupt is not None or bool(self._events)
                or bool(self._signalled) or self._should_hand_on())
            self._judge_signalled()
            if self._should_hand_on():
                await self._hand_on_gate()
            written = self._store_calls
            await self._flush_events()
            if self._machine_10 and self._store_calls != written:
                await self._wake_on_an_event()  # as after a store check (patches.RECOVERY_MACHINE_10)
            if self._interrupt is not None and not await self._interrupt_stands():
                continue
            if self._decision is not None or self._interrupt is not None:
                break
        decision, self._decision = self._decision, None
        if self._interrupt is not None:
            await self._end_by_user()
            return "ended"
        if decision == "continue":
            recovery.accept_continue(self._state)
            self._state.detail = None
            if not await self._persist_state() and self._machine_4:
                # The store has closed the turn (a discarded workflow task's Dismiss or
                # Stop, say): its ending stands, and nothing the gate held runs.
                self._state.approvals = []
                if self._machine_5:
                    await self._hand_on_what_the_store_lacks()
                return "ended"
            return "continue"
        recovery.end_recovered(self._state, Reason.DISMISSED)
        # Follow-ups that waited behind the gate are kept as user rows, not answered.
        self._inbox.return_in_flight()
        await self._finish_turn(closing_text=DISMISSED_TEXT, commit_messages=self._inbox.take())
        return "dismiss"

    async def _hand_on_what_the_store_lacks(self) -> None:
        """The store closed the turn without this run. What the lost call held and
        the store does not goes to the next turn, never with the call (chaos seeds
        523 and 525 lost such messages: a task that wrote a Stop's end, its worker
        killed before the task completed, left its retry here). Runs of machine 5
        only, with no marker of its own: one asked after a local activity can land
        in another task on replay (patches.py), and the run ends right after this."""
        if self._inbox.in_flight:
            _, held = await self._held_ids([m.message_id for m in self._inbox.in_flight])
            self._inbox.return_in_flight()
            self._inbox.drop(held)

    def _should_hand_on(self) -> bool:
        """Undecided, quiet, and long: a decision or a message is acted on first."""
        return (self._complete and self._decision is None and self._interrupt is None and not self._events
                and not self._signalled and self._gate_history_long())

    def _gate_history_long(self) -> bool:
        return history_long(None if self._machine_5 else GATE_HISTORY_EVENTS)

    async def _hand_on_gate(self) -> None:
        """Continue the waiting gate in a fresh run: same turn, same recovery id."""
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._wake_on_an_event()
        if not self._should_hand_on():
            return  # something came meanwhile: the gate acts on it here
        self._inbox.return_in_flight()
        s = self._state
        assert s.reason is not None  # a gate always has one
        workflow.continue_as_new(ChatTurnInput(chat_id=s.chat_id, pending=self._inbox.waiting, recovery=RecoveryStart(
            turn=s.turn, reason=s.reason, can_continue=s.can_continue, recovery_id=s.recovery_id,
            attempts=s.attempts, detail=s.detail, approvals=list(self._held))),
            task_timeout=TURN_TASK_TIMEOUT)

    def _refusal(self, action: recovery.Action, recovery_id: str | None) -> str | None:
        """As `recovery.refusal`, and a gate already decided in this task waits no more."""
        why = recovery.refusal(self._state, action, recovery_id)
        if why is None and self._decision is not None:
            why = recovery.NOT_WAITING
        return why

    def _validate(self, action: recovery.Action, payload: RawValue | None) -> None:
        try:
            recovery_id = RecoveryAction.model_validate(decode_payload(payload)).recovery_id
        except (ValidationError, Undecodable) as err:
            why = first_error(err) if isinstance(err, ValidationError) else str(err)
            raise ApplicationError(f'malformed {action} payload ({why}); expected {{"recovery_id": "..."}}',
                                   type="MalformedPayload", non_retryable=True) from None
        why = self._refusal(action, recovery_id)
        if why is not None:
            raise ApplicationError(why, type="RecoveryActionRejected", non_retryable=True)

    def _decide(self, action: recovery.Action, recovery_id: str | None) -> bool:
        """Act on an accepted Continue or Dismiss. True when it cancels a running continuation."""
        outcome = recovery.decide(self._state.status, Input(action), can_continue=self._state.can_continue)
        if outcome.effect == Effect.CANCEL_AND_DISMISS and self._complete:
            if self._interrupt is None:  # a Stop or a newer message already ends it
                self._interrupt = Reason.DISMISSED
                self._dismissed_pending = set(self._inbox.ids())
            return True
        self._decision, self._decision_id = action, recovery_id  # the gate takes it
        return False

    async def _act_by_update(self, action: recovery.Action, recovery_id: str) -> TurnState:
        # Answered in the workflow task that takes it, with the state the decision
        # leads to: the decision is in the history, and the turn acts on it when its
        # store writes go through. No handler waits on what the run may never reach,
        # and none starts a timer (a replay that meets the update early must do the
        # same). Earlier runs answered once the gate took the decision.
        cancels = self._decide(action, recovery_id)
        if self._at_wait_points:
            return recovery.after_decision(self.state(), action)
        if not cancels:
            await workflow.wait_condition(lambda: self._decision is None)
        return self.state()

    def _act_by_signal(self, action: recovery.Action, payload: RawValue | None) -> None:
        recovery_id: str | None = None  # none readable: refused below, and recorded
        try:
            recovery_id = RecoveryAction.model_validate(decode_payload(payload)).recovery_id
        except ValidationError:
            pass
        except Undecodable:
            if not (self._complete or workflow.patched(REFUSE_UNDECODABLE)):
                return  # earlier runs never saw such a signal
        if self._signals_at_wait_points and not self._before_turn:
            self._signalled.append((action, recovery_id))  # judged where the turn waits
            return
        self._judge_signal(action, recovery_id)

    def _judge_signalled(self) -> None:
        signalled, self._signalled = self._signalled, []
        for action, recovery_id in signalled:
            self._judge_signal(action, recovery_id)

    def _judge_signal(self, action: recovery.Action, recovery_id: str | None) -> None:
        why = self._refusal(action, recovery_id)
        if why is not None:
            workflow.logger.warning("%s refused for chat %s: %s", action, self._state.chat_id, why)
            self._events.append(NewEvent(type="recovery_action_rejected", payload={
                "turn": self._state.turn, "action": action, "recovery_id": recovery_id, "reason": why}))
            return
        self._decide(action, recovery_id)
