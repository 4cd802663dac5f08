"""The session stores against the SessionStore contract (turnkeeper/store/base.py).

Every contract test runs on SQLite and on PostgreSQL (`backend` fixture); the
PostgreSQL server and how to skip it: tests/pg.py.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.pg import PG_URL, pg_schema
from turnkeeper.config import Settings
from turnkeeper.models import (
    ChatMessage,
    ModelReply,
    NewEvent,
    Reason,
    ToolCall,
    TurnStatus,
    UserMessage,
)
from turnkeeper.store import (
    INTERRUPTED_TOOL_TEXT,
    SUPERSEDED_TEXT,
    CorruptRowError,
    PostgresStore,
    SessionStore,
    SQLiteStore,
    StoredRow,
    StoreError,
    StoreUnavailable,
    Summary,
    TurnUpdate,
    inline_calls,
    open_store,
)
from turnkeeper.store import sqlite as sqlite_store
from turnkeeper.store.postgres import _CHAT_LOCK_SPACE
from turnkeeper.store.postgres_driver import numbered
from turnkeeper.store.schema import SCHEMA_VERSION

CHAT = "chat-1"


# -- backends ---------------------------------------------------------------------------


class Backend(ABC):
    """One store database, and raw access to it as another process would have."""

    name: str

    @abstractmethod
    def new_store(self, **kwargs: Any) -> SessionStore:
        """Another store (not opened) on the same database."""

    @abstractmethod
    async def execute(self, sql: str, *args: Any) -> None:
        """Raw SQL outside any store; `?` placeholders."""

    @abstractmethod
    async def fetchval(self, sql: str, *args: Any) -> Any: ...

    @abstractmethod
    def hold_write_lock(self, chat_id: str) -> Any:
        """Async context: another process holds what a write to `chat_id` waits for."""


class SQLiteBackend(Backend):
    name = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path

    def new_store(self, **kwargs: Any) -> SQLiteStore:
        return SQLiteStore(self.path, **kwargs)

    async def execute(self, sql: str, *args: Any) -> None:
        with sqlite3.connect(self.path) as raw:
            raw.execute(sql, args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        with sqlite3.connect(self.path) as raw:
            row = raw.execute(sql, args).fetchone()
        return None if row is None else row[0]

    @asynccontextmanager
    async def hold_write_lock(self, chat_id: str) -> AsyncIterator[None]:
        raw = sqlite3.connect(self.path, isolation_level=None)
        raw.execute("BEGIN IMMEDIATE")  # the database's write lock
        try:
            yield
        finally:
            raw.execute("COMMIT")
            raw.close()


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, url: str, schema: str) -> None:
        self.url = url
        self.schema = schema

    def new_store(self, **kwargs: Any) -> PostgresStore:
        kwargs.setdefault("schema", self.schema)
        return PostgresStore(self.url, **kwargs)

    async def connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.url, server_settings={"search_path": self.schema})

    async def execute(self, sql: str, *args: Any) -> None:
        conn = await self.connect()
        try:
            await conn.execute(numbered(sql), *args)
        finally:
            await conn.close()

    async def fetchval(self, sql: str, *args: Any) -> Any:
        conn = await self.connect()
        try:
            return await conn.fetchval(numbered(sql), *args)
        finally:
            await conn.close()

    @asynccontextmanager
    async def hold_write_lock(self, chat_id: str) -> AsyncIterator[None]:
        conn = await self.connect()
        try:
            async with conn.transaction():  # the chat's advisory lock, as a store's write takes it
                await conn.execute(
                    "SELECT pg_advisory_xact_lock($1, hashtext($2))", _CHAT_LOCK_SPACE, chat_id
                )
                yield
        finally:
            await conn.close()


@asynccontextmanager
async def _postgres_backend() -> AsyncIterator[PostgresBackend]:
    async with pg_schema() as schema:  # PostgresStore creates it
        yield PostgresBackend(PG_URL, schema)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "sqlite":
        # The parent does not exist yet: open() creates it.
        yield SQLiteBackend(tmp_path / "data" / "sessions.db")
    else:
        async with _postgres_backend() as pg:
            yield pg


@pytest.fixture
async def pg() -> AsyncIterator[PostgresBackend]:
    async with _postgres_backend() as b:
        yield b


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[SessionStore]:
    s = backend.new_store()
    await s.open()
    try:
        yield s
    finally:
        await s.close()


def user(message_id: str, text: str | None = None) -> UserMessage:
    return UserMessage(message_id=message_id, text=text or f"text of {message_id}")


async def event_types(store: SessionStore, chat_id: str = CHAT, after_seq: int = 0) -> list[str]:
    return [e.type for e in await store.events(chat_id, after_seq=after_seq)]


async def last_seq(store: SessionStore, chat_id: str = CHAT) -> int:
    events = await store.events(chat_id)
    return events[-1].seq if events else 0


async def start_turn(store: SessionStore, run_id: str, *message_ids: str) -> int:
    began = await store.begin_turn(CHAT, run_id, list(message_ids))
    assert began.turn is not None
    await store.commit_user_messages(CHAT, began.turn, [user(m) for m in message_ids])
    return began.turn


# -- lifecycle -------------------------------------------------------------------------


async def test_open_is_idempotent_and_records_schema_version(backend: Backend) -> None:
    s = backend.new_store()
    await s.open()
    await s.open()
    await s.append_events(CHAT, [NewEvent(type="session_updated")])
    await s.close()
    await s.close()  # closing twice is harmless

    assert await backend.fetchval("SELECT value FROM meta WHERE key = 'schema_version'") == str(
        SCHEMA_VERSION
    )
    if isinstance(backend, SQLiteBackend):
        assert await backend.fetchval("PRAGMA journal_mode") == "wal"

    reopened = backend.new_store()
    await reopened.open()
    try:
        assert await event_types(reopened) == ["session_updated"]  # data survives reopening
    finally:
        await reopened.close()


async def _has_index(backend: Backend, name: str) -> bool:
    if isinstance(backend, SQLiteBackend):
        return bool(
            await backend.fetchval(
                "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ?", name
            )
        )
    assert isinstance(backend, PostgresBackend)
    return bool(
        await backend.fetchval(
            "SELECT count(*) FROM pg_indexes WHERE schemaname = ? AND indexname = ?", backend.schema, name
        )
    )


async def test_both_schemas_index_the_open_turns(store: SessionStore, backend: Backend) -> None:
    assert await _has_index(backend, "turns_open")


async def test_an_sqlite_store_made_without_the_open_turns_index_gains_it(tmp_path: Path) -> None:
    """SQLite stores made before both backends shared one schema lack `turns_open`."""
    backend = SQLiteBackend(tmp_path / "sessions.db")
    older = backend.new_store()
    await older.open()
    await older.begin_turn(CHAT, "run-1", ["m1"])
    await older.close()
    await backend.execute("DROP INDEX turns_open")

    store = backend.new_store()
    await store.open()
    try:
        assert await _has_index(backend, "turns_open")
        assert [(t.chat_id, t.turn) for t in await store.open_turns()] == [(CHAT, 1)]
    finally:
        await store.close()


async def test_sqlite_stores_opening_one_new_file_at_once_all_open(tmp_path: Path) -> None:
    """A worker and the page started together both create the file and switch it to WAL."""
    for round_ in range(40):
        stores = [SQLiteStore(tmp_path / str(round_) / "sessions.db") for _ in range(3)]
        try:
            await asyncio.gather(*(store.open() for store in stores))
        finally:
            for store in stores:
                await store.close()


async def test_a_version_1_store_is_migrated_and_keeps_its_rows(backend: Backend) -> None:
    """Version 2 added the drafts table, `summaries` and the `messages_chat_row` index:
    a store made at version 1 gains them when a newer worker opens it, and keeps what
    it holds."""
    older = backend.new_store()
    await older.open()
    turn = await start_turn(older, "run-1", "m1")
    await older.close()
    await backend.execute("DROP TABLE drafts")
    await backend.execute("DROP TABLE summaries")
    await backend.execute("DROP INDEX messages_chat_row")
    await backend.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")

    store = backend.new_store()
    await store.open()
    try:
        assert await backend.fetchval("SELECT value FROM meta WHERE key = 'schema_version'") == str(
            SCHEMA_VERSION
        )
        assert await _has_index(backend, "messages_chat_row")
        assert [m.content for m in await store.history(CHAT)] == ["text of m1"]
        kept = await store.add_summary(CHAT, Summary(upto_id=1, text="s", tokens=1, assistant_rows=0))
        assert kept.text == "s" and (await store.context_rows(CHAT)).summary == kept
        assert turn == 1
        assert await store.write_draft(CHAT, 1, 0, "streamed") == 1
    finally:
        await store.close()


async def test_context_rows_are_the_latest_summary_and_the_rows_after_it(store: SessionStore) -> None:
    turn = await start_turn(store, "run-1", "m1", "m2")
    await store.record_assistant(CHAT, turn, 0, ModelReply(text="answer"), final=True)
    loaded = await store.context_rows(CHAT)
    assert loaded.summary is None
    assert [(r.turn, r.message.role, r.message.content) for r in loaded.rows] == [
        (1, "user", "text of m1"),
        (1, "user", "text of m2"),
        (1, "assistant", "answer"),
    ]
    ids = [r.id for r in loaded.rows]
    assert ids == sorted(ids)

    first = Summary(upto_id=ids[0], text="m1 was said", tokens=3, assistant_rows=0)
    assert await store.add_summary(CHAT, first) == first
    # Made again (a model call run again after a loss): the first one stays.
    assert await store.add_summary(CHAT, first.model_copy(update={"text": "other"})) == first
    second = Summary(upto_id=ids[1], text="m1 and m2 were said", tokens=5, assistant_rows=0)
    await store.add_summary(CHAT, second)
    loaded = await store.context_rows(CHAT)
    assert loaded.summary == second
    assert loaded.rows == [
        StoredRow(id=ids[2], turn=1, message=ChatMessage(role="assistant", content="answer"))
    ]
    # The transcript itself is never shortened, and other chats see nothing of it.
    assert [m.content for m in await store.history(CHAT)] == ["text of m1", "text of m2", "answer"]
    assert (await store.context_rows("other")).summary is None


async def test_prepare_model_call_answers_lost_calls_commits_and_reads_in_one_go(store: SessionStore) -> None:
    turn = await start_turn(store, "run-1", "m1")
    await store.record_assistant(
        CHAT, turn, 0, ModelReply(tool_calls=[ToolCall(id="a", name="t")]), final=False
    )
    prepared = await store.prepare_model_call(CHAT, turn, [user("m1"), user("m2")], answer_lost_calls=True)
    assert prepared.committed == ["m2"]  # m1 was committed before: one row
    assert not isinstance(prepared.context, CorruptRowError)
    assert [(r.message.role, r.message.content) for r in prepared.context.rows] == [
        ("user", "text of m1"),
        ("assistant", None),
        ("tool", INTERRUPTED_TOOL_TEXT),
        ("user", "text of m2"),
    ]
    assert prepared.context == await store.context_rows(CHAT)
    # Again (the same call made again after a loss): nothing new, the same context.
    again = await store.prepare_model_call(CHAT, turn, [user("m2")], answer_lost_calls=True)
    assert again.committed == [] and again.context == prepared.context
    # Nothing to write: a read.
    assert (await store.prepare_model_call(CHAT, turn, [])).context == prepared.context


async def test_prepare_model_call_keeps_its_commits_when_a_row_cannot_be_read(
    store: SessionStore, backend: Backend
) -> None:
    turn = await start_turn(store, "run-1", "m1")
    ids = [r.id for r in (await store.context_rows(CHAT)).rows]
    await backend.execute("UPDATE messages SET body = 'not json' WHERE id = ?", ids[0])
    prepared = await store.prepare_model_call(CHAT, turn, [user("m2")])
    assert prepared.committed == ["m2"]
    assert isinstance(prepared.context, CorruptRowError) and f"id={ids[0]}" in str(prepared.context)
    assert await store.held_message_ids(CHAT, ["m2"]) == ["m2"]
    assert isinstance((await store.prepare_model_call(CHAT, turn, [])).context, CorruptRowError)


async def test_answered_call_ids_are_those_with_a_tool_row(store: SessionStore) -> None:
    turn = await start_turn(store, "run-1", "m1")
    await store.record_assistant(
        CHAT,
        turn,
        0,
        ModelReply(tool_calls=[ToolCall(id="a", name="t"), ToolCall(id="b", name="t")]),
        final=False,
    )
    await store.record_tool_result(CHAT, turn, "b", "t", "ok", "done")
    assert await store.answered_call_ids(CHAT, ["x", "b", "a", "b"]) == ["b"]
    assert (
        await store.answered_call_ids("other", ["b"]) == [] and await store.answered_call_ids(CHAT, []) == []
    )


async def test_a_corrupt_row_after_the_summary_is_named_one_before_it_is_not_read(
    store: SessionStore, backend: Backend
) -> None:
    turn = await start_turn(store, "run-1", "m1", "m2")
    ids = [r.id for r in (await store.context_rows(CHAT)).rows]
    await backend.execute("UPDATE messages SET body = 'not json' WHERE id = ?", ids[1])
    with pytest.raises(CorruptRowError, match=f"message row id={ids[1]}"):
        await store.context_rows(CHAT)
    await backend.execute("UPDATE messages SET body = 'not json' WHERE id = ?", ids[0])
    await backend.execute(
        "UPDATE messages SET body = ? WHERE id = ?", '{"role":"user","content":"fixed"}', ids[1]
    )
    await store.add_summary(CHAT, Summary(upto_id=ids[0], text="s", tokens=1, assistant_rows=0))
    assert [r.message.content for r in (await store.context_rows(CHAT)).rows] == ["fixed"]
    assert turn == 1


async def test_calls_before_open_raise_store_error(backend: Backend) -> None:
    with pytest.raises(StoreError, match="not open"):
        await backend.new_store().history(CHAT)


async def test_newer_schema_version_is_refused(backend: Backend) -> None:
    s = backend.new_store()
    await s.open()
    await s.close()
    await backend.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    newer = backend.new_store()
    with pytest.raises(StoreError, match="schema version 99"):
        await newer.open()
    await newer.close()
    with pytest.raises(StoreError, match="not open"):
        await newer.history(CHAT)


async def test_writes_wait_for_another_writer_without_blocking_the_event_loop(
    store: SessionStore, backend: Backend
) -> None:
    async with backend.hold_write_lock(CHAT):  # another process in the middle of a write
        write = asyncio.create_task(store.append_events(CHAT, [NewEvent(type="session_updated")]))
        started = time.monotonic()
        await asyncio.sleep(0.2)  # would not return on time if the store blocked the loop
        assert time.monotonic() - started < 1.0
        assert not write.done()  # the write waits for the lock, off the loop
    await asyncio.wait_for(write, timeout=5)
    assert await event_types(store) == ["session_updated"]


async def until_idle(store: SQLiteStore) -> None:
    while not store._thread_idle():
        await asyncio.sleep(0.01)


async def _sqlite_store(tmp_path: Path) -> SQLiteStore:
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.open()
    await start_turn(store, "run-1", "m1")
    return store


def _spy_threads(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch, names: dict[str, str], hold_s: float = 0.0
) -> list[tuple[str, str]]:
    """Record, per transaction, its name and whether it ran on the event loop's thread."""
    seen: list[tuple[str, str]] = []
    loop_thread = threading.get_ident()
    for attr, label in names.items():

        async def spy(chat: Any, *args: Any, inner: Any = getattr(store, attr), label: str = label) -> Any:
            seen.append((label, "loop" if threading.get_ident() == loop_thread else "store thread"))
            time.sleep(hold_s)  # a slow disk: the store thread is busy meanwhile
            return await inner(chat, *args)

        monkeypatch.setattr(store, attr, spy)
    return seen


