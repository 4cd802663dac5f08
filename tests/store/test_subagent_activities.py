"""The subagent store activities (activities/subagent_activities.py) against both
stores: the parent's `delegate` call recorded as started, and its result read from
the sub-chat's transcript, each written once however often it is retried."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from tests.pg import PG_URL, pg_schema
from turnkeeper import activity_io
from turnkeeper.activities.subagent_activities import SubagentActivities
from turnkeeper.config import Settings
from turnkeeper.models import ModelReply, Reason, ToolCall, TurnStatus, UserMessage
from turnkeeper.store import PostgresStore, SessionStore, SQLiteStore, StoreUnavailable

PARENT = "parent"
SUB = "parent.sub1-0123456789ab"
CALL = ToolCall(id="call_0_0", name="delegate", arguments='{"task": "count the files"}')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    if request.param == "sqlite":
        s: SessionStore = SQLiteStore(tmp_path / "sessions.db")
        await s.open()
        try:
            yield s
        finally:
            await s.close()
        return
    async with pg_schema() as schema:
        s = PostgresStore(PG_URL, schema=schema)
        await s.open()
        try:
            yield s
        finally:
            await s.close()


async def turn_with(store: SessionStore, chat: str, text: str, reply: ModelReply, final: bool) -> None:
    began = await store.begin_turn(chat, f"run-{chat}", [f"{chat}-m1"])
    assert began.turn == 1
    await store.commit_user_messages(chat, 1, [UserMessage(message_id=f"{chat}-m1", text=text)])
    await store.record_assistant(chat, 1, 0, reply, final=final)


async def delegating(store: SessionStore) -> None:
    """The parent's turn 1, whose model asked to delegate."""
    await turn_with(store, PARENT, "delegate: count the files", ModelReply(tool_calls=[CALL]), final=False)


def result_input(
    status: TurnStatus, reason: Reason | None = None, background: bool = False
) -> activity_io.SubagentResultInput:
    return activity_io.SubagentResultInput(
        chat_id=PARENT,
        turn=1,
        call=CALL,
        sub_chat_id=SUB,
        sub_turn=1,
        sub_status=status,
        sub_reason=reason,
        background=background,
    )


async def run(activity: object, arg: object) -> object:
    return await ActivityEnvironment().run(activity, arg)  # type: ignore[arg-type]


async def tool_rows(store: SessionStore) -> list[tuple[str | None, str | None]]:
    return [(m.tool_call_id, m.content) for m in await store.history(PARENT) if m.role == "tool"]


async def test_start_records_the_delegate_call_as_started_once(store: SessionStore) -> None:
    await delegating(store)
    acts = SubagentActivities(Settings(), store)
    start = activity_io.SubagentStartInput(chat_id=PARENT, turn=1, call=CALL)
    assert await run(acts.subagent_start, start) is None
    await run(acts.subagent_start, start)  # a retry
    started = [e for e in await store.events(PARENT) if e.type == "tool_started"]
    assert len(started) == 1
    # The tool activity would now refuse to run the call again: it may have begun.
    assert not await store.tool_started(PARENT, 1, CALL, start.idempotency_key)


async def test_a_waiting_delegate_gets_the_subagents_answer_once(store: SessionStore) -> None:
    await delegating(store)
    await turn_with(store, SUB, "count the files", ModelReply(text="There are 3 files."), final=True)
    acts = SubagentActivities(Settings(), store)
    first = await run(acts.subagent_result, result_input(TurnStatus.COMPLETED))
    again = await run(acts.subagent_result, result_input(TurnStatus.COMPLETED))  # a retry
    expected = activity_io.ToolCallResult(
        tool_call_id=CALL.id, name="delegate", status="done", content="There are 3 files.", recorded=True
    )
    assert first == again == expected
    assert await tool_rows(store) == [(CALL.id, "There are 3 files.")]
    finished = [e for e in await store.events(PARENT) if e.type == "tool_finished"]
    assert len(finished) == 1


