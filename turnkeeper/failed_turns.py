"""Turns whose recovery failed (failed / recovery_failed), for the CLI and the
web process alike.

No run holds such a turn, so the store is its only record: its state is read
from there, and Dismiss closes it there by the recovery rules, as the workflow
would have (interrupted rows for unanswered calls, one closing row). Continue
is refused: nothing is left to continue from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnkeeper import recovery
from turnkeeper.models import DISMISSED_TEXT, Reason, TurnRecord, TurnState, TurnStatus

if TYPE_CHECKING:
    from turnkeeper.store import SessionStore


class NotDecided(Exception):
    """Refused, in the recovery rules' words (`stale`, `not waiting for confirmation`, ...)."""


def state_of(record: TurnRecord) -> TurnState:
    return TurnState(
        chat_id=record.chat_id,
        turn=record.turn,
        status=record.status,
        reason=record.reason,
        recovery_id=record.recovery_id,
        can_continue=record.can_continue,
        attempts=record.attempts,
    )


async def failed_turn(store: SessionStore, chat_id: str) -> TurnRecord | None:
    """The chat's latest turn if its recovery failed, else None."""
    record = await store.get_turn(chat_id)
    return record if record is not None and record.status == TurnStatus.FAILED else None


async def decide_failed_turn(
    store: SessionStore, chat_id: str, action: recovery.Action, recovery_id: str | None = None
) -> TurnState:
    """`action` ("continue" or "dismiss") on the chat's failed turn, for
    `recovery_id` (None: the turn's own). The new state, or `NotDecided`."""
    record = await failed_turn(store, chat_id)
    if record is None:
        raise NotDecided(recovery.NOT_WAITING)
    state = state_of(record)
    refusal = recovery.refusal(state, action, recovery_id if recovery_id is not None else record.recovery_id)
    if refusal is not None:
        raise NotDecided(refusal)
    if action != "dismiss":  # the rules refuse Continue in `failed`; say so if they ever do not
        raise NotDecided(recovery.CONTEXT_UNAVAILABLE)
    from turnkeeper.store import TurnUpdate  # the store's module only where a turn is decided

    recovery.end_recovered(state, Reason.DISMISSED)
    await store.close_unanswered_calls(chat_id, record.turn)
    # Only from `failed`: a message sent meanwhile may have closed it as superseded.
    if not await store.finish_turn(
        chat_id,
        record.turn,
        TurnUpdate(
            status=state.status,
            reason=state.reason,
            recovery_id=record.recovery_id,
            can_continue=record.can_continue,
            attempts=record.attempts,
        ),
        closing_text=DISMISSED_TEXT,
        only_from=frozenset({TurnStatus.FAILED}),
    ):
        raise NotDecided(recovery.NOT_WAITING)
    closed = await store.get_turn(chat_id, record.turn)
    assert closed is not None  # written just now
    return state_of(closed)
