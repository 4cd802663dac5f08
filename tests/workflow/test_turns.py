"""ChatTurn end to end on a real dev server, with the real activities in an
in-process worker and the scripted model (or the fake OpenAI server)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from tests.support import Stack, until
from turnkeeper import activity_io
from turnkeeper import client as tk
from turnkeeper.models import TURN_TASK_TIMEOUT, ToolCallStatus, TurnState, TurnStatus
from turnkeeper.search_attributes import TURN_STATUS_ATTR
from turnkeeper.testing import FakeChatServer
from turnkeeper.worker import loop_activations


def _call(name: str, **arguments: object) -> dict:
    return {"name": name, "arguments": arguments}


async def test_two_sequential_tool_calls(stack: Stack) -> None:
    stack.script(
        [
            {"tool_calls": [_call("write_file", path="notes/a.txt", content="alpha")]},
            {"tool_calls": [_call("read_file", path="notes/a.txt")]},
            {"text": "a.txt says alpha"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat()
    handle = await stack.send(chat, "write then read")
    final = await handle.result()
    assert final.status == TurnStatus.COMPLETED and final.turn == 1
    assert [c.status for c in final.tool_calls] == [ToolCallStatus.DONE, ToolCallStatus.DONE]
    assert (stack.ws / "notes/a.txt").read_text() == "alpha"
    hist = await stack.history(chat)
    assert [m["role"] for m in hist] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert hist[4]["content"] == "alpha"
    assert hist[-1]["content"] == "a.txt says alpha"
    assert hist[2]["tool_call_id"] == hist[1]["tool_calls"][0]["id"]
    types = await stack.event_types(chat)
    assert types[0] == "turn_started" and types[-1] == "turn_end"
    assert types.count("tool_started") == 2 and types.count("tool_finished") == 2
    # What a plain turn costs in round trips: its steps alone. The first model call
    # numbers the turn and the last one closes it; no store write of its own, no marker.
    events = (
        await stack.client.get_workflow_handle(
            handle.id, run_id=handle.first_execution_run_id
        ).fetch_history()
    ).events
    assert [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
    ] == [
        activity_io.MODEL_CALL,
        activity_io.TOOL_CALL,
        activity_io.MODEL_CALL,
        activity_io.TOOL_CALL,
        activity_io.MODEL_CALL,
    ]
    assert [
        e.marker_recorded_event_attributes.marker_name
        for e in events
        if e.HasField("marker_recorded_event_attributes")
    ] == []
    listed = [
        wf.id async for wf in stack.client.list_workflows(f"ChatId='{chat}' AND TurnStatus='completed'")
    ]
    for _ in range(50):  # visibility is eventually consistent
        if listed:
            break
        await asyncio.sleep(0.1)
        listed = [
            wf.id async for wf in stack.client.list_workflows(f"ChatId='{chat}' AND TurnStatus='completed'")
        ]
    assert listed == [tk.workflow_id(chat)]


async def test_parallel_tool_calls_run_concurrently(stack: Stack) -> None:
    stack.env_extra["TURNKEEPER_TOOL_MODULES"] = "tests.ledger_tools"
    stack.env_extra["TURNKEEPER_TOOLS"] = "slow_write"
    stack.script(
        [
            {
                "tool_calls": [
                    _call("slow_write", path="x.txt", content="x", seconds=1.0),
                    _call("slow_write", path="y.txt", content="y", seconds=1.0),
                ]
            },
            {"text": "both written"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat()
    final = await (await stack.send(chat, "two at once")).result()
    assert final.status == TurnStatus.COMPLETED
    ledger = (stack.ws / "ledger.txt").read_text().split()
    # Both started before either finished: they ran side by side.
    assert [w for w in ledger if w in ("start", "done")] == ["start", "start", "done", "done"]
    hist = await stack.history(chat)
    assert [m["role"] for m in hist] == ["user", "assistant", "tool", "tool", "assistant"]
    call_ids = {c["id"] for c in hist[1]["tool_calls"]}
    assert {hist[2]["tool_call_id"], hist[3]["tool_call_id"]} == call_ids


async def test_follow_up_is_steered_into_the_running_turn(stack: Stack) -> None:
    stack.env_extra["TURNKEEPER_TOOL_MODULES"] = "tests.ledger_tools"
    stack.env_extra["TURNKEEPER_TOOLS"] = "slow_write"
    stack.script(
        [
            {"tool_calls": [_call("slow_write", path="f.txt", content="f", seconds=1.5)]},
            {"text": "done, and noted your follow-up"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat()
    handle = await stack.send(chat, "start", message_id="m1")
    await stack.wait_state(chat, lambda s: any(c.status == ToolCallStatus.RUNNING for c in s.tool_calls))
    await stack.send(chat, "also this", message_id="m2")
    state = await stack.state(chat)
    assert state.pending_followups == ["m2"]
    final = await handle.result()
    assert final.turn == 1 and final.status == TurnStatus.COMPLETED and final.pending_followups == []
    hist = await stack.history(chat)
    assert [(m["role"], m.get("content")) for m in hist if m["role"] == "user"] == [
        ("user", "start"),
        ("user", "also this"),
    ]
    assert [m["role"] for m in hist] == ["user", "assistant", "tool", "user", "assistant"]


async def test_the_worker_as_shipped_runs_a_turn_with_its_activations_on_its_event_loop(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unsandboxed workflow code (the default) runs on the worker's event loop thread
    (turnkeeper/worker/loop_activations.py): a turn, a follow-up signalled while its tool
    runs, a `state` query and the next turn all work there."""
    ran_on: list[int] = []
    real_run = loop_activations._run

    def run(*args: Any) -> None:
        ran_on.append(threading.get_ident())
        real_run(*args)

    monkeypatch.setattr(loop_activations, "_run", run)
    stack.env_extra["TURNKEEPER_TOOL_MODULES"] = "tests.ledger_tools"
    stack.env_extra["TURNKEEPER_TOOLS"] = "slow_write"
    stack.script(
        [
            {"tool_calls": [_call("slow_write", path="f.txt", content="f", seconds=1.0)]},
            {"text": "done, and noted your follow-up"},
            {"text": "second turn"},
        ]
    )
    await stack.start_worker(TURNKEEPER_WORKFLOW_SANDBOX="off")
    chat = stack.chat()
    handle = await stack.send(chat, "start", message_id="m1")
    await stack.wait_state(chat, lambda s: any(c.status == ToolCallStatus.RUNNING for c in s.tool_calls))
    await stack.send(chat, "also this", message_id="m2")
    assert (await stack.state(chat)).pending_followups == ["m2"]
    final = await handle.result()
    assert final.status == TurnStatus.COMPLETED and final.pending_followups == []
    second = await (await stack.send(chat, "again", message_id="m3")).result()
    assert second.turn == 2 and second.status == TurnStatus.COMPLETED
    hist = await stack.history(chat)
    assert [m["content"] for m in hist if m["role"] == "user"] == ["start", "also this", "again"]
    assert len(ran_on) >= 8 and set(ran_on) == {threading.get_ident()}