async def test_sqlite_runs_an_inline_call_that_cannot_wait_on_the_loop_and_a_synced_one_on_its_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await _sqlite_store(tmp_path)
    try:
        seen = _spy_threads(store, monkeypatch, {"_tool_started_tx": "started", "_tool_result_tx": "result"})
        with inline_calls():  # as the tool activity calls the store
            await store.tool_started(CHAT, 1, ToolCall(id="c1", name="write_file", arguments="{}"), "key-1")
            await store.record_tool_result(CHAT, 1, "c1", "write_file", "ok", "done")
        assert seen == [("started", "store thread"), ("result", "loop")]
    finally:
        await store.close()


async def test_sqlite_runs_every_call_on_its_thread_unless_the_caller_allows_it_inline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local activities, the web process and the CLI call the store outside
    `inline_calls`: their calls keep to the store thread, as a local activity's
    timing must (turnkeeper/store/base.py)."""
    store = await _sqlite_store(tmp_path)
    try:
        seen = _spy_threads(store, monkeypatch, {"_tool_result_tx": "result"})
        await store.record_tool_result(CHAT, 1, "c1", "write_file", "ok", "done")

        async def in_a_task_started_inline() -> None:  # as the draft writer's task
            await store.record_tool_result(CHAT, 1, "c1", "write_file", "ok", "done")

        with inline_calls():
            task = asyncio.create_task(in_a_task_started_inline())
        await task
        await store.record_tool_result(CHAT, 1, "c1", "write_file", "ok", "done")  # the context has ended
        assert seen == [("result", "store thread"), ("result", "loop"), ("result", "store thread")]
    finally:
        await store.close()


async def test_sqlite_calls_keep_their_order_while_the_store_thread_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call made while an earlier one still runs on the store thread (a synced
    write, or one whose caller was cancelled) queues behind it, never overtakes it:
    a draft written after the reply that removed it would show a stale answer."""
    store = await _sqlite_store(tmp_path)
    try:
        seen = _spy_threads(
            store, monkeypatch, {"_tool_started_tx": "started", "_tool_result_tx": "result"}, hold_s=0.3
        )
        first = asyncio.create_task(
            store.tool_started(CHAT, 1, ToolCall(id="c1", name="write_file", arguments="{}"), "key-1")
        )
        await asyncio.sleep(0.05)  # the synced write is on the store thread now
        first.cancel()  # its caller gives up; the write itself goes on
        with inline_calls():
            await store.record_tool_result(CHAT, 1, "c1", "write_file", "ok", "done")
        assert seen == [("started", "store thread"), ("result", "store thread")]
        assert first.cancelled()
        seen.clear()
        with inline_calls():
            await store.record_tool_result(
                CHAT, 1, "c1", "write_file", "ok", "done"
            )  # the thread is idle again
        assert seen == [("result", "loop")]
    finally:
        await store.close()


