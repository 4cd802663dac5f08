"""Store outages end by themselves: once the cause is gone, the next call succeeds.

What the backends promise (turnkeeper/store/sqlite.py and postgres.py, "Outages
end by themselves"): the first call made once the cause is gone succeeds, with
no wait of the store's own. These tests make each outage for real:

- SQLite: a file that cannot be written (as root `chattr +i` on the file and its
  WAL; otherwise `chmod` on the file, its WAL and their directory, which root
  ignores), a file deleted or moved away, a full disk (a small tmpfs, when this
  process may mount one).
- PostgreSQL: a database of the test's own made read-only
  (`default_transaction_read_only`) and its sessions ended, as a failover to a
  standby would; sessions cut off (`pg_terminate_backend`).
- /healthz reports the store as not ok while it cannot be written.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sqlite3
import stat
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from starlette.requests import Request

from tests.pg import PG_URL, pg_admin, pg_schema
from turnkeeper.models import NewEvent
from turnkeeper.store import (
    PostgresStore,
    SessionStore,
    SQLiteStore,
    StoreUnavailable,
    inline_calls,
)
from turnkeeper.web.app import healthz
from turnkeeper.web.backends import ApiError

CHAT = "chat-1"
# The store adds no wait of its own: the first call after the cause is gone goes
# through, at once. Generous here for a loaded machine.
BOUND_S = 2.0


def event() -> list[NewEvent]:
    return [NewEvent(type="session_updated")]


async def seqs(store: SessionStore, chat_id: str = CHAT) -> list[int]:
    return [e.seq for e in await store.events(chat_id)]


def store_log(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the store logged of its outages: "down" and "up"."""
    said = {"does not answer": "down", "answers again": "up"}
    return [
        word
        for r in caplog.records
        if r.name == "turnkeeper.store"
        for text, word in said.items()
        if text in r.getMessage()
    ]


async def first_write_after(store: SessionStore, chat_id: str = CHAT) -> float:
    """The time the first write after the outage takes; it must not fail."""
    started = time.monotonic()
    await store.append_events(chat_id, event())
    return time.monotonic() - started


# -- an unwritable file ----------------------------------------------------------------------


