"""The answer as it streams: a model call's text written to the store's draft
row while the provider produces it, for the page and `turnkeeper send`.

Drafts are a view, not a record: they never enter a workflow history or the
transcript, and a write that fails is skipped (the next one carries the whole
text). The recorded `assistant_message` is the truth.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType

from turnkeeper.activities.store import SessionStore

log = logging.getLogger("turnkeeper.drafts")

# The first piece is written at once (time to first token); after it, at most
# one write per chat this often, however fast the model streams.
FLUSH_S = 0.05


class DraftWriter:
    """A `TextSink` that keeps the chat's draft up to date, from a background task."""

    def __init__(self, store: SessionStore, chat_id: str, turn: int, step: int) -> None:
        self._store = store
        self._key = (chat_id, turn, step)
        self._parts: list[str] = []
        self._attempt: int | None = None
        self._more = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def __call__(self, piece: str) -> None:
        self._parts.append(piece)
        self._more.set()

    async def __aenter__(self) -> DraftWriter:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        # Before the reply is recorded: that write removes the draft, and must come last.
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        chat_id, turn, step = self._key
        while True:
            await self._more.wait()
            self._more.clear()
            try:
                self._attempt = await self._store.write_draft(chat_id, turn, step, "".join(self._parts),
                                                              self._attempt)
            except Exception as err:  # noqa: BLE001  a view: the next write carries the whole text
                log.debug("draft of chat %s not written: %s", chat_id, err)
            await asyncio.sleep(FLUSH_S)
