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
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from turnkeeper.store import codec
from turnkeeper.store.base import StoreError, StoreUnavailable, inline_allowed
from turnkeeper.store.core import SQLStore
from turnkeeper.store.schema import SCHEMA_VERSION, schema, stored_version
from turnkeeper.store.transaction import Availability, Transaction

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


def _now() -> str:
    # Fixed precision and offset keep the strings sortable as text (list_chats orders by them).
    return datetime.now(UTC).isoformat(timespec="microseconds")


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
            with contextlib.suppress(sqlite3.Error):  # what `fn` met is what the caller hears of
                conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def _probe_write(conn: sqlite3.Connection) -> None:
    """A write that reaches the file: one row of `meta` rewritten. (One rolled back,
    or one that changes nothing, never does: a file that cannot be written now
    would pass.)"""
    conn.execute(
        "INSERT INTO meta (key, value) VALUES ('write_probe', ?)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (_now(),),
    )


class _ToThread(Exception):
    """A call the loop does not run after all: the store thread runs it whole (the
    loop's connection met a lock held elsewhere, or has to be opened again)."""


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


# After these a connection is closed and opened again: SQLite keeps a file it
# opened read-only so for good (it opens read-only, silently, a file it may not
# write), and after an I/O error, a full disk or a file it could not read, a
# fresh connection sees the file as it is now.
_DROP_CODES = frozenset(
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


def _drops_connection(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _DROP_CODES
    return isinstance(exc, sqlite3.OperationalError) and not _is_busy(exc)


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
            self._here = self._loop_connection()

    def _connect(self) -> None:
        """Open the connections (again: the old ones are closed first) and create or
        migrate the schema. The first time the file is made if missing; after that
        never: a store file deleted under the running worker is waited for, not
        replaced by an empty one (see `_check_file`)."""
        self._drop()
        self._stale = True  # until this succeeds
        create = self._identity is None
        try:
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                str(self.path) if create else self._uri(),
                uri=not create,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,  # we issue BEGIN ourselves
                check_same_thread=False,
            )
        except (OSError, sqlite3.Error) as exc:
            raise self._open_failure(exc) from exc
        conn.row_factory = sqlite3.Row
        try:
            # busy_timeout first: switching to WAL needs a lock another process may hold.
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            st = os.stat(self.path)
        except (OSError, sqlite3.Error) as exc:
            conn.close()
            raise self._open_failure(exc) from exc
        self._conn, self._identity, self._stale = conn, (st.st_dev, st.st_ino), False
        self._here = self._loop_connection()
        self._schema_sync(conn)

    def _uri(self) -> str:
        # mode=rw: a file gone from the path is not made anew.
        return f"file:{urllib.parse.quote(os.fspath(self.path))}?mode=rw"

    def _open_failure(self, exc: OSError | sqlite3.Error) -> StoreError:
        # A file or directory that cannot be written or read now, a full disk: may work later.
        unavailable = isinstance(exc, (sqlite3.OperationalError, PermissionError)) or (
            isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.ENOSPC, errno.ENOENT)
        )
        kind = StoreUnavailable if unavailable else StoreError
        return kind(f"cannot open SQLite store {self.path}: {exc}")

    def _schema_sync(self, conn: sqlite3.Connection) -> None:
        try:
            _in_transaction(conn, True, self._schema_tx)
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

    def _loop_connection(self) -> sqlite3.Connection | None:
        try:
            conn = sqlite3.connect(
                self._uri(), uri=True, timeout=0, isolation_level=None, check_same_thread=False
            )
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
            result = _run_to_end(work(_Transaction(conn), _now()))
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
            return await self._transaction(False, lambda conn: _run_to_end(work(_Transaction(conn))))

    async def check_writable(self) -> None:
        """Raise `StoreUnavailable` unless a write goes through now: one small row
        rewritten and committed (not synced), on the store thread; it may wait up
        to BUSY_TIMEOUT_S for another process's write lock."""
        with self.availability.watch(write=True):
            await self._call(self._tx, True, _probe_write)

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
            except _ToThread:
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
            raise _ToThread()  # another file is at the path: the thread opens it
        try:
            return _in_transaction(conn, write, fn)
        except sqlite3.Error as exc:
            if _is_busy(exc):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")  # nothing of it stays: the thread runs it whole again
                raise _ToThread() from exc  # another connection writes: wait for its lock on the thread
            failure = self._failure(exc)
            if self._stale:
                raise _ToThread() from exc  # once more on fresh connections (`_tx`)
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
                result = self._tx_on(conn, write, fn, synced)
            except sqlite3.Error as exc:
                if write and _is_busy(exc):
                    self._locked_at = time.monotonic()
                failure = self._failure(exc)
                if self._stale and not fresh and not last:
                    continue
                raise failure from exc
            if write:
                self._locked_at = None
            return result
        raise AssertionError("unreachable")

    @staticmethod
    def _tx_on(
        conn: sqlite3.Connection, write: bool, fn: Callable[[sqlite3.Connection], T], synced: bool
    ) -> T:
        if not synced:
            return _in_transaction(conn, write, fn)
        conn.execute("PRAGMA synchronous = FULL")
        try:
            return _in_transaction(conn, write, fn)
        finally:
            conn.execute("PRAGMA synchronous = NORMAL")

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
        if _drops_connection(exc):
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
