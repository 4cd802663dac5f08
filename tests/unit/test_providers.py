"""Model providers: scripted, demo, OpenAI (against FakeChatServer), load_provider."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from turnkeeper.activities.providers import (
    DemoProvider,
    ModelProvider,
    OpenAIChatProvider,
    PermanentProviderError,
    ProviderError,
    RetryableProviderError,
    ScriptedProvider,
    load_provider,
)
from turnkeeper.activities.providers.base import ensure_tool_call_ids
from turnkeeper.models import ChatMessage, EffectClass, ModelReply, ToolCall, ToolSpec
from turnkeeper.testing import FakeChatServer

API_KEY = "sk-test-DO-NOT-LEAK-1234567890"

PATH_PARAMS = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS = [
    ToolSpec(
        name="write_file",
        description="Write a file.",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    ),
    ToolSpec(name="read_file", description="Read a file.", parameters=PATH_PARAMS, effect=EffectClass.READ),
    ToolSpec(
        name="list_dir", description="List a directory.", parameters=PATH_PARAMS, effect=EffectClass.READ
    ),
]


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


def write_script(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(data))
    return path


# --- scripted -----------------------------------------------------------------------


async def test_scripted_text_and_tool_calls() -> None:
    provider = ScriptedProvider(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}},
                    {"name": "list_dir", "arguments": {}},
                ]
            },
            {"text": "all done"},
        ]
    )
    first = await provider.complete([user("go")], TOOLS, call_index=0)
    assert not first.is_final and first.text is None
    assert [(c.id, c.name) for c in first.tool_calls] == [
        ("call_0_0", "write_file"),
        ("call_0_1", "list_dir"),
    ]
    assert json.loads(first.tool_calls[0].arguments) == {"path": "a.txt", "content": "hi"}
    assert first.tool_calls[1].arguments == "{}"

    second = await provider.complete([user("go")], TOOLS, call_index=1)
    assert second.is_final and second.text == "all done"


async def test_scripted_error_item_is_permanent() -> None:
    provider = ScriptedProvider([{"error": "the model exploded"}])
    with pytest.raises(PermanentProviderError, match="the model exploded") as info:
        await provider.complete([user("hi")], [], call_index=0)
    assert info.value.retryable is False


async def test_scripted_past_the_end_is_permanent() -> None:
    provider = ScriptedProvider([{"text": "only one"}])
    with pytest.raises(PermanentProviderError) as info:
        await provider.complete([user("hi")], [], call_index=1)
    assert str(info.value) == "scripted model has no answer for call 1 (the script has 1 items)"


@pytest.mark.parametrize(
    ("items", "index"),
    [
        ([{"text": "ok"}, {"text": "a", "error": "b"}], 1),
        ([{"text": "ok"}, {"text": "ok"}, {"bogus": 1}], 2),
        ([{"text": 5}], 0),
        ([{"text": "ok"}, {"tool_calls": []}], 1),
        ([{"tool_calls": [{"arguments": {}}]}], 0),
        ([{"tool_calls": [{"name": "x", "arguments": [1, 2]}]}], 0),
        ([{"tool_calls": [{"name": "x", "args": {}}]}], 0),
        (["text"], 0),
    ],
)
async def test_scripted_file_invalid_items_name_the_index(
    tmp_path: Path, items: list[Any], index: int
) -> None:
    path = write_script(tmp_path, items)
    with pytest.raises(ValueError, match=rf"item {index}\b"):
        load_provider(f"scripted:{path}")


async def test_scripted_file_must_exist_and_be_a_json_list(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not found"):
        load_provider(f"scripted:{tmp_path / 'missing.json'}")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_provider(f"scripted:{tmp_path / 'bad.json'}")
    with pytest.raises(ValueError, match="JSON list"):
        load_provider(f"scripted:{write_script(tmp_path, {'text': 'hi'})}")


async def test_scripted_file_is_read_once(tmp_path: Path) -> None:
    path = write_script(tmp_path, [{"text": "first version"}])
    provider = load_provider(f"scripted:{path}")
    path.write_text(json.dumps([{"text": "second version"}]))
    reply = await provider.complete([user("hi")], [], call_index=0)
    assert reply.text == "first version"


# --- demo -------------------------------------------------------------------------


async def test_demo_write_read_list() -> None:
    demo = DemoProvider()
    reply = await demo.complete([user("WRITE notes.txt: hello")], TOOLS, call_index=0)
    (call,) = reply.tool_calls
    assert (call.id, call.name) == ("call_0_0", "write_file")
    assert json.loads(call.arguments) == {"path": "notes.txt", "content": "hello"}

    reply = await demo.complete([user("read notes.txt")], TOOLS, call_index=3)
    (call,) = reply.tool_calls
    assert (call.id, call.name, json.loads(call.arguments)) == (
        "call_3_0",
        "read_file",
        {"path": "notes.txt"},
    )

    for text, path in [("list", "."), ("ls", "."), ("ls sub/dir", "sub/dir")]:
        (call,) = (await demo.complete([user(text)], TOOLS, call_index=0)).tool_calls
        assert call.name == "list_dir" and json.loads(call.arguments) == {"path": path}


async def test_demo_calls_any_enabled_tool_by_name() -> None:
    """`call <tool> {json}`: how a newcomer tries an MCP server's tools with the demo model."""
    mcp = ToolSpec(name="time__get_current_time", description="now", parameters={"type": "object"})
    demo = DemoProvider()
    reply = await demo.complete(
        [user('call time__get_current_time {"timezone": "UTC"}')], [*TOOLS, mcp], call_index=0
    )
    (call,) = reply.tool_calls
    assert (call.name, json.loads(call.arguments)) == ("time__get_current_time", {"timezone": "UTC"})
    (call,) = (await demo.complete([user("call list_dir")], TOOLS, call_index=0)).tool_calls
    assert (call.name, json.loads(call.arguments)) == ("list_dir", {})
    refused = await demo.complete([user("call time__get_current_time {}")], TOOLS, call_index=0)
    assert "not enabled" in (refused.text or "")
    assert (await demo.complete([user("call x {not json}")], TOOLS, call_index=0)).is_final