async def test_sqlite_a_write_that_meets_another_writers_lock_waits_on_the_store_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await _sqlite_store(tmp_path)
    backend = SQLiteBackend(tmp_path / "sessions.db")
    try:
        seen = _spy_threads(store, monkeypatch, {"_tool_result_tx": "result"})
        async with backend.hold_write_lock(CHAT):
            with inline_calls():
                write = asyncio.create_task(
                    store.record_tool_result(CHAT, 1, "c1", "write_file", "ok", "done")
                )
            await asyncio.sleep(0.2)
            assert not write.done()
        await asyncio.wait_for(write, timeout=5)
        # Tried on the loop, refused the lock at once without running, then run whole on the thread.
        assert seen == [("result", "store thread")]
    finally:
        await store.close()


async def test_sqlite_checkpoints_the_loops_writes_on_its_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "CHECKPOINT_EVERY_WRITES", 3)
    store = await _sqlite_store(tmp_path)
    try:
        checkpoints: list[bool] = []
        real = store._checkpoint_sync
        loop_thread = threading.get_ident()

        def spy() -> None:
            checkpoints.append(threading.get_ident() != loop_thread)
            real()

        monkeypatch.setattr(store, "_checkpoint_sync", spy)
        with inline_calls():
            for _ in range(6):  # six writes on the loop
                await store.append_events(CHAT, [NewEvent(type="session_updated")])
                await until_idle(store)
        assert checkpoints == [True, True]
    finally:
        await store.close()


# -- begin_turn ---------------------------------------------------------------------------


async def test_begin_turn_numbers_turns_1_2_3(store: SessionStore) -> None:
    turns = [await start_turn(store, f"run-{i}", f"m{i}") for i in range(3)]
    assert turns == [1, 2, 3]
    latest = await store.get_turn(CHAT)
    assert latest is not None and latest.turn == 3 and latest.run_id == "run-2"
    assert latest.status is TurnStatus.RUNNING
    # Another chat numbers its own turns.
    other = await store.begin_turn("chat-2", "run-x", ["m0"])
    assert other.turn == 1 and other.duplicate_ids == []


async def test_begin_turn_is_idempotent_for_the_same_run(store: SessionStore) -> None:
    first = await store.begin_turn(CHAT, "run-1", ["m1", "m2"])
    await store.commit_user_messages(CHAT, 1, [user("m1"), user("m2")])
    # The activity is retried after it committed: its own messages are not duplicates.
    again = await store.begin_turn(CHAT, "run-1", ["m1", "m2"])
    assert again == first
    assert again.turn == 1 and again.duplicate_ids == []
    assert (await event_types(store)).count("turn_started") == 1


async def test_begin_turn_reports_duplicates_and_writes_nothing_when_all_are(store: SessionStore) -> None:
    await start_turn(store, "run-1", "m1")
    await store.record_assistant(CHAT, 1, 0, ModelReply(text="hi"), final=True)

    began = await store.begin_turn(CHAT, "run-2", ["m1", "m2"])
    assert began.turn == 2 and began.duplicate_ids == ["m1"]
    await store.commit_user_messages(CHAT, 2, [user("m1"), user("m2")])
    await store.record_assistant(CHAT, 2, 0, ModelReply(text="hello"), final=True)

    seq_before = await last_seq(store)
    history_before = await store.history(CHAT)
    none = await store.begin_turn(CHAT, "run-3", ["m2", "m1"])
    assert none.turn is None
    assert none.duplicate_ids == ["m2", "m1"]
    assert none.closed_turn is None
    assert await last_seq(store) == seq_before
    assert await store.history(CHAT) == history_before
    latest = await store.get_turn(CHAT)
    assert latest is not None and latest.turn == 2


async def test_begin_turn_closes_open_turn_with_unanswered_tool_call(store: SessionStore) -> None:
    await start_turn(store, "run-1", "m1")
    calls = [
        ToolCall(id="call-a", name="read_file", arguments='{"path": "a"}'),
        ToolCall(id="call-b", name="write_file", arguments='{"path": "b"}'),
    ]
    await store.record_assistant(CHAT, 1, 0, ModelReply(text=None, tool_calls=calls), final=False)
    assert await store.record_tool_result(CHAT, 1, "call-a", "read_file", "contents", "done")
    await store.update_turn(
        CHAT,
        1,
        TurnUpdate(
            status=TurnStatus.AWAITING_USER, reason=Reason.TOOL_STATE_UNKNOWN, recovery_id="rec-1", attempts=2
        ),
    )
    seq = await last_seq(store)

    began = await store.begin_turn(CHAT, "run-2", ["m2"])
    assert began.turn == 2 and began.closed_turn == 1

    history = await store.history(CHAT)
    interrupted = [m for m in history if m.role == "tool" and m.content == INTERRUPTED_TOOL_TEXT]
    assert interrupted == [
        ChatMessage(role="tool", content=INTERRUPTED_TOOL_TEXT, tool_call_id="call-b", name="write_file")
    ]
    assert [m.content for m in history].count(SUPERSEDED_TEXT) == 1
    assert history[-1] == ChatMessage(role="assistant", content=SUPERSEDED_TEXT)
    assert [m.role for m in history] == ["user", "assistant", "tool", "tool", "assistant"]

    closed = await store.get_turn(CHAT, 1)
    assert closed is not None
    assert (closed.status, closed.reason) == (TurnStatus.RECOVERED, Reason.SUPERSEDED)
    assert (closed.recovery_id, closed.attempts) == ("rec-1", 2)  # kept, none minted

    new = await store.events(CHAT, after_seq=seq)
    assert [e.type for e in new] == [
        "tool_interrupted",
        "recovery_state",
        "session_updated",
        "turn_end",
        "turn_started",
    ]
    assert new[0].payload == {"turn": 1, "tool_call_id": "call-b", "name": "write_file"}
    assert new[1].payload == {
        "turn": 1,
        "status": "recovered",
        "reason": "superseded",
        "recovery_id": "rec-1",
        "can_continue": True,
        "attempts": 2,
    }
    assert new[2].payload == {"scope": "thread"}
    # The old turn ends in the log, so whoever waits on it (`send`, a UI) stops waiting.
    assert new[3].payload == {"turn": 1, "status": "recovered", "reason": "superseded"}
    assert new[4].payload == {"turn": 2, "run_id": "run-2"}

    # Retrying begin_turn answers the same and closes nothing again.
    assert await store.begin_turn(CHAT, "run-2", ["m2"]) == began
    assert await last_seq(store) == new[-1].seq


