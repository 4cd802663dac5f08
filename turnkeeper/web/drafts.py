"""The answers being streamed, for every event stream of this web process.

One reader looks at the store's drafts table for all the streams (`POLL_S`
apart, while any stream is open), so a hundred streaming chats cost one query,
not a hundred. A stream keeps only the newest draft of its chat: a draft holds
the whole text so far, so a slow client skips pieces, never loses text.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from turnkeeper.activities.store import Draft, SessionStore

log = logging.getLogger("turnkeeper.web")

POLL_S = 0.02
PAGE = 1000


class DraftSlot:
    """What one event stream is handed: the newest draft of its chat."""

    def __init__(self) -> None:
        self.latest: Draft | None = None
        self.changed = asyncio.Event()

    def put(self, draft: Draft) -> None:
        self.latest = draft
        self.changed.set()

    def take(self) -> Draft | None:
        draft, self.latest = self.latest, None
        self.changed.clear()
        return draft


class DraftHub:
    def __init__(self, store: Callable[[], Awaitable[SessionStore]]) -> None:
        self._store = store
        self._slots: dict[str, set[DraftSlot]] = {}
        self._version: int | None = None
        self._task: asyncio.Task[None] | None = None

    def subscribe(self, chat_id: str) -> DraftSlot:
        slot = DraftSlot()
        self._slots.setdefault(chat_id, set()).add(slot)
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        return slot

    def unsubscribe(self, chat_id: str, slot: DraftSlot) -> None:
        slots = self._slots.get(chat_id)
        if slots is not None:
            slots.discard(slot)
            if not slots:
                del self._slots[chat_id]

    async def close(self) -> None:
        self._slots.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        try:
            while self._slots:
                try:
                    store = await self._store()
                    if self._version is None:
                        # Older drafts are handed over by each stream's own first read.
                        self._version = await store.draft_version()
                    drafts = await store.drafts_since(self._version, limit=PAGE)
                except Exception as err:  # noqa: BLE001  the store is back soon; streams go on with events
                    log.warning("drafts: %s", err)
                    await asyncio.sleep(1.0)
                    continue
                for draft in drafts:
                    self._version = max(self._version, draft.version)
                    for slot in self._slots.get(draft.chat_id, ()):
                        slot.put(draft)
                if len(drafts) < PAGE:
                    await asyncio.sleep(POLL_S)
        finally:
            self._task = None
