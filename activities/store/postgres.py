"""`SessionStore` on PostgreSQL (`asyncpg`), for workers on several machines.

Same tables, semantics, events and idempotency as `SQLiteStore`; what differs is
how concurrent writers are kept apart:

- Every write transaction starts by taking a transaction-scoped advisory lock
  on its chat (`pg_advisory_xact_lock(<turnkeeper chat space>, hashtext(chat_id))`).
  All the read-then-write logic inside (next event `seq`, next turn number,
  "does this row exist yet", closing an open turn) therefore runs as if alone
  for that chat, whichever worker or machine issued it; other chats are not
  held up. As a consequence event `seq`s are gap-free per chat and commit in
  order: a reader paging with `after_seq` never sees seq n+1 before seq n.
- The transaction's timestamp is taken from the database clock once the lock is
  held, so `updated_at` and event times follow the commit order even when the
  workers' clocks disagree.
- `open()` creates or migrates the schema under an advisory lock of its own, so
  several workers starting at once don't collide; once the schema is current it
  runs no DDL at all (a new worker never blocks live traffic).

Bodies and payloads are JSON in `text` columns, exactly as in SQLite (cast to
`jsonb` in ad-hoc queries); a row that does not decode raises `CorruptRowError`
naming it. Connection URLs are shown without user or password.
"""
from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import asyncpg

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

LOCK_TIMEOUT_S = 10.0
"""How long a write waits for its chat's lock before it fails (StoreError, so
the activity is retried): the counterpart of SQLite's busy timeout."""

# Advisory lock keys, two-int form: (space, key). 'tkch' / 'tksc' in ASCII.
_CHAT_LOCK_SPACE = 0x746B6368
_SCHEMA_LOCK_SPACE = 0x746B7363
_SCHEMA_LOCK_KEY = 1

_OPEN_VALUES = frozenset(s.value for s in OPEN_STATUSES)
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

_SCHEMA = schema({
    "text": "text", "integer": "integer", "bigint": "bigint", "boolean": "boolean", "true": "true",
    "false": "false", "timestamp": "timestamptz", "row_id": "bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
})

Row = asyncpg.Record