async def test_begin_turn_closes_turn_that_has_only_a_user_row(store: SessionStore) -> None:
    await start_turn(store, "run-1", "m1")
    began = await store.begin_turn(CHAT, "run-2", ["m2"])
    assert began.closed_turn == 1
    history = await store.history(CHAT)
    assert history == [
        ChatMessage(role="user", content="text of m1"),
        ChatMessage(role="assistant", content=SUPERSEDED_TEXT),
    ]


async def test_begin_turn_closes_a_turn_whose_recovery_failed(store: SessionStore) -> None:
    """Nothing else ever closes a failed/recovery_failed turn: the next message does,
    as superseded, so the transcript the model sees stays balanced."""
    await start_turn(store, "run-1", "m1")
    call = ToolCall(id="call-a", name="write_file", arguments='{"path": "a"}')
    await store.record_assistant(CHAT, 1, 0, ModelReply(text=None, tool_calls=[call]), final=False)
    await store.update_turn(
        CHAT,
        1,
        TurnUpdate(
            status=TurnStatus.FAILED, reason=Reason.RECOVERY_FAILED, recovery_id="rec-f", can_continue=False
        ),
    )

    began = await store.begin_turn(CHAT, "run-2", ["m2"])
    assert began.turn == 2 and began.closed_turn == 1
    history = await store.history(CHAT)
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[2] == ChatMessage(
        role="tool", content=INTERRUPTED_TOOL_TEXT, tool_call_id="call-a", name="write_file"
    )
    assert history[3] == ChatMessage(role="assistant", content=SUPERSEDED_TEXT)
    closed = await store.get_turn(CHAT, 1)
    assert closed is not None
    assert (closed.status, closed.reason, closed.recovery_id) == (
        TurnStatus.RECOVERED,
        Reason.SUPERSEDED,
        "rec-f",
    )
    assert closed.can_continue is False


async def test_begin_turn_leaves_finished_turns_alone(store: SessionStore) -> None:
    await start_turn(store, "run-1", "m1")
    await store.record_assistant(CHAT, 1, 0, ModelReply(text="done"), final=True)
    began = await store.begin_turn(CHAT, "run-2", ["m2"])
    assert began.closed_turn is None
    assert SUPERSEDED_TEXT not in [m.content for m in await store.history(CHAT)]
    first = await store.get_turn(CHAT, 1)
    assert first is not None and first.status is TurnStatus.COMPLETED


# -- turn status ----------------------------------------------------------------------------


async def test_update_turn_announces_changes_only(store: SessionStore) -> None:
    await start_turn(store, "run-1", "m1")
    update = TurnUpdate(
        status=TurnStatus.AWAITING_USER,
        reason=Reason.MODEL_FAILED,
        recovery_id="rec-1",
        can_continue=False,
        attempts=1,
    )
    seq = await last_seq(store)
    await store.update_turn(CHAT, 1, update)
    await store.update_turn(CHAT, 1, update)  # retry: no-op
    assert await event_types(store, after_seq=seq) == ["recovery_state", "session_updated"]
    record = await store.get_turn(CHAT, 1)
    assert record is not None
    assert (record.status, record.reason, record.recovery_id, record.can_continue, record.attempts) == (
        TurnStatus.AWAITING_USER,
        Reason.MODEL_FAILED,
        "rec-1",
        False,
        1,
    )
    assert record.updated_at >= record.started_at and record.updated_at.tzinfo is not None

    await store.update_turn(CHAT, 1, update.model_copy(update={"attempts": 2}))
    assert await event_types(store, after_seq=seq) == ["recovery_state", "session_updated"] * 2


async def test_update_turn_of_missing_turn_raises(store: SessionStore) -> None:
    with pytest.raises(StoreError, match="no turn 7"):
        await store.update_turn(CHAT, 7, TurnUpdate(status=TurnStatus.FAILED))


async def test_finish_turn_writes_closing_row_and_turn_end_once(store: SessionStore) -> None:
    await start_turn(store, "run-1", "m1")
    update = TurnUpdate(status=TurnStatus.FAILED, reason=Reason.MODEL_FAILED, can_continue=False)
    seq = await last_seq(store)
    await store.finish_turn(CHAT, 1, update, closing_text="Sorry, the model failed.")
    await store.finish_turn(CHAT, 1, update, closing_text="Sorry, the model failed.")  # retried

    history = await store.history(CHAT)
    assert [m.content for m in history] == ["text of m1", "Sorry, the model failed."]
    new = await store.events(CHAT, after_seq=seq)
    assert [e.type for e in new] == ["recovery_state", "session_updated", "turn_end"]
    assert new[-1].payload == {"turn": 1, "status": "failed", "reason": "model_failed"}


async def test_finish_turn_only_from_leaves_a_newer_ending(store: SessionStore) -> None:
    """A Dismiss that read `failed` must not relabel a turn a new message closed meanwhile."""
    await start_turn(store, "run-1", "m1")
    await store.update_turn(CHAT, 1, TurnUpdate(status=TurnStatus.FAILED, reason=Reason.RECOVERY_FAILED))
    await store.begin_turn(CHAT, "run-2", ["m2"])  # supersedes the failed turn
    seq = await last_seq(store)
    dismiss = TurnUpdate(status=TurnStatus.RECOVERED, reason=Reason.DISMISSED)
    only_failed = frozenset({TurnStatus.FAILED})
    assert await store.finish_turn(CHAT, 1, dismiss, closing_text="dismissed", only_from=only_failed) is False
    record = await store.get_turn(CHAT, 1)
    assert record is not None and (record.status, record.reason) == (TurnStatus.RECOVERED, Reason.SUPERSEDED)
    assert await store.events(CHAT, after_seq=seq) == []
    assert "dismissed" not in [m.content for m in await store.history(CHAT)]
    # Without the condition, or with a status that matches, it closes as before.
    await store.update_turn(CHAT, 2, TurnUpdate(status=TurnStatus.FAILED))
    assert await store.finish_turn(CHAT, 2, dismiss, only_from=only_failed) is True
    assert (await store.get_turn(CHAT, 2)).reason == Reason.DISMISSED  # type: ignore[union-attr]


async def test_dismiss_racing_a_new_message_closes_the_turn_once(backend: Backend) -> None:
    """The CLI's Dismiss of a failed turn and the next message's `begin_turn`, from
    two stores at once (two processes): one of them closes the turn, never both."""
    worker, cli = backend.new_store(), backend.new_store()
    await worker.open()
    await cli.open()
    try:
        chats = [f"race-{i}" for i in range(12)]
        for chat in chats:
            await worker.begin_turn(chat, "run-1", ["m1"])
            await worker.update_turn(
                chat, 1, TurnUpdate(status=TurnStatus.FAILED, reason=Reason.RECOVERY_FAILED)
            )
        dismiss = TurnUpdate(status=TurnStatus.RECOVERED, reason=Reason.DISMISSED)
        outcomes = await asyncio.gather(
            *(
                asyncio.gather(
                    cli.finish_turn(
                        chat, 1, dismiss, closing_text="dismissed", only_from=frozenset({TurnStatus.FAILED})
                    ),
                    worker.begin_turn(chat, "run-2", ["m2"]),
                )
                for chat in chats
            )
        )
        for chat, (dismissed, begun) in zip(chats, outcomes, strict=False):
            assert begun.turn == 2
            record = await worker.get_turn(chat, 1)
            assert record is not None and record.status == TurnStatus.RECOVERED
            assert record.reason == (Reason.DISMISSED if dismissed else Reason.SUPERSEDED), chat
            assert (begun.closed_turn is None) == dismissed, chat
            endings = [
                e for e in await worker.events(chat) if e.type == "turn_end" and e.payload["turn"] == 1
            ]
            assert len(endings) == 1, chat
            closing = [m for m in await worker.turn_messages(chat, 1) if m.role == "assistant"]
            assert len(closing) == 1, chat
    finally:
        await worker.close()
        await cli.close()


async def test_finish_turn_refuses_an_open_status(store: SessionStore) -> None:
    await start_turn(store, "run-1", "m1")
    with pytest.raises(ValueError, match="terminal"):
        await store.finish_turn(CHAT, 1, TurnUpdate(status=TurnStatus.RUNNING))


