"""The context builder (activities/context.py): what a model call is sent stays
within the token budget, a tool call and its result are never split, the latest
turns go whole, and a summary is made once and reused. On a real SQLite store,
with a provider that records the summaries it is asked for."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.activities.context import (
    SUMMARY_HEADING,
    ContextBuilder,
    cuts,
    fold_chunks,
    fold_point,
    row_tokens,
    tools_tokens,
)
from turnkeeper.activities.providers import ModelProvider
from turnkeeper.activities.providers.base import SummaryRequest, TextSink
from turnkeeper.models import ChatMessage, ModelReply, ToolCall, ToolSpec, UserMessage
from turnkeeper.store import SQLiteStore, StoredRow

CHAT = "long"


class Summariser(ModelProvider):
    """Answers nothing; summarises by counting, and remembers what it was asked."""

    name = "summariser"

    def __init__(self) -> None:
        self.requests: list[SummaryRequest] = []

    async def complete(
        self,
        history: list[ChatMessage],
        tools: list[ToolSpec],
        *,
        call_index: int,
        on_text: TextSink | None = None,
    ) -> ModelReply:
        raise AssertionError("the builder never asks for an answer")

    async def summarise(self, request: SummaryRequest) -> str:
        self.requests.append(request)
        return f"summary {len(self.requests)} of {len(request.rows)} rows"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "s.db")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def add_turn(
    store: SQLiteStore, n: int, text_bytes: int = 200, tool_results: int = 0, answer: bool = True
) -> None:
    """Turn n: a user message, optionally an assistant row with calls and their results, an answer."""
    began = await store.begin_turn(CHAT, f"run-{n}", [f"m{n}"])
    turn = began.turn
    assert turn is not None
    await store.commit_user_messages(
        CHAT, turn, [UserMessage(message_id=f"m{n}", text=f"{n} " + "u" * text_bytes)]
    )
    step = 0
    if tool_results:
        calls = [
            ToolCall(id=f"t{n}-{i}", name="read_file", arguments='{"path": "x"}') for i in range(tool_results)
        ]
        await store.record_assistant(CHAT, turn, step, ModelReply(tool_calls=calls), final=False)
        for c in calls:
            await store.record_tool_result(CHAT, turn, c.id, c.name, "r" * 300, "done")
        step += 1
    if answer:
        await store.record_assistant(CHAT, turn, step, ModelReply(text=f"answer {n}"), final=True)


def _pairs_whole(messages: list[ChatMessage]) -> None:
    asked = {c.id for m in messages for c in m.tool_calls or []}
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    assert answered <= asked  # no result without its call
    assert asked <= answered  # no call without its result (every call here was answered)


async def test_a_long_chat_stays_within_the_budget_and_its_latest_turn_goes_whole(store: SQLiteStore) -> None:
    provider = Summariser()
    builder = ContextBuilder(store, provider, 1000)
    for n in range(1, 31):
        await add_turn(store, n, tool_results=n % 3 == 0 and 2 or 0)
        context = await builder.build(CHAT, [])
        assert context.tokens <= 1000
        sent_tokens = sum(row_tokens(m) for m in context.messages)
        assert sent_tokens <= context.tokens + 8  # the count is what is sent
        _pairs_whole(context.messages)
        # The latest turn is whole, and last.
        assert context.messages[-1].content == f"answer {n}"
        assert any(m.role == "user" and (m.content or "").startswith(f"{n} ") for m in context.messages)
        if context.summary is not None:
            assert context.messages[0].role == "system"
            assert context.messages[0].content == SUMMARY_HEADING + context.summary.text
        # Model calls go on numbering across the fold: assistant rows of the whole chat.
        history = await store.history(CHAT)
        assert context.call_index == sum(m.role == "assistant" for m in history)
    assert provider.requests, "30 turns of ~70 tokens never folded into 1,000"
    # The transcript is never shortened.
    assert len([m for m in await store.history(CHAT) if m.role == "user"]) == 30


async def test_a_summary_is_made_once_and_reused(store: SQLiteStore) -> None:
    provider = Summariser()
    builder = ContextBuilder(store, provider, 800)
    n = 0
    while not provider.requests:
        n += 1
        await add_turn(store, n)
        first = await builder.build(CHAT, [])
    assert first.summaries_made == len(provider.requests) >= 1
    again = await builder.build(CHAT, [])  # the next model call, the same rows
    assert again.summaries_made == 0 and again.summary == first.summary
    # A builder of another worker (nothing in memory) reads it from the store.
    other = await ContextBuilder(store, Summariser(), 800).build(CHAT, [])
    assert other.summary == first.summary and other.summaries_made == 0
    # The next fold goes on from it: the earlier summary is part of what it folds.
    asked = len(provider.requests)
    while len(provider.requests) == asked:
        n += 1
        await add_turn(store, n)
        await builder.build(CHAT, [])
    assert provider.requests[-1].earlier == first.summary.text  # type: ignore[union-attr]


async def test_a_step_loads_the_summary_and_the_rows_after_it_only(store: SQLiteStore) -> None:
    builder = ContextBuilder(store, Summariser(), 800)
    loaded: list[int] = []
    for n in range(1, 61):
        await add_turn(store, n)
        await builder.build(CHAT, [])
        loaded.append(len((await store.context_rows(CHAT)).rows))
    # Flat after the first fold: never more than what fits in the budget and one turn more.
    assert max(loaded[20:]) <= max(loaded[:20])
    assert len(await store.history(CHAT)) == 120


async def test_the_tools_count_and_a_row_larger_than_the_budget_still_goes(store: SQLiteStore) -> None:
    tools = [
        ToolSpec(
            name="read_file",
            description="Read a file.",
            parameters={"type": "object", "properties": {"p": {"type": "string"}}},
        )
    ]
    builder = ContextBuilder(store, Summariser(), 600)
    await add_turn(store, 1)
    plain = await builder.build(CHAT, [])
    with_tools = await builder.build(CHAT, tools)
    assert with_tools.tokens == plain.tokens + tools_tokens(tools)
    # The message a call answers, ~1,000 tokens alone: it goes whole, the rest folded.
    await add_turn(store, 2, text_bytes=4000, answer=False)
    context = await builder.build(CHAT, tools)
    assert context.rows == 1 and (context.messages[-1].content or "").startswith("2 uuu")
    assert context.summary is not None and context.messages[0].role == "system"


# -- the pure rules, on random transcripts ------------------------------------------------


@st.composite
def transcripts(draw: st.DrawFn) -> list[StoredRow]:
    rows: list[StoredRow] = []
    for turn in range(1, draw(st.integers(1, 8)) + 1):
        rows.append(
            StoredRow(
                id=len(rows) + 1,
                turn=turn,
                message=ChatMessage(role="user", content="u" * draw(st.integers(1, 400))),
            )
        )
        for step in range(draw(st.integers(0, 3))):
            calls = [ToolCall(id=f"{turn}-{step}-{i}", name="t") for i in range(draw(st.integers(1, 3)))]
            rows.append(
                StoredRow(
                    id=len(rows) + 1, turn=turn, message=ChatMessage(role="assistant", tool_calls=calls)
                )
            )
            for c in draw(st.permutations(calls)):
                if draw(st.booleans()):  # a follow-up committed between the results
                    rows.append(
                        StoredRow(id=len(rows) + 1, turn=turn, message=ChatMessage(role="user", content="f"))
                    )
                rows.append(
                    StoredRow(
                        id=len(rows) + 1,
                        turn=turn,
                        message=ChatMessage(
                            role="tool", tool_call_id=c.id, name="t", content="r" * draw(st.integers(1, 300))
                        ),
                    )
                )
        rows.append(
            StoredRow(id=len(rows) + 1, turn=turn, message=ChatMessage(role="assistant", content="a"))
        )
    return rows


def _split_pair(rows: list[StoredRow], i: int) -> bool:
    before = {c.id for r in rows[:i] for c in r.message.tool_calls or []}
    return any(r.message.tool_call_id in before for r in rows[i:] if r.message.role == "tool")


@settings(max_examples=300, deadline=None)
@given(rows=transcripts(), keep=st.integers(0, 3000))
def test_a_fold_never_splits_a_call_from_its_result(rows: list[StoredRow], keep: int) -> None:
    allowed = cuts(rows)
    assert all(allowed[i] == (not _split_pair(rows, i)) for i in range(len(rows) + 1))
    cut = fold_point(rows, keep)
    assert 0 <= cut < len(rows) and not _split_pair(rows, cut)
    kept = sum(row_tokens(r.message) for r in rows[cut:])
    whole_turn_fits = any(
        allowed[i]
        and rows[i].turn != rows[i - 1].turn
        and sum(row_tokens(r.message) for r in rows[i:]) <= keep
        for i in range(1, len(rows))
    )
    if whole_turn_fits:  # the latest turns go whole
        assert rows[cut].turn != rows[cut - 1].turn and kept <= keep
    for chunk in fold_chunks(rows[:cut], 500):
        end = rows.index(chunk[-1]) + 1
        assert not _split_pair(rows, end)
    assert [r for chunk in fold_chunks(rows[:cut], 500) for r in chunk] == rows[:cut]


async def test_a_reply_reusing_a_folded_call_id_gets_a_fresh_one(store: SQLiteStore, tmp_path: Path) -> None:
    """Tool call ids key the tool rows: a server that reuses an id the context no
    longer shows (it was folded) must not have its result dropped as a duplicate."""
    from temporalio.testing import ActivityEnvironment

    from turnkeeper import activity_io
    from turnkeeper.activities.model_call import ModelCallActivity
    from turnkeeper.activities.tools import default_registry
    from turnkeeper.config import Settings

    class Reuser(Summariser):
        async def complete(
            self,
            history: list[ChatMessage],
            tools: list[ToolSpec],
            *,
            call_index: int,
            on_text: TextSink | None = None,
        ) -> ModelReply:
            return ModelReply(tool_calls=[ToolCall(id="t1-0", name="read_file", arguments="{}")])

    for n in range(1, 15):
        await add_turn(store, n, tool_results=1 if n == 1 else 0)
    model = ModelCallActivity(
        Settings(tools=("read_file",), workspace=tmp_path, context_tokens=800),
        store,
        Reuser(),
        default_registry(),
    )
    await store.begin_turn(CHAT, "run-15", ["m15"])
    result = await ActivityEnvironment().run(
        model.model_call,
        activity_io.ModelCallInput(
            chat_id=CHAT, turn=15, step=0, new_messages=[UserMessage(message_id="m15", text="again")]
        ),
    )
    assert (await store.context_rows(CHAT)).summary is not None  # turn 1 was folded
    (call,) = result.reply.tool_calls
    assert call.id != "t1-0" and call.id.startswith("call_")
    history = await store.history(CHAT)
    assert history[-1].tool_calls == [call]


async def test_a_reply_reusing_a_call_id_it_was_sent_gets_a_fresh_one_without_a_read(
    store: SQLiteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing folded: every row went to the model, so the ids it was sent are all
    the chat has, and the check needs no store read."""
    from temporalio.testing import ActivityEnvironment

    from turnkeeper import activity_io
    from turnkeeper.activities.model_call import ModelCallActivity
    from turnkeeper.activities.tools import default_registry
    from turnkeeper.config import Settings

    class Reuser(Summariser):
        async def complete(
            self,
            history: list[ChatMessage],
            tools: list[ToolSpec],
            *,
            call_index: int,
            on_text: TextSink | None = None,
        ) -> ModelReply:
            return ModelReply(
                tool_calls=[
                    ToolCall(id="t1-0", name="read_file", arguments="{}"),
                    ToolCall(id="new", name="read_file", arguments="{}"),
                ]
            )

    async def no_read(*args: object) -> list[str]:
        raise AssertionError("answered_call_ids read although every row was sent")

    await add_turn(store, 1, tool_results=1)
    monkeypatch.setattr(store, "answered_call_ids", no_read)
    model = ModelCallActivity(
        Settings(tools=("read_file",), workspace=tmp_path), store, Reuser(), default_registry()
    )
    await store.begin_turn(CHAT, "run-2", ["m2"])
    result = await ActivityEnvironment().run(
        model.model_call,
        activity_io.ModelCallInput(
            chat_id=CHAT, turn=2, step=0, new_messages=[UserMessage(message_id="m2", text="again")]
        ),
    )
    assert (await store.context_rows(CHAT)).summary is None
    reused, kept = result.reply.tool_calls
    assert reused.id not in ("t1-0", "new") and reused.id.startswith("call_") and kept.id == "new"
    assert (await store.history(CHAT))[-1].tool_calls == [reused, kept]


