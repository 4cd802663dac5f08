"""The drafts table's transactions and reads (the answer as it streams), written
once for every backend: a part of `SQLStore`, which supplies `_write`, `_rows`
and `_run_read`."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from turnkeeper.store import codec
from turnkeeper.store.base import Draft
from turnkeeper.store.schema import OPEN_SQL
from turnkeeper.store.transaction import ChatWrite, Transaction


class DraftsSQL:
    # Provided by SQLStore.
    _write: Callable[..., Coroutine[Any, Any, Any]]
    _rows: Callable[..., Coroutine[Any, Any, Any]]
    _run_read: Callable[..., Coroutine[Any, Any, Any]]

    async def write_draft(
        self, chat_id: str, turn: int, step: int, text: str, attempt: int | None = None
    ) -> int:
        return await self._write(chat_id, self._write_draft_tx, turn, step, text, attempt)

    @staticmethod
    async def _write_draft_tx(chat: ChatWrite, turn: int, step: int, text: str, attempt: int | None) -> int:
        tx, chat_id = chat.tx, chat.chat_id
        if attempt is None:
            row = await tx.fetchone("SELECT turn, step, attempt FROM drafts WHERE chat_id = ?", chat_id)
            same_step = row is not None and (row["turn"], row["step"]) == (turn, step)
            attempt = int(row["attempt"]) + 1 if row is not None and same_step else 1
        # SQLite runs one writer at a time, so MAX + 1 grows; on PostgreSQL two chats'
        # writes can share a version, and a reader that misses one sees the next.
        version = int(await tx.fetchval("SELECT COALESCE(MAX(version), 0) + 1 FROM drafts"))
        await tx.notify("drafts", chat_id)
        await tx.execute(
            "INSERT INTO drafts (chat_id, turn, step, attempt, text, version, recorded, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (chat_id) DO UPDATE SET turn = excluded.turn,"
            " step = excluded.step, attempt = excluded.attempt, text = excluded.text,"
            " version = excluded.version, recorded = excluded.recorded, updated_at = excluded.updated_at",
            chat_id,
            turn,
            step,
            attempt,
            text,
            version,
            False,
            chat.now,
        )
        return attempt

    async def drafts_since(self, version: int, limit: int = 1000) -> list[Draft]:
        return await self._rows(
            codec.decode_draft,
            "SELECT * FROM drafts WHERE version > ? ORDER BY version LIMIT ?",
            version,
            limit,
        )

    async def draft(self, chat_id: str) -> Draft | None:
        rows = await self._rows(
            codec.decode_draft,
            f"SELECT d.* FROM drafts d JOIN turns t ON t.chat_id = d.chat_id AND t.turn = d.turn"
            f" WHERE d.chat_id = ? AND NOT d.recorded AND t.{OPEN_SQL} AND NOT t.ended",
            chat_id,
        )
        return rows[0] if rows else None

    async def draft_version(self) -> int:
        async def read(tx: Transaction) -> int:
            return int(await tx.fetchval("SELECT COALESCE(MAX(version), 0) FROM drafts"))

        return await self._run_read(read, snapshot=False)
