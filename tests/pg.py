"""The PostgreSQL server the tests use: TURNKEEPER_TEST_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/test, trust auth; .ci/run starts it).

An unreachable server fails the tests that need it, with a message saying so;
TURNKEEPER_TEST_SKIP_POSTGRES=1 skips them instead (or `pytest -m "not postgres"`).
Each test works in a schema of its own, dropped afterwards. Under pytest-xdist each
process works in a database of its own, made at its first use and dropped at its end:
a chat's advisory lock is database-wide, and tests in other schemas use the same chat ids.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from turnkeeper.store.postgres_driver import display_url

SERVER_URL = os.environ.get("TURNKEEPER_TEST_DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/test"
SKIP_PG = os.environ.get("TURNKEEPER_TEST_SKIP_POSTGRES", "").strip().lower() in ("1", "true", "yes")


def _own_database(url: str) -> str | None:
    """This xdist process's database (`test_gw0_1a2b3c4d`: the run's id too, so that two runs
    on one server keep apart), or None outside xdist."""
    worker, run = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_TESTRUNUID", "")
    if not worker:
        return None
    return f"{urlsplit(url).path.lstrip('/') or 'postgres'}_{worker}_{run[:8]}"


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, parts.fragment))


OWN_DATABASE = _own_database(SERVER_URL)
PG_URL = _with_database(SERVER_URL, OWN_DATABASE) if OWN_DATABASE else SERVER_URL

_unreachable: str | None = None
_created = False


async def _create_own_database() -> None:
    global _created
    admin = await asyncpg.connect(SERVER_URL, timeout=10)
    try:
        if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", OWN_DATABASE):
            await admin.execute(f'CREATE DATABASE "{OWN_DATABASE}"')
    finally:
        await admin.close()
    _created = True


def drop_own_database() -> None:
    """At the end of an xdist process: its database goes, with any session left in it."""
    if not _created:
        return

    async def drop() -> None:
        admin = await asyncpg.connect(SERVER_URL, timeout=10)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{OWN_DATABASE}" WITH (FORCE)')
        finally:
            await admin.close()

    asyncio.run(drop())


async def pg_admin() -> asyncpg.Connection:
    """A connection to the test server, or the test fails saying why (skips when opted out)."""
    global _unreachable
    if SKIP_PG:
        pytest.skip("TURNKEEPER_TEST_SKIP_POSTGRES is set")
    if _unreachable is None:
        doing = ""
        try:
            if OWN_DATABASE and not _created:
                doing = f"making database {OWN_DATABASE}: "  # needs the CREATEDB privilege
                await _create_own_database()
                doing = ""
            return await asyncpg.connect(PG_URL, timeout=10)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            _unreachable = f"{doing}{type(exc).__name__}: {exc}"  # once: later tests fail at once
    pytest.fail(
        f"PostgreSQL is not reachable at {display_url(SERVER_URL)} ({_unreachable}). Start it "
        "(.ci/run shows how), point TURNKEEPER_TEST_DATABASE_URL at another server, or set "
        "TURNKEEPER_TEST_SKIP_POSTGRES=1 to skip the PostgreSQL tests.",
        pytrace=False,
    )


@asynccontextmanager
async def pg_schema(create: bool = False) -> AsyncIterator[str]:
    """A fresh schema name on the test database (created when asked), dropped afterwards."""
    admin = await pg_admin()
    schema = f"t_{uuid.uuid4().hex[:16]}"
    try:
        if create:
            await admin.execute(f'CREATE SCHEMA "{schema}"')
        yield schema
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()


def url_with_search_path(schema: str) -> str:
    """PG_URL whose connections use `schema` (asyncpg passes unknown query parameters as settings)."""
    return f"{PG_URL}{'&' if '?' in PG_URL else '?'}search_path={schema}"
