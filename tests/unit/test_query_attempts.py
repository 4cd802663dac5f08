"""turnkeeper/query_attempts.py: how long a query attempt may take, and asking again while no answer has come."""

from __future__ import annotations

import asyncio
import time

import pytest

from turnkeeper.query_attempts import QUERY_ATTEMPT_S, QUERY_TIMEOUTS_AS_IS, QueryAttempts, first_answer


def test_a_lost_query_is_asked_again_after_the_same_short_wait() -> None:
    attempts = QueryAttempts()
    for _ in range(QUERY_TIMEOUTS_AS_IS - 1):
        attempts.failed(timed_out=True)
    assert attempts.seconds == QUERY_ATTEMPT_S


def test_only_timeouts_in_a_row_lengthen_the_next_attempt() -> None:
    attempts = QueryAttempts()
    for _ in range(5):
        attempts.failed(timed_out=False)  # refused at once: a catch-up, say
    assert attempts.seconds == QUERY_ATTEMPT_S
    for _ in range(QUERY_TIMEOUTS_AS_IS):
        attempts.failed(timed_out=True)
    assert attempts.seconds == 2 * QUERY_ATTEMPT_S
    attempts.failed(timed_out=False)
    attempts.failed(timed_out=True)
    assert attempts.seconds == 2 * QUERY_ATTEMPT_S


async def test_a_query_lost_with_its_worker_is_asked_again_and_the_first_answer_wins() -> None:
    asked: list[int] = []

    async def ask() -> int:
        asked.append(len(asked) + 1)
        n = asked[-1]
        if n == 1:
            await asyncio.sleep(30)  # gone down with a killed worker's task
        return n

    assert await asyncio.wait_for(first_answer(ask, every_s=0.05), 5) == 2
    assert asked == [1, 2]


async def test_a_slow_answer_still_counts_and_no_more_than_the_bound_are_in_flight() -> None:
    in_flight, most = 0, 0

    async def ask() -> str:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.3)
            return "slow"
        finally:
            in_flight -= 1

    assert await first_answer(ask, every_s=0.05, at_most=3) == "slow"
    assert most == 3
    await asyncio.sleep(0)
    assert in_flight == 0  # the rest cancelled


async def test_no_query_is_asked_again_past_the_deadline() -> None:
    asked: list[float] = []

    async def ask() -> None:
        asked.append(time.monotonic())
        await asyncio.sleep(0.3)
        raise TimeoutError("deadline exceeded")

    until = time.monotonic() + 0.12
    with pytest.raises(TimeoutError):
        await first_answer(ask, every_s=0.05, until=until)
    assert 2 <= len(asked) <= 4 and all(at < until for at in asked)


async def test_when_every_query_asked_fails_the_error_is_raised() -> None:
    async def ask() -> None:
        raise RuntimeError("QueryCatchUp: ask again")

    with pytest.raises(RuntimeError, match="QueryCatchUp"):
        await first_answer(ask, every_s=0.05)
