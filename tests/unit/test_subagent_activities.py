"""The activity side of subagents (activities/subagent_activities.py): which tools a
subagent's calls see and run, the built-in `delegate` spec, the turn's subagent
limits, what a subagent's model call is sent, the tool activity's refusal, and a
report cut to fit a message. The activities run on a real SQLite store; the store
writes against both stores are in tests/store/test_subagent_activities.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from turnkeeper import activity_io
from turnkeeper.activities.model_call import ModelCallActivity
from turnkeeper.activities.providers import ModelProvider
from turnkeeper.activities.providers.base import TextSink
from turnkeeper.activities.store_activities import StoreActivities
from turnkeeper.activities.subagent_activities import (
    allowed_tools,
    fit_message,
    instructions,
    report_text,
)
from turnkeeper.activities.tool_call import ToolCallActivity
from turnkeeper.activities.tools import ToolContext, default_registry
from turnkeeper.activities.tools.builtin import DELEGATE_NOT_HERE_TEXT
from turnkeeper.activities.tools.schema import arguments_schema
from turnkeeper.config import Settings, SubagentProfile
from turnkeeper.models import ChatMessage, ModelReply, SubagentLink, ToolCall, ToolSpec, UserMessage
from turnkeeper.store import SQLiteStore
from turnkeeper.subagents import DELEGATE_DESCRIPTION, DELEGATE_TOOL, DelegateArgs

CHAT = "sub-chat"
REVIEWER = SubagentProfile("reviewer", "Review only; never write.", ("read_file", "list_dir", "exec"))
DELEGATOR = SubagentProfile("delegator", "", ("read_file", "delegate"))
ENABLED = ("read_file", "write_file", "list_dir", "delegate")


def settings(tmp_path: Path | None = None, **kwargs: object) -> Settings:
    base: dict[str, object] = {"tools": ENABLED, "subagent_profiles": (REVIEWER, DELEGATOR)}
    if tmp_path is not None:
        base["workspace"] = tmp_path / "ws"
    return Settings(**{**base, **kwargs})  # type: ignore[arg-type]


def link(depth: int = 1, profile: str | None = None) -> SubagentLink:
    return SubagentLink(
        parent_chat_id="parent",
        parent_workflow_id="chat-parent",
        parent_turn=1,
        tool_call_id="call_0_0",
        depth=depth,
        profile=profile,
        task="the task",
    )


# -- which tools ------------------------------------------------------------------------


def test_a_chats_own_turn_sees_the_workers_tools() -> None:
    assert allowed_tools(settings(), None) == ENABLED


@pytest.mark.parametrize(
    "depth, profile, expected",
    [
        (1, None, ENABLED),  # no profile: the worker's tools, delegate below the limit
        (2, None, ("read_file", "write_file", "list_dir")),  # at the limit (2): no delegate
        (5, None, ("read_file", "write_file", "list_dir")),
        # The profile's among the worker's, in the worker's order: exec is not enabled here.
        (1, "reviewer", ("read_file", "list_dir")),
        (1, "delegator", ("read_file", "delegate")),
        (2, "delegator", ("read_file",)),
        (1, "gone", ()),  # a profile the worker does not know allows nothing
    ],
)
def test_a_subagent_sees_its_profiles_tools_among_the_workers(
    depth: int, profile: str | None, expected: tuple[str, ...]
) -> None:
    assert allowed_tools(settings(), link(depth, profile)) == expected


def test_a_subagent_never_sees_more_than_the_worker_enables() -> None:
    narrow = settings(tools=("read_file",), subagent_max_depth=3)
    assert allowed_tools(narrow, link(1, "delegator")) == ("read_file",)
    assert allowed_tools(narrow, link(1)) == ("read_file",)
    assert allowed_tools(settings(subagent_max_depth=1), link(1)) == ("read_file", "write_file", "list_dir")


def test_instructions_are_the_profiles() -> None:
    assert instructions(settings(), link(1, "reviewer")) == REVIEWER.instructions
    assert instructions(settings(), link(1, "delegator")) is None  # empty: no system row
    assert instructions(settings(), link(1)) is None
    assert instructions(settings(), None) is None
    assert instructions(settings(), link(1, "gone")) is None


# -- the built-in delegate --------------------------------------------------------------


def test_delegate_is_a_built_in_with_its_contract_schema() -> None:
    registry = default_registry()
    (spec,) = registry.specs([DELEGATE_TOOL])
    assert (spec.name, spec.description) == (DELEGATE_TOOL, DELEGATE_DESCRIPTION)
    assert spec.parameters == arguments_schema(DelegateArgs)
    assert spec.parameters["required"] == ["task"]
    assert spec.parameters["properties"]["mode"]["enum"] == ["wait", "background"]
    assert not registry.needs_approval(DELEGATE_TOOL)
    assert registry.confirm_names(ENABLED) == []
    assert registry.specs(Settings().tools) == registry.specs(("read_file", "write_file", "list_dir"))


async def test_the_registry_never_runs_delegate(tmp_path: Path) -> None:
    ctx = ToolContext.for_call(workspace=tmp_path, chat_id=CHAT, turn=1, tool_call_id="c", exec_timeout=5)
    outcome = await default_registry().run(
        DELEGATE_TOOL, '{"task": "x"}', ctx, enabled=ENABLED, max_output_bytes=4096
    )
    assert (outcome.status, outcome.content) == ("error", DELEGATE_NOT_HERE_TEXT)
    assert "child workflow" in DELEGATE_NOT_HERE_TEXT


# -- the turn's settings ----------------------------------------------------------------


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "sessions.db")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def test_turn_settings_carry_the_subagent_limits_when_delegate_is_enabled(store: SQLiteStore) -> None:
    ask = activity_io.BeginTurnInput(chat_id=CHAT, run_id="r", message_ids=[], only_existing=True)
    on = await StoreActivities(settings(subagent_max_depth=3, subagent_max_fanout=2), store).begin(ask)
    assert on.settings.subagents == activity_io.SubagentLimits(
        max_depth=3, max_fanout=2, profiles=["delegator", "reviewer"]
    )
    assert on.settings.confirm_tools == []
    off = await StoreActivities(settings(tools=("read_file",)), store).begin(ask)
    assert off.settings.subagents is None


# -- a subagent's model call ------------------------------------------------------------


class Recorder(ModelProvider):
    """Answers at once, and keeps what each call was sent."""

    name = "recorder"

    def __init__(self) -> None:
        self.sent: list[tuple[list[ChatMessage], list[str]]] = []

    async def complete(
        self,
        history: list[ChatMessage],
        tools: list[ToolSpec],
        *,
        call_index: int,
        on_text: TextSink | None = None,
    ) -> ModelReply:
        self.sent.append((history, [t.name for t in tools]))
        return ModelReply(text="ok")


async def model_call(
    store: SQLiteStore, tmp_path: Path, chat: str, subagent: SubagentLink | None
) -> tuple[list[ChatMessage], list[str]]:
    provider = Recorder()
    model = ModelCallActivity(settings(tmp_path, stream=False), store, provider, default_registry())
    await store.begin_turn(chat, "run-1", ["m1"])
    await ActivityEnvironment().run(
        model.model_call,
        activity_io.ModelCallInput(
            chat_id=chat,
            turn=1,
            step=0,
            new_messages=[UserMessage(message_id="m1", text="read notes.txt")],
            subagent=subagent,
        ),
    )
    (sent,) = provider.sent
    return sent


async def test_a_subagents_model_call_sees_its_instructions_first_and_its_tools(
    store: SQLiteStore, tmp_path: Path
) -> None:
    history, tools = await model_call(store, tmp_path, "a", link(1, "reviewer"))
    assert [(m.role, m.content) for m in history] == [
        ("system", REVIEWER.instructions),
        ("user", "read notes.txt"),
    ]
    assert tools == ["read_file", "list_dir"]
    assert [m.role for m in await store.history("a")] == ["user", "assistant"]  # never stored


async def test_a_subagent_at_the_depth_limit_is_not_offered_delegate(
    store: SQLiteStore, tmp_path: Path
) -> None:
    history, tools = await model_call(store, tmp_path, "b", link(2))
    assert [m.role for m in history] == ["user"]
    assert tools == ["read_file", "write_file", "list_dir"]
    _, tools = await model_call(store, tmp_path, "c", None)
    assert tools == list(ENABLED)


# -- a subagent's tool call -------------------------------------------------------------


async def tool_call(
    store: SQLiteStore, tmp_path: Path, chat: str, call: ToolCall, subagent: SubagentLink | None
) -> activity_io.ToolCallResult:
    (tmp_path / "ws").mkdir(exist_ok=True)
    await store.begin_turn(chat, "run-1", ["m1"])
    await store.commit_user_messages(chat, 1, [UserMessage(message_id="m1", text="go")])
    await store.record_assistant(chat, 1, 0, ModelReply(tool_calls=[call]), final=False)
    tools = ToolCallActivity(settings(tmp_path), store, default_registry())
    result: activity_io.ToolCallResult = await ActivityEnvironment().run(
        tools.tool_call, activity_io.ToolCallInput(chat_id=chat, turn=1, call=call, subagent=subagent)
    )
    return result


async def test_a_subagents_call_outside_its_profile_is_refused_and_recorded(
    store: SQLiteStore, tmp_path: Path
) -> None:
    call = ToolCall(id="call_0_0", name="write_file", arguments=json.dumps({"path": "n.txt", "content": "x"}))
    result = await tool_call(store, tmp_path, "d", call, link(1, "reviewer"))
    assert (result.status, result.recorded) == ("error", True)
    assert result.content == (
        "Error: subagent profile 'reviewer' may not use the tool 'write_file'; the call did not run. "
        "Its tools: read_file, list_dir"
    )
    assert not (tmp_path / "ws" / "n.txt").exists()  # never run
    rows = await store.history("d")
    assert (rows[-1].role, rows[-1].tool_call_id, rows[-1].content) == ("tool", "call_0_0", result.content)
    types = [e.type for e in await store.events("d")]
    assert "tool_started" not in types and "tool_finished" in types


async def test_a_subagents_call_inside_its_profile_runs(store: SQLiteStore, tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "notes.txt").write_text("hello")
    call = ToolCall(id="call_0_0", name="read_file", arguments='{"path": "notes.txt"}')
    result = await tool_call(store, tmp_path, "e", call, link(1, "reviewer"))
    assert (result.status, result.content) == ("done", "hello")


async def test_a_subagent_at_the_depth_limit_may_not_delegate(store: SQLiteStore, tmp_path: Path) -> None:
    call = ToolCall(id="call_0_0", name=DELEGATE_TOOL, arguments='{"task": "more"}')
    result = await tool_call(store, tmp_path, "f", call, link(2))
    assert result.status == "error"
    assert result.content.startswith("Error: subagents nest at most 2 deep and this one is at depth 2")


async def test_the_tool_activity_asked_to_run_delegate_refuses_in_words(
    store: SQLiteStore, tmp_path: Path
) -> None:
    call = ToolCall(id="call_0_0", name=DELEGATE_TOOL, arguments='{"task": "more"}')
    result = await tool_call(store, tmp_path, "g", call, None)
    assert (result.status, result.content) == ("error", DELEGATE_NOT_HERE_TEXT)


# -- the report's words -----------------------------------------------------------------


def test_a_report_names_the_sub_chat_and_the_task() -> None:
    assert report_text("p.sub1-abc", "count the files", True, "3 files") == (
        "Subagent (chat p.sub1-abc, task: count the files) answered:\n3 files"
    )
    long_task = "t" * 500
    text = report_text("p.sub1-abc", long_task, False, "Error: it stopped")
    assert text.startswith(f"Subagent (chat p.sub1-abc, task: {'t' * 197}...) ended without an answer:\n")


@pytest.mark.parametrize("limit", [1, 7, 60, 100, 1000])
def test_a_long_message_is_cut_to_fit_never_refused(limit: int) -> None:
    text = "é" * 400 + "z" * 400  # 1,200 bytes; a cut may fall inside a character
    cut = fit_message(text, limit)
    assert len(cut.encode()) <= limit
    assert text.startswith(cut.split("\n[cut")[0])
    if limit >= 100:
        assert cut.endswith("\n[cut to fit a message: 1200 bytes in all]")
    assert fit_message("short", 5) == "short"


def test_a_profile_naming_an_unknown_tool_stops_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    from turnkeeper.activities.tools import sandbox
    from turnkeeper.config import ConfigError
    from turnkeeper.worker.main import check_tools

    monkeypatch.setattr(sandbox, "MODE", sandbox.MODE)  # check_tools sets it: put it back afterwards

    check_tools(settings(tools=("read_file",)))  # exec: known, if not enabled
    typo = SubagentProfile("typo", "", ("read_flie",))
    with pytest.raises(
        ConfigError, match=r"TURNKEEPER_SUBAGENT_PROFILES: profile 'typo' names unknown tools \['read_flie'\]"
    ):
        check_tools(settings(subagent_profiles=(typo,)))
