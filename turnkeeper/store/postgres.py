"""`SessionStore` on PostgreSQL (`asyncpg`), for workers on several machines.

The same transactions (`SQLStore`), tables, events and idempotency as
`SQLiteStore`; what differs is how concurrent writers are kept apart:

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

Outages end by themselves. A server that is down, restarting, read-only (the
database's or the role's `default_transaction_read_only`, a standby after a
failover) or that cut its sessions fails a call as `StoreUnavailable`; no
connection that met such a state goes back to the pool. A connection the server
cut off is ended where it is met, and the call goes on with another (`STALE`);
one that was refused a write as read-only is ended, and the pool replaces every
other connection it holds (`DISCARD`), since a session keeps the setting it
started with. Bound: the first call made once the cause is gone succeeds; the
store adds no wait of its own (a write refused as read-only runs once more at
once on a new connection, a call that met a cut-off one on the next). How soon
that call comes is its caller's affair: a waiting turn tries again after 1, 2,
4 ... up to 30 s. `check_writable` is the web page's health probe.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import asyncpg

from turnkeeper.store.base import StoreError, StoreUnavailable
from turnkeeper.store.core import SQLStore
from turnkeeper.store.postgres_driver import (
    BROKEN,
    CALL_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    DISCARD,
    LOCK_TIMEOUT_S,
    STALE,
    UNAVAILABLE,
    Discarded,
    PostgresTransaction,
    Unsent,
    display_url,
    pooled_connection,
    url_password,
)
from turnkeeper.store.schema import SCHEMA_VERSION, schema, stored_version
from turnkeeper.store.transaction import Availability, Transaction

T = TypeVar("T")

# Advisory lock keys, two-int form: (space, key). 'tkch' / 'tksc' in ASCII.
_CHAT_LOCK_SPACE = 0x746B6368
_SCHEMA_LOCK_SPACE = 0x746B7363
_SCHEMA_LOCK_KEY = 1

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

_SCHEMA = schema(
    {
        "text": "text",
        "integer": "integer",
        "bigint": "bigint",
        "boolean": "boolean",
        "true": "true",
        "false": "false",
        "timestamp": "timestamptz",
        "row_id": "bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    }
)


class PostgresStore(SQLStore):
    """`PostgresStore("postgresql://user:pass@host/db")`; `await store.open()` first.

    `schema` keeps the tables in that schema (created when missing) instead of
    the first one on the server's `search_path`: several deployments, or tests,
    can share one database.
    """

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        schema: str | None = None,
        lock_timeout: float = LOCK_TIMEOUT_S,
        call_timeout: float = CALL_TIMEOUT_S,
    ) -> None:
        if schema is not None and not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(f"schema must be a plain identifier ([A-Za-z_][A-Za-z0-9_]*), got {schema!r}")
        if min_size < 0 or max_size < 1 or min_size > max_size:
            raise ValueError(f"need 0 <= min_size <= max_size and max_size >= 1, got {min_size}, {max_size}")
        self._url = url
        self._password = url_password(url)
        self.display_url = display_url(url) + (f" (schema {schema})" if schema else "")
        self.schema = schema
        self.min_size = min_size
        self.max_size = max_size
        self.lock_timeout = lock_timeout
        self.call_timeout = call_timeout
        # Notifications are per database: one channel per schema keeps deployments apart.
        self.channel = f"turnkeeper_{schema}" if schema else "turnkeeper"
        self._pool: asyncpg.Pool | None = None
        self.availability = Availability()

    def __repr__(self) -> str:
        return f"PostgresStore({self.display_url!r})"

    # -- lifecycle ---------------------------------------------------------------
    async def open(self) -> None:
        with self.availability.watch(write=False):  # no DDL once the schema is current
            await self._open()

    async def _open(self) -> None:
        if self._pool is None:
            # ValueError too: asyncpg's complaint about a malformed URL.
            with self._errors("cannot open", ValueError):
                pool = await asyncpg.create_pool(
                    self._url,
                    min_size=self.min_size,
                    max_size=self.max_size,
                    timeout=CONNECT_TIMEOUT_S,
                    server_settings=self._server_settings(),
                )
            try:
                await self._migrate(pool)
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
        else:
            await self._migrate(self._pool)

    async def listen(self, on_change: Callable[[str, str], None]) -> Callable[[], Awaitable[None]] | None:
        # A connection of its own, outside the pool: it stays LISTENing.
        with self._errors("cannot listen on"):
            conn = await asyncpg.connect(
                self._url, server_settings=self._server_settings(), timeout=CONNECT_TIMEOUT_S
            )

        def relay(_conn: object, _pid: int, _channel: str, payload: object) -> None:
            kind, _, chat_id = str(payload).partition(":")
            on_change(kind, chat_id)

        with self._errors("cannot listen on"):
            await conn.add_listener(self.channel, relay)
        conn.add_termination_listener(lambda _conn: on_change("lost", ""))

        async def stop() -> None:
            await conn.close(timeout=CONNECT_TIMEOUT_S)  # then it is cut off: the server may be gone

        return stop

    async def close(self) -> None:
        pool, self._pool = self._pool, None  # refuse new calls from here on
        if pool is not None:
            await pool.close()  # waits for connections in use to be released

    async def _migrate(self, pool: asyncpg.Pool) -> None:
        with self._errors("cannot set up the schema of"):
            async with pool.acquire() as conn, conn.transaction():
                # Several workers starting at once: one migrates, the others wait, then find it done.
                await conn.execute(
                    "SELECT pg_advisory_xact_lock($1, $2)", _SCHEMA_LOCK_SPACE, _SCHEMA_LOCK_KEY
                )
                if self.schema:
                    await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
                raw: str | None = None
                if await conn.fetchval("SELECT to_regclass('meta') IS NOT NULL"):
                    raw = await conn.fetchval("SELECT value FROM meta WHERE key = 'schema_version'")
                if stored_version(self.display_url, raw) == SCHEMA_VERSION:
                    return  # current: no DDL, no locks on the tables
                # All IF NOT EXISTS: they create the tables, or add what an older version lacked.
                for statement in _SCHEMA:
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', $1)"
                    " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                    str(SCHEMA_VERSION),
                )

    # -- plumbing ------------------------------------------------------------------
    def _server_settings(self) -> dict[str, str]:
        settings = {"lock_timeout": f"{max(1, int(self.lock_timeout * 1000))}ms"}
        if self.schema:
            settings["search_path"] = f'"{self.schema}"'
        return settings

    def _require_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreError("the store is not open")
        return self._pool

    @contextmanager
    def _errors(self, doing: str = "", *also: type[Exception]) -> Iterator[None]:
        """Driver and network errors become StoreError (retryable); the password never shows."""
        caught: tuple[type[Exception], ...] = (
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            asyncpg.exceptions.InternalClientError,
            OSError,
            TimeoutError,
            *also,
        )
        try:
            yield
        except caught as exc:
            text = f"{type(exc).__name__}: {exc}" if str(exc) else self._silent(exc, doing)
            if self._password:
                text = text.replace(self._password, "***")
            where = f"{doing} PostgreSQL store" if doing else "PostgreSQL store"
            kind = StoreUnavailable if isinstance(exc, UNAVAILABLE) else StoreError
            # `from None`: the driver's exception could carry the URL it was given.
            raise kind(f"{where} {self.display_url}: {text}") from None

    async def _once_more_if_stale(self, call: Callable[[float], Awaitable[T]]) -> T:
        # After the server cut sessions off (a restart, a failover, a proxy), the pool
        # still holds the dead ones. Each is ended when met (`BROKEN`), so at most
        # max_size tries in a row meet one; all of them within one call's time.
        # A write refused as read-only is tried once more, on a connection opened
        # after it (`DISCARD`): the first write after a read-only spell goes through.
        deadline = asyncio.get_running_loop().time() + self.call_timeout
        tries, read_only = 0, 0
        while True:
            try:
                return await call(deadline)
            except Unsent as unsent:
                tries += 1
                if tries > self.max_size:
                    assert unsent.__cause__ is not None
                    raise unsent.__cause__ from None
            except Discarded as discarded:
                read_only += 1
                if read_only > 1:
                    assert discarded.__cause__ is not None
                    raise discarded.__cause__ from None

    def _silent(self, exc: BaseException, doing: str) -> str:
        if isinstance(exc, TimeoutError):
            # Opening, listening, setting up: a connection being opened; else a call's bound.
            return f"no answer within {CONNECT_TIMEOUT_S if doing else self.call_timeout:g} s"
        return type(exc).__name__

    async def _run_write(
        self, chat_id: str, work: Callable[[Transaction, Any], Coroutine[Any, Any, T]], durable: bool
    ) -> T:
        pool = self._require_pool()
        wrote = False

        async def write(deadline: float) -> T:
            nonlocal wrote
            async with pooled_connection(pool, deadline) as conn:
                transaction = conn.transaction()
                try:
                    await transaction.start()
                except STALE as exc:
                    raise Unsent() from exc  # nothing began: the same call on another connection
                try:
                    # FROM first: the clock is read once the lock is held.
                    now = await conn.fetchval(
                        "SELECT clock_timestamp() FROM pg_advisory_xact_lock($1, hashtext($2))",
                        _CHAT_LOCK_SPACE,
                        chat_id,
                    )
                    if durable:
                        await conn.execute(
                            "SET LOCAL synchronous_commit TO on"
                        )  # whatever the server's default
                    tx = PostgresTransaction(conn, self.channel)
                    result = await work(tx, now)
                except BaseException as exc:
                    if not isinstance(exc, BROKEN):
                        await transaction.rollback()
                    if isinstance(exc, DISCARD):
                        raise Discarded() from exc
                    raise  # else the connection is ended, and the server rolls back
                await transaction.commit()
                wrote = tx.wrote
                return result

        with self.availability.watch(write=True) as call, self._errors():
            result = await self._once_more_if_stale(write)
            call.wrote = wrote
            return result

    async def check_writable(self) -> None:
        """Raise `StoreUnavailable` unless a write would go through now: an UPDATE
        that matches no row, in a transaction rolled back. PostgreSQL refuses it
        all the same in a read-only session, and it takes no lock and writes nothing."""
        pool = self._require_pool()

        async def probe(deadline: float) -> None:
            async with pooled_connection(pool, deadline) as conn:
                transaction = conn.transaction()
                try:
                    await transaction.start()
                except STALE as exc:
                    raise Unsent() from exc
                try:
                    await conn.execute("UPDATE meta SET value = value WHERE false")
                except DISCARD as exc:
                    await transaction.rollback()
                    raise Discarded() from exc
                except BaseException as exc:
                    if not isinstance(exc, BROKEN):
                        await transaction.rollback()
                    raise
                await transaction.rollback()

        with self.availability.watch(write=True), self._errors():
            await self._once_more_if_stale(probe)

    async def _run_read(self, work: Callable[[Transaction], Coroutine[Any, Any, T]], snapshot: bool) -> T:
        # One statement alone has a snapshot of its own: no transaction, no extra round trips.
        pool = self._require_pool()

        async def read(deadline: float) -> T:
            try:
                async with pooled_connection(pool, deadline) as conn:
                    if not snapshot:
                        return await work(PostgresTransaction(conn, self.channel))
                    async with conn.transaction(readonly=True):
                        return await work(PostgresTransaction(conn, self.channel))
            except STALE as exc:
                raise Unsent() from exc  # a read did nothing: the same call on another connection

        with self.availability.watch(write=False), self._errors():
            return await self._once_more_if_stale(read)