def test_rows_cost_their_json(tmp_path: Path) -> None:
    m = ChatMessage(role="user", content="x" * 400)
    assert (
        row_tokens(m)
        == -(-len(json.dumps({"role": "user", "content": "x" * 400}, separators=(",", ":"))) // 4) + 4
    )


async def test_a_malformed_reply_is_recorded_mended(store: SQLiteStore, tmp_path: Path) -> None:
    """A provider's reply can hold what no payload or store row carries: lone surrogates
    (JSON escapes them) and tool call ids with NUL (PostgreSQL keeps none), or ids too
    long for a key. The model activity mends them (`well_formed`) instead of failing
    the step at every Continue."""
    from temporalio.testing import ActivityEnvironment

    from turnkeeper import activity_io
    from turnkeeper.activities.model_call import ModelCallActivity
    from turnkeeper.activities.tools import default_registry
    from turnkeeper.config import Settings

    class Malformed(Summariser):
        async def complete(
            self,
            history: list[ChatMessage],
            tools: list[ToolSpec],
            *,
            call_index: int,
            on_text: TextSink | None = None,
        ) -> ModelReply:
            return ModelReply(
                text="half \ud83d a smile",
                tool_calls=[
                    ToolCall(id="a\x00b", name="read_file", arguments='{"path": "\udc00"}'),
                    ToolCall(id="x" * 500, name="read_file", arguments="{}"),
                    ToolCall(id="ok-id", name="read_\ud800file", arguments="{}"),
                ],
            )

    model = ModelCallActivity(
        Settings(tools=("read_file",), workspace=tmp_path), store, Malformed(), default_registry()
    )
    await store.begin_turn(CHAT, "run-1", ["m1"])
    result = await ActivityEnvironment().run(
        model.model_call,
        activity_io.ModelCallInput(
            chat_id=CHAT, turn=1, step=0, new_messages=[UserMessage(message_id="m1", text="go")]
        ),
    )
    result.model_dump_json()  # a payload at last
    reply = result.reply
    assert reply.text == "half \ufffd a smile"
    assert [c.id for c in reply.tool_calls] == ["call_0_0", "call_0_1", "ok-id"]
    assert [c.name for c in reply.tool_calls] == ["read_file", "read_file", "read_\ufffdfile"]
    assert reply.tool_calls[0].arguments == '{"path": "\ufffd"}'
    assert (await store.history(CHAT))[-1].tool_calls == reply.tool_calls
