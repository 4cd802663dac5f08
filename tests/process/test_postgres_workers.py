"""Turns end to end with the PostgreSQL session store shared by two workers
(one in this process, one a real `python worker.py` process) on one task queue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.pg import pg_schema, url_with_search_path
from tests.support import Stack
from turnkeeper.models import TurnStatus
from turnkeeper.store import PostgresStore

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    # Requested before `stack`, so the schema outlives the workers.
    async with pg_schema(create=True) as schema:
        yield url_with_search_path(schema)


async def test_two_workers_share_the_postgres_store(pg_url: str, stack: Stack) -> None:
    stack.env_extra["TURNKEEPER_DATABASE_URL"] = pg_url
    stack.script(
        [
            {"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]},
            {"text": "listed"},
            {"text": "second answer"},
        ]
    )
    proc = stack.spawn_worker()
    await stack.start_worker()
    store = await stack.store()
    assert isinstance(store, PostgresStore)

    chats = [stack.chat(f"pg{i}") for i in range(6)]
    handles = await asyncio.gather(*(stack.send(c, "list the workspace") for c in chats))
    finals = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60)
    assert all(f.status == TurnStatus.COMPLETED and f.turn == 1 for f in finals)
    for chat in chats:
        await stack.send(chat, "and again")
    for chat in chats:
        await stack.wait_turn_done(chat, 2, timeout=60)
    assert proc.poll() is None, "the worker process died; see its log in the test's tmp dir"
    log = stack.dir / "worker0.log"
    for _ in range(100):  # the process serves the same queue with the same store
        if "store PostgresStore" in log.read_text():
            break
        await asyncio.sleep(0.1)
    assert "store PostgresStore" in log.read_text()
    assert pg_url not in log.read_text()  # URLs are never logged

    for chat in chats:
        history = await stack.history(chat)
        assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
        assert history[-1]["content"] == "second answer"
        events = await store.events(chat)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert [e.type for e in events].count("turn_started") == 2
        assert [e.type for e in events].count("turn_end") == 2

    # The rows really are in PostgreSQL, in the test's schema.
    conn = await asyncpg.connect(pg_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM turns WHERE status = 'completed'") == 2 * len(chats)
    finally:
        await conn.close()
