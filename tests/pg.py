"""The PostgreSQL server the tests use: TURNKEEPER_TEST_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/test, trust auth; .ci/run starts it).

An unreachable server fails the tests that need it, with a message saying so;
TURNKEEPER_TEST_SKIP_POSTGRES=1 skips them instead (or `pytest -m "not postgres"`).
Each test works in a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pytest

from turnkeeper.store.postgres import display_url

PG_URL = os.environ.get("TURNKEEPER_TEST_DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/test"
SKIP_PG = os.environ.get("TURNKEEPER_TEST_SKIP_POSTGRES", "").strip().lower() in ("1", "true", "yes")

_unreachable: str | None = None


async def pg_admin() -> asyncpg.Connection:
    """A connection to the test server, or the test fails saying why (skips when opted out)."""
    global _unreachable
    if SKIP_PG:
        pytest.skip("TURNKEEPER_TEST_SKIP_POSTGRES is set")
    if _unreachable is None:
        try:
            return await asyncpg.connect(PG_URL, timeout=10)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            _unreachable = f"{type(exc).__name__}: {exc}"  # once: later tests fail at once
    pytest.fail(
        f"PostgreSQL is not reachable at {display_url(PG_URL)} ({_unreachable}). Start it "
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
