"""The contract's search attributes as the SDK's typed keys (Keyword each).

Apart from turnkeeper.models so that what only needs their names (the CLI, the
dev server's command line) does not import the SDK.
"""

from __future__ import annotations

from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)

from turnkeeper.models import CHAT_ID, RECONCILE_OUTCOME, RECOVERY_REASON, TURN_STATUS, Reason, TurnStatus

CHAT_ID_ATTR = SearchAttributeKey.for_keyword(CHAT_ID)
TURN_STATUS_ATTR = SearchAttributeKey.for_keyword(TURN_STATUS)
RECOVERY_REASON_ATTR = SearchAttributeKey.for_keyword(RECOVERY_REASON)
RECONCILE_OUTCOME_ATTR = SearchAttributeKey.for_keyword(RECONCILE_OUTCOME)
SEARCH_ATTRIBUTE_KEYS = (CHAT_ID_ATTR, TURN_STATUS_ATTR, RECOVERY_REASON_ATTR, RECONCILE_OUTCOME_ATTR)


def at_start(chat_id: str) -> TypedSearchAttributes:
    """A new turn's run is listed as running from its start, before it upserts anything."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(CHAT_ID_ATTR, chat_id),
            SearchAttributePair(TURN_STATUS_ATTR, TurnStatus.RUNNING.value),
        ]
    )


def of_turn(chat_id: str, status: TurnStatus, reason: Reason | None) -> list[SearchAttributeUpdate]:
    """What a run upserts: the status and reason `state` shows (no reason: unset)."""
    why = RECOVERY_REASON_ATTR.value_set(reason.value) if reason else RECOVERY_REASON_ATTR.value_unset()
    return [CHAT_ID_ATTR.value_set(chat_id), TURN_STATUS_ATTR.value_set(status.value), why]
