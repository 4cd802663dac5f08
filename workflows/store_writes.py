"""What the turn writes to the store besides its steps' own writes: a gate, a
turn's numbering, adoption or closing, a tool's outcome, each waiting out an outage
visibly and taking the turn's inputs meanwhile; and announcements for the event log
(refusals, a subagent's gate shown or gone), one `append_events` at a time, in
order, each event keyed by run and position so that a retry adds nothing twice."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from turnkeeper import activity_io, step_errors
    from turnkeeper.models import NewEvent
    from turnkeeper.workflows import steps

if TYPE_CHECKING:
    from turnkeeper.workflows.turn_loop import Turn

R = TypeVar("R")

STORE_WAIT_FIRST_S = 1.0
STORE_WAIT_MAX_S = 30.0


class StoreWrites:
    def __init__(self, turn: Turn) -> None:
        self._turn = turn
        self._wait_s = STORE_WAIT_FIRST_S
        self._waiting: list[NewEvent] = []  # announced, not yet being written
        self._writing: workflow.ActivityHandle[None] | None = None
        self._in_the_air: list[NewEvent] = []
        self._sent = 0

    async def write(
        self, activity: str, arg: Any, result_type: type[R] | None = None, patient: bool = False
    ) -> R:
        """A store write that waits out an outage: `store_unavailable` shows in `state`."""
        while True:
            handle = steps.store_write(activity, arg, result_type, patient=patient)
            await self._turn.wait([handle], cancel_on_end=False)
            try:
                result: R = handle.result()
            except ActivityError as err:
                if step_errors.error_type(err) != activity_io.STORE_UNAVAILABLE_ERROR:
                    raise  # the run fails; the reconciler finds its turn
                await self.wait_out(step_errors.failure_text(err), cancel_on_end=False)
                continue
            self.answered()
            return result

    async def write_turn(
        self, row: activity_io.UpdateTurnInput, activity: str = activity_io.UPDATE_TURN
    ) -> activity_io.TurnWriteResult:
        """The turn's row as `row` has it (UPDATE_TURN), or its closing (FINISH_TURN)."""
        return await self.write(activity, row, activity_io.TurnWriteResult)

    async def wait_out(self, why: str | None, cancel_on_end: bool = True) -> None:
        """The store did not answer: the turn shows it and tries again later, each pause longer."""
        state = self._turn.state
        if not state.store_unavailable:
            state.store_unavailable = True
            self._wait_s = STORE_WAIT_FIRST_S
            workflow.logger.warning(
                "chat %s: the session store is unavailable, the turn waits: %s", state.chat_id, why
            )
        pause = asyncio.ensure_future(asyncio.sleep(self._wait_s))
        self._wait_s = min(self._wait_s * 2, STORE_WAIT_MAX_S)
        await self._turn.wait([pause], cancel_on_end=cancel_on_end)

    def answered(self) -> None:
        state = self._turn.state
        if state.store_unavailable:
            state.store_unavailable = False
            workflow.logger.info("chat %s: the session store answers again", state.chat_id)

    # -- announcements -------------------------------------------------------------------
    def announce(self, event: NewEvent) -> None:
        self._waiting.append(event)
        if self._writing is None:
            self._next()

    @property
    def announcing(self) -> bool:
        """Some event is not in the log yet."""
        return bool(self._waiting) or self._writing is not None

    def states_written(self) -> bool:
        """No subagent's gate shown or gone is on its way to the event log."""
        return not any(e.type == "recovery_state" for e in self._waiting + self._in_the_air)

    def _next(self, _: Any = None) -> None:
        self._writing, self._in_the_air = None, []
        if not self._waiting:
            return
        events, self._waiting = self._waiting, []
        self._in_the_air = events
        run_id = workflow.info().run_id
        keys = [f"{run_id}/{self._sent + i}" for i in range(len(events))]
        self._sent += len(events)
        self._writing = steps.store_write(
            activity_io.APPEND_EVENTS,
            activity_io.AppendEventsInput(chat_id=self._turn.state.chat_id, events=events, keys=keys),
            summary="announce refusals",
            patient=True,
        )
        self._turn.inputs.watch(self._writing, self._next)