async def test_open_turns_and_list_chats(store: SessionStore) -> None:
    await store.begin_turn("a", "run-a1", ["m"])
    await store.record_assistant("a", 1, 0, ModelReply(text="ok"), final=True)
    await store.begin_turn("b", "run-b1", ["m"])
    await store.begin_turn("a", "run-a2", ["n"])  # a's latest turn is open again
    await store.begin_turn("c", "run-c1", ["m"])
    await store.finish_turn("c", 1, TurnUpdate(status=TurnStatus.FAILED, reason=Reason.STOPPED))

    assert sorted((t.chat_id, t.turn) for t in await store.open_turns()) == [("a", 2), ("b", 1)]
    assert len(await store.open_turns(limit=1)) == 1

    chats = await store.list_chats()
    assert [(t.chat_id, t.turn) for t in chats] == [("c", 1), ("a", 2), ("b", 1)]  # newest update first
    assert [t.chat_id for t in await store.list_chats(status=TurnStatus.RUNNING)] == ["a", "b"]
    # Only the latest turn counts: a's completed turn 1 does not list it as completed.
    assert await store.list_chats(status=TurnStatus.COMPLETED) == []
    assert len(await store.list_chats(limit=2)) == 2


async def test_unknown_turn_status_raises_corrupt_row(store: SessionStore, backend: Backend) -> None:
    await start_turn(store, "run-1", "m1")
    await backend.execute("UPDATE turns SET status = 'exploded' WHERE chat_id = ?", CHAT)
    with pytest.raises(CorruptRowError, match=CHAT):
        await store.get_turn(CHAT)
    with pytest.raises(CorruptRowError):
        await store.list_chats()
    assert await store.open_turns() == []  # filtered by status in SQL: the bad row is not open


async def test_closing_a_turn_works_with_an_unreadable_assistant_row(
    store: SessionStore, backend: Backend
) -> None:
    """Dismiss is always possible, whatever the store holds: an assistant row that does
    not decode is left as it is (its calls cannot be known) and the rest is answered."""
    await start_turn(store, "run-1", "m1")
    calls = [ToolCall(id="call-a", name="read_file", arguments='{"path": "a"}')]
    await store.record_assistant(CHAT, 1, 0, ModelReply(tool_calls=calls), final=False)
    await store.record_assistant(
        CHAT,
        1,
        1,
        ModelReply(tool_calls=[ToolCall(id="call-b", name="read_file", arguments='{"path": "b"}')]),
        final=False,
    )
    await backend.execute(
        "UPDATE messages SET body = '{broken' WHERE chat_id = ? AND step = 0 AND role = 'assistant'", CHAT
    )
    assert await store.close_unanswered_calls(CHAT, 1) == ["call-b"]
    assert await store.finish_turn(
        CHAT, 1, TurnUpdate(status=TurnStatus.RECOVERED, reason=Reason.DISMISSED), closing_text="dismissed"
    )
    record = await store.get_turn(CHAT, 1)
    assert record is not None and record.reason == Reason.DISMISSED
    with pytest.raises(CorruptRowError, match=r"message row id=\d+ does not decode"):
        await store.history(CHAT)  # reading the transcript stays strict


# -- transcript --------------------------------------------------------------------------------


async def test_commit_user_messages_is_idempotent(store: SessionStore) -> None:
    began = await store.begin_turn(CHAT, "run-1", ["m1", "m2"])
    assert began.turn == 1
    messages = [UserMessage(message_id="m1", text="one", sender="ann"), user("m2", "two")]
    seq = await last_seq(store)
    assert await store.commit_user_messages(CHAT, 1, messages) == ["m1", "m2"]
    assert await store.commit_user_messages(CHAT, 1, messages) == []
    assert await store.commit_user_messages(CHAT, 1, [user("m2"), user("m3", "three")]) == ["m3"]

    assert [m.content for m in await store.history(CHAT)] == ["one", "two", "three"]
    new = await store.events(CHAT, after_seq=seq)
    assert [e.type for e in new] == ["user_message"] * 3
    assert new[0].payload == {"turn": 1, "message_id": "m1", "text": "one", "sender": "ann"}


async def test_record_assistant_replaces_in_place_and_skips_same_content_retry(store: SessionStore) -> None:
    await start_turn(store, "run-1", "m1")
    lost = ModelReply(text="let me look", tool_calls=[ToolCall(id="c1", name="list_dir")])
    await store.record_assistant(CHAT, 1, 0, lost, final=False)
    await store.record_tool_result(CHAT, 1, "c1", "list_dir", "a.txt", "done")
    await store.record_assistant(CHAT, 1, 1, ModelReply(text="draft"), final=False)

    seq = await last_seq(store)
    rerun = ModelReply(
        text="looking again", tool_calls=[ToolCall(id="c1", name="list_dir", arguments='{"p": 1}')]
    )
    await store.record_assistant(CHAT, 1, 0, rerun, final=False)
    history = await store.history(CHAT)
    assert [m.content for m in history] == ["text of m1", "looking again", "a.txt", "draft"]
    assert history[1].tool_calls == rerun.tool_calls

    new = await store.events(CHAT, after_seq=seq)
    assert [e.type for e in new] == ["assistant_message"]
    assert new[0].payload == {
        "turn": 1,
        "step": 0,
        "text": "looking again",
        "tool_calls": [{"id": "c1", "name": "list_dir", "arguments": '{"p": 1}'}],
    }

    await store.record_assistant(CHAT, 1, 0, rerun, final=False)  # pure retry
    assert await last_seq(store) == new[-1].seq
    assert await store.history(CHAT) == history


async def test_record_assistant_final_closes_turn_once(store: SessionStore) -> None:
    await start_turn(store, "run-1", "m1")
    seq = await last_seq(store)
    await store.record_assistant(CHAT, 1, 0, ModelReply(text="answer"), final=True)
    closed = await store.get_turn(CHAT, 1)
    await store.record_assistant(CHAT, 1, 0, ModelReply(text="answer"), final=True)
    assert await store.get_turn(CHAT, 1) == closed  # the retry touched nothing, not even updated_at

    new = await store.events(CHAT, after_seq=seq)
    assert [e.type for e in new] == ["assistant_message", "turn_end"]
    assert new[1].payload == {"turn": 1, "status": "completed"}
    assert new[0].payload["tool_calls"] == []
    record = await store.get_turn(CHAT, 1)
    assert record is not None and (record.status, record.reason) == (TurnStatus.COMPLETED, None)
    assert (await store.history(CHAT))[-1] == ChatMessage(role="assistant", content="answer")


async def test_tool_started_reports_a_repeat(store: SessionStore) -> None:
    await start_turn(store, "run-1", "m1")
    call = ToolCall(id="c1", name="write_file", arguments="{}")
    seq = await last_seq(store)
    assert await store.tool_started(CHAT, 1, call, "key-1") is True
    assert await store.tool_started(CHAT, 1, call, "key-1") is False
    new = await store.events(CHAT, after_seq=seq)
    assert [e.type for e in new] == ["tool_started"]
    assert new[0].payload == {
        "turn": 1,
        "tool_call_id": "c1",
        "name": "write_file",
        "idempotency_key": "key-1",
    }


