"""The turn's input queue: what the loop takes, one at a time, in history order.

Signal handlers append inputs; an activity or timer the turn watches appends one
as it ends. The loop waits here for the next input and nowhere else, so this is
also where a cancelled run's Stop is noticed. (A query's catch-up never reaches
the run: turnkeeper/worker/catch_up.py refuses it.)
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnkeeper.workflows.inputs import Decision, Done, TurnInput


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
            return Decision("stop", None)
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
