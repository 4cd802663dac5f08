"""The contract's search attributes as the SDK's typed keys (Keyword each).

Apart from turnkeeper.models so that what only needs their names (the CLI, the
dev server's command line) does not import the SDK.
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

from turnkeeper.models import CHAT_ID, RECONCILE_OUTCOME, RECOVERY_REASON, TURN_STATUS

CHAT_ID_ATTR = SearchAttributeKey.for_keyword(CHAT_ID)
TURN_STATUS_ATTR = SearchAttributeKey.for_keyword(TURN_STATUS)
RECOVERY_REASON_ATTR = SearchAttributeKey.for_keyword(RECOVERY_REASON)
RECONCILE_OUTCOME_ATTR = SearchAttributeKey.for_keyword(RECONCILE_OUTCOME)
SEARCH_ATTRIBUTE_KEYS = (CHAT_ID_ATTR, TURN_STATUS_ATTR, RECOVERY_REASON_ATTR, RECONCILE_OUTCOME_ATTR)