async def test_follow_up_after_the_answer_starts_the_next_turn(stack: Stack) -> None:
    stack.script([{"text": "first"}, {"text": "second"}])
    await stack.start_worker()
    chat = stack.chat()
    first = await (await stack.send(chat, "one")).result()
    assert first.turn == 1
    second = await (await stack.send(chat, "two")).result()
    assert second.turn == 2 and second.status == TurnStatus.COMPLETED
    assert [m.get("content") for m in await stack.history(chat)] == ["one", "first", "two", "second"]


async def test_message_during_the_final_model_call_becomes_the_next_turn(stack: Stack) -> None:
    with FakeChatServer() as server:
        server.script([{"text": "answer one", "delay": 1.5}, {"text": "answer two"}])
        _use_fake_model(stack, server)
        await stack.start_worker()
        chat = stack.chat()
        handle = await stack.send(chat, "one", message_id="a")
        await until(lambda: len(server.requests) == 1, what="the final model call under way")
        await stack.send(chat, "two", message_id="b")
        await stack.wait_turn_done(chat, 2)
        hist = await stack.history(chat)
        assert [m.get("content") for m in hist] == ["one", "answer one", "two", "answer two"]
        # The first run handed "two" on by continue-as-new.
        desc = await stack.client.get_workflow_handle(
            tk.workflow_id(chat), run_id=handle.result_run_id
        ).describe()
        assert desc.status == WorkflowExecutionStatus.CONTINUED_AS_NEW
        # Both runs keep the short workflow task timeout: a dead worker's task holds the turn 3 s, not 10.
        latest = await stack.client.get_workflow_handle(tk.workflow_id(chat)).describe()
        for d in (desc, latest):
            timeout = d.raw_description.execution_config.default_workflow_task_timeout
            assert timeout.ToTimedelta() == TURN_TASK_TIMEOUT


