"""The session store a chaos run uses, and the outages the harness makes in it.

SQLite (the default): the workers share one file. An outage is one of:

- `lock`: its write lock held, as another process writing would;
- `read_only` (only as root, where `chattr` works): the file and its WAL made
  immutable. The running workers' writes fail (an I/O error), and a worker
  started meanwhile (the killer's replacements) opens the file read-only, as
  SQLite does with a file it may not write: its store must open it again once
  the file is writable.

PostgreSQL (`--postgres URL`, a database the URL's user may create roles in):
the run gets a login role and a schema of its own, dropped afterwards, so runs
and test suites can share the database. The workers connect as that role, so
an outage reaches them and nobody else. Each outage is one of:

- `lock`: the store's tables locked against writers (`EXCLUSIVE`: reads go on),
  as a long migration or a stuck batch job would; writers wait up to the
  store's lock timeout, then fail;
- `read_only`: the role's new sessions are read-only and its open ones are cut
  off, as during a failover to a standby; every write fails at once, reads work;
  when it ends the role's sessions are cut off again;
- `read_only_kept`: the same, but when it ends the setting is only reset, as a
  database made writable again is: the sessions the workers opened meanwhile stay
  read-only until the workers themselves end them (the role's setting rather
  than the database's, so that it reaches no one else);
- `cut`: the role's sessions are cut off again and again (`pg_terminate_backend`),
  as a restarting server or a proxy dropping connections would, in the middle of
  whatever transaction each one runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from tests.chaos.base import CLOSED_TURN

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
# How often a `cut` outage cuts the role's sessions off again.
CUT_EVERY_S = (0.3, 1.5)


@dataclass
class Hold:
    """An outage (or a short stall) in progress; `release` ends it."""

    kind: str
    conn: object | None = None
    task: asyncio.Task[None] | None = None
    cuts: list[int] = field(default_factory=list)  # sessions cut off, per cut


class ChaosStore(Protocol):
    kinds: tuple[str, ...]  # the outages it can make

    def worker_env(self) -> dict[str, str]: ...
    def describe(self) -> str: ...
    async def setup(self) -> None: ...
    async def teardown(self, keep: bool) -> None: ...
    async def closed_turns(self) -> int | None: ...
    async def hold(self, kind: str, timeout: float) -> Hold | None: ...
    async def release(self, hold: Hold) -> None: ...


class SQLiteChaosStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.kinds: tuple[str, ...] = ("lock",)  # and `read_only` where `chattr +i` works (setup)
        self._immutable: list[Path] = []

    def worker_env(self) -> dict[str, str]:
        return {}  # the workers' own default: TURNKEEPER_DATA_DIR/sessions.db

    def describe(self) -> str:
        return f"SQLite {self.path}"

    async def setup(self) -> None:
        if await asyncio.to_thread(self._chattr_works):
            self.kinds = ("lock", "read_only")

    def _chattr_works(self) -> bool:
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self.path.parent) as probe:
            if not self._chattr("+i", [Path(probe.name)]):
                return False
            return self._chattr("-i", [Path(probe.name)])

    @staticmethod
    def _chattr(flag: str, files: list[Path]) -> bool:
        try:
            return subprocess.run(["chattr", flag, *map(str, files)], capture_output=True).returncode == 0
        except OSError:
            return False

    async def teardown(self, keep: bool) -> None:
        await asyncio.to_thread(self._writable)

    async def closed_turns(self) -> int | None:
        return await asyncio.to_thread(self._closed_turns)

    def _closed_turns(self) -> int | None:
        if not self.path.exists():
            return 0
        conn = sqlite3.connect(str(self.path), timeout=10)
        try:
            return int(
                conn.execute(
                    f"SELECT COUNT(*) FROM turns WHERE status IN ({','.join('?' * len(CLOSED_TURN))})",
                    CLOSED_TURN,
                ).fetchone()[0]
            )
        except sqlite3.Error:
            return None
        finally:
            conn.close()

    async def hold(self, kind: str, timeout: float) -> Hold | None:
        if kind == "read_only":
            return Hold(kind) if await asyncio.to_thread(self._read_only) else None
        if kind != "lock":
            raise ValueError(f"unknown outage kind {kind!r}")
        conn = await asyncio.to_thread(self._take_write_lock, timeout)
        return Hold(kind, conn) if conn is not None else None

    def _read_only(self) -> bool:
        files = [p for p in (self.path, self.path.with_name(self.path.name + "-wal")) if p.exists()]
        if not files or not self._chattr("+i", files):
            return False
        self._immutable = files
        return True

    def _writable(self) -> None:
        files, self._immutable = self._immutable, []
        if files:
            self._chattr("-i", files)

    def _take_write_lock(self, timeout: float) -> sqlite3.Connection | None:
        try:
            conn = sqlite3.connect(
                str(self.path), timeout=timeout, isolation_level=None, check_same_thread=False
            )
            conn.execute("BEGIN IMMEDIATE")
            return conn
        except sqlite3.Error:
            return None

    async def release(self, hold: Hold) -> None:
        if hold.kind == "read_only":
            await asyncio.to_thread(self._writable)
        else:
            await asyncio.to_thread(self._rollback, hold.conn)

    @staticmethod
    def _rollback(conn: object) -> None:
        assert isinstance(conn, sqlite3.Connection)
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        conn.close()


class PostgresChaosStore:
    kinds = ("lock", "read_only", "read_only_kept", "cut")

    def __init__(self, admin_url: str, rng_uniform: Callable[[float, float], float]) -> None:
        self.admin_url = admin_url
        self.name = f"chaos_{uuid.uuid4().hex[:12]}"  # the role and the schema
        self._uniform = rng_uniform
        self._admin: asyncpg.Pool | None = None  # the harness's own sessions, as the URL's user

    def worker_env(self) -> dict[str, str]:
        return {"TURNKEEPER_DATABASE_URL": self.worker_url()}

    def worker_url(self) -> str:
        parts = urlsplit(self.admin_url)
        host = parts.netloc.rpartition("@")[2]
        query = "&".join(q for q in (parts.query, f"search_path={self.name}") if q)
        return urlunsplit((parts.scheme, f"{self.name}@{host}", parts.path, query, ""))

    def describe(self) -> str:
        host = urlsplit(self.admin_url).netloc.rpartition("@")[2]
        return f"PostgreSQL {host}{urlsplit(self.admin_url).path}, role and schema {self.name}"

    async def setup(self) -> None:
        self._admin = await asyncpg.create_pool(self.admin_url, min_size=1, max_size=3, timeout=10)
        await self._admin.execute(f'CREATE ROLE "{self.name}" LOGIN')
        await self._admin.execute(f'CREATE SCHEMA "{self.name}" AUTHORIZATION "{self.name}"')

    async def teardown(self, keep: bool) -> None:
        admin, self._admin = self._admin, None
        if admin is None:
            return
        try:
            await self._reset_role(admin)
            if not keep:
                await self._cut(admin)
                await admin.execute(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')
                await admin.execute(f'DROP ROLE IF EXISTS "{self.name}"')
        finally:
            await admin.close()

    async def closed_turns(self) -> int | None:
        assert self._admin is not None
        try:
            return int(
                await self._admin.fetchval(
                    f'SELECT COUNT(*) FROM "{self.name}".turns WHERE status = ANY($1::text[])',
                    list(CLOSED_TURN),
                )
            )
        except asyncpg.UndefinedTableError:
            return 0
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            return None

    async def hold(self, kind: str, timeout: float) -> Hold | None:
        if kind == "lock":
            return await self._lock_tables(timeout)
        assert self._admin is not None
        if kind in ("read_only", "read_only_kept"):
            await self._admin.execute(f'ALTER ROLE "{self.name}" SET default_transaction_read_only = on')
            hold = Hold(kind)
            hold.cuts.append(await self._cut(self._admin))
            return hold
        if kind == "cut":
            hold = Hold(kind)
            hold.task = asyncio.create_task(self._keep_cutting(hold))
            return hold
        raise ValueError(f"unknown outage kind {kind!r}")

    async def release(self, hold: Hold) -> None:
        if hold.kind == "lock":
            conn = hold.conn
            assert isinstance(conn, asyncpg.Connection)
            with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                await conn.execute("ROLLBACK")
            await conn.close()
        elif hold.kind == "read_only":
            assert self._admin is not None
            await self._reset_role(self._admin)
            # Sessions opened read-only stay so until they end: cut them off too.
            hold.cuts.append(await self._cut(self._admin))
        elif hold.kind == "read_only_kept":
            assert self._admin is not None
            await self._reset_role(self._admin)  # and nothing more: the workers' own sessions stay
        elif hold.task is not None:
            hold.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await hold.task

    async def _lock_tables(self, timeout: float) -> Hold | None:
        conn = await asyncpg.connect(self.admin_url, timeout=10)
        try:
            tables = [
                r["tablename"]
                for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", self.name)
            ]
            if not tables:
                await conn.close()
                return None
            await conn.execute(f"SET lock_timeout = '{int(timeout * 1000)}ms'")
            await conn.execute("BEGIN")
            names = ", ".join(f'"{self.name}"."{t}"' for t in sorted(tables))
            await conn.execute(f"LOCK TABLE {names} IN EXCLUSIVE MODE")
            return Hold("lock", conn)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
            await conn.close()
            return None

    async def _keep_cutting(self, hold: Hold) -> None:
        assert self._admin is not None
        while True:
            hold.cuts.append(await self._cut(self._admin))
            await asyncio.sleep(self._uniform(*CUT_EVERY_S))

    async def _cut(self, admin: asyncpg.Pool) -> int:
        """End every session of the run's role; how many there were."""
        return int(
            await admin.fetchval(
                "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE usename = $1 AND pid <> pg_backend_pid()) AS cut",
                self.name,
            )
        )

    async def _reset_role(self, admin: asyncpg.Pool) -> None:
        await admin.execute(f'ALTER ROLE "{self.name}" RESET default_transaction_read_only')
