"""The keys a run announces its events under: a workflow task that timed out keeps
its local activities' store writes, and its retry may announce the same refusals
in another order, or others besides. Every event must still land exactly once."""
from __future__ import annotations

from pathlib import Path

from turnkeeper.activities.store import SQLiteStore
from turnkeeper.models import NewEvent
from turnkeeper.workflows.turn_persistence import TurnPersistence

CHAT = "c"
RUN = "run-1"
STALE = NewEvent(type="recovery_action_rejected", payload={"action": "dismiss", "recovery_id": "old"})


def _rejected(message_id: str) -> NewEvent:
    return NewEvent(type="message_rejected", payload={"message_id": message_id, "reason": "over the limit"})


class _Attempt(TurnPersistence):
    """One workflow task's run of the turn's code: each retry starts from scratch."""

    def __init__(self) -> None:
        self._event_keys_seen: dict[str, int] = {}

    def keys(self, events: list[NewEvent]) -> list[str]:
        return [self._content_key(RUN, e) for e in events]


async def test_a_retried_task_announcing_in_another_order_loses_no_event(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    try:
        # The timed-out attempt saw only the stale Dismiss; its retry saw the burst first.
        first = [STALE]
        await store.append_events(CHAT, first, _Attempt().keys(first))
        retry = [_rejected("b-20"), _rejected("b-21"), STALE]
        await store.append_events(CHAT, retry, _Attempt().keys(retry))
        # And the same task retried once more writes nothing twice.
        await store.append_events(CHAT, retry, _Attempt().keys(retry))
        events = [(e.type, e.payload) for e in await store.events(CHAT)]
    finally:
        await store.close()
    assert sorted(map(str, events)) == sorted(map(str, [(e.type, e.payload) for e in retry]))


def test_the_same_event_twice_in_a_run_gets_two_keys() -> None:
    attempt = _Attempt()
    one, two = attempt.keys([STALE, STALE])
    assert one != two and one.startswith(f"{RUN}/")
    assert _Attempt().keys([STALE, STALE]) == [one, two]