async def test_duplicate_message_id_counts_once(stack: Stack) -> None:
    stack.script([{"text": "hello back"}, {"text": "never used"}])
    await stack.start_worker()
    chat = stack.chat()
    first = await stack.send(chat, "hello", message_id="same")
    await stack.send(chat, "hello", message_id="same")
    await first.result()
    # A retry after the turn ended is still the same message: its run begins no turn.
    retry = await stack.send(chat, "hello", message_id="same")
    assert retry.result_run_id != first.result_run_id
    again = await retry.result()
    assert again.status == TurnStatus.COMPLETED
    hist = await stack.history(chat)
    assert [m.get("content") for m in hist] == ["hello", "hello back"]
    assert (await (await stack.store()).get_turn(chat)).turn == 1
    # That run closes listed as it ended, not as a turn still running.
    attributes = (await retry.describe()).typed_search_attributes
    assert attributes.get(TURN_STATUS_ATTR) == "completed"


async def test_unknown_tool_becomes_a_result_the_model_sees(stack: Stack) -> None:
    stack.script([{"tool_calls": [_call("launch_rockets", count=3)]}, {"text": "cannot do that"}])
    await stack.start_worker()
    chat = stack.chat()
    final = await (await stack.send(chat, "launch")).result()
    assert final.status == TurnStatus.COMPLETED
    assert final.tool_calls[0].status == ToolCallStatus.ERROR
    tool_row = (await stack.history(chat))[2]
    assert tool_row["role"] == "tool" and "unknown tool" in tool_row["content"]


async def test_workspace_escape_is_refused(stack: Stack) -> None:
    stack.script(
        [{"tool_calls": [_call("write_file", path="../outside.txt", content="x")]}, {"text": "refused"}]
    )
    await stack.start_worker()
    chat = stack.chat()
    final = await (await stack.send(chat, "escape")).result()
    assert final.tool_calls[0].status == ToolCallStatus.ERROR
    assert not (stack.dir / "outside.txt").exists()
    assert "escapes the workspace" in (await stack.history(chat))[2]["content"]


async def test_malformed_arguments_and_output_through_openai(stack: Stack) -> None:
    with FakeChatServer() as server:
        server.script(
            [
                {"tool_calls": [{"name": "write_file", "arguments": "{not json"}]},
                {"tool_calls": [{"name": "write_file", "arguments": {"path": "o.txt", "content": "ok"}}]},
                {"raw": {"id": "x", "object": "chat.completion", "choices": []}},
            ]
        )
        stack.env_extra.update(
            {
                "TURNKEEPER_MODEL": "openai:fake-model",
                "OPENAI_BASE_URL": server.base_url,
                "OPENAI_API_KEY": "sk-test-secret",
            }
        )
        await stack.start_worker()
        chat = stack.chat()
        await stack.send(chat, "go")
        state = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
        assert state.reason.value == "model_failed"
        hist = await stack.history(chat)
        assert "malformed arguments" in hist[2]["content"]
        assert (stack.ws / "o.txt").read_text() == "ok"
        # The history the fake server saw is the committed one, in OpenAI's shape.
        sent = server.requests[1]["messages"]
        assert sent[1]["tool_calls"][0]["function"]["arguments"] == "{not json"
        assert sent[2]["role"] == "tool"
        # Dismiss closes the turn; nothing runs again.
        done = await stack.decide(chat, "dismiss", state.recovery_id)
        assert done.status == TurnStatus.RECOVERED and done.reason.value == "dismissed"
        await stack.client.get_workflow_handle(tk.workflow_id(chat)).result()
        assert len(server.requests) == 3


