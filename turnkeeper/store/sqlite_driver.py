"""How `SQLiteStore` talks to `sqlite3`: opening its two connections, running
one transaction on a connection, and telling a passing lock from a connection
that has to be opened again.

Kept apart from `sqlite.py`, which decides where and when a call runs (store
thread or event loop, retries, outages); everything here is plain driver work
on one connection, with no state of its own.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from turnkeeper.store import codec
from turnkeeper.store.base import StoreError, StoreUnavailable
from turnkeeper.store.transaction import Transaction

T = TypeVar("T")
log = logging.getLogger("turnkeeper.store")

# A write waits this long for another process's lock before it counts as an outage
# (StoreUnavailable): the turn then shows `store_unavailable` and tries again,
# rather than sitting in `running` behind a lock another process holds.
BUSY_TIMEOUT_S = 1.0
# After a write timed out on the lock, the writes queued behind it on the store
# thread fail at once for this long instead of each waiting BUSY_TIMEOUT_S in turn.
LOCKED_FAIL_FAST_S = 0.5


def now() -> str:
    # Fixed precision and offset keep the strings sortable as text (list_chats orders by them).
    return datetime.now(UTC).isoformat(timespec="microseconds")


# -- connections -------------------------------------------------------------------
def store_uri(path: Path) -> str:
    # mode=rw: a file gone from the path is not made anew.
    return f"file:{urllib.parse.quote(os.fspath(path))}?mode=rw"


def open_failure(path: Path, exc: OSError | sqlite3.Error) -> StoreError:
    # A file or directory that cannot be written or read now, a full disk: may work later.
    unavailable = isinstance(exc, (sqlite3.OperationalError, PermissionError)) or (
        isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.ENOSPC, errno.ENOENT)
    )
    kind = StoreUnavailable if unavailable else StoreError
    return kind(f"cannot open SQLite store {path}: {exc}")


def connect(path: Path, create: bool) -> sqlite3.Connection:
    """The store thread's connection, in WAL mode; it waits up to BUSY_TIMEOUT_S for
    a lock. `create`: the file (and its directory) is made if missing; else a file
    gone from the path fails. Failures raise `open_failure`'s error."""
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            str(path) if create else store_uri(path),
            uri=not create,
            timeout=BUSY_TIMEOUT_S,
            isolation_level=None,  # we issue BEGIN ourselves
            check_same_thread=False,
        )
    except (OSError, sqlite3.Error) as exc:
        raise open_failure(path, exc) from exc
    conn.row_factory = sqlite3.Row
    try:
        # busy_timeout first: switching to WAL needs a lock another process may hold.
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        switch_to_wal(conn)
        conn.execute("PRAGMA synchronous = NORMAL")
    except sqlite3.Error as exc:
        conn.close()
        raise open_failure(path, exc) from exc
    return conn


def switch_to_wal(conn: sqlite3.Connection) -> None:
    """Two processes opening a new file at once (a worker and the page) both switch
    it to WAL; SQLite answers the loser "locked" at once, without its busy handler,
    so the lock is waited for here, within BUSY_TIMEOUT_S like any other."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(0.01)


def loop_connection(path: Path) -> sqlite3.Connection | None:
    """The event loop's connection: it never waits for a lock and never
    checkpoints; None if it cannot be opened (every call then runs on the thread)."""
    try:
        conn = sqlite3.connect(
            store_uri(path), uri=True, timeout=0, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        log.debug("SQLite store %s: every call runs on the store thread: %s", path, exc)
        return None
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("PRAGMA busy_timeout = 0")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
    except sqlite3.Error as exc:
        conn.close()
        log.debug("SQLite store %s: every call runs on the store thread: %s", path, exc)
        return None
    return conn


# -- transactions ------------------------------------------------------------------
def run_to_end(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` to its end on this thread, with no event loop: over `SQLiteTransaction`
    no await of a store transaction ever waits, so one step finishes it."""
    try:
        work.send(None)
    except StopIteration as done:
        return done.value
    work.close()
    raise RuntimeError("a SQLite store transaction awaited something other than its sqlite3 calls")


def in_transaction(
    conn: sqlite3.Connection, write: bool, fn: Callable[[sqlite3.Connection], T], synced: bool = False
) -> T:
    """`fn(conn)` between BEGIN (IMMEDIATE for a write) and COMMIT; rolled back if it
    raises. `synced`: on disk before it returns (synchronous=FULL for this one)."""
    if not synced:
        return _in_transaction(conn, write, fn)
    conn.execute("PRAGMA synchronous = FULL")
    try:
        return _in_transaction(conn, write, fn)
    finally:
        conn.execute("PRAGMA synchronous = NORMAL")


def _in_transaction(conn: sqlite3.Connection, write: bool, fn: Callable[[sqlite3.Connection], T]) -> T:
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        result = fn(conn)
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # what `fn` met is what the caller hears of
                conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def probe_write(conn: sqlite3.Connection) -> None:
    """A write that reaches the file: one row of `meta` rewritten. (One rolled back,
    or one that changes nothing, never does: a file that cannot be written now
    would pass.)"""
    conn.execute(
        "INSERT INTO meta (key, value) VALUES ('write_probe', ?)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (now(),),
    )


class SQLiteTransaction(Transaction):
    """A transaction on one of the store's connections (the caller issued BEGIN)."""

    IN_TEXTS = "IN (SELECT value FROM json_each(?))"  # sqlite3 binds no lists: a JSON array instead

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    @staticmethod
    def texts(values: list[str]) -> str:
        return codec.json_text(values)

    async def execute(self, sql: str, *args: Any) -> int:
        return self.conn.execute(sql, args).rowcount

    async def fetchone(self, sql: str, *args: Any) -> sqlite3.Row | None:
        return self.conn.execute(sql, args).fetchone()

    async def fetchall(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        return self.conn.execute(sql, args).fetchall()


# -- errors ------------------------------------------------------------------------
class ToThread(Exception):
    """A call the loop does not run after all: the store thread runs it whole (the
    loop's connection met a lock held elsewhere, or has to be opened again)."""


def is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


# After these a connection is closed and opened again: SQLite keeps a file it
# opened read-only so for good (it opens read-only, silently, a file it may not
# write), and after an I/O error, a full disk or a file it could not read, a
# fresh connection sees the file as it is now.
DROP_CODES = frozenset(
    (
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PERM,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_NOTADB,
        sqlite3.SQLITE_CORRUPT,
    )
)


def drops_connection(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in DROP_CODES
    return isinstance(exc, sqlite3.OperationalError) and not is_busy(exc)
