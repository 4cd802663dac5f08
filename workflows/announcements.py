"""What the turn tells the store's event log beside its rows: refusals, and a
subagent's gate shown or gone. One `append_events` activity at a time, in the
order announced, each event keyed by run and position so that a retried write
adds nothing twice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnkeeper import activity_io
    from turnkeeper.models import NewEvent
    from turnkeeper.workflows import steps
    from turnkeeper.workflows.inputs import InputQueue


class Announcements:
    def __init__(self, inputs: InputQueue, chat_id: Callable[[], str]) -> None:
        self._inputs = inputs
        self._chat_id = chat_id
        self._waiting: list[NewEvent] = []
        self._writing: workflow.ActivityHandle[None] | None = None
        self._in_the_air: list[NewEvent] = []
        self._sent = 0

    def add(self, event: NewEvent) -> None:
        self._waiting.append(event)
        if self._writing is None:
            self._next()

    @property
    def pending(self) -> bool:
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
            activity_io.AppendEventsInput(chat_id=self._chat_id(), events=events, keys=keys),
            summary="announce refusals",
            patient=True,
        )
        self._inputs.watch(self._writing, self._next)