async def test_tool_started_is_synced_to_disk(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one write a tool waits for before it acts is synced, whatever the
    database's default; the others are not."""
    store: SessionStore
    if isinstance(backend, SQLiteBackend):
        store = backend.new_store()
        level_sql, synced, not_synced = "PRAGMA synchronous", "2", "1"  # FULL, NORMAL
    else:
        assert isinstance(backend, PostgresBackend)
        # A server that by default commits before its disk has the commit.
        url = f"{backend.url}{'&' if '?' in backend.url else '?'}synchronous_commit=off"
        store = PostgresStore(url, schema=backend.schema)
        level_sql, synced, not_synced = "SHOW synchronous_commit", "on", "off"
    await store.open()
    try:
        await start_turn(store, "run-1", "m1")
        seen: list[str] = []
        for name in ("_tool_started_tx", "_tool_result_tx"):

            async def spy(chat: Any, *args: Any, inner: Any = getattr(store, name)) -> Any:
                seen.append(str(await chat.tx.fetchval(level_sql)))
                return await inner(chat, *args)

            monkeypatch.setattr(store, name, spy)
        await store.tool_started(CHAT, 1, ToolCall(id="c1", name="write_file", arguments="{}"), "key-1")
        await store.record_tool_result(CHAT, 1, "c1", "write_file", "ok", "done")
        assert seen == [synced, not_synced]
    finally:
        await store.close()


async def test_record_tool_result_writes_once(store: SessionStore) -> None:
    await start_turn(store, "run-1", "m1")
    seq = await last_seq(store)
    assert await store.record_tool_result(CHAT, 1, "c1", "read_file", "data", "done") is True
    assert await store.record_tool_result(CHAT, 1, "c1", "read_file", "other", "error") is False
    assert (
        await store.record_tool_result(CHAT, 1, "c2", "write_file", INTERRUPTED_TOOL_TEXT, "interrupted")
        is True
    )

    tools = [m for m in await store.history(CHAT) if m.role == "tool"]
    assert tools == [
        ChatMessage(role="tool", content="data", tool_call_id="c1", name="read_file"),
        ChatMessage(role="tool", content=INTERRUPTED_TOOL_TEXT, tool_call_id="c2", name="write_file"),
    ]
    new = await store.events(CHAT, after_seq=seq)
    assert [(e.type, e.payload) for e in new] == [
        ("tool_finished", {"turn": 1, "tool_call_id": "c1", "name": "read_file", "status": "done"}),
        ("tool_interrupted", {"turn": 1, "tool_call_id": "c2", "name": "write_file"}),
    ]
    with pytest.raises(ValueError, match="status"):
        await store.record_tool_result(CHAT, 1, "c3", "read_file", "x", "finished")


@pytest.mark.parametrize("garbage", ["{not json", '{"role": "robot", "content": "x"}'])
async def test_history_names_the_corrupt_row(store: SessionStore, backend: Backend, garbage: str) -> None:
    await start_turn(store, "run-1", "m1", "m2")
    row_id = await backend.fetchval("SELECT id FROM messages WHERE chat_id = ? AND message_id = 'm2'", CHAT)
    await backend.execute("UPDATE messages SET body = ? WHERE id = ?", garbage, row_id)
    with pytest.raises(CorruptRowError) as info:
        await store.history(CHAT)
    assert CHAT in str(info.value)
    assert f"id={row_id}" in str(info.value)


async def test_transcript_rows_are_the_history_with_each_rows_keys(
    store: SessionStore, backend: Backend
) -> None:
    await start_turn(store, "run-1", "m1")
    await store.record_assistant(
        CHAT, 1, 0, ModelReply(tool_calls=[ToolCall(id="c1", name="t")]), final=False
    )
    await store.record_tool_result(CHAT, 1, "c1", "t", "ok", "done")
    await start_turn(store, "run-2", "m2")  # closes turn 1 with a row of no step
    rows = await store.transcript_rows(CHAT)
    assert [(r.turn, r.message.role, r.message_id, r.step, r.message.tool_call_id) for r in rows] == [
        (1, "user", "m1", None, None),
        (1, "assistant", None, 0, None),
        (1, "tool", None, None, "c1"),
        (1, "assistant", None, None, None),
        (2, "user", "m2", None, None),
    ]
    assert rows[3].message.content == SUPERSEDED_TEXT
    assert [r.message for r in rows] == await store.history(CHAT)
    assert [r.id for r in rows] == sorted(r.id for r in rows)
    assert await store.transcript_rows("other") == []
    await backend.execute("UPDATE messages SET body = 'not json' WHERE id = ?", rows[2].id)
    with pytest.raises(CorruptRowError, match=f"message row id={rows[2].id} does not decode"):
        await store.transcript_rows(CHAT)


# -- events and sharing ---------------------------------------------------------------------------


async def test_events_paging(store: SessionStore) -> None:
    await store.append_events(CHAT, [NewEvent(type="session_updated", payload={"n": n}) for n in range(1, 6)])
    await store.append_events("other", [NewEvent(type="session_updated")])

    page = await store.events(CHAT, after_seq=2, limit=2)
    assert [(e.seq, e.payload["n"]) for e in page] == [(3, 3), (4, 4)]
    assert all(e.chat_id == CHAT and e.created_at.tzinfo is not None for e in page)
    assert [e.seq for e in await store.events(CHAT, after_seq=page[-1].seq)] == [5]
    assert await store.events(CHAT, after_seq=5) == []
    assert [e.seq for e in await store.events("other")] == [1]  # seq is per chat


async def test_follow_from_a_new_message_a_retry_and_a_new_chat(
    store: SessionStore, backend: Backend
) -> None:
    assert await store.follow_from(CHAT, "m1") == 0  # no chat yet
    await start_turn(store, "run-1", "m1")
    await store.append_events(CHAT, [NewEvent(type="session_updated")])
    await start_turn(store, "run-2", "m2")
    seq_of_m2 = next(
        e.seq
        for e in await store.events(CHAT)
        if e.type == "user_message" and e.payload["message_id"] == "m2"
    )
    latest = await last_seq(store)
    assert await store.follow_from(CHAT) == latest
    assert await store.follow_from(CHAT, "m3") == latest  # not held: what comes next
    assert await store.follow_from(CHAT, "m2") == seq_of_m2 - 1  # held: the turn that took it
    assert await store.follow_from("other", "m2") == 0  # message ids are per chat
    # An unreadable event payload is passed over, not raised: the CLI must still follow.
    await backend.execute("UPDATE events SET payload = '{not json' WHERE chat_id = ? AND seq = 1", CHAT)
    assert await store.follow_from(CHAT, "m2") == seq_of_m2 - 1


async def test_two_stores_on_one_database_see_each_others_writes(backend: Backend) -> None:
    worker, cli = backend.new_store(), backend.new_store()
    await worker.open()
    await cli.open()
    try:
        began = await worker.begin_turn(CHAT, "run-1", ["m1"])
        await worker.commit_user_messages(CHAT, 1, [user("m1")])
        assert began.turn == 1
        assert await cli.history(CHAT) == [ChatMessage(role="user", content="text of m1")]

        await cli.append_events(CHAT, [NewEvent(type="session_updated", payload={"from": "cli"})])
        events = await worker.events(CHAT)
        assert [e.seq for e in events] == [1, 2, 3]  # seq keeps counting across connections
        assert events[-1].payload == {"from": "cli"}

        # Concurrent writers from both: no lost or duplicated seq.
        await asyncio.gather(
            *(s.append_events(CHAT, [NewEvent(type="session_updated")]) for s in (worker, cli) * 5)
        )
        assert [e.seq for e in await cli.events(CHAT)] == list(range(1, 14))
    finally:
        await worker.close()
        await cli.close()


async def test_adopt_turn_records_the_run_and_returns_the_next_step(store: SessionStore) -> None:
    await store.begin_turn("c", "run-1", ["m1"])
    await store.commit_user_messages("c", 1, [UserMessage(message_id="m1", text="hi")])
    assert await store.adopt_turn("c", 1, "run-2") == 0
    await store.record_assistant("c", 1, 0, ModelReply(tool_calls=[ToolCall(id="t1", name="x")]), final=False)
    await store.record_assistant("c", 1, 1, ModelReply(tool_calls=[ToolCall(id="t2", name="x")]), final=False)
    assert await store.adopt_turn("c", 1, "run-3") == 2
    record = await store.get_turn("c", 1)
    assert record is not None and record.run_id == "run-3"
    rows = await store.turn_messages("c", 1)
    assert [m.role for m in rows] == ["user", "assistant", "assistant"]
    with pytest.raises(StoreError, match="no turn 5"):
        await store.adopt_turn("c", 5, "run-4")


async def test_open_turn_refs_list_open_turns_without_decoding_them(
    store: SessionStore, backend: Backend
) -> None:
    await store.begin_turn("a", "run-a1", ["m"])
    await store.record_assistant("a", 1, 0, ModelReply(text="ok"), final=True)
    await store.begin_turn("b", "run-b1", ["m"])
    await store.begin_turn("c", "run-c1", ["m"])
    # An open row that no longer decodes.
    await backend.execute("UPDATE turns SET reason = 'from_the_future' WHERE chat_id = 'c'")
    with pytest.raises(CorruptRowError):
        await store.open_turns()
    refs = await store.open_turn_refs()
    assert [(r.chat_id, r.turn, r.run_id) for r in refs] == [("b", 1, "run-b1"), ("c", 1, "run-c1")]
    assert len(await store.open_turn_refs(limit=1)) == 1


async def test_held_message_ids_in_the_order_offered(store: SessionStore) -> None:
    await start_turn(store, "run-1", "m1")
    await store.commit_user_messages(CHAT, 1, [user("m1"), user("m2")])
    assert await store.held_message_ids(CHAT, ["m3", "m2", "m1", "m2"]) == ["m2", "m1"]
    assert await store.held_message_ids("other", ["m1"]) == []
    assert await store.held_message_ids(CHAT, []) == []


# -- PostgreSQL only: several workers on several machines ----------------------------------------


@pytest.mark.postgres
async def test_pg_concurrent_writers_keep_seq_gap_free_and_rows_once(pg: PostgresBackend) -> None:
    a, b = pg.new_store(max_size=5), pg.new_store(max_size=5)
    await asyncio.gather(a.open(), b.open())
    try:
        began = await a.begin_turn(CHAT, "run-1", ["m0"])
        assert began.turn == 1
        ids = [f"m{i}" for i in range(10)]
        appends = [
            (a, b)[i % 2].append_events(
                CHAT, [NewEvent(type="session_updated", payload={"call": i, "n": n}) for n in range(3)]
            )
            for i in range(20)
        ]
        # Every message offered twice, by different stores: committed once.
        commits = [(a, b)[i % 2].commit_user_messages(CHAT, 1, [user(ids[i % 10])]) for i in range(20)]
        results = await asyncio.gather(*appends, *commits)
        committed = [m for r in results[20:] for m in r]
        assert sorted(committed) == sorted(ids)

        events = await b.events(CHAT)
        seqs = [e.seq for e in events]
        assert seqs == list(range(1, len(events) + 1))  # unique, ordered, gap-free
        assert len(events) == 1 + 20 * 3 + 10  # turn_started, the appends, one user_message per id
        created = [e.created_at for e in events]
        assert created == sorted(created)  # the database clock, read under the chat lock
        # Each call's events are consecutive: one transaction, the chat locked throughout.
        by_call: dict[int, list[int]] = {}
        for e in events:
            if e.type == "session_updated":
                by_call.setdefault(e.payload["call"], []).append(e.seq)
        assert all(s == list(range(s[0], s[0] + 3)) for s in by_call.values())
        assert len(by_call) == 20

        history = await a.history(CHAT)
        assert sorted(m.content for m in history) == sorted(f"text of {m}" for m in ids)
        order = [e.payload["message_id"] for e in events if e.type == "user_message"]
        assert [m.content for m in history] == [f"text of {m}" for m in order]  # rows in event order
    finally:
        await asyncio.gather(a.close(), b.close())


@pytest.mark.postgres
async def test_pg_racing_begin_turn_numbers_turns_1_and_2(pg: PostgresBackend) -> None:
    a, b = pg.new_store(), pg.new_store()
    await asyncio.gather(a.open(), b.open())
    try:
        chats = [f"race-{i}" for i in range(10)]
        results = await asyncio.gather(
            *(
                call
                for c in chats
                for call in (a.begin_turn(c, "run-a", ["ma"]), b.begin_turn(c, "run-b", ["mb"]))
            )
        )
        for i, chat in enumerate(chats):
            first, second = sorted(results[2 * i : 2 * i + 2], key=lambda r: r.turn or 0)
            assert (first.turn, second.turn) == (1, 2)  # never both 1
            assert (first.closed_turn, second.closed_turn) == (None, 1)  # the later closed the earlier
            closed, running = await a.get_turn(chat, 1), await a.get_turn(chat, 2)
            assert closed is not None and running is not None
            assert (closed.status, closed.reason) == (TurnStatus.RECOVERED, Reason.SUPERSEDED)
            assert running.status is TurnStatus.RUNNING
            assert (await event_types(a, chat)).count("turn_started") == 2

        # The same run from two workers at once (a retried activity): one turn.
        same = await asyncio.gather(*(s.begin_turn(CHAT, "run-x", ["m1"]) for s in (a, b, a, b)))
        assert all(r == same[0] for r in same) and same[0].turn == 1
        assert await event_types(b) == ["turn_started"]
    finally:
        await asyncio.gather(a.close(), b.close())


@pytest.mark.postgres
async def test_pg_several_stores_create_the_schema_at_once(pg: PostgresBackend) -> None:
    stores = [pg.new_store(min_size=1, max_size=2) for _ in range(5)]
    try:
        await asyncio.gather(*(s.open() for s in stores))
        assert await pg.fetchval("SELECT count(*) FROM meta") == 1
        assert await pg.fetchval("SELECT value FROM meta WHERE key = 'schema_version'") == str(SCHEMA_VERSION)
        await asyncio.gather(*(s.append_events(CHAT, [NewEvent(type="session_updated")]) for s in stores))
        assert [e.seq for e in await stores[0].events(CHAT)] == [1, 2, 3, 4, 5]
        tables = await pg.fetchval(
            "SELECT array_agg(table_name::text ORDER BY table_name) FROM information_schema.tables"
            " WHERE table_schema = ?",
            pg.schema,
        )
        assert tables == [
            "drafts",
            "event_keys",
            "events",
            "messages",
            "meta",
            "summaries",
            "tool_runs",
            "turns",
        ]
    finally:
        await asyncio.gather(*(s.close() for s in stores))


@pytest.mark.postgres
async def test_pg_a_held_chat_lock_times_out_as_a_store_error_and_holds_up_no_other_chat(
    pg: PostgresBackend,
) -> None:
    store = pg.new_store(lock_timeout=0.3)
    await store.open()
    try:
        async with pg.hold_write_lock(CHAT):
            await store.append_events("another-chat", [NewEvent(type="session_updated")])  # not held up
            started = time.monotonic()
            with pytest.raises(StoreError, match="lock"):
                await store.append_events(CHAT, [NewEvent(type="session_updated")])
            assert time.monotonic() - started < 5
        await store.append_events(CHAT, [NewEvent(type="session_updated")])  # the pool recovered
        assert [e.seq for e in await store.events(CHAT)] == [1]
    finally:
        await store.close()


@pytest.mark.postgres
async def test_pg_a_call_that_stops_moving_fails_as_unavailable_in_time_and_frees_its_connection(
    pg: PostgresBackend,
) -> None:
    # One connection in the pool: a call that kept it would hold up every later one.
    store = pg.new_store(min_size=1, max_size=1, lock_timeout=30, call_timeout=0.5)
    await store.open()
    try:
        async with pg.hold_write_lock(CHAT):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match=r"no answer within 0\.5 s"):
                await store.append_events(CHAT, [NewEvent(type="session_updated")])
            assert time.monotonic() - started < 3
            await store.append_events("another-chat", [NewEvent(type="session_updated")])  # a new connection
        await store.append_events(CHAT, [NewEvent(type="session_updated")])
        assert [e.seq for e in await store.events(CHAT)] == [1]  # the cut-off write left nothing
    finally:
        await store.close()