class Unwritable:
    """Makes files unwritable and writable again, by whatever this process can:
    as root `chattr +i` (root writes through any mode), else `chmod` on the files
    and on their directory."""

    def __init__(self) -> None:
        self.how = "chattr +i" if os.geteuid() == 0 else "chmod a-w"
        self._modes: dict[Path, int] = {}
        self._immutable: list[Path] = []

    def on(self, *files: Path) -> None:
        files = tuple(f for f in files if f.exists())
        if self.how == "chattr +i":
            done = subprocess.run(["chattr", "+i", *map(str, files)], capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(
                    f"chattr +i does not work here ({done.stderr.strip()}), and root ignores file modes"
                )
            self._immutable.extend(files)
            return
        for path in (*files, files[0].parent):
            self._modes.setdefault(path, stat.S_IMODE(path.stat().st_mode))
            path.chmod(self._modes[path] & ~0o222)

    def off(self) -> None:
        if self._immutable:
            subprocess.run(["chattr", "-i", *map(str, self._immutable)], check=True)
            self._immutable.clear()
        for path, mode in self._modes.items():
            path.chmod(mode)
        self._modes.clear()


@pytest.fixture
def unwritable() -> Iterator[Unwritable]:
    u = Unwritable()
    try:
        yield u
    finally:
        u.off()  # whatever the test did: tmp_path must stay removable


def wal(db: Path) -> Path:
    return db.with_name(db.name + "-wal")


async def sqlite_store(db: Path) -> SQLiteStore:
    store = SQLiteStore(db)
    await store.open()
    return store


@pytest.mark.parametrize("with_wal", [True, False], ids=["with-its-wal", "file-alone"])
async def test_sqlite_a_store_read_only_when_opened_takes_writes_once_it_is_writable(
    tmp_path: Path, unwritable: Unwritable, with_wal: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The file (and its WAL, when another process keeps one) cannot be written when
    the store opens it (a worker started then): SQLite opens it read-only, silently.
    The store opens all the same; writes fail as unavailable, reads work; once the
    files are writable the next write goes through, without a restart, on the
    loop's connection too."""
    caplog.set_level(logging.INFO, logger="turnkeeper.store")
    db = tmp_path / "sessions.db"
    first = await sqlite_store(db)
    await first.append_events(CHAT, event())
    other = sqlite3.connect(db)  # another process has the file open: its WAL stays
    other.execute("SELECT 1 FROM meta").fetchall()
    if not with_wal:
        other.close()
    await first.close()
    assert wal(db).exists() == with_wal
    unwritable.on(db, wal(db))
    store = await sqlite_store(db)
    if not with_wal:
        other = sqlite3.connect(db)
    try:
        for _ in range(3):
            with pytest.raises(StoreUnavailable, match="readonly"):
                await store.append_events(CHAT, event())
            with inline_calls(), pytest.raises(StoreUnavailable, match="readonly"):
                await store.append_events(CHAT, event())
        assert await seqs(store) == [1]  # reads work meanwhile
        assert store_log(caplog) == ["down"]  # once, however many calls failed
        unwritable.off()
        assert await first_write_after(store) < BOUND_S
        assert store_log(caplog) == ["down", "up"]
        with inline_calls():
            await store.append_events(CHAT, event())
        assert await seqs(store) == [1, 2, 3]
        assert other.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 3
    finally:
        other.close()
        await store.close()


async def test_sqlite_a_store_made_unwritable_while_open_takes_writes_once_it_is_writable(
    tmp_path: Path, unwritable: Unwritable
) -> None:
    """The same while the store has the files open: its writes meet an I/O error
    (chattr) or a read-only file; the connections opened again meanwhile are read-only."""
    db = tmp_path / "sessions.db"
    store = await sqlite_store(db)
    try:
        await store.append_events(CHAT, event())
        unwritable.on(db, wal(db))
        for _ in range(3):
            with pytest.raises(StoreUnavailable):
                await store.append_events(CHAT, event())
            with inline_calls(), pytest.raises(StoreUnavailable):
                await store.append_events(CHAT, event())
        unwritable.off()
        assert await first_write_after(store) < BOUND_S
        assert await seqs(store) == [1, 2]
    finally:
        await store.close()


async def test_sqlite_a_deleted_store_file_is_waited_for_and_a_restored_copy_is_opened(
    tmp_path: Path,
) -> None:
    """Deleted under the running store: calls fail as unavailable (no empty store
    is made in its place: what it took would be lost when the file is restored).
    A copy put back at the path (another file) is opened, as a restart would."""
    db = tmp_path / "sessions.db"
    store = await sqlite_store(db)
    try:
        await store.append_events(CHAT, event())
        backup = tmp_path / "backup.db"
        with sqlite3.connect(db) as src, sqlite3.connect(backup) as dst:
            src.backup(dst)
        db.unlink()
        for _ in range(3):
            with pytest.raises(StoreUnavailable):
                await store.append_events(CHAT, event())
            with pytest.raises(StoreUnavailable):
                await store.events(CHAT)
        assert not db.exists()  # not made anew
        shutil.copy(backup, db)
        assert await first_write_after(store) < BOUND_S
        with inline_calls():
            await store.append_events(CHAT, event())
        assert (await seqs(store))[:1] == [1] and len(await seqs(store)) >= 3
        with sqlite3.connect(db) as check:
            assert check.execute("SELECT COUNT(*) FROM events").fetchone()[0] == len(await seqs(store))
    finally:
        await store.close()


async def test_sqlite_a_store_file_moved_away_and_back_is_used_again(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    store = await sqlite_store(db)
    try:
        await store.append_events(CHAT, event())
        aside = tmp_path / "sessions.db.aside"
        db.rename(aside)
        with pytest.raises(StoreUnavailable):
            await store.append_events(CHAT, event())
        aside.rename(db)
        assert await first_write_after(store) < BOUND_S
        assert await seqs(store) == [1, 2]
    finally:
        await store.close()


@contextmanager
def small_tmpfs(where: Path, size_kb: int) -> Iterator[Path]:
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


async def test_sqlite_a_full_disk_ends_and_the_next_write_goes_through(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", 512) as disk:
        db = disk / "sessions.db"
        store = await sqlite_store(db)
        try:
            await store.append_events(CHAT, event())
            filler = disk / "filler"
            with suppress(OSError), filler.open("wb") as f:
                while True:
                    f.write(b"x" * 4096)
                    f.flush()
            big = [NewEvent(type="session_updated", payload={"pad": "y" * 200_000})]
            with pytest.raises(StoreUnavailable, match="full|disk"):
                for _ in range(10):
                    await store.append_events(CHAT, big)
            filler.unlink()
            assert await first_write_after(store) < BOUND_S
            assert (await seqs(store))[-1] >= 2
        finally:
            await store.close()


# -- PostgreSQL ----------------------------------------------------------------------------------


@asynccontextmanager
async def own_database() -> AsyncIterator[tuple[str, asyncpg.Connection]]:
    """A database of the test's own (its URL) and an admin connection to the test
    server: what is done to it reaches no other test. Dropped afterwards."""
    admin = await pg_admin()
    name = f"tk_ro_{uuid.uuid4().hex[:12]}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(PG_URL)
    try:
        yield urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, "")), admin
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def end_sessions(admin: asyncpg.Connection, database: str) -> int:
    return int(
        await admin.fetchval(
            "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()) AS ended",
            database,
        )
    )


@pytest.mark.postgres
async def test_pg_writes_go_through_once_a_read_only_database_is_writable_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As during a failover: the database turns read-only and its sessions end. The
    pool opens new sessions, read-only ones; writes fail as unavailable, reads
    work. Once it is writable again the next write goes through, though the pool
    still held sessions opened read-only, and nobody ended them by hand."""
    caplog.set_level(logging.INFO, logger="turnkeeper.store")
    async with own_database() as (url, admin):
        database = urlsplit(url).path[1:]
        store = PostgresStore(url, max_size=4)
        await store.open()
        try:
            await store.append_events(CHAT, event())
            await admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
            assert await end_sessions(admin, database) >= 1
            for _ in range(3):
                with pytest.raises(StoreUnavailable, match="read-only"):
                    await store.append_events(CHAT, event())
                # Reads meanwhile: the pool fills with sessions opened read-only.
                assert all(s == [1] for s in await asyncio.gather(*(seqs(store) for _ in range(4))))
            assert store_log(caplog) == ["down"]
            await admin.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
            assert await first_write_after(store) < BOUND_S
            assert store_log(caplog) == ["down", "up"]
            # Every session of the pool takes writes now.
            await asyncio.gather(*(store.append_events(f"c{i}", event()) for i in range(8)))
            await asyncio.gather(*(store.append_events(f"c{i}", event()) for i in range(8)))
            assert await seqs(store) == [1, 2]
        finally:
            await store.close()


@pytest.mark.postgres
async def test_pg_calls_go_through_after_the_servers_sessions_are_cut() -> None:
    """A restart or a proxy ends every session the pool holds, idle or not: the next
    calls go through, each at its first try."""
    app = f"tk_cut_{uuid.uuid4().hex[:8]}"
    async with pg_schema() as schema:
        store = PostgresStore(
            f"{PG_URL}{'&' if '?' in PG_URL else '?'}application_name={app}",
            schema=schema,
            min_size=4,
            max_size=4,
        )
        await store.open()
        admin = await pg_admin()
        try:
            await asyncio.gather(*(store.append_events(f"c{i}", event()) for i in range(8)))
            for _ in range(3):
                cut = await admin.fetchval(
                    "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                    app,
                )
                assert cut >= 1
                assert await first_write_after(store) < BOUND_S
                await asyncio.gather(
                    *(store.append_events(f"c{i}", event()) for i in range(8)),
                    *(store.events(f"c{i}") for i in range(8)),
                )
            assert await seqs(store) == [1, 2, 3]
        finally:
            await admin.close()
            await store.close()


# -- /healthz ----------------------------------------------------------------------------------


class _Backends:
    """What /healthz asks of the web process: no Temporal here, and `store`."""

    def __init__(self, store: SessionStore) -> None:
        self._store = store

    async def client(self) -> Any:
        raise ApiError(503, "no Temporal in this test")

    async def store(self) -> SessionStore:
        return self._store


async def health_of_store(store: SessionStore) -> str:
    app = SimpleNamespace(state=SimpleNamespace(backends=_Backends(store)))
    request = Request({"type": "http", "method": "GET", "path": "/healthz", "headers": [], "app": app})
    answer = await healthz(request)
    parts = json.loads(bytes(answer.body))
    assert answer.status_code == (200 if all(v == "ok" for v in parts.values()) else 503)
    return str(parts["store"])


async def test_healthz_reports_a_read_only_sqlite_store_until_it_is_writable(
    tmp_path: Path, unwritable: Unwritable
) -> None:
    db = tmp_path / "sessions.db"
    store = await sqlite_store(db)
    try:
        await store.append_events(CHAT, event())
        assert await health_of_store(store) == "ok"
        unwritable.on(db, wal(db))  # under the open store
        assert await health_of_store(store) != "ok"
        await store.close()
        store = await sqlite_store(db)  # opened while it is read-only: a web process started then
        assert "readonly" in await health_of_store(store)
        assert await seqs(store) == [1]  # reads work: a read would have said ok
        unwritable.off()
        assert await health_of_store(store) == "ok"
        assert await first_write_after(store) < BOUND_S
    finally:
        await store.close()


@pytest.mark.postgres
async def test_healthz_reports_a_read_only_postgres_database_until_it_is_writable() -> None:
    async with own_database() as (url, admin):
        database = urlsplit(url).path[1:]
        store = PostgresStore(url, max_size=2)
        await store.open()
        try:
            assert await health_of_store(store) == "ok"
            await admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
            await end_sessions(admin, database)
            assert "read-only" in await health_of_store(store)
            assert await seqs(store) == []  # reads work: a read would have said ok
            await admin.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
            assert await health_of_store(store) == "ok"
        finally:
            await store.close()