async def test_demo_echoes_with_a_hint() -> None:
    reply = await DemoProvider().complete([user("hello there")], TOOLS, call_index=0)
    assert reply.is_final
    assert "hello there" in (reply.text or "")
    assert "write notes.txt: hello" in (reply.text or "") and "list" in (reply.text or "")


async def test_demo_summarises_tool_results_after_a_tool_row() -> None:
    history = [
        user("earlier"),
        ChatMessage(role="assistant", content="ok"),
        user("write notes.txt: hello"),
        ChatMessage(
            role="assistant",
            tool_calls=[
                ToolCall(id="call_1_0", name="write_file", arguments='{"path":"notes.txt","content":"hello"}')
            ],
        ),
        ChatMessage(role="tool", tool_call_id="call_1_0", content="wrote 5 bytes to notes.txt"),
    ]
    reply = await DemoProvider().complete(history, TOOLS, call_index=2)
    assert reply.is_final
    assert reply.text == "Done. write_file: wrote 5 bytes to notes.txt"


async def test_demo_does_not_call_tools_that_are_not_enabled() -> None:
    only_read = [t for t in TOOLS if t.name == "read_file"]
    reply = await DemoProvider().complete([user("write notes.txt: hi")], only_read, call_index=0)
    assert reply.is_final
    assert "write_file" in (reply.text or "") and "not enabled" in (reply.text or "")
    reply = await DemoProvider().complete([user("list")], [], call_index=0)
    assert reply.is_final and "not enabled" in (reply.text or "")


DELEGATE = ToolSpec(name="delegate", description="Hand a task to a subagent.", parameters={"type": "object"})


