"""How a run of `ChatTurn` takes its turn, as a mixin of `ChatTurn`.

A run started by a message waits for its first one, then `begin_turn` numbers
the turn from the store (closing any earlier turn left open) and refuses what
is over the configured limit. A run started by the reconciler, or handed on by
a long gate, adopts its turn instead and asks its user at the same gate. A
running turn whose history grew long hands itself on between two steps, and the
fresh run adopts it and takes the next step (workflows/history_bound.py).
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Literal

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnkeeper import activity_io
    from turnkeeper.models import (
        TURN_TASK_TIMEOUT,
        CarryOn,
        ChatTurnInput,
        Reason,
        RecoveryStart,
        TurnStatus,
        UserMessage,
    )
    from turnkeeper.workflows.approval import Approvals
    from turnkeeper.workflows.history_bound import history_long
    from turnkeeper.workflows.intake import MessageIntake

# A run started without a message (e.g. `temporal workflow start`) waits this long.
IDLE_TIMEOUT = timedelta(minutes=10)
# The latest tool calls a handed-on turn keeps showing in `state` (the store keeps all):
# the run's input stays small however many steps the turn takes.
CARRIED_TOOL_CALLS = 256


class TurnStart(Approvals, MessageIntake):
    """Needs `_turn_taken`, the turn loop and the Stop flags from the workflow."""

    _turn_taken: bool
    _turn_loop: Callable[[int, list[UserMessage]], Awaitable[None]]
    _machine_6: bool
    _numbering: bool
    _stop_while_numbering: bool
    _take_stop: Callable[[], None]

    async def _numbered(self, call: Awaitable[Any]) -> Any:
        """A store call that numbers or adopts the turn. A Stop that comes meanwhile
        is judged once the caller has set the turn (`_stop_now_numbered`)."""
        self._numbering = self._machine_6
        try:
            return await call
        finally:
            self._numbering = False

    def _stop_now_numbered(self) -> None:
        if self._stop_while_numbering:
            self._stop_while_numbering = False
            self._take_stop()

    def _apply_settings(self, settings: activity_io.TurnSettings) -> None:
        self._settings = settings
        self._settings_known = True

    async def _wait_for_first_message(self) -> bool:
        try:
            await workflow.wait_condition(lambda: bool(self._inbox.waiting), timeout=IDLE_TIMEOUT)
        except asyncio.TimeoutError:
            self._state.status = TurnStatus.COMPLETED
            return False
        finally:
            self._before_turn = False
            if self._idle_refusals is not None:
                await self._idle_refusals  # announced before the turn's own events
        return True

    async def _begin(self) -> Literal["begun", "nothing", "refused"]:
        """Number the turn from the store and close any earlier turn left open."""
        while self._inbox.waiting:
            waiting = self._inbox.waiting
            begun: activity_io.BeginTurnResult = await self._numbered(self._store_call(
                activity_io.BEGIN_TURN,
                activity_io.BeginTurnInput(chat_id=self._state.chat_id, run_id=workflow.info().run_id,
                                           message_ids=[m.message_id for m in waiting],
                                           message_sizes=[len(m.text.encode()) for m in waiting]),
                activity_io.BeginTurnResult))
            self._apply_settings(begun.settings)
            for message in waiting:
                if message.message_id in begun.oversized_ids:
                    self._reject_message(message.message_id, (
                        f"message is {len(message.text.encode())} bytes; the limit is "
                        f"{begun.settings.max_message_bytes}"))
            self._inbox.drop(set(begun.duplicate_ids) | set(begun.oversized_ids))
            if begun.turn is not None:
                self._state.turn = begun.turn
                self._stop_now_numbered()
                return "begun"
            self._stop_while_numbering = False  # no turn began: nothing to stop
            self._state.turn = begun.latest_turn
            if begun.oversized_ids and not begun.duplicate_ids and not self._inbox.waiting:
                return "refused"
        # Every message was a retry of one already committed: no turn to run.
        self._state.status = TurnStatus.COMPLETED
        return "nothing"

    async def _recover(self, start: RecoveryStart) -> None:
        """A run started by the reconciler, or handed on by a long gate: take the
        turn over and ask its user."""
        adopted: activity_io.AdoptTurnResult = await self._numbered(self._store_call(
            activity_io.ADOPT_TURN,
            activity_io.AdoptTurnInput(chat_id=self._state.chat_id, turn=start.turn, run_id=workflow.info().run_id),
            activity_io.AdoptTurnResult))
        self._apply_settings(adopted.settings)
        self._turn_taken = True
        # A gate handed on by a long run (continue-as-new) was counted where it opened.
        self._count_gate = workflow.info().continued_run_id is None
        self._state.turn = start.turn
        self._state.recovery_id = start.recovery_id
        self._state.attempts = start.attempts
        self._stop_now_numbered()
        asks = start.reason == Reason.APPROVAL_REQUIRED and bool(start.approvals)  # a handed-on approval gate
        goes_on = asks or await self._gate(start.reason, can_continue=start.can_continue,
                                           detail=start.detail) == "continue"
        if goes_on and start.approvals:
            goes_on = await self._run_approved(start.approvals)
        if goes_on:
            await self._turn_loop(step=adopted.next_step, batch=self._inbox.take())

    def _hand_on_if_long(self, step: int) -> None:
        """Between two steps, with nothing in flight: a long history goes on in a
        fresh run of the same turn. Only straight from the wait for the step, in
        the same activation: what signals leave is read at wait points only (see
        patches.WAIT_POINTS). Anything waiting to be acted on (a Stop, a decision,
        refusals to announce, an update's handler) goes first, and the turn hands
        on after a later step instead. A signal that reaches the server while this
        task runs fails its continue-as-new, and the retried task sees it."""
        if self._store_calls != self._woke_at_store_calls or not history_long():
            return
        if (self._interrupt is not None or self._signalled or self._events or self._superseding
                or self._dismissed_pending or self._held or not workflow.all_handlers_finished()):
            return
        state = self._state.model_copy(update={"pending_followups": [], "approvals": [],
                                               "tool_calls": self._state.tool_calls[-CARRIED_TOOL_CALLS:]})
        workflow.continue_as_new(ChatTurnInput(chat_id=state.chat_id, pending=self._inbox.waiting,
                                               carry_on=CarryOn(state=state, step=step)),
                                 task_timeout=TURN_TASK_TIMEOUT)

    async def _carry_on(self, carry: CarryOn) -> None:
        """A running turn handed on between steps: adopt it and take its next step."""
        # `state` shows the turn as it stood from the run's first task on.
        self._state = carry.state.model_copy(update={"chat_id": self._state.chat_id})
        self._turn_taken = True
        adopted: activity_io.AdoptTurnResult = await self._store_call(
            activity_io.ADOPT_TURN,
            activity_io.AdoptTurnInput(chat_id=self._state.chat_id, turn=carry.state.turn,
                                       run_id=workflow.info().run_id),
            activity_io.AdoptTurnResult)
        self._apply_settings(adopted.settings)
        await self._turn_loop(step=carry.step, batch=self._inbox.take())
