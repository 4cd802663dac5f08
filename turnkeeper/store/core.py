"""The session store's transactions and reads, written once for every backend.

`SQLStore` implements `SessionStore` in SQL over a backend's `Transaction`. A
backend (`SQLiteStore`, `PostgresStore`) supplies how a transaction runs: its
connection and thread, how it keeps other writers out, which placeholders its
driver takes, and what its errors mean.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

from turnkeeper.models import (
    OPEN_STATUSES,
    ChatMessage,
    Event,
    NewEvent,
    TurnRecord,
    TurnStatus,
)
from turnkeeper.store import codec
from turnkeeper.store.base import (
    INTERRUPTED_TOOL_TEXT,
    SUPERSEDED_TEXT,
    BeginTurn,
    SessionStore,
    TurnRef,
    TurnUpdate,
    recovery_state_payload,
    superseded,
)
from turnkeeper.store.drafts import DraftsSQL
from turnkeeper.store.schema import OPEN_SQL, SUPERSEDABLE_SQL
from turnkeeper.store.summaries import SummariesSQL
from turnkeeper.store.transaction import ChatWrite, Transaction, held_ids, turn_ref
from turnkeeper.store.transcript import TranscriptSQL

T = TypeVar("T")


class SQLStore(TranscriptSQL, DraftsSQL, SummariesSQL, SessionStore):
    """`SessionStore` over a backend's transactions: a backend implements `open`,
    `close`, `_run_write` and `_run_read`."""

    @abstractmethod
    async def _run_write(
        self, chat_id: str, work: Callable[[Transaction, Any], Coroutine[Any, Any, T]], durable: bool
    ) -> T:
        """`work(tx, now)` in one transaction that keeps every other writer of
        `chat_id` out until it commits; `now` is read once it does.
        `durable`: on disk before this returns, whatever the database's default."""

    @abstractmethod
    async def _run_read(self, work: Callable[[Transaction], Coroutine[Any, Any, T]], snapshot: bool) -> T:
        """`work(tx)`; with `snapshot`, its statements see one state of the database."""

    async def _write(
        self, chat_id: str, body: Callable[..., Coroutine[Any, Any, T]], *args: Any, durable: bool = False
    ) -> T:
        """`body(chat, *args)` in one write transaction on the chat."""
        return await self._run_write(
            chat_id, lambda tx, now: body(ChatWrite(tx, chat_id, now), *args), durable
        )

    async def _rows(self, decode: Callable[[codec.Row], T], sql: str, *args: Any) -> list[T]:
        """The rows of one query, decoded where the backend reads them (off the
        event loop for SQLite)."""

        async def read(tx: Transaction) -> list[T]:
            return [decode(row) for row in await tx.fetchall(sql, *args)]

        return await self._run_read(read, snapshot=False)

    # -- turn status -------------------------------------------------------------
    async def _set_turn(self, chat: ChatWrite, turn: int, update: TurnUpdate) -> bool:
        """Write `update` and announce it; False (nothing written) when already in that state."""
        current = codec.decode_turn(await chat.turn_row(turn))
        if (current.status, current.reason, current.recovery_id, current.can_continue, current.attempts) == (
            update.status,
            update.reason,
            update.recovery_id,
            update.can_continue,
            update.attempts,
        ):
            return False
        await chat.tx.execute(
            "UPDATE turns SET status = ?, reason = ?, recovery_id = ?, can_continue = ?, attempts = ?,"
            " updated_at = ? WHERE chat_id = ? AND turn = ?",
            update.status.value,
            codec.enum_value(update.reason),
            update.recovery_id,
            update.can_continue,
            update.attempts,
            chat.now,
            chat.chat_id,
            turn,
        )
        await chat.emit("recovery_state", recovery_state_payload(turn, update))
        await chat.emit("session_updated", {"scope": "thread"})
        return True

    async def update_turn(self, chat_id: str, turn: int, update: TurnUpdate) -> None:
        await self._write(chat_id, self._set_turn, turn, update)

    # -- turns -----------------------------------------------------------------------
    async def begin_turn(self, chat_id: str, run_id: str, message_ids: list[str]) -> BeginTurn:
        return await self._write(chat_id, self._begin_turn_tx, run_id, list(message_ids))

    async def _begin_turn_tx(self, chat: ChatWrite, run_id: str, message_ids: list[str]) -> BeginTurn:
        tx, chat_id = chat.tx, chat.chat_id
        # Checked first: by the time the activity retries, this run may have committed
        # its messages, and they must not then count as duplicates.
        existing = await tx.fetchone(
            "SELECT turn, closed_turn FROM turns WHERE chat_id = ? AND run_id = ? ORDER BY turn LIMIT 1",
            chat_id,
            run_id,
        )
        if existing is not None:
            return BeginTurn(
                turn=existing["turn"],
                duplicate_ids=await held_ids(tx, chat_id, message_ids, except_turn=existing["turn"]),
                closed_turn=existing["closed_turn"],
            )

        duplicates = await held_ids(tx, chat_id, message_ids)
        if not set(message_ids) - set(duplicates):
            return BeginTurn(turn=None, duplicate_ids=duplicates)

        closed_turn: int | None = None
        open_rows = await tx.fetchall(
            f"SELECT * FROM turns WHERE chat_id = ? AND {SUPERSEDABLE_SQL} ORDER BY turn", chat_id
        )
        for row in open_rows:  # normally at most one: each begin_turn closes the previous
            await self._supersede(chat, codec.decode_turn(row))
            closed_turn = row["turn"]

        turn = int(
            await tx.fetchval("SELECT COALESCE(MAX(turn), 0) + 1 FROM turns WHERE chat_id = ?", chat_id)
        )
        await tx.execute(
            "INSERT INTO turns (chat_id, turn, run_id, status, started_at, updated_at, closed_turn)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            chat_id,
            turn,
            run_id,
            TurnStatus.RUNNING.value,
            chat.now,
            chat.now,
            closed_turn,
        )
        await chat.emit("turn_started", {"turn": turn, "run_id": run_id})
        return BeginTurn(turn=turn, duplicate_ids=duplicates, closed_turn=closed_turn)

    async def turn_of_run(self, chat_id: str, run_id: str) -> int | None:
        rows = await self._rows(
            lambda row: int(row["turn"]),
            "SELECT turn FROM turns WHERE chat_id = ? AND run_id = ? ORDER BY turn LIMIT 1",
            chat_id,
            run_id,
        )
        return rows[0] if rows else None

    async def _supersede(self, chat: ChatWrite, record: TurnRecord) -> None:
        """Close an open turn so the transcript stays well formed for the model:
        every tool call gets an answer, the turn ends with an assistant row, and
        its `turn_end` tells whoever waits on it (`turnkeeper send`, a UI)."""
        await self._answer_unanswered(chat, record.turn)
        await self._finish_turn_tx(chat, record.turn, superseded(record), SUPERSEDED_TEXT, None)

    async def _answer_unanswered(self, chat: ChatWrite, turn: int) -> list[str]:
        """An interrupted tool row for every tool call of the turn that has no answer."""
        rows = await chat.tx.fetchall(
            "SELECT id, body FROM messages WHERE chat_id = ? AND turn = ? AND role = 'assistant' ORDER BY id",
            chat.chat_id,
            turn,
        )
        answered: list[str] = []
        for row in rows:
            for call in codec.tool_calls_of(chat.chat_id, row):
                if await chat.insert_message(
                    turn,
                    ChatMessage(
                        role="tool",
                        content=INTERRUPTED_TOOL_TEXT,
                        tool_call_id=call.id,
                        name=call.name,
                    ),
                ):
                    answered.append(call.id)
                    await chat.emit(
                        "tool_interrupted", {"turn": turn, "tool_call_id": call.id, "name": call.name}
                    )
        return answered

    async def close_unanswered_calls(self, chat_id: str, turn: int) -> list[str]:
        return await self._write(chat_id, self._answer_unanswered, turn)

    async def finish_turn(
        self,
        chat_id: str,
        turn: int,
        update: TurnUpdate,
        closing_text: str | None = None,
        only_from: frozenset[TurnStatus] | None = None,
    ) -> bool:
        if update.status in OPEN_STATUSES:
            raise ValueError(f"finish_turn needs a terminal status, got {update.status.value!r}")
        return await self._write(chat_id, self._finish_turn_tx, turn, update, closing_text, only_from)

    async def _finish_turn_tx(
        self,
        chat: ChatWrite,
        turn: int,
        update: TurnUpdate,
        closing_text: str | None,
        only_from: frozenset[TurnStatus] | None,
    ) -> bool:
        row = await chat.turn_row(turn)
        if only_from is not None and row["status"] not in {s.value for s in only_from}:
            return False
        ended = bool(row["ended"])
        # A closing row has no key of its own; `ended` keeps a retried call from adding it twice.
        if closing_text is not None and not ended:
            await chat.insert_message(turn, ChatMessage(role="assistant", content=closing_text))
        await self._set_turn(chat, turn, update)
        if not ended:
            await chat.end_turn(
                turn, {"turn": turn, "status": update.status.value, "reason": codec.enum_value(update.reason)}
            )
        return True

    async def adopt_turn(self, chat_id: str, turn: int, run_id: str) -> int:
        return await self._write(chat_id, self._adopt_turn_tx, turn, run_id)

    @staticmethod
    async def _adopt_turn_tx(chat: ChatWrite, turn: int, run_id: str) -> int:
        await chat.turn_row(turn)  # raises for a missing turn
        await chat.tx.execute(
            "UPDATE turns SET run_id = ?, updated_at = ? WHERE chat_id = ? AND turn = ?",
            run_id,
            chat.now,
            chat.chat_id,
            turn,
        )
        return int(
            await chat.tx.fetchval(
                "SELECT COALESCE(MAX(step), -1) + 1 FROM messages WHERE chat_id = ? AND turn = ?",
                chat.chat_id,
                turn,
            )
        )

    # -- turn reads ----------------------------------------------------------------------
    async def get_turn(self, chat_id: str, turn: int | None = None) -> TurnRecord | None:
        if turn is None:
            rows = await self._rows(
                codec.decode_turn, "SELECT * FROM turns WHERE chat_id = ? ORDER BY turn DESC LIMIT 1", chat_id
            )
        else:
            rows = await self._rows(
                codec.decode_turn, "SELECT * FROM turns WHERE chat_id = ? AND turn = ?", chat_id, turn
            )
        return rows[0] if rows else None

    async def open_turns(self, limit: int = 1000) -> list[TurnRecord]:
        return await self._rows(
            codec.decode_turn,
            f"SELECT * FROM turns WHERE {OPEN_SQL} ORDER BY updated_at, chat_id, turn LIMIT ?",
            limit,
        )

    async def open_turn_refs(self, limit: int = 1000) -> list[TurnRef]:
        return await self._rows(
            turn_ref,
            f"SELECT chat_id, turn, run_id FROM turns WHERE {OPEN_SQL}"
            " ORDER BY updated_at, chat_id, turn LIMIT ?",
            limit,
        )

    async def held_message_ids(self, chat_id: str, message_ids: list[str]) -> list[str]:
        return await self._run_read(
            partial(held_ids, chat_id=chat_id, message_ids=list(message_ids)), snapshot=False
        )

    async def list_chats(self, status: TurnStatus | None = None, limit: int = 1000) -> list[TurnRecord]:
        # The filter applies to each chat's latest turn, not to any of its turns.
        return await self._rows(
            codec.decode_turn,
            "SELECT t.* FROM turns t"
            " JOIN (SELECT chat_id, MAX(turn) AS turn FROM turns GROUP BY chat_id) latest"
            "   ON latest.chat_id = t.chat_id AND latest.turn = t.turn"
            " WHERE CAST(? AS text) IS NULL OR t.status = ?"
            " ORDER BY t.updated_at DESC, t.chat_id LIMIT ?",
            codec.enum_value(status),
            codec.enum_value(status),
            limit,
        )

    # -- events ------------------------------------------------------------------------------
    async def append_events(
        self, chat_id: str, events: list[NewEvent], keys: list[str] | None = None
    ) -> None:
        await self._write(chat_id, self._append_events_tx, list(events), keys)

    @staticmethod
    async def _append_events_tx(chat: ChatWrite, events: list[NewEvent], keys: list[str] | None) -> None:
        for i, event in enumerate(events):
            if (
                keys is not None
                and await chat.tx.execute(
                    "INSERT INTO event_keys (chat_id, event_key) VALUES (?, ?) ON CONFLICT DO NOTHING",
                    chat.chat_id,
                    keys[i],
                )
                != 1
            ):
                continue  # appended before
            await chat.emit(event.type, event.payload)

    async def events(self, chat_id: str, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        return await self._rows(
            codec.decode_event,
            "SELECT * FROM events WHERE chat_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            chat_id,
            after_seq,
            limit,
        )

    async def follow_from(self, chat_id: str, message_id: str | None = None) -> int:
        return await self._run_read(
            partial(self._follow_from_tx, chat_id=chat_id, message_id=message_id), snapshot=True
        )

    @staticmethod
    async def _follow_from_tx(tx: Transaction, chat_id: str, message_id: str | None) -> int:
        if message_id is not None and await tx.fetchone(
            "SELECT 1 FROM messages WHERE chat_id = ? AND message_id = ?", chat_id, message_id
        ):
            taken = codec.seq_before_message(
                await tx.fetchall(
                    "SELECT seq, payload FROM events WHERE chat_id = ? AND type = 'user_message' ORDER BY seq",
                    chat_id,
                ),
                message_id,
            )
            if taken is not None:
                return taken
        return int(await tx.fetchval("SELECT COALESCE(MAX(seq), 0) FROM events WHERE chat_id = ?", chat_id))
