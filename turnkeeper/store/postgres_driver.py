"""How `PostgresStore` deals with the asyncpg driver, apart from what it stores.

Connection URLs (shown without user or password), the timeouts of a connection
and of a call, which driver errors mean an outage and which leave a connection
unfit for reuse, a pooled connection bound by a deadline, and statements in the
store's `?` form run on a connection. Kept apart from `postgres.py`, which holds
the store itself: its schema, its locks and its transactions.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from functools import cache
from typing import Any
from urllib.parse import unquote, urlsplit

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from turnkeeper.store.transaction import Transaction

# A pooled connection (the pool's proxy of one) or one of its own (LISTEN): the calls made on both.
Connection = asyncpg.Connection | PoolConnectionProxy

LOCK_TIMEOUT_S = 10.0
"""How long a write waits for its chat's lock before it fails (StoreError, so
the activity is retried): the counterpart of SQLite's busy timeout."""

CONNECT_TIMEOUT_S = 10.0
"""How long opening a connection may take (asyncpg's own default is 60 s): a
server that is unreachable without refusing (a failover, a dropped route) is
then an outage within seconds, for the pool and for the web page's LISTEN."""

CALL_TIMEOUT_S = 15.0
"""The most one store call may take, from asking the pool for a connection to
handing it back: then its connection is cut off and it fails as
StoreUnavailable. The driver can wait without end on a connection the server
cut off in the middle of a call, and a turn must not sit in `running` behind
it. Longer than a write's wait for its chat's lock (`LOCK_TIMEOUT_S`), shorter
than a store activity's own timeout (30 s), so such a call ends as an
outage the turn waits out."""


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


def url_password(url: str) -> str | None:
    try:
        password = urlsplit(url).password
    except ValueError:
        return None
    return unquote(password) if password else None


# The server is down, unreachable, read-only, overloaded or shutting down: the same
# call may work later (StoreUnavailable). Anything else is a bug or a bad row.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    asyncpg.exceptions.LockNotAvailableError,
    asyncpg.exceptions.QueryCanceledError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    # The driver's own state after a cut-off connection ("cannot switch to state 15;
    # another operation is in progress"): the next connection works.
    asyncpg.exceptions.InternalClientError,
)


def terminate(conn: Connection) -> None:
    """End `conn` at once; the pool opens a new connection in its place."""
    with suppress(asyncpg.InterfaceError):  # the driver already gave it back, closed
        conn.terminate()


class Unsent(Exception):
    """A call whose connection turned out dead before it did anything (its cause)."""


# What a call meets on a connection the server has cut off, or the driver's state
# after one ("cannot switch to state 15; another operation is in progress").
STALE: tuple[type[BaseException], ...] = (
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InternalClientError,
)


# A call that ends in one of these leaves its connection unfit for the next call.
BROKEN: tuple[type[BaseException], ...] = (asyncio.CancelledError, OSError, *STALE)

# A session that met one of these keeps meeting it, whatever becomes of the cause:
# `default_transaction_read_only` (set on the database or the role) is read when a
# session starts, and a session on a server that was a standby stays on it. Such a
# connection is ended, not handed back to the pool, and every other connection the
# pool holds is replaced too (`Pool.expire_connections`): those opened during the
# same spell are read-only as well, even the ones that have only read so far.
DISCARD: tuple[type[BaseException], ...] = (asyncpg.exceptions.ReadOnlySQLTransactionError,)


class Discarded(Exception):
    """A write whose connection was read-only (its cause); the transaction wrote
    nothing, and the connection has been ended."""


@asynccontextmanager
async def pooled_connection(pool: asyncpg.Pool, deadline: float) -> AsyncIterator[Connection]:
    """A pooled connection for a call that must end by `deadline` (the loop's
    clock): then the connection is cut off, so that whatever waits on it (a
    statement, a rollback, its return to the pool) ends at once, and TimeoutError
    is raised."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout_at(deadline):
        conn = await pool.acquire()
    expired = False

    def cut_off() -> None:
        nonlocal expired
        expired = True
        terminate(conn)

    timer = loop.call_at(deadline, cut_off)
    try:
        yield conn
    except BaseException as exc:
        if expired:
            raise TimeoutError() from None
        if isinstance(exc, (*BROKEN, Unsent)):
            # Cancelled half way, or cut off: the driver would wait on the cancel, or
            # hand the next caller a connection still "in another operation".
            terminate(conn)
        elif isinstance(exc, (*DISCARD, Discarded)):
            terminate(conn)
            await pool.expire_connections()
        raise
    finally:
        try:
            await pool.release(conn)
        except Exception:
            pass  # the driver has dropped the connection; what the call did or met stands
        finally:
            timer.cancel()


@cache
def numbered(sql: str) -> str:
    """`sql` with asyncpg's `$1, $2, ...` for its `?`s, worked out once per statement.
    (The store's SQL has no `?` of its own, in a literal or as a jsonb operator.)"""
    numbers = iter(range(1, sql.count("?") + 1))
    return re.sub(r"\?", lambda _: f"${next(numbers)}", sql)


class PostgresTransaction(Transaction):
    """Statements on one pooled connection (in a transaction where the caller opened one)."""

    IN_TEXTS = "= ANY(?::text[])"

    def __init__(self, conn: Connection, channel: str) -> None:
        self.conn = conn
        self.channel = channel
        self.wrote = False  # a row inserted, updated or deleted

    @staticmethod
    def texts(values: list[str]) -> list[str]:
        return values

    async def execute(self, sql: str, *args: Any) -> int:
        status = await self.conn.execute(numbered(sql), *args)  # "INSERT 0 1", "UPDATE 2", "SET"
        count = status.rpartition(" ")[2]
        written = int(count) if count.isdigit() else 0
        if written and status.startswith(("INSERT", "UPDATE", "DELETE")):
            self.wrote = True
        return written

    async def fetchone(self, sql: str, *args: Any) -> asyncpg.Record | None:
        return await self.conn.fetchrow(numbered(sql), *args)

    async def fetchall(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        return await self.conn.fetch(numbered(sql), *args)

    async def notify(self, kind: str, chat_id: str) -> None:
        # Sent at commit, and not at all on rollback; the same one twice in a transaction once.
        await self.conn.execute("SELECT pg_notify($1, $2)", self.channel, f"{kind}:{chat_id}")