async def test_oversized_and_malformed_messages_are_refused(stack: Stack) -> None:
    stack.script([{"text": "fine"}])
    await stack.start_worker()
    chat = stack.chat()
    with pytest.raises(tk.MessageTooLarge):
        tk.new_message("x" * (stack.settings().max_message_bytes + 1), stack.settings())
    # Straight to the workflow, bypassing the client's check: refused, nothing wedged.
    handle = await stack.client.start_workflow(
        tk.WORKFLOW_TYPE,
        {"chat_id": chat},
        id=tk.workflow_id(chat),
        task_queue=stack.task_queue,
        start_signal="user_message",
        start_signal_args=[{"message_id": "big", "text": "y" * 70_000}],
        result_type=TurnState,
    )
    await handle.signal("user_message", {"text": "no id"})
    await handle.signal("user_message", "not an object")
    await handle.signal("user_message", {"message_id": "ok", "text": "hi"})
    final = await handle.result()
    assert final.status == TurnStatus.COMPLETED and final.turn == 1
    hist = await stack.history(chat)
    assert [m.get("content") for m in hist] == ["hi", "fine"]
    events = await (await stack.store()).events(chat)
    rejected = [e.payload for e in events if e.type == "message_rejected"]
    assert len(rejected) == 3
    # The first message is judged against the configured limit once the run reads it.
    big = [r for r in rejected if r["message_id"] == "big"]
    assert len(big) == 1 and "limit" in big[0]["reason"]
    assert all("malformed" in r["reason"] for r in rejected if r is not big[0])


async def test_an_answer_over_the_payload_limit_still_completes_the_turn(stack: Stack) -> None:
    """Bigger than Temporal's 2 MB payload limit: the model activity's result cannot
    be recorded, but the answer is already committed in the store, and the store's
    completion wins, so the turn completes with it (and the history stays small)."""
    answer = "x" * (2_500_000)
    stack.script([{"text": answer}])
    await stack.start_worker()
    chat = stack.chat()
    final = await (await stack.send(chat, "write a lot")).result()
    assert final.status == TurnStatus.COMPLETED
    assert (await stack.history(chat))[-1]["content"] == answer
    history = await stack.client.get_workflow_handle(tk.workflow_id(chat)).fetch_history()
    assert sum(e.ByteSize() for e in history.events) < 20_000


async def test_undecodable_payloads_are_refused_at_once(stack: Stack) -> None:
    """Payloads the data converter cannot read (an unknown encoding, broken JSON),
    as any Temporal client can send them: refused with a `message_rejected` event
    while the run still waits for its first message, and the chat goes on."""
    from temporalio.api.common.v1 import Payload, Payloads, WorkflowType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import SignalWithStartWorkflowExecutionRequest

    stack.script([{"text": "fine"}])
    await stack.start_worker()
    chat = stack.chat()

    def raw(encoding: bytes, data: bytes) -> Payloads:
        return Payloads(payloads=[Payload(metadata={"encoding": encoding}, data=data)])

    for i, signal_input in enumerate([raw(b"foo/bar", b"x"), raw(b"json/plain", b"{not json")]):
        await stack.client.workflow_service.signal_with_start_workflow_execution(
            SignalWithStartWorkflowExecutionRequest(
                namespace=stack.client.namespace,
                workflow_id=tk.workflow_id(chat),
                request_id=f"{chat}-{i}",
                workflow_type=WorkflowType(name=tk.WORKFLOW_TYPE),
                task_queue=TaskQueue(name=stack.task_queue),
                input=raw(b"json/plain", b'{"chat_id": "%s"}' % chat.encode()),
                signal_name="user_message",
                signal_input=signal_input,
            )
        )
    store = await stack.store()
    reasons: list[str] = []
    for _ in range(100):  # long before the run's idle timeout
        reasons = [e.payload["reason"] for e in await store.events(chat) if e.type == "message_rejected"]
        if len(reasons) == 2:
            break
        await asyncio.sleep(0.1)
    assert reasons == [
        "malformed user_message payload: Unknown payload encoding foo/bar",
        reasons[1],
    ] and reasons[1].startswith("malformed user_message payload: not JSON")
    assert (await stack.state(chat)).turn == 0  # no turn began

    handle = await stack.send(chat, "hi")
    final = await handle.result()
    assert final.status == TurnStatus.COMPLETED and final.turn == 1
    assert [m.get("content") for m in await stack.history(chat)] == ["hi", "fine"]
    types = await stack.event_types(chat)
    assert types[:3] == ["message_rejected", "message_rejected", "turn_started"]