@pytest.mark.parametrize(
    "text, arguments",
    [
        ("delegate: write notes.txt: hi", {"task": "write notes.txt: hi", "mode": "wait"}),
        ("Delegate in background: list", {"task": "list", "mode": "background"}),
        (
            "delegate in the background:  tidy up\nthe notes ",
            {"task": "tidy up\nthe notes", "mode": "background"},
        ),
        (
            "delegate as reviewer: read notes.txt",
            {"task": "read notes.txt", "mode": "wait", "profile": "reviewer"},
        ),
        (
            "delegate as reviewer in background: read a.txt",
            {"task": "read a.txt", "mode": "background", "profile": "reviewer"},
        ),
        (
            "delegate in background as reviewer: read a.txt",
            {"task": "read a.txt", "mode": "background", "profile": "reviewer"},
        ),
    ],
)
async def test_demo_delegates_a_task(text: str, arguments: dict[str, str]) -> None:
    reply = await DemoProvider().complete([user(text)], [*TOOLS, DELEGATE], call_index=2)
    (call,) = reply.tool_calls
    assert (call.id, call.name, json.loads(call.arguments)) == ("call_2_0", "delegate", arguments)


async def test_demo_delegates_only_when_delegate_is_offered() -> None:
    reply = await DemoProvider().complete([user("delegate: list")], TOOLS, call_index=0)
    assert reply.is_final and "The delegate tool is not enabled" in (reply.text or "")
    # Not a delegate command: no colon, so an echo.
    reply = await DemoProvider().complete([user("delegate everything")], [DELEGATE], call_index=0)
    assert reply.is_final and reply.text and reply.text.startswith("You said")


async def test_demo_in_a_sub_chat_takes_the_task_as_its_message() -> None:
    """A sub-chat's first row is the task: `delegate: write notes.txt: hi` nests into a write."""
    (parent_call,) = (
        await DemoProvider().complete(
            [user("delegate: write notes.txt: hi")], [*TOOLS, DELEGATE], call_index=0
        )
    ).tool_calls
    task = json.loads(parent_call.arguments)["task"]
    (call,) = (await DemoProvider().complete([user(task)], TOOLS, call_index=0)).tool_calls
    assert (call.name, json.loads(call.arguments)) == ("write_file", {"path": "notes.txt", "content": "hi"})
    # A profile's instructions come first, as a system row: the demo reads the last row.
    system = ChatMessage(role="system", content="You review; never write.")
    (call,) = (
        await DemoProvider().complete([system, user("read notes.txt")], TOOLS, call_index=0)
    ).tool_calls
    assert call.name == "read_file"


async def test_demo_acknowledges_a_background_subagents_report() -> None:
    from turnkeeper.activities.subagent_activities import report_text

    text = report_text("c.sub1-abc", "count the files", True, "There are 3 files.")
    reply = await DemoProvider().complete([user(text)], [*TOOLS, DELEGATE], call_index=4)
    assert reply.text == "A subagent reported back (chat c.sub1-abc): There are 3 files."
    text = report_text("c.sub1-abc", "count", False, "Error: the subagent's turn ended recovered/stopped")
    reply = await DemoProvider().complete([user(text)], [*TOOLS, DELEGATE], call_index=4)
    assert reply.text == (
        "A subagent stopped short (chat c.sub1-abc): Error: the subagent's turn ended recovered/stopped"
    )


# --- load_provider ------------------------------------------------------------------


async def test_load_provider_forms(tmp_path: Path) -> None:
    assert isinstance(load_provider("demo"), DemoProvider)
    scripted = load_provider(f"scripted:{write_script(tmp_path, [{'text': 'hi'}])}")
    assert isinstance(scripted, ScriptedProvider)

    provider = load_provider(
        "openai:llama3.1:8b", env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": API_KEY}
    )
    try:
        assert isinstance(provider, OpenAIChatProvider) and isinstance(provider, ModelProvider)
        assert provider.model == "llama3.1:8b"  # split on the first colon only
        assert API_KEY not in repr(provider)
    finally:
        await provider.aclose()

    keyless = load_provider("openai:local", env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    await keyless.aclose()


@pytest.mark.parametrize("spec", ["", "gpt-4o", "anthropic:claude", "openai:", "scripted:", "DEMO:"])
async def test_load_provider_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError, match="demo") as info:
        load_provider(spec, env={})
    assert "openai:<model>" in str(info.value) and "scripted:" in str(info.value)