def display_url(url: str) -> str:
    """`scheme://host:port/db`: never the user, the password or the query."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "postgresql://?"
    if ":" in host:
        host = f"[{host}]"
    scheme = parts.scheme or "postgresql"
    return f"{scheme}://{host}{port}{parts.path or '/'}"


def _password(url: str) -> str | None:
    try:
        password = urlsplit(url).password
    except ValueError:
        return None
    return unquote(password) if password else None


# The server is down, unreachable, read-only, overloaded or shutting down: the same
# call may work later (StoreUnavailable). Anything else is a bug or a bad row.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError, TimeoutError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError,
    asyncpg.exceptions.CannotConnectNowError, asyncpg.exceptions.ReadOnlySQLTransactionError,
    asyncpg.exceptions.LockNotAvailableError, asyncpg.exceptions.QueryCanceledError,
    asyncpg.exceptions.TooManyConnectionsError, asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
)

class _Tx:
    """One write transaction on one chat, holding that chat's lock."""

    def __init__(self, conn: asyncpg.Connection, chat_id: str, now: datetime) -> None:
        self.conn = conn
        self.chat_id = chat_id
        self.now = now
        self._next_seq: int | None = None

    async def emit(self, type_: str, payload: dict[str, Any]) -> None:
        # Safe without a sequence table: the chat lock is held until commit.
        if self._next_seq is None:
            self._next_seq = int(await self.conn.fetchval(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE chat_id = $1", self.chat_id))
        await self.conn.execute(
            "INSERT INTO events (chat_id, seq, type, payload, created_at) VALUES ($1, $2, $3, $4, $5)",
            self.chat_id, self._next_seq, type_, codec.json_text(payload), self.now,
        )
        self._next_seq += 1

    async def turn_row(self, turn: int) -> Row:
        row = await self.conn.fetchrow("SELECT * FROM turns WHERE chat_id = $1 AND turn = $2", self.chat_id, turn)
        if row is None:
            raise StoreError(f"chat {self.chat_id!r} has no turn {turn}")
        return row

    async def insert_message(self, turn: int, message: ChatMessage, *, message_id: str | None = None,
                             step: int | None = None) -> bool:
        """Insert a transcript row unless its key (message id, step, tool call id) exists."""
        inserted = await self.conn.fetchval(
            "INSERT INTO messages (chat_id, turn, role, message_id, step, tool_call_id, body)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING RETURNING id",
            self.chat_id, turn, message.role, message_id, step, message.tool_call_id, codec.message_body(message),
        )
        return inserted is not None

    async def held_ids(self, message_ids: list[str], except_turn: int | None = None) -> list[str]:
        return await _held_ids(self.conn, self.chat_id, message_ids, except_turn)


async def _held_ids(conn: asyncpg.Connection, chat_id: str, message_ids: list[str],
                    except_turn: int | None = None) -> list[str]:
    wanted = list(dict.fromkeys(message_ids))  # unique, in the order offered
    if not wanted:
        return []
    rows = await conn.fetch(
        "SELECT message_id, turn FROM messages WHERE chat_id = $1 AND message_id = ANY($2::text[])",
        chat_id, wanted,
    )
    turns = {r["message_id"]: r["turn"] for r in rows}
    return [m for m in wanted if m in turns and turns[m] != except_turn]


class PostgresStore(SessionStore):
    """`PostgresStore("postgresql://user:pass@host/db")`; `await store.open()` first.

    `schema` keeps the tables in that schema (created when missing) instead of
    the first one on the server's `search_path`: several deployments, or tests,
    can share one database.
    """

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10, schema: str | None = None,
                 lock_timeout: float = LOCK_TIMEOUT_S) -> None:
        if schema is not None and not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(f"schema must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*), got {schema!r}")
        if min_size < 0 or max_size < 1 or min_size > max_size:
            raise ValueError(f"need 0 <= min_size <= max_size and max_size >= 1, got {min_size}, {max_size}")
        self._url = url
        self._password = _password(url)
        self.display_url = display_url(url) + (f" (schema {schema})" if schema else "")
        self.schema = schema
        self.min_size = min_size
        self.max_size = max_size
        self.lock_timeout = lock_timeout
        self._pool: asyncpg.Pool | None = None

    def __repr__(self) -> str:
        return f"PostgresStore({self.display_url!r})"

    # -- lifecycle ---------------------------------------------------------------
    async def open(self) -> None:
        if self._pool is None:
            settings = {"lock_timeout": f"{max(1, int(self.lock_timeout * 1000))}ms"}
            if self.schema:
                settings["search_path"] = f'"{self.schema}"'
            # ValueError too: asyncpg's complaint about a malformed URL.
            with self._errors("cannot open", ValueError):
                pool = await asyncpg.create_pool(
                    self._url, min_size=self.min_size, max_size=self.max_size, server_settings=settings,
                )
            try:
                await self._migrate(pool)
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
        else:
            await self._migrate(self._pool)

    async def close(self) -> None:
        pool, self._pool = self._pool, None  # refuse new calls from here on
        if pool is not None:
            await pool.close()  # waits for connections in use to be released

    async def _migrate(self, pool: asyncpg.Pool) -> None:
        with self._errors("cannot set up the schema of"):
            async with pool.acquire() as conn, conn.transaction():
                # Several workers starting at once: one migrates, the others wait, then find it done.
                await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", _SCHEMA_LOCK_SPACE, _SCHEMA_LOCK_KEY)
                if self.schema:
                    await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
                raw: str | None = None
                if await conn.fetchval("SELECT to_regclass('meta') IS NOT NULL"):
                    raw = await conn.fetchval("SELECT value FROM meta WHERE key = 'schema_version'")
                if stored_version(self.display_url, raw) == SCHEMA_VERSION:
                    return  # current: no DDL, no locks on the tables
                for statement in _SCHEMA:
                    await conn.execute(statement)
                # Older versions would be migrated here; version 1 is the first.
                await conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', $1)"
                    " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                    str(SCHEMA_VERSION),
                )

    # -- plumbing ------------------------------------------------------------------
    def _require_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreError("the store is not open")
        return self._pool

    @contextmanager
    def _errors(self, doing: str = "", *also: type[Exception]) -> Iterator[None]:
        """Driver and network errors become StoreError (retryable); the password never shows."""
        try:
            yield
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError, *also) as exc:
            text = f"{type(exc).__name__}: {exc}"
            if self._password:
                text = text.replace(self._password, "***")
            where = f"{doing} PostgreSQL store" if doing else "PostgreSQL store"
            kind = StoreUnavailable if isinstance(exc, _UNAVAILABLE) else StoreError
            # `from None`: the driver's exception could carry the URL it was given.
            raise kind(f"{where} {self.display_url}: {text}") from None

    async def _write(self, chat_id: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`fn(tx, *args)` in one transaction that holds `chat_id`'s lock."""
        pool = self._require_pool()
        with self._errors():
            async with pool.acquire() as conn, conn.transaction():
                # FROM first: the clock is read once the lock is held.
                now = await conn.fetchval(
                    "SELECT clock_timestamp() FROM pg_advisory_xact_lock($1, hashtext($2))",
                    _CHAT_LOCK_SPACE, chat_id,
                )
                return await fn(_Tx(conn, chat_id, now), *args)

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection for one read statement (its own snapshot)."""
        pool = self._require_pool()
        with self._errors():
            async with pool.acquire() as conn:
                yield conn

    async def _set_turn(self, tx: _Tx, turn: int, update: TurnUpdate) -> bool:
        """Write `update` and announce it; False (nothing written) when already in that state."""
        current = codec.decode_turn(await tx.turn_row(turn))
        if (current.status, current.reason, current.recovery_id, current.can_continue, current.attempts) == (
            update.status, update.reason, update.recovery_id, update.can_continue, update.attempts
        ):
            return False
        await tx.conn.execute(
            "UPDATE turns SET status = $1, reason = $2, recovery_id = $3, can_continue = $4, attempts = $5,"
            " updated_at = $6 WHERE chat_id = $7 AND turn = $8",
            update.status.value, codec.enum_value(update.reason), update.recovery_id, update.can_continue,
            update.attempts, tx.now, tx.chat_id, turn,
        )
        await tx.emit("recovery_state", recovery_state_payload(turn, update))
        await tx.emit("session_updated", {"scope": "thread"})
        return True

    async def _end_turn(self, tx: _Tx, turn: int, payload: dict[str, Any]) -> None:
        await tx.conn.execute("UPDATE turns SET ended = true WHERE chat_id = $1 AND turn = $2", tx.chat_id, turn)
        await tx.emit("turn_end", payload)

    # -- turns -----------------------------------------------------------------------
    async def begin_turn(self, chat_id: str, run_id: str, message_ids: list[str]) -> BeginTurn:
        return await self._write(chat_id, self._begin_turn_tx, run_id, list(message_ids))

    async def _begin_turn_tx(self, tx: _Tx, run_id: str, message_ids: list[str]) -> BeginTurn:
        conn, chat_id = tx.conn, tx.chat_id
        # Checked first: by the time the activity retries, this run may have committed
        # its messages, and they must not then count as duplicates.
        existing = await conn.fetchrow(
            "SELECT turn, closed_turn FROM turns WHERE chat_id = $1 AND run_id = $2 ORDER BY turn LIMIT 1",
            chat_id, run_id,
        )
        if existing is not None:
            return BeginTurn(
                turn=existing["turn"],
                duplicate_ids=await tx.held_ids(message_ids, except_turn=existing["turn"]),
                closed_turn=existing["closed_turn"],
            )

        duplicates = await tx.held_ids(message_ids)
        if not set(message_ids) - set(duplicates):
            return BeginTurn(turn=None, duplicate_ids=duplicates)

        closed_turn: int | None = None
        open_rows = await conn.fetch(
            f"SELECT * FROM turns WHERE chat_id = $1 AND {SUPERSEDABLE_SQL} ORDER BY turn", chat_id)
        for row in open_rows:  # normally at most one: each begin_turn closes the previous
            await self._supersede(tx, codec.decode_turn(row))
            closed_turn = row["turn"]

        turn = int(await conn.fetchval("SELECT COALESCE(MAX(turn), 0) + 1 FROM turns WHERE chat_id = $1", chat_id))
        await conn.execute(
            "INSERT INTO turns (chat_id, turn, run_id, status, started_at, updated_at, closed_turn)"
            " VALUES ($1, $2, $3, $4, $5, $5, $6)",
            chat_id, turn, run_id, TurnStatus.RUNNING.value, tx.now, closed_turn,
        )
        await tx.emit("turn_started", {"turn": turn, "run_id": run_id})
        return BeginTurn(turn=turn, duplicate_ids=duplicates, closed_turn=closed_turn)

    async def _supersede(self, tx: _Tx, record: TurnRecord) -> None:
        """Close an open turn so the transcript stays well formed for the model:
        every tool call gets an answer, the turn ends with an assistant row, and
        its `turn_end` tells whoever waits on it (`turnkeeper send`, a UI)."""
        await self._answer_unanswered(tx, record.turn)
        await self._finish_turn_tx(tx, record.turn, superseded(record), SUPERSEDED_TEXT, None)

    async def _answer_unanswered(self, tx: _Tx, turn: int) -> list[str]:
        """An interrupted tool row for every tool call of the turn that has no answer."""
        rows = await tx.conn.fetch(
            "SELECT id, body FROM messages WHERE chat_id = $1 AND turn = $2 AND role = 'assistant' ORDER BY id",
            tx.chat_id, turn,
        )
        answered: list[str] = []
        for row in rows:
            for call in codec.tool_calls_of(tx.chat_id, row):
                if await tx.insert_message(turn, ChatMessage(
                    role="tool", content=INTERRUPTED_TOOL_TEXT, tool_call_id=call.id, name=call.name,
                )):
                    answered.append(call.id)
                    await tx.emit("tool_interrupted", {"turn": turn, "tool_call_id": call.id, "name": call.name})
        return answered

    async def close_unanswered_calls(self, chat_id: str, turn: int) -> list[str]:
        return await self._write(chat_id, self._answer_unanswered, turn)

    async def update_turn(self, chat_id: str, turn: int, update: TurnUpdate) -> None:
        await self._write(chat_id, self._set_turn, turn, update)

    async def get_turn(self, chat_id: str, turn: int | None = None) -> TurnRecord | None:
        async with self._read() as conn:
            if turn is None:
                row = await conn.fetchrow(
                    "SELECT * FROM turns WHERE chat_id = $1 ORDER BY turn DESC LIMIT 1", chat_id)
            else:
                row = await conn.fetchrow("SELECT * FROM turns WHERE chat_id = $1 AND turn = $2", chat_id, turn)
        return None if row is None else codec.decode_turn(row)

    async def open_turns(self, limit: int = 1000) -> list[TurnRecord]:
        async with self._read() as conn:
            rows = await conn.fetch(
                f"SELECT * FROM turns WHERE {OPEN_SQL} ORDER BY updated_at, chat_id, turn LIMIT $1", limit)
        return [codec.decode_turn(row) for row in rows]

    async def open_turn_refs(self, limit: int = 1000) -> list[TurnRef]:
        async with self._read() as conn:
            rows = await conn.fetch(
                f"SELECT chat_id, turn, run_id FROM turns WHERE {OPEN_SQL}"
                " ORDER BY updated_at, chat_id, turn LIMIT $1", limit)
        return [TurnRef(chat_id=str(r["chat_id"]), turn=int(r["turn"]),
                        run_id=None if r["run_id"] is None else str(r["run_id"])) for r in rows]

    async def run_known(self, chat_id: str, run_id: str) -> bool:
        async with self._read() as conn:
            return await conn.fetchval(
                "SELECT 1 FROM turns WHERE chat_id = $1 AND run_id = $2 LIMIT 1", chat_id, run_id) is not None

    async def held_message_ids(self, chat_id: str, message_ids: list[str]) -> list[str]:
        async with self._read() as conn:
            return await _held_ids(conn, chat_id, list(message_ids))

    async def list_chats(self, status: TurnStatus | None = None, limit: int = 1000) -> list[TurnRecord]:
        # The filter applies to each chat's latest turn, not to any of its turns.
        async with self._read() as conn:
            rows = await conn.fetch(
                "SELECT t.* FROM turns t"
                " JOIN (SELECT chat_id, MAX(turn) AS turn FROM turns GROUP BY chat_id) latest"
                "   ON latest.chat_id = t.chat_id AND latest.turn = t.turn"
                " WHERE $1::text IS NULL OR t.status = $1::text"
                " ORDER BY t.updated_at DESC, t.chat_id LIMIT $2",
                codec.enum_value(status), limit,
            )
        return [codec.decode_turn(row) for row in rows]

    # -- transcript ----------------------------------------------------------------------
    async def commit_user_messages(self, chat_id: str, turn: int, messages: list[UserMessage]) -> list[str]:
        return await self._write(chat_id, self._commit_user_tx, turn, list(messages))

    async def _commit_user_tx(self, tx: _Tx, turn: int, messages: list[UserMessage]) -> list[str]:
        committed: list[str] = []
        for message in messages:
            if await tx.insert_message(turn, ChatMessage(role="user", content=message.text),
                                       message_id=message.message_id):
                committed.append(message.message_id)
                await tx.emit("user_message", {
                    "turn": turn, "message_id": message.message_id,
                    "text": message.text, "sender": message.sender,
                })
        return committed

    async def record_assistant(self, chat_id: str, turn: int, step: int, reply: ModelReply,
                               final: bool) -> None:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        await self._write(chat_id, self._record_assistant_tx, turn, step, reply, final)

    async def _record_assistant_tx(self, tx: _Tx, turn: int, step: int, reply: ModelReply, final: bool) -> None:
        conn, chat_id = tx.conn, tx.chat_id
        message = ChatMessage(role="assistant", content=reply.text, tool_calls=reply.tool_calls or None)
        row = await conn.fetchrow(
            "SELECT id, body FROM messages WHERE chat_id = $1 AND turn = $2 AND step = $3", chat_id, turn, step)
        if row is None:
            changed = await tx.insert_message(turn, message, step=step)
        else:
            try:
                changed = codec.decode_message(chat_id, row) != message
            except CorruptRowError:
                changed = True  # an undecodable row is exactly what a rewrite should repair
            if changed:
                # UPDATE in place: the row keeps its id, hence its place in the transcript.
                await conn.execute("UPDATE messages SET body = $1 WHERE id = $2",
                                   codec.message_body(message), row["id"])
        if changed:
            await tx.emit("assistant_message", {
                "turn": turn, "step": step, "text": reply.text,
                "tool_calls": [call.model_dump() for call in reply.tool_calls],
            })
        if final:
            current = await tx.turn_row(turn)
            # Only an open turn completes: a late answer never reopens a closed one.
            if current["status"] in _OPEN_VALUES and not current["ended"]:
                await conn.execute(
                    "UPDATE turns SET status = $1, reason = NULL, updated_at = $2 WHERE chat_id = $3 AND turn = $4",
                    TurnStatus.COMPLETED.value, tx.now, chat_id, turn,
                )
                await self._end_turn(tx, turn, {"turn": turn, "status": TurnStatus.COMPLETED.value})

    async def tool_started(self, chat_id: str, turn: int, call: ToolCall, idempotency_key: str) -> bool:
        return await self._write(chat_id, self._tool_started_tx, turn, call, idempotency_key)

    async def _tool_started_tx(self, tx: _Tx, turn: int, call: ToolCall, idempotency_key: str) -> bool:
        # On disk before the tool acts, whatever the server's default.
        await tx.conn.execute("SET LOCAL synchronous_commit TO on")
        inserted = await tx.conn.fetchval(
            "INSERT INTO tool_runs (idempotency_key, chat_id, turn, tool_call_id, started_at)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (idempotency_key) DO NOTHING RETURNING 1",
            idempotency_key, tx.chat_id, turn, call.id, tx.now,
        )
        if inserted is None:
            return False
        await tx.emit("tool_started", {
            "turn": turn, "tool_call_id": call.id, "name": call.name, "idempotency_key": idempotency_key,
        })
        return True

    async def record_tool_result(self, chat_id: str, turn: int, tool_call_id: str, name: str,
                                 content: str, status: str) -> bool:
        if status not in codec.TOOL_RESULT_STATUSES:
            raise ValueError(f"tool result status must be one of {sorted(codec.TOOL_RESULT_STATUSES)}, got {status!r}")
        return await self._write(chat_id, self._tool_result_tx, turn, tool_call_id, name, content, status)

    async def _tool_result_tx(self, tx: _Tx, turn: int, tool_call_id: str, name: str, content: str,
                              status: str) -> bool:
        message = ChatMessage(role="tool", content=content, tool_call_id=tool_call_id, name=name)
        if not await tx.insert_message(turn, message):
            return False
        if status == "interrupted":
            await tx.emit("tool_interrupted", {"turn": turn, "tool_call_id": tool_call_id, "name": name})
        else:
            await tx.emit("tool_finished",
                          {"turn": turn, "tool_call_id": tool_call_id, "name": name, "status": status})
        return True

    async def finish_turn(self, chat_id: str, turn: int, update: TurnUpdate,
                          closing_text: str | None = None,
                          only_from: frozenset[TurnStatus] | None = None) -> bool:
        if update.status in OPEN_STATUSES:
            raise ValueError(f"finish_turn needs a terminal status, got {update.status.value!r}")
        return await self._write(chat_id, self._finish_turn_tx, turn, update, closing_text, only_from)

    async def _finish_turn_tx(self, tx: _Tx, turn: int, update: TurnUpdate, closing_text: str | None,
                              only_from: frozenset[TurnStatus] | None) -> bool:
        row = await tx.turn_row(turn)
        if only_from is not None and row["status"] not in {s.value for s in only_from}:
            return False
        ended = bool(row["ended"])
        # A closing row has no key of its own; `ended` keeps a retried call from adding it twice.
        if closing_text is not None and not ended:
            await tx.insert_message(turn, ChatMessage(role="assistant", content=closing_text))
        await self._set_turn(tx, turn, update)
        if not ended:
            await self._end_turn(tx, turn, {"turn": turn, "status": update.status.value,
                                            "reason": codec.enum_value(update.reason)})
        return True

    async def adopt_turn(self, chat_id: str, turn: int, run_id: str) -> int:
        return await self._write(chat_id, self._adopt_turn_tx, turn, run_id)

    async def _adopt_turn_tx(self, tx: _Tx, turn: int, run_id: str) -> int:
        await tx.turn_row(turn)  # raises for a missing turn
        await tx.conn.execute("UPDATE turns SET run_id = $1, updated_at = $2 WHERE chat_id = $3 AND turn = $4",
                              run_id, tx.now, tx.chat_id, turn)
        return int(await tx.conn.fetchval(
            "SELECT COALESCE(MAX(step), -1) + 1 FROM messages WHERE chat_id = $1 AND turn = $2", tx.chat_id, turn))

    async def turn_messages(self, chat_id: str, turn: int) -> list[ChatMessage]:
        async with self._read() as conn:
            rows = await conn.fetch(
                "SELECT id, body FROM messages WHERE chat_id = $1 AND turn = $2 ORDER BY id", chat_id, turn)
        return [codec.decode_message(chat_id, row) for row in rows]

    async def history(self, chat_id: str) -> list[ChatMessage]:
        async with self._read() as conn:
            rows = await conn.fetch("SELECT id, body FROM messages WHERE chat_id = $1 ORDER BY id", chat_id)
        return [codec.decode_message(chat_id, row) for row in rows]

    # -- events ------------------------------------------------------------------------------
    async def append_events(self, chat_id: str, events: list[NewEvent], keys: list[str] | None = None) -> None:
        await self._write(chat_id, self._append_events_tx, list(events), keys)

    @staticmethod
    async def _append_events_tx(tx: _Tx, events: list[NewEvent], keys: list[str] | None) -> None:
        for i, event in enumerate(events):
            if keys is not None and await tx.conn.fetchval(
                    "INSERT INTO event_keys (chat_id, event_key) VALUES ($1, $2)"
                    " ON CONFLICT DO NOTHING RETURNING 1", tx.chat_id, keys[i]) is None:
                continue  # appended before
            await tx.emit(event.type, event.payload)

    async def events(self, chat_id: str, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        async with self._read() as conn:
            rows = await conn.fetch(
                "SELECT * FROM events WHERE chat_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                chat_id, after_seq, limit)
        return [codec.decode_event(row) for row in rows]

    async def follow_from(self, chat_id: str, message_id: str | None = None) -> int:
        async with self._read() as conn, conn.transaction(readonly=True):
            held = message_id is not None and await conn.fetchval(
                "SELECT 1 FROM messages WHERE chat_id = $1 AND message_id = $2", chat_id, message_id)
            if held:
                taken = codec.seq_before_message(await conn.fetch(
                    "SELECT seq, payload FROM events WHERE chat_id = $1 AND type = 'user_message' ORDER BY seq",
                    chat_id), message_id)
                if taken is not None:
                    return taken
            return int(await conn.fetchval("SELECT COALESCE(MAX(seq), 0) FROM events WHERE chat_id = $1",
                                           chat_id))
