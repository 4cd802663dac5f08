"""What the event streams of this web process wait for: the chat's new events
and the answers being streamed.

One reader looks at the store's drafts table for all the streams (`POLL_S`
apart while any stream is open), so a hundred streaming chats cost one query,
not a hundred. A stream keeps only the newest draft of its chat: a draft holds
the whole text so far, so a slow client skips pieces, never loses text.

On PostgreSQL the store pushes (LISTEN/NOTIFY): a stream is woken when its
chat's log grows, the reader when a draft is written, and both poll only as
a fallback (`PUSHED_POLL_S`). On SQLite there is no push: they poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from turnkeeper.store import Draft, SessionStore

log = logging.getLogger("turnkeeper.web")

POLL_S = 0.02  # drafts, without push
EVENTS_POLL_S = 0.15  # a stream's look at the log, without push
PUSHED_POLL_S = 1.0  # either, with push: only in case a notification was missed
RELISTEN_S = 5.0
PAGE = 1000


class StreamSlot:
    """What one event stream is handed: the newest draft of its chat, and word
    that the chat's log has grown."""

    def __init__(self) -> None:
        self.latest: Draft | None = None
        self.events_due = False
        self.changed = asyncio.Event()

    def put(self, draft: Draft) -> None:
        self.latest = draft
        self.changed.set()

    def events_changed(self) -> None:
        self.events_due = True
        self.changed.set()

    def take(self) -> Draft | None:
        draft, self.latest = self.latest, None
        self.changed.clear()
        return draft


class ChatFeed:
    def __init__(self, store: Callable[[], Awaitable[SessionStore]]) -> None:
        self._store = store
        self._slots: dict[str, set[StreamSlot]] = {}
        self._version: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._drafts_due = asyncio.Event()
        self._stop_listening: Callable[[], Awaitable[None]] | None = None
        self._listen_after = 0.0  # loop time of the next try to listen

    @property
    def pushed(self) -> bool:
        return self._stop_listening is not None

    def events_poll_s(self) -> float:
        return PUSHED_POLL_S if self.pushed else EVENTS_POLL_S

    def subscribe(self, chat_id: str) -> StreamSlot:
        slot = StreamSlot()
        self._slots.setdefault(chat_id, set()).add(slot)
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        return slot

    def unsubscribe(self, chat_id: str, slot: StreamSlot) -> None:
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
        await self._unlisten()

    # -- push ------------------------------------------------------------------------
    def _on_change(self, kind: str, chat_id: str) -> None:
        if kind == "events":
            for slot in self._slots.get(chat_id, ()):
                slot.events_changed()
        elif kind == "drafts":
            self._drafts_due.set()
        elif kind == "lost":  # the listening connection is gone: poll until it is back
            log.warning("the store's change notifications stopped; polling until they are back")
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self._unlisten()))

    async def _listen(self, store: SessionStore) -> None:
        loop = asyncio.get_running_loop()
        if self.pushed or loop.time() < self._listen_after:
            return
        self._listen_after = loop.time() + RELISTEN_S
        try:
            self._stop_listening = await store.listen(self._on_change)
        except Exception as err:
            log.warning("cannot listen for the store's changes: %s", err)

    async def _unlisten(self) -> None:
        stop, self._stop_listening = self._stop_listening, None
        if stop is not None:
            with contextlib.suppress(Exception):
                await stop()

    # -- the drafts reader ---------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while self._slots:
                try:
                    store = await self._store()
                    await self._listen(store)
                    if self._version is None:
                        # Older drafts are handed over by each stream's own first read.
                        self._version = await store.draft_version()
                    self._drafts_due.clear()
                    drafts = await store.drafts_since(self._version, limit=PAGE)
                except Exception as err:
                    log.warning("drafts: %s", err)
                    await asyncio.sleep(1.0)
                    continue
                for draft in drafts:
                    self._version = max(self._version, draft.version)
                    for slot in self._slots.get(draft.chat_id, ()):
                        slot.put(draft)
                if len(drafts) < PAGE:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self._drafts_due.wait(), PUSHED_POLL_S if self.pushed else POLL_S
                        )
        finally:
            self._task = None
