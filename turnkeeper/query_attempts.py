"""How the clients ask a run's `state` query: how long one attempt may take, and
asking again while no answer has come. Used by `turnkeeper.client` (`decide`,
`query_state`); no Temporal import, so a short command stays fast."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

# A query handed to a worker that dies with it is answered by nobody until its RPC
# times out, so each attempt gets this long and a lost query is asked again within
# seconds. 5 s covers a task held by a killed worker (2 s) and a cold replay on a busy
# worker; a shorter cut only makes a busy worker replay again. Only after
# QUERY_TIMEOUTS_AS_IS attempts in a row timed out does each get twice as long (a
# replay slower than that); a query refused at once (a catch-up) is asked again at once.
QUERY_ATTEMPT_S = 5.0
QUERY_TIMEOUTS_AS_IS = 3
# Meanwhile, while no answer came, the query is sent once more this often (the ones
# sent before still count; the first answer wins): one that went down with a killed
# worker's task is not waited out, and a slow one is not cut short.
QUERY_AGAIN_S = 1.5
QUERIES_AT_ONCE = 4

T = TypeVar("T")


async def first_answer(
    ask: Callable[[], Awaitable[T]],
    every_s: float = QUERY_AGAIN_S,
    at_most: int = QUERIES_AT_ONCE,
    until: float | None = None,
) -> T:
    """`ask()`'s first answer. While none has come and none has failed, it is asked
    again every `every_s`, at most `at_most` at once and not past `until` (monotonic);
    once every one asked has failed, the last error."""
    import asyncio
    import time

    asked: set[asyncio.Future[T]] = {asyncio.ensure_future(ask())}
    try:
        while True:
            done, asked = await asyncio.wait(asked, timeout=every_s, return_when=asyncio.FIRST_COMPLETED)
            for answer in done:
                if answer.exception() is None:
                    return answer.result()
            if not asked:
                raise next(iter(done)).exception()  # type: ignore[misc]
            if not done and len(asked) < at_most and (until is None or time.monotonic() < until):
                asked.add(asyncio.ensure_future(ask()))
    finally:
        for answer in asked:
            answer.cancel()


class QueryAttempts:
    """How long the next attempt at a query may take."""

    def __init__(self) -> None:
        self.seconds = QUERY_ATTEMPT_S
        self._timeouts = 0  # in a row

    def failed(self, *, timed_out: bool) -> None:
        self._timeouts = self._timeouts + 1 if timed_out else 0
        if self._timeouts >= QUERY_TIMEOUTS_AS_IS:
            self.seconds *= 2