async def test_ensure_tool_call_ids_replaces_empty_and_reused_ids() -> None:
    history = [ChatMessage(role="assistant", tool_calls=[ToolCall(id="call_0", name="x")])]
    calls = [ToolCall(id="", name="a"), ToolCall(id="call_0", name="b"), ToolCall(id="abc", name="c")]
    fixed = ensure_tool_call_ids(calls, history, call_index=1)
    assert [c.id for c in fixed] == ["call_1_0", "call_1_1", "abc"]


# --- openai against FakeChatServer --------------------------------------------------


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    with FakeChatServer() as s:
        yield s


@pytest.fixture
async def openai_provider(server: FakeChatServer) -> AsyncIterator[OpenAIChatProvider]:
    provider = OpenAIChatProvider(
        "fake-model", base_url=server.base_url, api_key=API_KEY, timeout=5, max_retries=0
    )
    yield provider
    await provider.aclose()


async def test_openai_text_answer(server: FakeChatServer, openai_provider: OpenAIChatProvider) -> None:
    server.script([{"text": "Hello from the fake."}])
    reply = await openai_provider.complete([user("hi")], [], call_index=0)
    assert reply.is_final and reply.text == "Hello from the fake."
    (request,) = server.requests
    assert request["model"] == "fake-model"
    assert request["messages"] == [{"role": "user", "content": "hi"}]
    assert "tools" not in request  # omitted when no tool is enabled


async def test_openai_tool_calls_keep_arguments_verbatim(
    server: FakeChatServer, openai_provider: OpenAIChatProvider
) -> None:
    server.script(
        [
            {
                "text": "Let me do that.",
                "tool_calls": [
                    {"id": "call_abc", "name": "write_file", "arguments": {"path": "a.txt", "content": "x"}},
                    {"id": "call_def", "name": "read_file", "arguments": '{"path": "a.txt",'},
                    {"id": "", "name": "list_dir", "arguments": "{}"},
                ],
            }
        ]
    )
    reply = await openai_provider.complete([user("go")], TOOLS, call_index=4)
    assert reply.text == "Let me do that." and not reply.is_final
    assert [(c.id, c.name) for c in reply.tool_calls] == [
        ("call_abc", "write_file"),
        ("call_def", "read_file"),
        ("call_4_2", "list_dir"),  # the server sent an empty id
    ]
    assert json.loads(reply.tool_calls[0].arguments) == {"path": "a.txt", "content": "x"}
    assert reply.tool_calls[1].arguments == '{"path": "a.txt",'  # malformed, kept for the tool layer


