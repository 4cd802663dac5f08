"""Gates, Continue and Dismiss, supersede, Stop, clean hand-off and the resume
window, on a real dev server with real worker processes and SIGKILL/SIGTERM."""
from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.worker import Worker

from tests.support import Stack, until, until_async
from turnkeeper import activity_io
from turnkeeper import client as tk
from turnkeeper.activities.assemble import build_activities
from turnkeeper.activities.providers import load_provider
from turnkeeper.activities.store import open_store
from turnkeeper.activities.tools import default_registry
from turnkeeper.models import (
    SUPERSEDED_TEXT,
    ChatTurnInput,
    Reason,
    RecoveryAction,
    RecoveryStart,
    ToolCallStatus,
    TurnState,
    TurnStatus,
)
from turnkeeper.testing import FakeChatServer
from turnkeeper.worker import check_tools
from turnkeeper.workflows.chat_turn import ChatTurn

pytestmark = pytest.mark.crash


def _call(name: str, **arguments: object) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def _slow_tools(stack: Stack, ledger: Path | None = None) -> None:
    stack.env_extra.update({"TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
                            "TURNKEEPER_TOOLS": "slow_write,write_file"})
    if ledger is not None:
        stack.env_extra["TK_LEDGER"] = str(ledger)


def _fake_model(stack: Stack, server: FakeChatServer) -> None:
    stack.env_extra.update({"TURNKEEPER_MODEL": "openai:fake", "OPENAI_BASE_URL": server.base_url,
                            "OPENAI_API_KEY": "k"})


async def _decide(stack: Stack, chat: str, update: str, recovery_id: str | None) -> TurnState:
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
    return await handle.execute_update(update, RecoveryAction(recovery_id=recovery_id or ""),
                                       result_type=TurnState)


def _awaiting(s: TurnState) -> bool:
    return s.status == TurnStatus.AWAITING_USER


async def test_lost_model_call_waits_then_continue_and_loop_guard(stack: Stack) -> None:
    with FakeChatServer() as server:
        server.script([{"text": "never delivered", "delay": 30}, {"text": "also lost", "delay": 30},
                       {"text": "third time lucky"}])
        _fake_model(stack, server)
        first = stack.spawn_worker()
        chat = stack.chat()
        await stack.send(chat, "hello")
        await until(lambda: len(server.requests) == 1, what="model call under way")
        stack.kill(first)
        second = stack.spawn_worker()
        gate = await stack.wait_state(chat, _awaiting, timeout=45)
        assert gate.reason == Reason.RESTART_REQUIRES_CONFIRMATION and gate.can_continue
        assert gate.attempts == 0 and gate.recovery_id

        resumed = await _decide(stack, chat, "continue_turn", gate.recovery_id)
        assert (resumed.status, resumed.reason, resumed.attempts) == (
            TurnStatus.RESUMING, Reason.USER_CONFIRMED, 1)
        await until(lambda: len(server.requests) == 2, what="resumed model call")
        stack.kill(second)  # the resumed step is lost too: never retried by itself
        stack.spawn_worker()
        guard = await stack.wait_state(chat, _awaiting, timeout=45)
        assert guard.reason == Reason.LOOP_GUARD and guard.attempts == 1
        assert guard.recovery_id == gate.recovery_id  # kept until the turn ends
        await asyncio.sleep(1)
        assert len(server.requests) == 2

        await _decide(stack, chat, "continue_turn", guard.recovery_id)
        done = await stack.wait_turn_done(chat, 1)
        assert (done.status, done.reason, done.attempts) == (TurnStatus.RECOVERED, Reason.CONTINUED, 2)
        hist = await stack.history(chat)
        assert [m["content"] for m in hist] == ["hello", "third time lucky"]


async def test_stale_ids_double_continue_and_unavailable_context(stack: Stack) -> None:
    server = FakeChatServer([{"status": 400, "message": "provider says no"}, {"text": "after continue"}])
    with server:
        _fake_model(stack, server)
        await _stale_ids_double_continue_and_unavailable_context(stack)


