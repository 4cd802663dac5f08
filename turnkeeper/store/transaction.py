"""What a store backend implements (`Transaction`: SQL with `?` placeholders on
its driver), the pieces of a write that `SQLStore` builds its transactions of,
and what the backends share about outages (`Availability`)."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from turnkeeper.models import ChatMessage
from turnkeeper.store import codec
from turnkeeper.store.base import StoreError, StoreUnavailable, TurnRef

log = logging.getLogger("turnkeeper.store")


class Transaction(ABC):
    """One transaction on a backend's database. Statements use `?` placeholders."""

    IN_TEXTS: ClassVar[str]
    """SQL that follows a column to test it against a list of texts, the one
    parameter `texts(values)` makes: drivers pass lists differently."""

    @staticmethod
    @abstractmethod
    def texts(values: list[str]) -> Any: ...

    @abstractmethod
    async def execute(self, sql: str, *args: Any) -> int:
        """Run a statement; how many rows it wrote."""

    @abstractmethod
    async def fetchone(self, sql: str, *args: Any) -> codec.Row | None: ...

    @abstractmethod
    async def fetchall(self, sql: str, *args: Any) -> Sequence[codec.Row]: ...

    async def fetchval(self, sql: str, *args: Any) -> Any:
        row = await self.fetchone(sql, *args)
        return None if row is None else row[0]

    async def notify(self, kind: str, chat_id: str) -> None:
        """Tell other processes' listeners, once this commits, that the chat's
        `kind` ("events", "drafts") changed. Without push (SQLite) nothing: its
        readers poll."""
        return None


class ChatWrite:
    """A write transaction on one chat. Until it commits the backend keeps every
    other writer of the chat out, so the read-then-write logic here (the next
    seq, the next turn, "does this row exist yet") runs as if alone."""

    def __init__(self, tx: Transaction, chat_id: str, now: Any) -> None:
        self.tx = tx
        self.chat_id = chat_id
        self.now = now
        """The transaction's time, as the backend stores times."""
        self._next_seq: int | None = None

    async def emit(self, type_: str, payload: dict[str, Any]) -> None:
        # Safe without a sequence table: no other writer of the chat runs until commit.
        if self._next_seq is None:
            await self.tx.notify("events", self.chat_id)  # once per transaction
            self._next_seq = int(
                await self.tx.fetchval(
                    "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE chat_id = ?", self.chat_id
                )
            )
        await self.tx.execute(
            "INSERT INTO events (chat_id, seq, type, payload, created_at) VALUES (?, ?, ?, ?, ?)",
            self.chat_id,
            self._next_seq,
            type_,
            codec.json_text(payload),
            self.now,
        )
        self._next_seq += 1

    async def turn_row(self, turn: int) -> codec.Row:
        row = await self.tx.fetchone("SELECT * FROM turns WHERE chat_id = ? AND turn = ?", self.chat_id, turn)
        if row is None:
            raise StoreError(f"chat {self.chat_id!r} has no turn {turn}")
        return row

    async def insert_message(
        self, turn: int, message: ChatMessage, *, message_id: str | None = None, step: int | None = None
    ) -> bool:
        """Insert a transcript row unless its key (message id, step, tool call id) exists."""
        return (
            await self.tx.execute(
                "INSERT INTO messages (chat_id, turn, role, message_id, step, tool_call_id, body)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                self.chat_id,
                turn,
                message.role,
                message_id,
                step,
                message.tool_call_id,
                codec.message_body(message),
            )
            == 1
        )

    async def end_turn(self, turn: int, payload: dict[str, Any]) -> None:
        await self.tx.execute(
            "UPDATE turns SET ended = ? WHERE chat_id = ? AND turn = ?", True, self.chat_id, turn
        )
        # Emptied, not deleted: the row keeps the highest version, which readers count on.
        await self.tx.execute(
            "UPDATE drafts SET recorded = ?, text = '' WHERE chat_id = ? AND turn = ?",
            True,
            self.chat_id,
            turn,
        )
        await self.emit("turn_end", payload)


async def held_ids(
    tx: Transaction, chat_id: str, message_ids: list[str], except_turn: int | None = None
) -> list[str]:
    wanted = list(dict.fromkeys(message_ids))  # unique, in the order offered
    if not wanted:
        return []
    rows = await tx.fetchall(
        f"SELECT message_id, turn FROM messages WHERE chat_id = ? AND message_id {tx.IN_TEXTS}",
        chat_id,
        tx.texts(wanted),
    )
    turns = {r["message_id"]: r["turn"] for r in rows}
    return [m for m in wanted if m in turns and turns[m] != except_turn]


def turn_ref(row: codec.Row) -> TurnRef:
    return TurnRef(
        chat_id=str(row["chat_id"]),
        turn=int(row["turn"]),
        run_id=None if row["run_id"] is None else str(row["run_id"]),
    )


class WatchedCall:
    """One store call as `Availability.watch` sees it."""

    wrote = True
    """Whether the call changed anything, as far as its backend tells: a write that
    finds its work done already goes through even on a read-only database."""


class Availability:
    """Whether a store answers, as its calls find it; the log says when that changes.

    One warning when a call first fails as `StoreUnavailable`, one info line when
    the store answers again. After a failed write only a write that changed
    something counts as an answer: while a database is read-only its reads still
    work, and so do writes that find nothing to do."""

    def __init__(self) -> None:
        self._down_since: float | None = None
        self._writes_failed = False

    @property
    def down(self) -> bool:
        return self._down_since is not None

    @contextmanager
    def watch(self, write: bool) -> Iterator[WatchedCall]:
        """Around one store call: a write, or a read (`write=False`)."""
        call = WatchedCall()
        try:
            yield call
        except StoreUnavailable as err:
            self.failed(err, write)
            raise
        self.answered(write and call.wrote)

    def failed(self, err: StoreUnavailable, write: bool) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("the session store does not answer: %s; turns wait for it", err)
        self._writes_failed = self._writes_failed or write

    def answered(self, wrote: bool) -> None:
        if self._down_since is None or (self._writes_failed and not wrote):
            return
        log.info("the session store answers again, after %.1f s", time.monotonic() - self._down_since)
        self._down_since = None
        self._writes_failed = False