async def test_openai_sends_history_and_tools_in_openai_shape(
    server: FakeChatServer, openai_provider: OpenAIChatProvider
) -> None:
    server.script([{"text": "Done."}])
    history = [
        user("write a.txt: hi"),
        ChatMessage(
            role="assistant",
            content=None,
            tool_calls=[
                ToolCall(id="call_0_0", name="write_file", arguments='{"path":"a.txt","content":"hi"}')
            ],
        ),
        ChatMessage(
            role="tool", tool_call_id="call_0_0", name="write_file", content="wrote 2 bytes to a.txt"
        ),
    ]
    await openai_provider.complete(history, TOOLS, call_index=1)
    (request,) = server.requests
    assert request["messages"] == [
        {"role": "user", "content": "write a.txt: hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0_0",
                    "type": "function",
                    "function": {"name": "write_file", "arguments": '{"path":"a.txt","content":"hi"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0_0", "content": "wrote 2 bytes to a.txt"},
    ]
    assert request["tools"] == [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in TOOLS
    ]


async def test_openai_rate_limit_then_success_is_retried_by_the_client(server: FakeChatServer) -> None:
    server.script([{"status": 429, "message": "slow down"}, {"text": "finally"}])
    provider = OpenAIChatProvider("m", base_url=server.base_url, api_key=API_KEY, timeout=5, max_retries=2)
    try:
        reply = await provider.complete([user("hi")], [], call_index=0)
    finally:
        await provider.aclose()
    assert reply.text == "finally"
    assert len(server.requests) == 2


async def test_openai_server_errors_beyond_retries_are_retryable(server: FakeChatServer) -> None:
    server.script([{"status": 500, "message": "boom"}] * 3)
    provider = OpenAIChatProvider("m", base_url=server.base_url, api_key=API_KEY, timeout=5, max_retries=2)
    try:
        with pytest.raises(RetryableProviderError) as info:
            await provider.complete([user("hi")], [], call_index=0)
    finally:
        await provider.aclose()
    assert info.value.retryable and info.value.status_code == 500
    assert "500" in str(info.value) and "boom" in str(info.value)
    assert len(server.requests) == 3


async def test_openai_auth_error_is_permanent_and_hides_the_key(
    server: FakeChatServer, openai_provider: OpenAIChatProvider
) -> None:
    # A server that echoes the key it got: the key must still not reach our error.
    server.script([{"status": 401, "message": f"Incorrect API key provided: {API_KEY}"}])
    with pytest.raises(PermanentProviderError) as info:
        await openai_provider.complete([user("hi")], [], call_index=0)
    err = info.value
    assert not err.retryable and err.status_code == 401 and "401" in str(err)
    assert API_KEY not in str(err) and API_KEY not in repr(err)
    assert err.__cause__ is None and err.__suppress_context__  # Temporal would serialise the cause


async def test_openai_bad_request_is_permanent(
    server: FakeChatServer, openai_provider: OpenAIChatProvider
) -> None:
    server.script([{"status": 400, "message": "Invalid 'messages'"}])
    with pytest.raises(PermanentProviderError, match=r"400.*Invalid 'messages'"):
        await openai_provider.complete([user("hi")], [], call_index=0)
    assert len(server.requests) == 1  # not retried


@pytest.mark.parametrize(
    "raw",
    [
        {"id": "x", "object": "chat.completion"},
        {"choices": []},
        {
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": None}, "finish_reason": "stop"}
            ]
        },
        "not an object",
    ],
)
async def test_openai_malformed_output_is_permanent(
    server: FakeChatServer, openai_provider: OpenAIChatProvider, raw: Any
) -> None:
    server.script([{"raw": raw}])
    with pytest.raises(PermanentProviderError, match="malformed"):
        await openai_provider.complete([user("hi")], [], call_index=0)


async def test_openai_timeout_is_retryable(server: FakeChatServer) -> None:
    server.script([{"delay": 3, "text": "too late"}])
    provider = OpenAIChatProvider("m", base_url=server.base_url, api_key=API_KEY, timeout=0.3, max_retries=0)
    try:
        with pytest.raises(RetryableProviderError, match="timed out"):
            await provider.complete([user("hi")], [], call_index=0)
    finally:
        await provider.aclose()


async def test_openai_connection_error_is_retryable() -> None:
    with FakeChatServer() as s:
        base_url = s.base_url  # a port that was just free, now closed
    provider = OpenAIChatProvider("m", base_url=base_url, api_key=API_KEY, timeout=2, max_retries=0)
    try:
        with pytest.raises(RetryableProviderError, match="connect") as info:
            await provider.complete([user("hi")], [], call_index=0)
    finally:
        await provider.aclose()
    assert API_KEY not in str(info.value)


async def test_fake_server_responder_and_exhausted_script() -> None:
    def responder(request: dict[str, Any]) -> dict[str, Any]:
        return {"text": f"you sent {len(request['messages'])} messages"}

    with FakeChatServer() as s:
        provider = OpenAIChatProvider("m", base_url=s.base_url, api_key=None, timeout=5, max_retries=0)
        try:
            with pytest.raises(RetryableProviderError, match="exhausted"):
                await provider.complete([user("hi")], [], call_index=0)
            s.responder = responder
            reply = await provider.complete([user("a"), user("b")], [], call_index=0)
        finally:
            await provider.aclose()
    assert reply.text == "you sent 2 messages"
    with pytest.raises(ValueError):
        FakeChatServer([{"delay": 1}])


async def test_provider_errors_share_a_base() -> None:
    assert issubclass(RetryableProviderError, ProviderError) and RetryableProviderError("x").retryable
    assert issubclass(PermanentProviderError, ProviderError) and not PermanentProviderError("x").retryable
    assert ProviderError("x", retryable=True).retryable


async def test_demo_runs_commands_only_when_exec_is_enabled() -> None:
    exec_spec = ToolSpec(name="exec", description="run", parameters={"type": "object"})
    reply = await DemoProvider().complete([user("run sleep 1 && echo ok")], [*TOOLS, exec_spec], call_index=0)
    (call,) = reply.tool_calls
    assert call.name == "exec" and json.loads(call.arguments) == {"command": "sleep 1 && echo ok"}
    refused = await DemoProvider().complete([user("run ls")], TOOLS, call_index=0)
    assert refused.is_final and "not enabled" in (refused.text or "")


# --- streaming ----------------------------------------------------------------------


async def test_openai_streams_text_and_assembles_tool_calls(
    server: FakeChatServer, openai_provider: OpenAIChatProvider
) -> None:
    """With a text sink the call streams: the pieces add up to the text, and each
    tool call (id and name first, arguments in pieces) comes out whole."""
    calls = [
        {"id": "call_abc", "name": "write_file", "arguments": {"path": "a.txt", "content": "x y"}},
        {"id": "call_def", "name": "read_file", "arguments": '{"path": "a.txt",'},
    ]
    server.script([{"text": "Let me do that now.", "tool_calls": calls}, {"text": "Done, all of it."}])
    pieces: list[str] = []
    reply = await openai_provider.complete([user("go")], TOOLS, call_index=0, on_text=pieces.append)
    assert server.requests[0]["stream"] is True
    assert pieces == ["Let ", "me ", "do ", "that ", "now."] and reply.text == "Let me do that now."
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_abc", "write_file", json.dumps({"path": "a.txt", "content": "x y"})),
        ("call_def", "read_file", '{"path": "a.txt",'),  # verbatim, as without streaming
    ]
    whole = await openai_provider.complete([user("go")], TOOLS, call_index=1)
    assert whole.text == "Done, all of it." and "stream" not in server.requests[1]  # no sink: no stream


