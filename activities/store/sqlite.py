"""`SessionStore` on SQLite (standard library `sqlite3`).

Each public method is one transaction of `SQLStore`, run whole in one step;
writes use `BEGIN IMMEDIATE` so the read-then-write logic inside (next seq,
next turn, "does this row exist yet") cannot race with another process.

Where a transaction runs: the event loop must never wait on a disk sync or on a
lock held by another process (worker, web and CLI open the same file), so the
store owns one thread, and every call runs there unless its caller allows it
inline (`inline_calls`: the model and tool activities). Such a call runs on
the loop itself only when it can wait for nothing: nothing is queued on the
store thread (so calls keep their order), it needs no sync, and it gets the
write lock at once (its own connection never waits for a lock; a busy lock
sends it to the thread). That spares each of those calls two thread hops
(about 0.25 ms each) for a few tenths of a millisecond of SQLite work.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from turnkeeper.activities.store import codec
from turnkeeper.activities.store.base import StoreError, StoreUnavailable, inline_allowed
from turnkeeper.activities.store.core import SQLStore
from turnkeeper.activities.store.schema import SCHEMA_VERSION, schema, stored_version
from turnkeeper.activities.store.transaction import Transaction

T = TypeVar("T")
log = logging.getLogger("turnkeeper.store")

# A write waits this long for another process's lock before it counts as an outage
# (StoreUnavailable): the turn then waits visibly and tries again. Store calls run
# as local activities inside a workflow task, and updates and signals wait behind
# that task: this keeps one call well under the task's timeout (TURN_TASK_TIMEOUT).
BUSY_TIMEOUT_S = 1.0
# After a write timed out on the lock, the writes queued behind it on the store
# thread fail at once for this long instead of each waiting BUSY_TIMEOUT_S in turn.
LOCKED_FAIL_FAST_S = 0.5
# The loop's connection never checkpoints on its own (a checkpoint syncs the file):
# after this many of its writes the store thread checkpoints the WAL instead.
CHECKPOINT_EVERY_WRITES = 100

_SCHEMA = schema({
    "text": "TEXT", "integer": "INTEGER", "bigint": "INTEGER", "boolean": "INTEGER", "true": "1", "false": "0",
    "timestamp": "TEXT", "row_id": "INTEGER PRIMARY KEY AUTOINCREMENT",
})


def _now() -> str:
    # Fixed precision and offset keep the strings sortable as text (list_chats orders by them).
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _run_to_end(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` to its end on this thread, with no event loop: over `_Transaction`
    no await of a store transaction ever waits, so one step finishes it."""
    try:
        work.send(None)
    except StopIteration as done:
        return done.value
    work.close()
    raise RuntimeError("a SQLite store transaction awaited something other than its sqlite3 calls")


def _in_transaction(conn: sqlite3.Connection, write: bool, fn: Callable[[sqlite3.Connection], T]) -> T:
    """`fn(conn)` between BEGIN (IMMEDIATE for a write) and COMMIT; rolled back if it raises."""
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        result = fn(conn)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


class _Busy(Exception):
    """The loop's connection met a lock held elsewhere: the store thread waits for it."""


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


class _Transaction(Transaction):
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