@pytest.mark.postgres
async def test_pg_sessions_cut_off_mid_call_fail_only_as_unavailable_and_the_store_goes_on(
    pg: PostgresBackend,
) -> None:
    """As when a server restarts or a proxy drops connections: every call either works
    or fails as StoreUnavailable (the driver's own errors included), none hangs,
    and the store works once the cutting stops. Calls are also cancelled half way,
    as a Stop cancels a model call in the middle of its store write."""
    app = f"tk_cut_{uuid.uuid4().hex[:8]}"
    store = PostgresStore(
        f"{PG_URL}{'&' if '?' in PG_URL else '?'}application_name={app}",
        schema=pg.schema,
        max_size=4,
        call_timeout=5,
    )
    await store.open()
    admin = await pg.connect()
    outcomes: dict[str, int] = {}
    stop = asyncio.Event()

    async def cut_off() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.05)
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", app
            )

    async def chat(i: int) -> None:
        chat_id = f"cut-{i}"
        n = 0
        while not stop.is_set():
            n += 1
            call = asyncio.ensure_future(store.append_events(chat_id, [NewEvent(type="session_updated")]))
            if n % 3 == 0:
                await asyncio.sleep(0.001 * (n % 5))
                call.cancel()
            try:
                await call
                outcomes["ok"] = outcomes.get("ok", 0) + 1
            except asyncio.CancelledError:
                outcomes["cancelled"] = outcomes.get("cancelled", 0) + 1
            except StoreUnavailable:
                outcomes["unavailable"] = outcomes.get("unavailable", 0) + 1
            try:
                await store.events(chat_id)
            except StoreUnavailable:
                outcomes["unavailable"] = outcomes.get("unavailable", 0) + 1

    try:
        cutter = asyncio.create_task(cut_off())
        chats = [asyncio.create_task(chat(i)) for i in range(6)]
        await asyncio.sleep(3)
        stop.set()
        # Every call ends within its bound: nothing waits on a connection that is gone.
        done, pending = await asyncio.wait([cutter, *chats], timeout=15)
        assert not pending
        for task in done:
            task.result()  # a StoreError other than StoreUnavailable, or a driver error, fails here
        assert outcomes.get("unavailable", 0) > 0 and outcomes.get("ok", 0) > 0, outcomes
        await store.append_events("after", [NewEvent(type="session_updated")])
        assert [e.seq for e in await store.events("after")] == [1]
    finally:
        stop.set()
        await admin.close()
        await store.close()


