"""turnkeeper/inbox.py: which messages a run's inbox refuses, and why, in words."""

from __future__ import annotations

from turnkeeper.inbox import Inbox, wire_size
from turnkeeper.models import UserMessage


def message(message_id: str, text: str) -> UserMessage:
    return UserMessage(message_id=message_id, text=text)


def test_a_message_over_the_size_limit_is_refused_with_its_size() -> None:
    inbox = Inbox()
    assert inbox.refusal(message("m1", "é" * 6), max_bytes=11, max_pending=10_000) == (
        "message is 12 bytes; the limit is 11"
    )
    assert inbox.refusal(message("m1", "é" * 5), max_bytes=10, max_pending=10_000) is None


def test_the_pending_bound_refuses_a_new_message_but_never_a_retry() -> None:
    inbox = Inbox()
    first = message("m1", "x" * 100)
    bound = wire_size(first) + 10
    assert inbox.refusal(first, max_bytes=1_000, max_pending=bound) is None
    assert inbox.offer(first)
    why = inbox.refusal(message("m2", "y" * 100), max_bytes=1_000, max_pending=bound)
    assert why is not None and f"holds {wire_size(first)} bytes" in why and f"limit of {bound}" in why
    assert inbox.refusal(first, max_bytes=1_000, max_pending=bound) is None  # the client's retry
    assert not inbox.offer(first)  # taken once


def test_a_message_taken_in_flight_still_counts_until_it_is_committed() -> None:
    inbox = Inbox()
    first = message("m1", "x" * 100)
    inbox.offer(first)
    inbox.in_flight = inbox.take()
    bound = wire_size(first) + 10
    assert inbox.refusal(message("m2", "y" * 100), max_bytes=1_000, max_pending=bound) is not None
    inbox.in_flight = []
    assert inbox.refusal(message("m2", "y" * 100), max_bytes=1_000, max_pending=bound) is None


def test_pulled_messages_leave_in_order_and_free_their_bytes() -> None:
    inbox = Inbox()
    for i in range(3):
        inbox.offer(UserMessage(message_id=f"m{i}", text="x" * 10))
    before = inbox.pending_bytes()
    pulled = inbox.pull({"m2", "m0", None})
    assert [m.message_id for m in pulled] == ["m0", "m2"]
    assert [m.message_id for m in inbox.waiting] == ["m1"]
    assert inbox.pending_bytes() == before - sum(map(wire_size, pulled))