class SQLiteStore(SQLStore):
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # the store thread's
        self._here: sqlite3.Connection | None = None  # the event loop's: never waits for a lock
        self._on_thread: list[Future[Any]] = []  # submitted to the store thread, maybe not done
        self._writes_here = 0
        self._identity: tuple[int, int] | None = None
        self._reported_gone = False
        self._locked_at: float | None = None  # when a write last timed out on the lock

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
        if self._here is None:
            self._here = self._loop_connection()

    def _loop_connection(self) -> sqlite3.Connection | None:
        try:
            conn = sqlite3.connect(str(self.path), timeout=0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            log.debug("SQLite store %s: every call runs on the store thread: %s", self.path, exc)
            return None
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        except sqlite3.Error as exc:
            conn.close()
            log.debug("SQLite store %s: every call runs on the store thread: %s", self.path, exc)
            return None
        return conn

    def _schema_tx(self, conn: sqlite3.Connection) -> None:
        for statement in _SCHEMA:
            conn.execute(statement)
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = stored_version(str(self.path), None if row is None else row["value"])
        if version is None:
            conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif version < SCHEMA_VERSION:
            # The statements above, all IF NOT EXISTS, have added what the older version lacked.
            log.info("SQLite store %s: schema migrated from version %d to %d", self.path, version, SCHEMA_VERSION)
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))

    def _close_sync(self) -> None:
        for conn in (self._here, self._conn):
            if conn is not None:
                conn.close()
        self._here = self._conn = None

    # -- plumbing ------------------------------------------------------------------
    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise StoreError("the store is not open")
        # Tracked until the job itself is done: a caller cancelled while it runs does not end it.
        job = self._executor.submit(partial(fn, *args))
        self._on_thread.append(job)
        return await asyncio.wrap_future(job)

    def _thread_idle(self) -> bool:
        self._on_thread = [job for job in self._on_thread if not job.done()]
        return not self._on_thread

    async def _run_write(self, chat_id: str, work: Callable[[Transaction, Any], Coroutine[Any, Any, T]],
                         durable: bool) -> T:
        def transaction(conn: sqlite3.Connection) -> T:
            return _run_to_end(work(_Transaction(conn), _now()))
        if durable:
            return await self._call(self._synced_tx, transaction)  # a sync never blocks the loop
        return await self._transaction(True, transaction)

    async def _run_read(self, work: Callable[[Transaction], Coroutine[Any, Any, T]], snapshot: bool) -> T:
        # Every read is a transaction here, so each sees one snapshot anyway.
        return await self._transaction(False, lambda conn: _run_to_end(work(_Transaction(conn))))

    async def _transaction(self, write: bool, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn` in one transaction: here on the loop when nothing can make it wait
        (see the module's docstring), else on the store thread."""
        if (inline_allowed() and self._here is not None and self._executor is not None and self._thread_idle()
                and not (write and self._locked_at is not None)):
            try:
                result = self._tx_here(write, fn)
            except _Busy:
                pass  # another connection writes: wait for its lock on the store thread
            else:
                if write:
                    self._wrote_here()
                return result
        return await self._call(self._tx, write, fn)

    def _tx_here(self, write: bool, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._here
        assert conn is not None
        self._check_file()
        try:
            return _in_transaction(conn, write, fn)
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")  # nothing of it stays: the thread runs it whole again
                raise _Busy() from exc
            raise self._failure(exc) from exc
        except sqlite3.Error as exc:
            raise self._failure(exc) from exc

    def _wrote_here(self) -> None:
        self._writes_here += 1
        if self._writes_here % CHECKPOINT_EVERY_WRITES == 0 and self._executor is not None:
            self._on_thread.append(self._executor.submit(self._checkpoint_sync))

    def _checkpoint_sync(self) -> None:
        """Fold the WAL into the database file (PASSIVE: waits for no reader or writer)."""
        if self._conn is not None:
            try:
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error as exc:
                log.debug("SQLite store %s: checkpoint skipped: %s", self.path, exc)

    def _synced_tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`_tx` for a write, synced to disk before it returns. Other writes use WAL's
        synchronous=NORMAL, which survives a killed process but not a power cut."""
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

    def _tx(self, write: bool, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` in one transaction on the store thread; sqlite errors become StoreError."""
        conn = self._conn
        if conn is None:
            raise StoreError("the store is not open")
        self._check_file()
        if write and self._locked_at is not None and time.monotonic() - self._locked_at < LOCKED_FAIL_FAST_S:
            raise StoreUnavailable(f"SQLite store {self.path}: database is locked (by another process)")
        try:
            result = _in_transaction(conn, write, fn)
            if write:
                self._locked_at = None
            return result
        except sqlite3.Error as exc:
            if write and "locked" in str(exc):
                self._locked_at = time.monotonic()
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