async def test_openai_stream_that_breaks_off_is_retryable(
    server: FakeChatServer, openai_provider: OpenAIChatProvider
) -> None:
    server.script([{"text": "this answer never ends", "cut_after": 3}])
    pieces: list[str] = []
    with pytest.raises(RetryableProviderError, match="stream ended before the answer did"):
        await openai_provider.complete([user("hi")], [], call_index=0, on_text=pieces.append)
    assert pieces == ["this ", "answer "]  # what came before the break was streamed


@pytest.mark.parametrize(
    "chunk, why",
    [
        ({"choices": [{"index": 0, "delta": {"content": 7}}]}, "content is a int"),
        (
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
                        "finish_reason": "tool_calls",
                    }
                ]
            },
            "tool call 0 has no function name",
        ),
        ({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, "neither content nor tool calls"),
        ({"choices": "nope"}, "choices is not a list"),
    ],
)
def test_stream_assembler_reports_malformed_chunks(chunk: dict[str, Any], why: str) -> None:
    from turnkeeper.activities.providers.openai_chat import StreamAssembler

    assembler = StreamAssembler()
    with pytest.raises(PermanentProviderError, match=why):
        assembler.add(chunk)
        assembler.reply()


def test_stream_assembler_takes_a_name_sent_again_in_every_piece() -> None:
    from turnkeeper.activities.providers.openai_chat import StreamAssembler

    assembler = StreamAssembler()
    for args in ('{"pa', 'th": "a"}'):
        assembler.add(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {"index": 0, "id": "c1", "function": {"name": "read_file", "arguments": args}}
                            ]
                        },
                    }
                ]
            }
        )
    (call,) = assembler.reply().tool_calls
    assert (call.id, call.name, call.arguments) == ("c1", "read_file", '{"path": "a"}')