async def test_next_message_closes_a_turn_that_ended_abnormally(stack: Stack) -> None:
    stack.env_extra["TURNKEEPER_TOOL_MODULES"] = "tests.ledger_tools"
    stack.env_extra["TURNKEEPER_TOOLS"] = "slow_write"
    stack.script(
        [
            {"tool_calls": [_call("slow_write", path="t.txt", content="t", seconds=30)]},
            {"text": "unused: the superseded row is assistant call 1"},
            {"text": "fresh answer"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat()
    handle = await stack.send(chat, "first")
    await stack.wait_state(chat, lambda s: any(c.status == ToolCallStatus.RUNNING for c in s.tool_calls))
    await handle.terminate("operator pulled the plug")

    final = await (await stack.send(chat, "second")).result()
    assert final.turn == 2 and final.status == TurnStatus.COMPLETED
    hist = await stack.history(chat)
    assert [m["role"] for m in hist] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert "interrupted" in hist[2]["content"] and hist[2]["tool_call_id"] == hist[1]["tool_calls"][0]["id"]
    assert "superseded" in hist[3]["content"]
    turn1 = await (await stack.store()).get_turn(chat, 1)
    assert (turn1.status.value, turn1.reason.value) == ("recovered", "superseded")


async def test_the_turns_own_message_is_no_pending_follow_up_while_its_first_call_runs(stack: Stack) -> None:
    """`pending_followups` lists what no call has taken: not the message the running
    first model call commits, only a follow-up sent while it runs."""
    with FakeChatServer() as server:
        server.script([{"text": "slow answer", "delay": 2.0}, {"text": "answer two"}])
        _use_fake_model(stack, server)
        await stack.start_worker()
        chat = stack.chat()
        await stack.send(chat, "one", message_id="a")
        await until(lambda: len(server.requests) == 1, what="the first model call under way")
        assert (await stack.state(chat)).pending_followups == []
        await stack.send(chat, "two", message_id="b")
        assert (await stack.wait_state(chat, lambda s: s.pending_followups != [])).pending_followups == ["b"]
        await stack.wait_turn_done(chat, 2)


async def test_cancelling_the_run_is_stop(stack: Stack) -> None:
    """The UI's "Request Cancellation" (`temporal workflow cancel`) stops the turn as Stop
    does: the running call cancelled, the turn ended recovered/stopped, no gate opened."""
    with FakeChatServer() as server:
        server.script([{"text": "never seen", "delay": 20}])
        _use_fake_model(stack, server)
        await stack.start_worker()
        chat = stack.chat()
        handle = await stack.send(chat, "one", message_id="a")
        await until(lambda: len(server.requests) == 1, what="the model call under way")
        await until_turn_row(stack, chat)
        await stack.client.get_workflow_handle(tk.workflow_id(chat)).cancel()
        final = await asyncio.wait_for(handle.result(), 30)
        assert (final.status.value, final.reason and final.reason.value) == ("recovered", "stopped")
        record = await (await stack.store()).get_turn(chat, 1)
        assert (record.status.value, record.reason and record.reason.value) == ("recovered", "stopped")
        assert "awaiting_user" not in await stack.event_types(chat) and not any(
            e.payload.get("status") == "awaiting_user" for e in await (await stack.store()).events(chat)
        )


async def until_turn_row(stack: Stack, chat: str) -> None:
    for _ in range(100):
        if await (await stack.store()).get_turn(chat, 1) is not None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the first model call never numbered the turn")


def _use_fake_model(stack: Stack, server: FakeChatServer) -> None:
    stack.env_extra.update(
        {"TURNKEEPER_MODEL": "openai:fake-model", "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "k"}
    )