async def test_a_continued_subagents_answer_is_its_last_assistant_row(store: SessionStore) -> None:
    await delegating(store)
    await turn_with(store, SUB, "count", ModelReply(tool_calls=[ToolCall(id="s1", name="list_dir")]), False)
    await store.record_tool_result(SUB, 1, "s1", "list_dir", "a\nb", "done")
    await store.record_assistant(SUB, 1, 1, ModelReply(text="Two files."), final=False)
    acts = SubagentActivities(Settings(), store)
    result = await run(acts.subagent_result, result_input(TurnStatus.RECOVERED, Reason.CONTINUED))
    assert isinstance(result, activity_io.ToolCallResult)
    assert (result.status, result.content) == ("done", "Two files.")


async def test_a_long_answer_is_cut_like_a_tool_output(store: SessionStore) -> None:
    await delegating(store)
    await turn_with(store, SUB, "write a lot", ModelReply(text="x" * 5000), final=True)
    acts = SubagentActivities(Settings(max_tool_output_bytes=1000), store)
    result = await run(acts.subagent_result, result_input(TurnStatus.COMPLETED))
    assert isinstance(result, activity_io.ToolCallResult)
    assert result.content == "x" * 1000 + "\n[output truncated: 1000 of 5000 bytes shown]"


@pytest.mark.parametrize(
    "status, reason, how",
    [
        (TurnStatus.RECOVERED, Reason.STOPPED, "recovered/stopped"),
        (TurnStatus.RECOVERED, Reason.DISMISSED, "recovered/dismissed"),
        (TurnStatus.FAILED, Reason.RECOVERY_FAILED, "failed/recovery_failed"),
    ],
)
async def test_a_subagent_that_did_not_answer_is_an_error_in_words(
    store: SessionStore, status: TurnStatus, reason: Reason, how: str
) -> None:
    await delegating(store)
    await turn_with(store, SUB, "count", ModelReply(text="half an answer"), final=False)
    acts = SubagentActivities(Settings(), store)
    result = await run(acts.subagent_result, result_input(status, reason))
    words = f"Error: the subagent's turn ended {how}; its transcript is in chat {SUB}"
    assert isinstance(result, activity_io.ToolCallResult)
    assert (result.status, result.content) == ("error", words)
    assert await tool_rows(store) == [(CALL.id, words)]


async def test_a_completed_turn_without_an_answer_says_so(store: SessionStore) -> None:
    await delegating(store)
    acts = SubagentActivities(Settings(), store)  # the sub-chat holds no row of turn 1
    result = await run(acts.subagent_result, result_input(TurnStatus.COMPLETED))
    assert isinstance(result, activity_io.ToolCallResult)
    assert (result.status, result.content) == (
        "error",
        f"Error: the subagent's turn ended completed without an answer; its transcript is in chat {SUB}",
    )


async def test_a_background_delegate_says_where_the_answer_will_arrive(store: SessionStore) -> None:
    await delegating(store)
    acts = SubagentActivities(Settings(), store)
    result = await run(acts.subagent_result, result_input(TurnStatus.RUNNING, background=True))
    words = f"Started subagent in chat {SUB}; its answer will arrive as a message in this chat."
    assert isinstance(result, activity_io.ToolCallResult)
    assert (result.status, result.content) == ("done", words)
    assert await tool_rows(store) == [(CALL.id, words)]


class Unavailable:
    """A store that does not answer."""

    def __getattr__(self, name: str) -> object:
        async def refuse(*args: object, **kwargs: object) -> None:
            raise StoreUnavailable("the store is locked")

        return refuse


@pytest.mark.parametrize("which", ["start", "result"])
async def test_an_unavailable_store_fails_the_write_with_its_type(which: str) -> None:
    """As the other store writes: the failure's type is STORE_UNAVAILABLE_ERROR, and the
    step's retry policy decides whether it is tried again."""
    acts = SubagentActivities(Settings(), Unavailable())  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable) as failed:
        if which == "start":
            await run(acts.subagent_start, activity_io.SubagentStartInput(chat_id=PARENT, turn=1, call=CALL))
        else:
            await run(acts.subagent_result, result_input(TurnStatus.COMPLETED))
    assert type(failed.value).__name__ == activity_io.STORE_UNAVAILABLE_ERROR
