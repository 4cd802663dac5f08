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

Outages end by themselves. A database that cannot be written or read now (a
read-only file or directory, a full disk, an I/O error, its file gone, another
process's lock held past BUSY_TIMEOUT_S) fails a call as `StoreUnavailable`.
After any of these but a lock, the store closes both its connections and opens
new ones before its next call: SQLite opens a file it may not write read-only,
silently, and a connection keeps it so for good, whatever becomes of the file.
Bound: the first call made once the cause is gone succeeds; the store adds no
wait of its own (a call whose connection was opened before the outage and fails
is run once more at once on a new one; opening again takes about a millisecond).
How soon that call comes is its caller's affair: a waiting turn tries again
after 1, 2, 4 ... up to 30 s. A file deleted under the store is waited for, not
made anew (messages written to an empty store would be lost when the file is
restored); whatever file is at the path again (moved back, or a copy restored)
is opened, as a restart would. `check_writable` is the web page's health probe.

The `sqlite3` work on one connection (opening it, one transaction, which errors
mean a lock and which a connection to open again) is in `sqlite_driver.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from turnkeeper.store.base import StoreError, StoreUnavailable, inline_allowed
from turnkeeper.store.core import SQLStore
from turnkeeper.store.schema import SCHEMA_VERSION, schema, stored_version
from turnkeeper.store.sqlite_driver import (
    LOCKED_FAIL_FAST_S,
    SQLiteTransaction,
    ToThread,
    connect,
    drops_connection,
    in_transaction,
    is_busy,
    loop_connection,
    now,
    open_failure,
    probe_write,
    run_to_end,
)
from turnkeeper.store.transaction import Availability, Transaction

T = TypeVar("T")
log = logging.getLogger("turnkeeper.store")

# The loop's connection never checkpoints on its own (a checkpoint syncs the file):
# after this many of its writes the store thread checkpoints the WAL instead.
CHECKPOINT_EVERY_WRITES = 100

_SCHEMA = schema(
    {
        "text": "TEXT",
        "integer": "INTEGER",
        "bigint": "INTEGER",
        "boolean": "INTEGER",
        "true": "1",
        "false": "0",
        "timestamp": "TEXT",
        "row_id": "INTEGER PRIMARY KEY AUTOINCREMENT",
    }
)


class SQLiteStore(SQLStore):
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # the store thread's
        self._here: sqlite3.Connection | None = None  # the event loop's: never waits for a lock
        self._on_thread: list[Future[Any]] = []  # submitted to the store thread, maybe not done
        self._writes_here = 0
        self._identity: tuple[int, int] | None = None  # the open file's (device, inode); None: never opened
        self._stale = False  # the connections are to be opened again before the next call
        self._locked_at: float | None = None  # when a write last timed out on the lock
        self.availability = Availability()

    # -- lifecycle ---------------------------------------------------------------
    async def open(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="turnkeeper-sqlite")
        with self.availability.watch(write=False):  # it may open a read-only file: see _schema_sync
            await self._call(self._open_sync)

    async def close(self) -> None:
        executor, self._executor = self._executor, None  # refuse new calls from here on
        if executor is None:
            return
        # Queued jobs run first (FIFO), so the connection closes after them.
        await asyncio.get_running_loop().run_in_executor(executor, self._close_sync)
        executor.shutdown(wait=True)

    def _open_sync(self) -> None:
        if self._conn is None or self._stale:
            self._connect()
            return
        self._schema_sync(self._conn)  # open() once more: the schema is checked again
        if self._here is None:
            self._here = loop_connection(self.path)

    def _connect(self) -> None:
        """Open the connections (again: the old ones are closed first) and create or
        migrate the schema. The first time the file is made if missing; after that
        never: a store file deleted under the running worker is waited for, not
        replaced by an empty one (see `_check_file`)."""
        self._drop()
        self._stale = True  # until this succeeds
        conn = connect(self.path, create=self._identity is None)
        try:
            st = os.stat(self.path)
        except OSError as exc:
            conn.close()
            raise open_failure(self.path, exc) from exc
        self._conn, self._identity, self._stale = conn, (st.st_dev, st.st_ino), False
        self._here = loop_connection(self.path)
        self._schema_sync(conn)

    def _schema_sync(self, conn: sqlite3.Connection) -> None:
        try:
            in_transaction(conn, True, self._schema_tx)
        except sqlite3.Error as exc:
            failure = self._failure(exc)
            if self._stale and self._schema_current(conn):
                # Read-only (or the like), with nothing to migrate: open, as the store
                # is; its writes wait, and the next call opens the file again.
                return
            raise failure from exc

    @staticmethod
    def _schema_current(conn: sqlite3.Connection) -> bool:
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.Error:
            return False
        return row is not None and row["value"] == str(SCHEMA_VERSION)

    def _schema_tx(self, conn: sqlite3.Connection) -> None:
        for statement in _SCHEMA:
            conn.execute(statement)
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = stored_version(str(self.path), None if row is None else row["value"])
        if version is None:
            conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif version < SCHEMA_VERSION:
            # The statements above, all IF NOT EXISTS, have added what the older version lacked.
            log.info(
                "SQLite store %s: schema migrated from version %d to %d", self.path, version, SCHEMA_VERSION
            )
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))

    def _drop(self) -> None:
        """Close both connections (on the store thread: the loop uses its own only
        while the thread is idle)."""
        here, conn, self._here, self._conn = self._here, self._conn, None, None
        for c in (here, conn):
            if c is not None:
                with contextlib.suppress(sqlite3.Error):
                    c.close()

    def _close_sync(self) -> None:
        self._drop()
        self._identity = None
        self._stale = False

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

    async def _run_write(
        self, chat_id: str, work: Callable[[Transaction, Any], Coroutine[Any, Any, T]], durable: bool
    ) -> T:
        changed = False

        def transaction(conn: sqlite3.Connection) -> T:
            nonlocal changed
            before = conn.total_changes
            result = run_to_end(work(SQLiteTransaction(conn), now()))
            changed = conn.total_changes != before
            return result

        with self.availability.watch(write=True) as call:
            if durable:
                result = await self._call(self._tx, True, transaction, True)  # a sync never blocks the loop
            else:
                result = await self._transaction(True, transaction)
            call.wrote = changed
            return result

    async def _run_read(self, work: Callable[[Transaction], Coroutine[Any, Any, T]], snapshot: bool) -> T:
        # Every read is a transaction here, so each sees one snapshot anyway.
        with self.availability.watch(write=False):
            return await self._transaction(False, lambda conn: run_to_end(work(SQLiteTransaction(conn))))

    async def check_writable(self) -> None:
        """Raise `StoreUnavailable` unless a write goes through now: one small row
        rewritten and committed (not synced), on the store thread; it may wait up
        to BUSY_TIMEOUT_S for another process's write lock."""
        with self.availability.watch(write=True):
            await self._call(self._tx, True, probe_write)

    async def _transaction(self, write: bool, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn` in one transaction: here on the loop when nothing can make it wait
        (see the module's docstring), else on the store thread."""
        if (
            inline_allowed()
            and self._here is not None
            and not self._stale
            and self._executor is not None
            and self._thread_idle()
            and not (write and self._locked_at is not None)
        ):
            try:
                result = self._tx_here(write, fn)
            except ToThread:
                pass
            else:
                if write:
                    self._wrote_here()
                return result
        return await self._call(self._tx, write, fn)

    def _tx_here(self, write: bool, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._here
        assert conn is not None
        self._check_file()
        if self._stale:
            raise ToThread()  # another file is at the path: the thread opens it
        try:
            return in_transaction(conn, write, fn)
        except sqlite3.Error as exc:
            if is_busy(exc):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")  # nothing of it stays: the thread runs it whole again
                raise ToThread() from exc  # another connection writes: wait for its lock on the thread
            failure = self._failure(exc)
            if self._stale:
                raise ToThread() from exc  # once more on fresh connections (`_tx`)
            raise failure from exc

    def _wrote_here(self) -> None:
        self._writes_here += 1
        if self._writes_here % CHECKPOINT_EVERY_WRITES == 0 and self._executor is not None:
            self._on_thread.append(self._executor.submit(self._checkpoint_sync))

    def _checkpoint_sync(self) -> None:
        """Fold the WAL into the database file (PASSIVE: waits for no reader or writer)."""
        if self._conn is not None and not self._stale:
            try:
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error as exc:
                log.debug("SQLite store %s: checkpoint skipped: %s", self.path, exc)

    def _tx(self, write: bool, fn: Callable[[sqlite3.Connection], T], synced: bool = False) -> T:
        """Run `fn` in one transaction on the store thread; sqlite errors become
        StoreError. `synced`: on disk before it returns (other writes use WAL's
        synchronous=NORMAL, which survives a killed process but not a power cut).

        A connection that met a read-only, unreadable or full database is closed
        (`_failure`), and the next call opens a new one. If it was opened before
        this call, this call runs once more at once on a new one: the cause may be
        gone since (a file read-only when the store opened it stays read-only to
        that connection), and a transaction that failed so wrote nothing."""
        for last in (False, True):
            conn, fresh = self._ready()
            if (
                write
                and self._locked_at is not None
                and time.monotonic() - self._locked_at < LOCKED_FAIL_FAST_S
            ):
                raise StoreUnavailable(f"SQLite store {self.path}: database is locked (by another process)")
            try:
                result = in_transaction(conn, write, fn, synced)
            except sqlite3.Error as exc:
                if write and is_busy(exc):
                    self._locked_at = time.monotonic()
                failure = self._failure(exc)
                if self._stale and not fresh and not last:
                    continue
                raise failure from exc
            if write:
                self._locked_at = None
            return result
        raise AssertionError("unreachable")

    def _ready(self) -> tuple[sqlite3.Connection, bool]:
        """The store thread's connection, and whether it was opened just now: again
        if an error dropped the connections or another file is at the path now."""
        if self._identity is None:
            raise StoreError("the store is not open")
        self._check_file()
        fresh = self._stale or self._conn is None
        if fresh:
            self._connect()
        assert self._conn is not None
        return self._conn, fresh

    def _failure(self, exc: sqlite3.Error) -> StoreError:
        if drops_connection(exc):
            self._stale = True  # closed and opened again before the next call
        # Locked, read-only, out of space, unreadable: the same call may work later.
        kind = StoreUnavailable if isinstance(exc, sqlite3.OperationalError) else StoreError
        return kind(f"SQLite store {self.path}: {exc}")

    def _check_file(self) -> None:
        """The connection would go on writing to a deleted file, silently: refuse
        instead while no file is at the path, and open the one that is there if it
        is another (a copy restored, another file moved there): what a restart
        would do. None is made anew: messages written to an empty store would be
        lost when the operator restores the file."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise StoreUnavailable(
                f"SQLite store {self.path} is gone (deleted or moved away while in use); calls wait until "
                "a file is back at that path (moved back, or a copy restored)"
            ) from None
        except OSError as exc:
            raise StoreUnavailable(f"SQLite store {self.path}: {exc}") from None
        if (st.st_dev, st.st_ino) != self._identity:
            self._stale = True
