"""turnkeeper/client.py: what needs no server (the rest is tested against one in tests/workflow)."""

from __future__ import annotations

from turnkeeper.client import QUERY_ATTEMPT_S, QUERY_TIMEOUTS_AS_IS, QueryAttempts


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
