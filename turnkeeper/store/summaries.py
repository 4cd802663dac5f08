"""What a model call reads of a chat (its latest summary and the rows after it,
read in one transaction with what the call commits first), the summaries it
keeps, and which tool calls have their rows: written once for every backend, a
part of `SQLStore`, which supplies `_write`, `_run_read` and the commits."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from turnkeeper.models import UserMessage
from turnkeeper.store import codec
from turnkeeper.store.base import ContextRows, CorruptRowError, PreparedCall, Summary
from turnkeeper.store.transaction import ChatWrite, Transaction

_SUMMARY_COLUMNS = "upto_id, text, tokens, assistant_rows"


class SummariesSQL:
    # Provided by SQLStore.
    _write: Callable[..., Coroutine[Any, Any, Any]]
    _run_read: Callable[..., Coroutine[Any, Any, Any]]
    _answer_unanswered: Callable[..., Coroutine[Any, Any, Any]]
    _commit_user_tx: Callable[..., Coroutine[Any, Any, Any]]

    async def prepare_model_call(
        self, chat_id: str, turn: int, messages: list[UserMessage], answer_lost_calls: bool = False
    ) -> PreparedCall:
        if not messages and not answer_lost_calls:
            # Nothing to write: a read, which takes no writer's lock.
            try:
                return PreparedCall(committed=[], context=await self.context_rows(chat_id))
            except CorruptRowError as err:
                return PreparedCall(committed=[], context=err)
        return await self._write(chat_id, self._prepare_tx, turn, list(messages), answer_lost_calls)

    async def _prepare_tx(
        self, chat: ChatWrite, turn: int, messages: list[UserMessage], answer_lost_calls: bool
    ) -> PreparedCall:
        # One transaction instead of three: each costs a hop to the store's thread
        # and a commit, on every turn's first model call.
        if answer_lost_calls:
            await self._answer_unanswered(chat, turn)
        committed = await self._commit_user_tx(chat, turn, messages)
        try:
            context: ContextRows | CorruptRowError = await self._context_rows_tx(chat.tx, chat.chat_id)
        except CorruptRowError as err:
            context = err  # returned, not raised: the rows above are committed all the same
        return PreparedCall(committed=committed, context=context)

    async def context_rows(self, chat_id: str) -> ContextRows:
        return await self._run_read(partial(self._context_rows_tx, chat_id=chat_id), snapshot=True)

    @staticmethod
    async def _context_rows_tx(tx: Transaction, chat_id: str) -> ContextRows:
        # Both by index (summaries' key, messages_chat_row): as cheap at turn 2,000 as at turn 20.
        row = await tx.fetchone(
            f"SELECT {_SUMMARY_COLUMNS} FROM summaries WHERE chat_id = ? ORDER BY upto_id DESC LIMIT 1",
            chat_id,
        )
        summary = None if row is None else codec.decode_summary(chat_id, row)
        rows = await tx.fetchall(
            "SELECT id, turn, body FROM messages WHERE chat_id = ? AND id > ? ORDER BY id",
            chat_id,
            summary.upto_id if summary else 0,
        )
        return ContextRows(summary=summary, rows=[codec.decode_stored_row(chat_id, r) for r in rows])

    async def add_summary(self, chat_id: str, summary: Summary) -> Summary:
        return await self._write(chat_id, self._add_summary_tx, summary)

    @staticmethod
    async def _add_summary_tx(chat: ChatWrite, summary: Summary) -> Summary:
        # A model call made again after a loss may summarise the same rows: the first one stays.
        await chat.tx.execute(
            "INSERT INTO summaries (chat_id, upto_id, text, tokens, assistant_rows, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            chat.chat_id,
            summary.upto_id,
            summary.text,
            summary.tokens,
            summary.assistant_rows,
            chat.now,
        )
        row = await chat.tx.fetchone(
            f"SELECT {_SUMMARY_COLUMNS} FROM summaries WHERE chat_id = ? AND upto_id = ?",
            chat.chat_id,
            summary.upto_id,
        )
        assert row is not None  # kept by this transaction, just above
        return codec.decode_summary(chat.chat_id, row)

    async def answered_call_ids(self, chat_id: str, tool_call_ids: list[str]) -> list[str]:
        wanted = list(dict.fromkeys(tool_call_ids))
        if not wanted:
            return []

        async def read(tx: Transaction) -> list[str]:
            rows = await tx.fetchall(
                f"SELECT tool_call_id FROM messages WHERE chat_id = ? AND tool_call_id {tx.IN_TEXTS}",
                chat_id,
                tx.texts(wanted),
            )
            found = {r["tool_call_id"] for r in rows}
            return [i for i in wanted if i in found]

        return await self._run_read(read, snapshot=False)
