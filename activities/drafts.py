"""The answer as it streams: a model call's text written to the store's draft
row while the provider produces it, for the page and `turnkeeper send`.

Drafts are a view, not a record: they never enter a workflow history or the
transcript, and a write that fails is skipped (the next one carries the whole
text). The recorded `assistant_message` is the truth.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

from turnkeeper.store import SessionStore

log = logging.getLogger("turnkeeper.drafts")

# The first piece is written this soon (time to first token): a reply whose whole
# text comes within it is recorded without a draft, which the record would only
# remove again. After it, at most one write per chat this often, however fast the
# model streams.
FIRST_FLUSH_S = 0.01
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
        self._writing = False
        self._closing = False

    def __call__(self, piece: str) -> None:
        self._parts.append(piece)
        self._more.set()

    async def __aenter__(self) -> DraftWriter:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Before the reply is recorded: that write removes the draft, and must come last.
        task = self._task
        if task is None:
            return
        self._closing = True
        if not self._writing:
            task.cancel()
        # A write under way is let finish, even when this activity is cancelled (the
        # store bounds each call): a database call cancelled half way can leave its
        # connection waiting on the cancel.
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled() or _cancelling():
                raise  # this activity is cancelled (Stop, Dismiss, shutdown), not only the writer

    async def _run(self) -> None:
        chat_id, turn, step = self._key
        await self._more.wait()
        await asyncio.sleep(FIRST_FLUSH_S)  # closing meanwhile cancels the writer: no draft
        while True:
            await self._more.wait()
            self._more.clear()
            self._writing = True
            try:
                self._attempt = await self._store.write_draft(
                    chat_id, turn, step, "".join(self._parts), self._attempt
                )
            except Exception as err:
                log.debug("draft of chat %s not written: %s", chat_id, err)
            finally:
                self._writing = False
            if self._closing:
                return
            await asyncio.sleep(FLUSH_S)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