async def _stale_ids_double_continue_and_unavailable_context(stack: Stack) -> None:
    await stack.start_worker()
    chat = stack.chat()
    await stack.send(chat, "hi")
    gate = await stack.wait_state(chat, _awaiting)
    assert gate.reason == Reason.MODEL_FAILED

    with pytest.raises(WorkflowUpdateFailedError) as stale:
        await _decide(stack, chat, "continue_turn", "not-the-id")
    assert "stale" in str(stale.value.cause)
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
    await handle.signal("continue", {"recovery_id": "not-the-id"})
    await handle.signal("dismiss", {"recovery_id": "also-wrong"})
    # Unreadable ones are refused and recorded too, never dropped unseen.
    await stack.signal_undecodable(chat, "continue")
    await stack.signal_undecodable(chat, "dismiss")
    await asyncio.sleep(0.5)
    assert (await stack.state(chat)).status == TurnStatus.AWAITING_USER
    rejected = [e.payload for e in await (await stack.store()).events(chat) if e.type == "recovery_action_rejected"]
    assert [(r["action"], r["recovery_id"]) for r in rejected] == [
        ("continue", "not-the-id"), ("dismiss", "also-wrong"), ("continue", None), ("dismiss", None)]

    await _decide(stack, chat, "continue_turn", gate.recovery_id)
    with pytest.raises(WorkflowUpdateFailedError) as again:
        await _decide(stack, chat, "continue_turn", gate.recovery_id)
    assert "not waiting for confirmation" in str(again.value.cause)
    done = await stack.wait_turn_done(chat, 1)
    assert done.reason == Reason.CONTINUED and done.attempts == 1
    assert [m["content"] for m in await stack.history(chat)] == ["hi", "after continue"]

    # A recovery run whose context is gone: Continue is refused, Dismiss always works.
    other = stack.chat()
    store = await stack.store()
    await store.begin_turn(other, "lost-run", ["m1"])
    from turnkeeper.models import UserMessage
    await store.commit_user_messages(other, 1, [UserMessage(message_id="m1", text="lost")])
    await stack.client.start_workflow(
        "ChatTurn", ChatTurnInput(chat_id=other, recovery=RecoveryStart(
            turn=1, reason=Reason.CHECKPOINT_UNKNOWN, can_continue=False)),
        id=tk.workflow_id(other), task_queue=stack.task_queue)
    gate = await stack.wait_state(other, _awaiting)
    assert gate.reason == Reason.CHECKPOINT_UNKNOWN and not gate.can_continue
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await _decide(stack, other, "continue_turn", gate.recovery_id)
    assert "context is unavailable" in str(refused.value.cause)
    dismissed = await _decide(stack, other, "dismiss_turn", gate.recovery_id)
    assert dismissed.status == TurnStatus.RECOVERED and dismissed.reason == Reason.DISMISSED
    assert [m["role"] for m in await stack.history(other)] == ["user", "assistant"]


async def test_pending_follow_ups_wait_and_a_newer_message_supersedes(stack: Stack) -> None:
    with FakeChatServer() as server:
        server.script([{"status": 400, "message": "bad request", "delay": 1.5},
                       {"text": "answering both"}])
        _fake_model(stack, server)
        await stack.start_worker()
        chat = stack.chat()
        await stack.send(chat, "first", message_id="m1")
        await until(lambda: len(server.requests) == 1, what="model call under way")
        await stack.send(chat, "pending before the gate", message_id="m2")
        gate = await stack.wait_state(chat, _awaiting)
        # Pending when the turn was interrupted: not consent, no supersede.
        assert gate.reason == Reason.MODEL_FAILED and gate.pending_followups == ["m2"]
        await asyncio.sleep(0.5)
        assert (await stack.state(chat)).status == TurnStatus.AWAITING_USER

        await stack.send(chat, "newer", message_id="m3")
        done = await stack.wait_turn_done(chat, 2)
        assert done.status == TurnStatus.COMPLETED
        turn1 = await (await stack.store()).get_turn(chat, 1)
        assert (turn1.status, turn1.reason) == (TurnStatus.RECOVERED, Reason.SUPERSEDED)
        hist = await stack.history(chat)
        assert [m["content"] for m in hist] == [
            "first", SUPERSEDED_TEXT, "pending before the gate", "newer", "answering both"]


async def test_a_late_retry_of_a_committed_message_does_not_supersede(stack: Stack) -> None:
    with FakeChatServer() as server:
        server.script([{"status": 400, "message": "bad request"}])
        _fake_model(stack, server)
        await stack.start_worker()
        chat = stack.chat()
        await stack.send(chat, "first", message_id="m1")
        gate = await stack.wait_state(chat, _awaiting)
        await stack.send(chat, "first", message_id="m1")  # the client retries, late
        await asyncio.sleep(1.0)
        state = await stack.state(chat)
        assert (state.status, state.recovery_id) == (TurnStatus.AWAITING_USER, gate.recovery_id)
        assert state.pending_followups == []
        done = await _decide(stack, chat, "dismiss_turn", gate.recovery_id)
        assert done.reason == Reason.DISMISSED
        assert [m["content"] for m in await stack.history(chat)][:1] == ["first"]
        assert [m["role"] for m in await stack.history(chat)].count("user") == 1


