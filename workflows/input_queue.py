"""The turn's input queue: what the loop takes, one at a time, in history order.

Signal handlers append inputs; an activity or timer the turn watches appends one
as it ends. The loop waits here for the next input and nowhere else, so this is
also where a cancelled run's Stop and a query's catch-up are noticed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnkeeper.workflows.inputs import Decision, Done, TurnInput


class QueryCatchUp(Exception):
    """Fails a workflow task's activation on purpose (see `InputQueue._woken`): never a workflow failure."""


class InputQueue:
    def __init__(self) -> None:
        self.items: deque[TurnInput] = deque()
        self.ended: set[asyncio.Future[Any]] = set()  # watched futures whose end was taken
        self.cancel_requested = False
        self._then: dict[asyncio.Future[Any], Callable[[asyncio.Future[Any]], None] | None] = {}
        self._seen: tuple[int, int, Any] | None = None
        self._catching_up = False

    def append(self, inp: TurnInput) -> None:
        self.items.append(inp)

    async def next(self) -> TurnInput:
        try:
            await workflow.wait_condition(self._woken)
        except asyncio.CancelledError:
            # Cancelling the run (the UI's "Request Cancellation") is the user's Stop.
            self.cancel_requested = True
            return Decision("stop", None)
        if self._catching_up:
            raise QueryCatchUp(
                "a query applied events of a workflow task not started yet: "
                "this worker drops the run and the next task replays it whole"
            )
        return self.items.popleft()

    def _woken(self) -> bool:
        """Whether an input waits; also notices an activation that applies events of a
        workflow task not yet started (history length moved, its size and time did not:
        those two move at a task's start only). A worker answering a query about a run
        it did not hold does that, and sends what the run does with them along with the
        next task's commands, where a replay takes them together and in another order
        (tests/replay/test_sdk_query_order.py). Failing that activation fails the query
        and evicts the run instead."""
        info = workflow.info()
        seen = (info.get_current_history_length(), info.get_current_history_size(), workflow.now())
        last, self._seen = self._seen, seen
        if last is not None and seen[0] != last[0] and seen[1:] == last[1:]:
            self._catching_up = True
        return bool(self.items) or self._catching_up

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