async def test_offline_models_stream_word_by_word() -> None:
    pieces: list[str] = []
    reply = await DemoProvider(word_delay_s=0).complete(
        [user("hello there")], TOOLS, call_index=0, on_text=pieces.append
    )
    assert len(pieces) > 3 and "".join(pieces) == reply.text
    scripted: list[str] = []
    reply = await ScriptedProvider([{"text": "a b  c"}]).complete(
        [], [], call_index=0, on_text=scripted.append
    )
    assert scripted == ["a ", "b  ", "c"] and reply.text == "a b  c"
    calls_only: list[str] = []
    await ScriptedProvider([{"tool_calls": [{"name": "list_dir", "arguments": {}}]}]).complete(
        [], [], call_index=0, on_text=calls_only.append
    )
    assert calls_only == []


def test_only_an_openai_model_imports_openai(tmp_path: Path) -> None:
    """`import openai` is about a third of a worker's start: a worker on `demo` or a
    script (restarted after a crash, say) polls without it."""
    import subprocess
    import sys

    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "hi"}]))
    code = (
        "import sys\n"
        "from turnkeeper.worker import main\n"
        "from turnkeeper.activities.providers import load_provider\n"
        "load_provider('demo'); load_provider('scripted:' + sys.argv[1])\n"
        "assert 'openai' not in sys.modules, 'imported by the worker, or demo and scripted'\n"
        "load_provider('openai:m', env={'OPENAI_API_KEY': 'k'})\n"
        "assert 'openai' in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


async def test_a_cancelled_model_call_cancels_the_providers_request() -> None:
    """Stop or Dismiss cancels the model activity: the request it made goes too,
    rather than running on unseen and failing where nobody reads it."""
    from temporalio.testing import ActivityEnvironment

    from turnkeeper.activities.model_call import _unless_shutdown

    started, cancelled = asyncio.Event(), asyncio.Event()

    async def request() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def model_call() -> None:
        await _unless_shutdown(request())

    env = ActivityEnvironment()
    running = asyncio.create_task(env.run(model_call))
    await asyncio.wait_for(started.wait(), 5)
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await asyncio.wait_for(cancelled.wait(), 1)


@pytest.mark.parametrize(
    ("call_id", "usable"),
    [
        ("call_abc", True),
        ("x" * 128, True),
        ("é✓", True),
        ("", False),
        ("x" * 129, False),
        ("a\x00b", False),
        ("tab\tid", False),
        ("del\x7f", False),
        ("\ud800", False),
    ],
)
def test_a_tool_call_id_is_usable_as_a_store_key(call_id: str, usable: bool) -> None:
    from turnkeeper.activities.providers.base import usable_tool_call_id

    assert usable_tool_call_id(call_id) is usable
    (call,) = ensure_tool_call_ids([ToolCall(id=call_id, name="t")], [], call_index=3)
    assert call.id == (call_id if usable else "call_3_0")


def test_a_well_formed_reply_is_left_as_it_is() -> None:
    from turnkeeper.activities.providers.base import well_formed

    reply = ModelReply(text="é ✓ 😀", tool_calls=[ToolCall(id="c1", name="t", arguments='{"a": "\\ud800"}')])
    assert well_formed(reply) is reply  # an escape in the JSON text is no lone surrogate