async def test_a_retry_that_comes_while_the_gate_checks_another_does_not_supersede(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate asks the store whether a message is a retry of one it holds. A
    second retry that comes while it asks is judged on its own: whether the SDK
    hands it to the workflow before or after the store's answer must not matter
    (here before: the check outlives the workflow task, whose heartbeat brings the
    signal in first). Earlier, a newcomer seen after the answer let the supersede
    stand, and a retry closed the turn."""
    from turnkeeper.activities.store.core import SQLStore
    checked = SQLStore.held_message_ids

    async def slow_check(self: SQLStore, chat_id: str, message_ids: list[str]) -> list[str]:
        await asyncio.sleep(1.8)  # past the task's heartbeat, at 80% of its 2 s timeout
        return await checked(self, chat_id, message_ids)

    with FakeChatServer() as server:
        server.script([{"text": "one"}, {"text": "two"}, {"status": 400, "message": "bad request"}])
        _fake_model(stack, server)
        await stack.start_worker()
        chat = stack.chat()
        for turn, message_id in enumerate(("m1", "m2"), start=1):
            await stack.send(chat, f"text of {message_id}", message_id=message_id)
            await stack.wait_turn_done(chat, turn)
        await stack.send(chat, "text of m3", message_id="m3")
        gate = await stack.wait_state(chat, lambda s: s.turn == 3 and _awaiting(s))
        monkeypatch.setattr(SQLStore, "held_message_ids", slow_check)
        await stack.send(chat, "text of m1", message_id="m1")  # late retries of committed messages
        await asyncio.sleep(0.6)
        await stack.send(chat, "text of m2", message_id="m2")
        await asyncio.sleep(4.5)  # both checks
        state = await stack.state(chat)
        assert (state.turn, state.status, state.recovery_id) == (3, TurnStatus.AWAITING_USER, gate.recovery_id)
        assert state.pending_followups == []
        monkeypatch.setattr(SQLStore, "held_message_ids", checked)
        done = await _decide(stack, chat, "dismiss_turn", gate.recovery_id)
        assert done.reason == Reason.DISMISSED
        users = [m["content"] for m in await stack.history(chat) if m["role"] == "user"]
        assert users == ["text of m1", "text of m2", "text of m3"]


async def test_dismiss_commits_pending_follow_ups_without_model_work(stack: Stack) -> None:
    with FakeChatServer() as server:
        server.script([{"status": 400, "message": "bad request", "delay": 1.5}])
        _fake_model(stack, server)
        await stack.start_worker()
        chat = stack.chat()
        await stack.send(chat, "first", message_id="m1")
        await until(lambda: len(server.requests) == 1, what="model call under way")
        await stack.send(chat, "second", message_id="m2")
        gate = await stack.wait_state(chat, _awaiting)
        done = await _decide(stack, chat, "dismiss_turn", gate.recovery_id)
        assert done.reason == Reason.DISMISSED
        handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
        await handle.result()
        hist = await stack.history(chat)
        assert [m["role"] for m in hist] == ["user", "user", "assistant"]
        assert [m["content"] for m in hist][:2] == ["first", "second"]
        assert len(server.requests) == 1


async def test_new_message_supersedes_a_running_recovery(stack: Stack) -> None:
    with FakeChatServer() as server:
        server.script([{"status": 400, "message": "bad"}, {"text": "slow resumed answer", "delay": 20},
                       {"text": "the new turn"}])
        _fake_model(stack, server)
        await stack.start_worker()
        chat = stack.chat()
        handle = await stack.send(chat, "one", message_id="m1")
        gate = await stack.wait_state(chat, _awaiting)
        await _decide(stack, chat, "continue_turn", gate.recovery_id)
        await until(lambda: len(server.requests) == 2, what="resumed call under way")
        await stack.send(chat, "two", message_id="m2")
        done = await stack.wait_turn_done(chat, 2, timeout=30)
        assert done.status == TurnStatus.COMPLETED
        turn1 = await (await stack.store()).get_turn(chat, 1)
        assert (turn1.status, turn1.reason) == (TurnStatus.RECOVERED, Reason.SUPERSEDED)
        hist = await stack.history(chat)
        assert [m["content"] for m in hist] == ["one", SUPERSEDED_TEXT, "two", "the new turn"]
        # The store check of "two" is judged after an activity's completion, never on
        # its own result: the call is cancelled after `end_of_run` (patches.RECOVERY_MACHINE_10).
        first = await stack.client.get_workflow_handle(tk.workflow_id(chat), run_id=handle.first_execution_run_id
                                                       ).fetch_history()
        assert _steps_around_the_cancel(first) == [activity_io.HELD_MESSAGES, activity_io.END_OF_RUN,
                                                   f"cancel {activity_io.MODEL_CALL}"]


async def test_a_newer_message_that_comes_with_a_continued_steps_end_starts_the_next_turn(stack: Stack) -> None:
    """A newer message sent while a continued turn's tool runs and no worker takes
    workflow tasks, then a worker that caches no run (it replays the whole history
    at every task, as one taking the run over does): the message supersedes the
    continuation and starts the next turn. The shape of chaos seed 582 also needs
    a task that times out between the tool's end and the message, which this test
    does not force; tests/replay/test_replay.py replays that run
    (`test_a_newer_message_that_came_with_a_continued_steps_end_is_handed_on`)."""
    with FakeChatServer() as server:
        server.script([{"status": 400, "message": "bad"},
                       {"tool_calls": [_call("slow_write", path="s.txt", content="s", seconds=2)]},
                       {"text": "continued answer"}, {"text": "the new turn"}])
        _fake_model(stack, server)
        _slow_tools(stack)
        settings = stack.settings()
        check_tools(settings)  # the ledger tools, as the worker loads them
        store = open_store(settings)
        await store.open()
        provider = load_provider(settings.model, env=settings.provider_env())

        def activities() -> list[Any]:
            return build_activities(settings, store, provider, default_registry())

        def workflows_only(cached: int = 100) -> Worker:  # workflow tasks and store writes
            return Worker(stack.client, task_queue=stack.task_queue, workflows=[ChatTurn],
                          activities=activities(), no_remote_activities=True, max_cached_workflows=cached)
        steps = Worker(stack.client, task_queue=stack.task_queue, activities=activities())
        chat = stack.chat()
        try:
            async with steps:
                async with workflows_only():
                    handle = await stack.send(chat, "one", message_id="m1")
                    gate = await stack.wait_state(chat, _awaiting)
                    await _decide(stack, chat, "continue_turn", gate.recovery_id)
                    await stack.wait_state(chat, lambda s: any(c.status == ToolCallStatus.RUNNING
                                                               for c in s.tool_calls))
                # No worker takes workflow tasks now: the message and the tool's end
                # wait for the next one together.
                await stack.send(chat, "two", message_id="m2")
                events = stack.client.get_workflow_handle(tk.workflow_id(chat), run_id=handle.result_run_id)

                async def tool_done() -> bool:
                    history = await events.fetch_history()
                    return any(e.HasField("activity_task_completed_event_attributes") for e in history.events[-4:])
                await until_async(tool_done, timeout=20, what="the tool's end in the history")
                # Caching no run, it replays the whole history at every task, as a worker
                # that takes the run over does: there the message comes first.
                async with workflows_only(cached=0):
                    done = await stack.wait_turn_done(chat, 2, timeout=30)
            assert done.status == TurnStatus.COMPLETED
            rows = await (await stack.store()).transcript_rows(chat)
            assert [(r.message.content, r.turn) for r in rows if r.message.role == "user"] == [("one", 1), ("two", 2)]
            turn2 = await (await stack.store()).get_turn(chat, 2)
            assert turn2 is not None and turn2.status == TurnStatus.COMPLETED
        finally:
            await store.close()


def _steps_around_the_cancel(history: Any) -> list[str]:
    """From the resumed model call on to the first cancel: the store checks, the other
    activities scheduled, and that cancel."""
    names: dict[int, str] = {}
    seen: list[str] = []
    for e in history.events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            name = names[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
            if name == activity_io.MODEL_CALL:
                seen = []  # the last model call's
            else:
                seen.append(name)
        elif e.HasField("marker_recorded_event_attributes") and \
                activity_io.HELD_MESSAGES.encode() in e.marker_recorded_event_attributes.SerializeToString():
            seen.append(activity_io.HELD_MESSAGES)
        elif e.HasField("activity_task_cancel_requested_event_attributes"):
            scheduled = e.activity_task_cancel_requested_event_attributes.scheduled_event_id
            return [*seen, f"cancel {names[scheduled]}"]
    return seen


async def test_stop_keeps_completed_results_and_interrupts_running_tools(stack: Stack) -> None:
    ledger = stack.ws / "ledger.txt"  # in-process worker: the tools' default ledger
    _slow_tools(stack)
    stack.script([{"tool_calls": [_call("write_file", path="fast.txt", content="f"),
                                  _call("slow_write", path="slow.txt", content="s", seconds=20)]}])
    await stack.start_worker()
    chat = stack.chat()
    handle = await stack.send(chat, "do both")
    await stack.wait_state(chat, lambda s: [c.status for c in s.tool_calls] == [
        ToolCallStatus.DONE, ToolCallStatus.RUNNING])
    await stack.signal_undecodable(chat, "stop")  # Stop needs no argument: whatever it carries works
    final = await asyncio.wait_for(handle.result(), 30)
    assert (final.status, final.reason) == (TurnStatus.RECOVERED, Reason.STOPPED)
    assert [c.status for c in final.tool_calls] == [ToolCallStatus.DONE, ToolCallStatus.INTERRUPTED]
    hist = await stack.history(chat)
    assert [m["role"] for m in hist] == ["user", "assistant", "tool", "tool", "assistant"]
    assert hist[2]["content"].startswith("wrote") and "interrupted" in hist[3]["content"]
    assert "done" not in ledger.read_text()


async def test_step_nobody_picks_up_within_the_resume_window_asks_the_user(stack: Stack) -> None:
    stack.script([{"text": "finally"}])
    settings = stack.settings(TURNKEEPER_RESUME_WINDOW="2")
    store = open_store(settings)
    await store.open()
    provider = load_provider(settings.model)
    # Workflow tasks and store writes only: no worker takes the model call.
    workflows_only = Worker(stack.client, task_queue=stack.task_queue, workflows=[ChatTurn],
                            activities=build_activities(settings, store, provider, default_registry()),
                            no_remote_activities=True)
    chat = stack.chat()
    try:
        async with workflows_only:
            await stack.send(chat, "anyone there?")
            gate = await stack.wait_state(chat, _awaiting, timeout=20)
            assert gate.reason == Reason.RESTART_REQUIRES_CONFIRMATION
            # A process: one client holds one worker per queue. Serving before the
            # decision, or the 2 s window could pass again while it starts.
            await stack.wait_serving(stack.spawn_worker())
            await _decide(stack, chat, "continue_turn", gate.recovery_id)
            done = await stack.wait_turn_done(chat, 1)
            assert done.reason == Reason.CONTINUED
    finally:
        await store.close()


async def test_sigterm_hands_a_model_call_to_the_next_worker(stack: Stack) -> None:
    with FakeChatServer() as server:
        server.script([{"text": "cut off", "delay": 30}, {"text": "from the other worker"}])
        _fake_model(stack, server)
        first = stack.spawn_worker()
        chat = stack.chat()
        handle = await stack.send(chat, "hello")
        await until(lambda: len(server.requests) == 1, what="model call under way")
        stack.spawn_worker()
        await asyncio.sleep(2)
        stack.kill(first, signal.SIGTERM)
        assert first.returncode == 0
        final = await asyncio.wait_for(handle.result(), 30)
        assert final.status == TurnStatus.COMPLETED and final.reason is None
        assert [m["content"] for m in await stack.history(chat)] == ["hello", "from the other worker"]


async def test_sigterm_lets_a_running_tool_finish_within_the_grace(stack: Stack) -> None:
    ledger = stack.dir / "ledger.txt"
    _slow_tools(stack, ledger)
    stack.script([{"tool_calls": [_call("slow_write", path="g.txt", content="g", seconds=3)]},
                  {"text": "finished"}])
    first = stack.spawn_worker()
    chat = stack.chat()
    handle = await stack.send(chat, "slow")
    await until(lambda: ledger.exists() and "start" in ledger.read_text(), what="tool started")
    stack.spawn_worker()
    stack.kill(first, signal.SIGTERM)
    final = await asyncio.wait_for(handle.result(), 40)
    assert final.status == TurnStatus.COMPLETED
    assert ledger.read_text().split()[::2] == ["start", "done"]
    assert (stack.ws / "g.txt").read_text() == "g"


async def test_tool_outliving_the_grace_is_state_unknown(stack: Stack) -> None:
    ledger = stack.dir / "ledger.txt"
    _slow_tools(stack, ledger)
    stack.script([{"tool_calls": [_call("slow_write", path="h.txt", content="h", seconds=20)]}])
    first = stack.spawn_worker(TURNKEEPER_SHUTDOWN_GRACE="1")
    chat = stack.chat()
    await stack.send(chat, "too slow")
    await until(lambda: ledger.exists() and "start" in ledger.read_text(), what="tool started")
    stack.spawn_worker()
    stack.kill(first, signal.SIGTERM)
    gate = await stack.wait_state(chat, _awaiting, timeout=40)
    assert gate.reason == Reason.TOOL_STATE_UNKNOWN
    assert "done" not in ledger.read_text()


async def test_21_follow_ups_around_a_kill_are_committed_once_in_order(stack: Stack) -> None:
    _slow_tools(stack)
    stack.script([{"tool_calls": [_call("slow_write", path="k.txt", content="k", seconds=30)]},
                  {"text": "unused: the superseded row is assistant call 1"},
                  {"text": "read all 21"}] + [{"text": "spare"}] * 20)  # late ones may make more turns
    first = stack.spawn_worker()
    chat = stack.chat()
    await stack.send(chat, "start", message_id="m00")
    await stack.wait_state(chat, lambda s: any(c.status == ToolCallStatus.RUNNING for c in s.tool_calls))
    ids = [f"m{i:02d}" for i in range(1, 22)]
    for mid in ids[:10]:
        await stack.send(chat, f"follow-up {mid}", message_id=mid)
    stack.kill(first)
    for mid in ids[10:14]:  # worker dead, gate not yet open: still follow-ups
        await stack.send(chat, f"follow-up {mid}", message_id=mid)
    stack.spawn_worker()
    await stack.wait_state(chat, _awaiting, timeout=45)
    for mid in ids[14:]:  # after the gate: the first one supersedes it
        await stack.send(chat, f"follow-up {mid}", message_id=mid)
    await stack.send(chat, "follow-up m05", message_id="m05")  # a client retry
    expected = ["start"] + [f"follow-up {mid}" for mid in ids]
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        state = await stack.state(chat)
        hist = await stack.history(chat)
        users = [m["content"] for m in hist if m["role"] == "user"]
        if (state.status == TurnStatus.COMPLETED and not state.pending_followups and len(users) >= 22
                and hist[-1]["role"] == "assistant"):
            break
        await asyncio.sleep(0.2)
    assert users == expected, (state, hist)
    assert hist[-1]["content"] in ("read all 21", "spare"), (state, hist[-6:])
    turn1 = await (await stack.store()).get_turn(chat, 1)
    assert (turn1.status, turn1.reason) == (TurnStatus.RECOVERED, Reason.SUPERSEDED)


async def test_an_unreadable_stored_row_asks_the_user_without_continue(stack: Stack) -> None:
    """A transcript row that does not decode: no model call can be made from the
    transcript, so the turn waits as checkpoint_invalid (no Continue), names the
    row, and Dismiss closes it (Dismiss is always possible for the current id, whatever state is corrupt)."""
    import sqlite3

    stack.script([{"text": "first answer"}, {"text": "never asked"}])
    await stack.start_worker()
    chat = stack.chat()
    await (await stack.send(chat, "hi")).result()
    with sqlite3.connect(stack.settings().sqlite_path) as db:
        db.execute("UPDATE messages SET body = '{broken' WHERE chat_id = ? AND role = 'assistant'", (chat,))

    await stack.send(chat, "and now?")
    gate = await stack.wait_state(chat, lambda s: s.turn == 2 and _awaiting(s))
    assert (gate.reason, gate.can_continue) == (Reason.CHECKPOINT_INVALID, False)
    failure = (await stack.client.get_workflow_handle(tk.workflow_id(chat)).fetch_history()).events
    assert any("message row id=2 does not decode" in e.activity_task_failed_event_attributes.failure.message
               for e in failure if e.HasField("activity_task_failed_event_attributes"))
    with pytest.raises(WorkflowUpdateFailedError):
        await _decide(stack, chat, "continue_turn", gate.recovery_id)
    done = await _decide(stack, chat, "dismiss_turn", gate.recovery_id)
    assert (done.status, done.reason) == (TurnStatus.RECOVERED, Reason.DISMISSED)