async def test_pg_a_server_that_never_answers_is_unavailable_within_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server unreachable without refusing (a failover, a dropped route): opening
    the store and listening for its changes fail in seconds, not asyncpg's 60."""
    import socket

    from turnkeeper.store import postgres

    monkeypatch.setattr(postgres, "CONNECT_TIMEOUT_S", 0.5)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts, and never says a word
    try:
        store = PostgresStore(f"postgresql://nobody@127.0.0.1:{silent.getsockname()[1]}/db")
        for attempt in (store.open, lambda: store.listen(lambda kind, chat_id: None)):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match=r"no answer within 0\.5 s"):
                await attempt()
            assert time.monotonic() - started < 5
    finally:
        silent.close()


@pytest.mark.postgres
async def test_pg_errors_name_the_server_but_never_the_password(pg: PostgresBackend) -> None:
    parts = PG_URL.split("://", 1)[1].rsplit("/", 1)[0]  # user@host:port
    host = parts.rsplit("@", 1)[-1]
    url = f"postgresql://turnkeeper_nobody:s3cret-pw@{host}/no_such_db_{uuid.uuid4().hex[:8]}"
    store = PostgresStore(url)
    with pytest.raises(StoreError) as info:
        await store.open()
    assert "s3cret" not in str(info.value) and "s3cret" not in repr(store)
    assert host in str(info.value) and "turnkeeper_nobody" not in repr(store)


# -- open_store and construction (no server needed) ---------------------------------------------------


def test_open_store_defaults_to_sqlite_in_data_dir(tmp_path: Path) -> None:
    store = open_store(Settings(data_dir=tmp_path))
    assert isinstance(store, SQLiteStore) and store.path == tmp_path / "sessions.db"


def test_open_store_sqlite_url(tmp_path: Path) -> None:
    store = open_store(Settings(database_url=f"sqlite:///{tmp_path}/x.db"))
    assert isinstance(store, SQLiteStore) and store.path == tmp_path / "x.db"
    relative = open_store(Settings(database_url="sqlite:///rel/x.db"))
    assert isinstance(relative, SQLiteStore) and relative.path == Path("rel/x.db")


@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "postgresql+asyncpg"])
def test_open_store_postgres_urls_without_showing_the_password(scheme: str) -> None:
    store = open_store(
        Settings(database_url=f"{scheme}://user:s3cret@db.example:6543/turnkeeper?sslmode=require")
    )
    assert isinstance(store, PostgresStore)
    assert store.display_url == "postgresql://db.example:6543/turnkeeper"
    assert "s3cret" not in repr(store) and "user" not in repr(store)


async def test_unreachable_postgres_is_a_store_error_without_the_password() -> None:
    store = PostgresStore("postgresql://user:s3cret@127.0.0.1:1/turnkeeper")  # nothing listens on port 1
    with pytest.raises(StoreError, match="127.0.0.1:1/turnkeeper") as info:
        await store.open()
    assert "s3cret" not in str(info.value)
    with pytest.raises(StoreError, match="not open"):
        await store.history(CHAT)


def test_postgres_store_refuses_a_schema_that_is_no_plain_identifier() -> None:
    with pytest.raises(ValueError, match="schema"):
        PostgresStore(PG_URL, schema='x"; DROP TABLE turns; --')


@pytest.mark.parametrize("url", ["mysql://db/x", "sessions.db", "sqlite:///"])
def test_open_store_rejects_other_urls(url: str) -> None:
    with pytest.raises(StoreError):
        open_store(Settings(database_url=url))


async def test_events_with_keys_are_appended_once(store: SessionStore) -> None:
    """A workflow task retried after a failure appends its events again, keyed."""
    first = [
        NewEvent(type="session_updated", payload={"n": 1}),
        NewEvent(type="session_updated", payload={"n": 2}),
    ]
    await store.append_events(CHAT, first, keys=["run/0", "run/1"])
    again = first + [NewEvent(type="session_updated", payload={"n": 3})]
    await store.append_events(CHAT, again, keys=["run/0", "run/1", "run/2"])
    assert [e.payload["n"] for e in await store.events(CHAT)] == [1, 2, 3]


# -- drafts: the answer as it streams ----------------------------------------------------


async def test_a_draft_grows_and_is_emptied_when_recorded_and_when_its_turn_ends(store: SessionStore) -> None:
    turn = await start_turn(store, "run-1", "m1")
    before = await store.draft_version()
    attempt = await store.write_draft(CHAT, turn, 0, "Hel")
    assert attempt == 1
    assert await store.write_draft(CHAT, turn, 0, "Hello wor", attempt) == 1
    draft = await store.draft(CHAT)
    assert draft is not None and (draft.turn, draft.step, draft.attempt, draft.text) == (
        turn,
        0,
        1,
        "Hello wor",
    )
    since = await store.drafts_since(before)
    assert [d.text for d in since] == ["Hello wor"] and since[0].version == await store.draft_version()
    assert await store.drafts_since(since[0].version) == []

    # The call is lost and run again: a new attempt, which starts from nothing.
    assert await store.write_draft(CHAT, turn, 0, "Hi") == 2
    await store.record_assistant(CHAT, turn, 0, ModelReply(text="Hi there"), final=False)
    assert await store.draft(CHAT) is None  # the reply is the truth now
    # Run again once more after it was recorded: the attempts count on.
    assert await store.write_draft(CHAT, turn, 0, "Hi") == 3
    assert await store.write_draft(CHAT, turn, 1, "Next step") == 1
    assert "assistant_delta" not in await event_types(store)  # never in the event log
    assert [m.content for m in await store.history(CHAT)][-1] == "Hi there"  # nor in the transcript

    version = await store.draft_version()
    await store.finish_turn(CHAT, turn, TurnUpdate(status=TurnStatus.COMPLETED))
    assert await store.draft(CHAT) is None
    assert [(d.recorded, d.text) for d in await store.drafts_since(0) if d.chat_id == CHAT] == [(True, "")]
    # Versions only grow, across turns: a reader that saw `version` misses nothing newer.
    turn2 = await start_turn(store, "run-2", "m2")
    assert await store.write_draft(CHAT, turn2, 0, "Turn two") == 1
    assert [d.text for d in await store.drafts_since(version)] == ["Turn two"]


async def test_drafts_of_many_chats_come_in_write_order(store: SessionStore) -> None:
    chats = [f"{CHAT}-{i}" for i in range(3)]
    for chat in chats:
        began = await store.begin_turn(chat, f"run-{chat}", ["m1"])
        assert began.turn is not None
    start = await store.draft_version()
    for text in ("a", "ab"):
        for chat in reversed(chats):
            await store.write_draft(chat, 1, 0, text, 1)
    rows = await store.drafts_since(start)
    assert [(d.chat_id, d.text) for d in rows] == [(c, "ab") for c in reversed(chats)]
    assert [d.version for d in rows] == sorted(d.version for d in rows)


async def test_any_text_a_client_may_send_is_stored_and_read_back(store: SessionStore) -> None:
    """Clients refuse ids with NUL and lone surrogates (turnkeeper.client.check_message_id);
    whatever else a message says, control characters included, both stores keep."""
    text = 'nul \x00, bell \x07, é ✓ 😀, quote " and backslash \\'
    turn = await start_turn(store, "run-1", "m\x07é✓")
    prepared = await store.prepare_model_call(CHAT, turn, [user("m2", text)])
    assert prepared.committed == ["m2"]
    assert [m.content for m in await store.history(CHAT)][-1] == text
