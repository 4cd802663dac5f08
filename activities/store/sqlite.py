"""`SessionStore` on SQLite (standard library `sqlite3`).

All database work runs on one dedicated thread owned by the store, so the
event loop never blocks on disk or on a lock held by another process (worker
and CLI open the same file). Each public method is one transaction; writes use
`BEGIN IMMEDIATE` so the read-then-write logic inside (next seq, next turn,
"does this row exist yet") cannot race with another process.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, Callable, TypeVar

from activities.store.base import (
    INTERRUPTED_TOOL_TEXT,
    SUPERSEDED_TEXT,
    BeginTurn,
    CorruptRowError,
    SessionStore,
    StoreError,
    StoreUnavailable,
    TurnRef,
    TurnUpdate,
    recovery_state_payload,
    superseded,
)
from activities.store import codec
from activities.store.schema import OPEN_SQL, SCHEMA_VERSION, SUPERSEDABLE_SQL, schema, stored_version
from turnkeeper.models import (
    OPEN_STATUSES,
    ChatMessage,
    Event,
    ModelReply,
    NewEvent,
    ToolCall,
    TurnRecord,
    TurnStatus,
    UserMessage,
)

T = TypeVar("T")
log = logging.getLogger("turnkeeper.store")

# A write waits this long for another process's lock before it counts as an outage
# (StoreUnavailable): the turn then waits visibly and tries again, and the
# workflow task is not held so long that updates and signals wait behind it.
BUSY_TIMEOUT_S = 3.0
_OPEN_VALUES = frozenset(s.value for s in OPEN_STATUSES)

_SCHEMA = schema({
    "text": "TEXT", "integer": "INTEGER", "bigint": "INTEGER", "boolean": "INTEGER", "true": "1", "false": "0",
    "timestamp": "TEXT", "row_id": "INTEGER PRIMARY KEY AUTOINCREMENT",
})


def _now() -> str:
    # Fixed precision and offset keep the strings sortable as text (list_chats orders by them).
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class SQLiteStore(SessionStore):
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        self._reported_gone = False

    # -- lifecycle ---------------------------------------------------------------
    async def open(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="turnkeeper-sqlite")
        await self._call(self._open_sync)

    async def close(self) -> None:
        executor, self._executor = self._executor, None  # refuse new calls from here on
        if executor is None:
            return
        # Queued jobs run first (FIFO), so the connection closes after them.
        await asyncio.get_running_loop().run_in_executor(executor, self._close_sync)
        executor.shutdown(wait=True)

    def _open_sync(self) -> None:
        if self._conn is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(
                    str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None,  # we issue BEGIN ourselves
                    check_same_thread=False,
                )
            except (OSError, sqlite3.Error) as exc:
                raise StoreError(f"cannot open SQLite store {self.path}: {exc}") from exc
            conn.row_factory = sqlite3.Row
            try:
                # busy_timeout first: switching to WAL needs a lock another process may hold.
                conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
            except sqlite3.Error as exc:
                conn.close()
                kind = StoreUnavailable if isinstance(exc, sqlite3.OperationalError) else StoreError
                raise kind(f"cannot open SQLite store {self.path}: {exc}") from exc
            self._conn = conn
            st = os.stat(self.path)
            self._identity = (st.st_dev, st.st_ino)
        self._tx(True, self._schema_tx)

    def _schema_tx(self, conn: sqlite3.Connection) -> None:
        for statement in _SCHEMA:
            conn.execute(statement)
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if stored_version(str(self.path), None if row is None else row["value"]) is None:
            conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        # Older versions would be migrated here; version 1 is the first.

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- plumbing ------------------------------------------------------------------
    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise StoreError("the store is not open")
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(conn, *args)` in a write transaction on the store thread."""
        return await self._call(self._tx, True, lambda conn: fn(conn, *args))

    async def _durable_write(self, fn: Callable[..., T], *args: Any) -> T:
        """`_write`, synced to disk before it returns. Other writes use WAL's
        synchronous=NORMAL, which survives a killed process but not a power cut."""
        return await self._call(self._synced_tx, lambda conn: fn(conn, *args))

    def _synced_tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            raise StoreError("the store is not open")
        try:
            conn.execute("PRAGMA synchronous = FULL")
            try:
                return self._tx(True, fn)
            finally:
                conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raise self._failure(exc) from exc

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(conn, *args)` in a read transaction on the store thread."""
        return await self._call(self._tx, False, lambda conn: fn(conn, *args))

    def _tx(self, write: bool, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` in one transaction on the store thread; sqlite errors become StoreError."""
        conn = self._conn
        if conn is None:
            raise StoreError("the store is not open")
        self._check_file()
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = fn(conn)
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result
        except sqlite3.Error as exc:
            raise self._failure(exc) from exc

    def _failure(self, exc: sqlite3.Error) -> StoreError:
        # Locked, read-only, out of space, unreadable: the same call may work later.
        kind = StoreUnavailable if isinstance(exc, sqlite3.OperationalError) else StoreError
        return kind(f"SQLite store {self.path}: {exc}")

    def _check_file(self) -> None:
        """The connection would go on writing to a deleted file, silently: refuse instead."""
        try:
            st = os.stat(self.path)
            same = (st.st_dev, st.st_ino) == self._identity
        except OSError:
            same = False
        if not same:
            if not self._reported_gone:
                self._reported_gone = True
                log.error("SQLite store %s was deleted or replaced under the running worker; turns wait "
                          "until it is back (restore the file, or restart the worker to use a new one)", self.path)
            raise StoreUnavailable(f"SQLite store {self.path} was deleted or replaced while the worker ran")
        self._reported_gone = False

    @staticmethod
    def _emit(conn: sqlite3.Connection, chat_id: str, type_: str, payload: dict[str, Any], now: str) -> None:
        # Safe without a sequence table: BEGIN IMMEDIATE holds the write lock.
        seq = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE chat_id = ?", (chat_id,)
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO events (chat_id, seq, type, payload, created_at) VALUES (?, ?, ?, ?, ?)",
            (chat_id, seq, type_, codec.json_text(payload), now),
        )

    @staticmethod
    def _turn_row(conn: sqlite3.Connection, chat_id: str, turn: int) -> sqlite3.Row:
        row = conn.execute("SELECT * FROM turns WHERE chat_id = ? AND turn = ?", (chat_id, turn)).fetchone()
        if row is None:
            raise StoreError(f"chat {chat_id!r} has no turn {turn}")
        return row

    @staticmethod
    def _insert_message(conn: sqlite3.Connection, chat_id: str, turn: int, message: ChatMessage, *,
                        message_id: str | None = None, step: int | None = None) -> bool:
        """Insert a transcript row unless its key (message id, step, tool call id) exists."""
        cur = conn.execute(
            "INSERT OR IGNORE INTO messages (chat_id, turn, role, message_id, step, tool_call_id, body)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (chat_id, turn, message.role, message_id, step, message.tool_call_id, codec.message_body(message)),
        )
        return cur.rowcount == 1

    def _set_turn(self, conn: sqlite3.Connection, chat_id: str, turn: int, update: TurnUpdate,
                  now: str) -> bool:
        """Write `update` and announce it; False (nothing written) when already in that state."""
        current = codec.decode_turn(self._turn_row(conn, chat_id, turn))
        if (current.status, current.reason, current.recovery_id, current.can_continue, current.attempts) == (
            update.status, update.reason, update.recovery_id, update.can_continue, update.attempts
        ):
            return False
        conn.execute(
            "UPDATE turns SET status = ?, reason = ?, recovery_id = ?, can_continue = ?, attempts = ?,"
            " updated_at = ? WHERE chat_id = ? AND turn = ?",
            (update.status.value, codec.enum_value(update.reason), update.recovery_id, int(update.can_continue),
             update.attempts, now, chat_id, turn),
        )
        self._emit(conn, chat_id, "recovery_state", recovery_state_payload(turn, update), now)
        self._emit(conn, chat_id, "session_updated", {"scope": "thread"}, now)
        return True

    @staticmethod
    def _held_ids(conn: sqlite3.Connection, chat_id: str, message_ids: list[str],
                  except_turn: int | None = None) -> list[str]:
        held: list[str] = []
        for message_id in dict.fromkeys(message_ids):  # unique, in the order offered
            row = conn.execute(
                "SELECT turn FROM messages WHERE chat_id = ? AND message_id = ?", (chat_id, message_id)
            ).fetchone()
            if row is not None and row["turn"] != except_turn:
                held.append(message_id)
        return held

    # -- turns -----------------------------------------------------------------------
    async def begin_turn(self, chat_id: str, run_id: str, message_ids: list[str]) -> BeginTurn:
        return await self._write(self._begin_turn_tx, chat_id, run_id, list(message_ids))

    def _begin_turn_tx(self, conn: sqlite3.Connection, chat_id: str, run_id: str,
                       message_ids: list[str]) -> BeginTurn:
        # Checked first: by the time the activity retries, this run may have committed
        # its messages, and they must not then count as duplicates.
        existing = conn.execute(
            "SELECT turn, closed_turn FROM turns WHERE chat_id = ? AND run_id = ? ORDER BY turn LIMIT 1",
            (chat_id, run_id),
        ).fetchone()
        if existing is not None:
            return BeginTurn(
                turn=existing["turn"],
                duplicate_ids=self._held_ids(conn, chat_id, message_ids, except_turn=existing["turn"]),
                closed_turn=existing["closed_turn"],
            )

        duplicates = self._held_ids(conn, chat_id, message_ids)
        if not set(message_ids) - set(duplicates):
            return BeginTurn(turn=None, duplicate_ids=duplicates)

        now = _now()
        closed_turn: int | None = None
        open_rows = conn.execute(
            f"SELECT * FROM turns WHERE chat_id = ? AND {SUPERSEDABLE_SQL} ORDER BY turn", (chat_id,)).fetchall()
        for row in open_rows:  # normally at most one: each begin_turn closes the previous
            self._supersede(conn, codec.decode_turn(row), now)
            closed_turn = row["turn"]

        turn = conn.execute(
            "SELECT COALESCE(MAX(turn), 0) + 1 FROM turns WHERE chat_id = ?", (chat_id,)
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO turns (chat_id, turn, run_id, status, started_at, updated_at, closed_turn)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (chat_id, turn, run_id, TurnStatus.RUNNING.value, now, now, closed_turn),
        )
        self._emit(conn, chat_id, "turn_started", {"turn": turn, "run_id": run_id}, now)
        return BeginTurn(turn=turn, duplicate_ids=duplicates, closed_turn=closed_turn)

    def _supersede(self, conn: sqlite3.Connection, record: TurnRecord, now: str) -> None:
        """Close an open turn so the transcript stays well formed for the model:
        every tool call gets an answer, the turn ends with an assistant row, and
        its `turn_end` tells whoever waits on it (`turnkeeper send`, a UI)."""
        self._answer_unanswered(conn, record.chat_id, record.turn, now)
        self._finish_turn_tx(conn, record.chat_id, record.turn, superseded(record), SUPERSEDED_TEXT, None)

    def _answer_unanswered(self, conn: sqlite3.Connection, chat_id: str, turn: int, now: str) -> list[str]:
        """An interrupted tool row for every tool call of the turn that has no answer."""
        rows = conn.execute(
            "SELECT id, body FROM messages WHERE chat_id = ? AND turn = ? AND role = 'assistant' ORDER BY id",
            (chat_id, turn),
        ).fetchall()
        answered: list[str] = []
        for row in rows:
            for call in codec.tool_calls_of(chat_id, row):
                if self._insert_message(conn, chat_id, turn, ChatMessage(
                    role="tool", content=INTERRUPTED_TOOL_TEXT, tool_call_id=call.id, name=call.name,
                )):
                    answered.append(call.id)
                    self._emit(conn, chat_id, "tool_interrupted",
                               {"turn": turn, "tool_call_id": call.id, "name": call.name}, now)
        return answered

    async def close_unanswered_calls(self, chat_id: str, turn: int) -> list[str]:
        return await self._write(lambda conn: self._answer_unanswered(conn, chat_id, turn, _now()))

    async def update_turn(self, chat_id: str, turn: int, update: TurnUpdate) -> None:
        await self._write(lambda conn: self._set_turn(conn, chat_id, turn, update, _now()))

    async def get_turn(self, chat_id: str, turn: int | None = None) -> TurnRecord | None:
        return await self._read(self._get_turn_tx, chat_id, turn)

    @staticmethod
    def _get_turn_tx(conn: sqlite3.Connection, chat_id: str, turn: int | None) -> TurnRecord | None:
        if turn is None:
            row = conn.execute(
                "SELECT * FROM turns WHERE chat_id = ? ORDER BY turn DESC LIMIT 1", (chat_id,)
            ).fetchone()
        else:
            row = conn.execute("SELECT * FROM turns WHERE chat_id = ? AND turn = ?", (chat_id, turn)).fetchone()
        return None if row is None else codec.decode_turn(row)

    async def open_turns(self, limit: int = 1000) -> list[TurnRecord]:
        return await self._read(self._open_turns_tx, limit)

    @staticmethod
    def _open_turns_tx(conn: sqlite3.Connection, limit: int) -> list[TurnRecord]:
        rows = conn.execute(
            f"SELECT * FROM turns WHERE {OPEN_SQL} ORDER BY updated_at, chat_id, turn LIMIT ?", (limit,),
        ).fetchall()
        return [codec.decode_turn(row) for row in rows]

    async def open_turn_refs(self, limit: int = 1000) -> list[TurnRef]:
        return await self._read(self._open_turn_refs_tx, limit)

    @staticmethod
    def _open_turn_refs_tx(conn: sqlite3.Connection, limit: int) -> list[TurnRef]:
        rows = conn.execute(
            f"SELECT chat_id, turn, run_id FROM turns WHERE {OPEN_SQL}"
            " ORDER BY updated_at, chat_id, turn LIMIT ?", (limit,),
        ).fetchall()
        return [TurnRef(chat_id=str(r["chat_id"]), turn=int(r["turn"]),
                        run_id=None if r["run_id"] is None else str(r["run_id"])) for r in rows]

    async def run_known(self, chat_id: str, run_id: str) -> bool:
        return await self._read(lambda conn: conn.execute(
            "SELECT 1 FROM turns WHERE chat_id = ? AND run_id = ? LIMIT 1", (chat_id, run_id)).fetchone() is not None)

    async def held_message_ids(self, chat_id: str, message_ids: list[str]) -> list[str]:
        return await self._read(self._held_ids, chat_id, list(message_ids))

    async def list_chats(self, status: TurnStatus | None = None, limit: int = 1000) -> list[TurnRecord]:
        return await self._read(self._list_chats_tx, status, limit)

    @staticmethod
    def _list_chats_tx(conn: sqlite3.Connection, status: TurnStatus | None, limit: int) -> list[TurnRecord]:
        # The filter applies to each chat's latest turn, not to any of its turns.
        rows = conn.execute(
            "SELECT t.* FROM turns t"
            " JOIN (SELECT chat_id, MAX(turn) AS turn FROM turns GROUP BY chat_id) latest"
            "   ON latest.chat_id = t.chat_id AND latest.turn = t.turn"
            " WHERE ?1 IS NULL OR t.status = ?1"
            " ORDER BY t.updated_at DESC, t.chat_id LIMIT ?2",
            (codec.enum_value(status), limit),
        ).fetchall()
        return [codec.decode_turn(row) for row in rows]

    # -- transcript ----------------------------------------------------------------------
    async def commit_user_messages(self, chat_id: str, turn: int, messages: list[UserMessage]) -> list[str]:
        return await self._write(self._commit_user_tx, chat_id, turn, list(messages))

    def _commit_user_tx(self, conn: sqlite3.Connection, chat_id: str, turn: int,
                        messages: list[UserMessage]) -> list[str]:
        now = _now()
        committed: list[str] = []
        for message in messages:
            if self._insert_message(conn, chat_id, turn, ChatMessage(role="user", content=message.text),
                                    message_id=message.message_id):
                committed.append(message.message_id)
                self._emit(conn, chat_id, "user_message", {
                    "turn": turn, "message_id": message.message_id,
                    "text": message.text, "sender": message.sender,
                }, now)
        return committed

    async def record_assistant(self, chat_id: str, turn: int, step: int, reply: ModelReply,
                               final: bool) -> None:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        await self._write(self._record_assistant_tx, chat_id, turn, step, reply, final)

    def _record_assistant_tx(self, conn: sqlite3.Connection, chat_id: str, turn: int, step: int,
                             reply: ModelReply, final: bool) -> None:
        now = _now()
        message = ChatMessage(role="assistant", content=reply.text, tool_calls=reply.tool_calls or None)
        row = conn.execute(
            "SELECT id, body FROM messages WHERE chat_id = ? AND turn = ? AND step = ?", (chat_id, turn, step)
        ).fetchone()
        if row is None:
            changed = self._insert_message(conn, chat_id, turn, message, step=step)
        else:
            try:
                changed = codec.decode_message(chat_id, row) != message
            except CorruptRowError:
                changed = True  # an undecodable row is exactly what a rewrite should repair
            if changed:
                # UPDATE in place: the row keeps its id, hence its place in the transcript.
                conn.execute("UPDATE messages SET body = ? WHERE id = ?", (codec.message_body(message), row["id"]))
        if changed:
            self._emit(conn, chat_id, "assistant_message", {
                "turn": turn, "step": step, "text": reply.text,
                "tool_calls": [call.model_dump() for call in reply.tool_calls],
            }, now)
        if final:
            current = self._turn_row(conn, chat_id, turn)
            # Only an open turn completes: a late answer never reopens a closed one.
            if current["status"] in _OPEN_VALUES and not current["ended"]:
                conn.execute(
                    "UPDATE turns SET status = ?, reason = NULL, updated_at = ? WHERE chat_id = ? AND turn = ?",
                    (TurnStatus.COMPLETED.value, now, chat_id, turn),
                )
                self._end_turn(conn, chat_id, turn, {"turn": turn, "status": TurnStatus.COMPLETED.value}, now)

    def _end_turn(self, conn: sqlite3.Connection, chat_id: str, turn: int, payload: dict[str, Any],
                  now: str) -> None:
        conn.execute("UPDATE turns SET ended = 1 WHERE chat_id = ? AND turn = ?", (chat_id, turn))
        self._emit(conn, chat_id, "turn_end", payload, now)

    async def tool_started(self, chat_id: str, turn: int, call: ToolCall, idempotency_key: str) -> bool:
        # On disk before the tool acts: should the Temporal server lose its last
        # moments in a power cut and schedule the call again, this row refuses it.
        return await self._durable_write(self._tool_started_tx, chat_id, turn, call, idempotency_key)

    def _tool_started_tx(self, conn: sqlite3.Connection, chat_id: str, turn: int, call: ToolCall,
                         idempotency_key: str) -> bool:
        now = _now()
        cur = conn.execute(
            "INSERT OR IGNORE INTO tool_runs (idempotency_key, chat_id, turn, tool_call_id, started_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (idempotency_key, chat_id, turn, call.id, now),
        )
        if cur.rowcount != 1:
            return False
        self._emit(conn, chat_id, "tool_started", {
            "turn": turn, "tool_call_id": call.id, "name": call.name, "idempotency_key": idempotency_key,
        }, now)
        return True

    async def record_tool_result(self, chat_id: str, turn: int, tool_call_id: str, name: str,
                                 content: str, status: str) -> bool:
        if status not in codec.TOOL_RESULT_STATUSES:
            raise ValueError(f"tool result status must be one of {sorted(codec.TOOL_RESULT_STATUSES)}, got {status!r}")
        return await self._write(self._tool_result_tx, chat_id, turn, tool_call_id, name, content, status)

    def _tool_result_tx(self, conn: sqlite3.Connection, chat_id: str, turn: int, tool_call_id: str,
                        name: str, content: str, status: str) -> bool:
        now = _now()
        message = ChatMessage(role="tool", content=content, tool_call_id=tool_call_id, name=name)
        if not self._insert_message(conn, chat_id, turn, message):
            return False
        if status == "interrupted":
            self._emit(conn, chat_id, "tool_interrupted",
                       {"turn": turn, "tool_call_id": tool_call_id, "name": name}, now)
        else:
            self._emit(conn, chat_id, "tool_finished",
                       {"turn": turn, "tool_call_id": tool_call_id, "name": name, "status": status}, now)
        return True

    async def finish_turn(self, chat_id: str, turn: int, update: TurnUpdate,
                          closing_text: str | None = None,
                          only_from: frozenset[TurnStatus] | None = None) -> bool:
        if update.status in OPEN_STATUSES:
            raise ValueError(f"finish_turn needs a terminal status, got {update.status.value!r}")
        return await self._write(self._finish_turn_tx, chat_id, turn, update, closing_text, only_from)

    def _finish_turn_tx(self, conn: sqlite3.Connection, chat_id: str, turn: int, update: TurnUpdate,
                        closing_text: str | None, only_from: frozenset[TurnStatus] | None) -> bool:
        now = _now()
        row = self._turn_row(conn, chat_id, turn)
        if only_from is not None and row["status"] not in {s.value for s in only_from}:
            return False
        ended = bool(row["ended"])
        # A closing row has no key of its own; `ended` keeps a retried call from adding it twice.
        if closing_text is not None and not ended:
            self._insert_message(conn, chat_id, turn, ChatMessage(role="assistant", content=closing_text))
        self._set_turn(conn, chat_id, turn, update, now)
        if not ended:
            self._end_turn(conn, chat_id, turn, {
                "turn": turn, "status": update.status.value, "reason": codec.enum_value(update.reason),
            }, now)
        return True

    async def adopt_turn(self, chat_id: str, turn: int, run_id: str) -> int:
        return await self._write(self._adopt_turn_tx, chat_id, turn, run_id)

    def _adopt_turn_tx(self, conn: sqlite3.Connection, chat_id: str, turn: int, run_id: str) -> int:
        self._turn_row(conn, chat_id, turn)  # raises for a missing turn
        conn.execute("UPDATE turns SET run_id = ?, updated_at = ? WHERE chat_id = ? AND turn = ?",
                     (run_id, _now(), chat_id, turn))
        return int(conn.execute(
            "SELECT COALESCE(MAX(step), -1) + 1 FROM messages WHERE chat_id = ? AND turn = ?",
            (chat_id, turn)).fetchone()[0])

    async def turn_messages(self, chat_id: str, turn: int) -> list[ChatMessage]:
        return await self._read(self._turn_messages_tx, chat_id, turn)

    @staticmethod
    def _turn_messages_tx(conn: sqlite3.Connection, chat_id: str, turn: int) -> list[ChatMessage]:
        rows = conn.execute("SELECT id, body FROM messages WHERE chat_id = ? AND turn = ? ORDER BY id",
                            (chat_id, turn)).fetchall()
        return [codec.decode_message(chat_id, row) for row in rows]

    async def history(self, chat_id: str) -> list[ChatMessage]:
        return await self._read(self._history_tx, chat_id)

    @staticmethod
    def _history_tx(conn: sqlite3.Connection, chat_id: str) -> list[ChatMessage]:
        rows = conn.execute("SELECT id, body FROM messages WHERE chat_id = ? ORDER BY id", (chat_id,)).fetchall()
        return [codec.decode_message(chat_id, row) for row in rows]

    # -- events ------------------------------------------------------------------------------
    async def append_events(self, chat_id: str, events: list[NewEvent], keys: list[str] | None = None) -> None:
        await self._write(self._append_events_tx, chat_id, list(events), keys)

    def _append_events_tx(self, conn: sqlite3.Connection, chat_id: str, events: list[NewEvent],
                          keys: list[str] | None) -> None:
        now = _now()
        for i, event in enumerate(events):
            if keys is not None and conn.execute(
                    "INSERT OR IGNORE INTO event_keys (chat_id, event_key) VALUES (?, ?)",
                    (chat_id, keys[i])).rowcount != 1:
                continue  # appended before
            self._emit(conn, chat_id, event.type, event.payload, now)

    async def events(self, chat_id: str, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        return await self._read(self._events_tx, chat_id, after_seq, limit)

    async def follow_from(self, chat_id: str, message_id: str | None = None) -> int:
        return await self._read(self._follow_from_tx, chat_id, message_id)

    @staticmethod
    def _follow_from_tx(conn: sqlite3.Connection, chat_id: str, message_id: str | None) -> int:
        held = message_id is not None and conn.execute(
            "SELECT 1 FROM messages WHERE chat_id = ? AND message_id = ?", (chat_id, message_id)).fetchone()
        if held:
            taken = codec.seq_before_message(conn.execute(
                "SELECT seq, payload FROM events WHERE chat_id = ? AND type = 'user_message' ORDER BY seq",
                (chat_id,)), message_id)
            if taken is not None:
                return taken
        return int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE chat_id = ?",
                                (chat_id,)).fetchone()[0])

    @staticmethod
    def _events_tx(conn: sqlite3.Connection, chat_id: str, after_seq: int, limit: int) -> list[Event]:
        rows = conn.execute(
            "SELECT * FROM events WHERE chat_id = ? AND seq > ? ORDER BY seq LIMIT ?", (chat_id, after_seq, limit)
        ).fetchall()
        return [codec.decode_event(row) for row in rows]
