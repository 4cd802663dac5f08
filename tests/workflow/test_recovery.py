"""Gates, Continue and Dismiss, supersede, Stop, clean hand-off and the resume
window, on a real dev server with real worker processes and SIGKILL/SIGTERM."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import Awaitable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.worker import Worker

from tests.support import Stack, until, until_async
from turnkeeper import activity_io
from turnkeeper import client as tk
from turnkeeper.activities.assemble import build_activities
from turnkeeper.activities.providers import load_provider
from turnkeeper.activities.tools import default_registry
from turnkeeper.models import (
    DISMISSED_TEXT,
    STOPPED_TEXT,
    SUPERSEDED_TEXT,
    ChatTurnInput,
    Reason,
    RecoveryStart,
    ToolCallStatus,
    TurnState,
    TurnStatus,
)
from turnkeeper.search_attributes import RECOVERY_REASON_ATTR, TURN_STATUS_ATTR
from turnkeeper.step_timeouts import StepTimeouts
from turnkeeper.store import open_store
from turnkeeper.testing import FakeChatServer
from turnkeeper.worker.main import check_tools
from turnkeeper.workflows.chat_turn import ChatTurn

pytestmark = pytest.mark.crash


def _call(name: str, **arguments: object) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def _slow_tools(stack: Stack, ledger: Path | None = None) -> None:
    stack.env_extra.update(
        {"TURNKEEPER_TOOL_MODULES": "tests.ledger_tools", "TURNKEEPER_TOOLS": "slow_write,write_file"}
    )
    if ledger is not None:
        stack.env_extra["TK_LEDGER"] = str(ledger)


def _fake_model(stack: Stack, server: FakeChatServer) -> None:
    stack.env_extra.update(
        {"TURNKEEPER_MODEL": "openai:fake", "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "k"}
    )


def _awaiting(s: TurnState) -> bool:
    return s.status == TurnStatus.AWAITING_USER


async def _eq(got: Awaitable[Any], want: Any) -> bool:
    return await got == want


async def test_lost_model_call_waits_then_continue_and_loop_guard(stack: Stack) -> None:
    with FakeChatServer() as server:
        server.script(
            [
                {"text": "never delivered", "delay": 30},
                {"text": "also lost", "delay": 30},
                {"text": "third time lucky"},
            ]
        )
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

        resumed = await stack.decide(chat, "continue", gate.recovery_id)
        assert (resumed.status, resumed.reason, resumed.attempts) == (
            TurnStatus.RESUMING,
            Reason.USER_CONFIRMED,
            1,
        )
        await until(lambda: len(server.requests) == 2, what="resumed model call")
        stack.kill(second)  # the resumed step is lost too: never retried by itself
        stack.spawn_worker()
        guard = await stack.wait_state(chat, _awaiting, timeout=45)
        assert guard.reason == Reason.LOOP_GUARD and guard.attempts == 1
        assert guard.recovery_id == gate.recovery_id  # kept until the turn ends
        await asyncio.sleep(1)
        assert len(server.requests) == 2

        await stack.decide(chat, "continue", guard.recovery_id)
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

    with pytest.raises(tk.DecisionRefused, match="stale"):
        await stack.decide(chat, "continue", "not-the-id")
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
    await handle.signal("continue", {"recovery_id": "not-the-id"})
    await handle.signal("dismiss", {"recovery_id": "also-wrong"})
    # Unreadable ones are refused and recorded too, never dropped unseen.
    await stack.signal_undecodable(chat, "continue")
    await stack.signal_undecodable(chat, "dismiss")
    store = await stack.store()

    async def rejected() -> list[tuple[str, str | None]]:
        return [
            (e.payload["action"], e.payload["recovery_id"])
            for e in await store.events(chat)
            if e.type == "recovery_action_rejected"
        ]

    want = [
        ("continue", "not-the-id"),
        ("continue", "not-the-id"),
        ("dismiss", "also-wrong"),
        ("continue", None),
        ("dismiss", None),
    ]
    await until_async(lambda: _eq(rejected(), want), what="every refusal recorded")
    assert (await stack.state(chat)).status == TurnStatus.AWAITING_USER

    await stack.decide(chat, "continue", gate.recovery_id)
    with pytest.raises(tk.DecisionRefused, match="not waiting for confirmation"):
        await stack.decide(chat, "continue", gate.recovery_id)
    done = await stack.wait_turn_done(chat, 1)
    assert done.reason == Reason.CONTINUED and done.attempts == 1
    assert [m["content"] for m in await stack.history(chat)] == ["hi", "after continue"]

    # A recovery run whose context is gone: Continue is refused, Dismiss always works.
    other = stack.chat()
    store = await stack.store()
    await store.begin_turn(other, "lost-run", ["m1"])
    from turnkeeper.models import UserMessage

    await store.commit_user_messages(other, 1, [UserMessage(message_id="m1", text="lost")])
    run = await stack.client.start_workflow(
        "ChatTurn",
        ChatTurnInput(
            chat_id=other,
            recovery=RecoveryStart(turn=1, reason=Reason.CHECKPOINT_UNKNOWN, can_continue=False),
        ),
        id=tk.workflow_id(other),
        task_queue=stack.task_queue,
    )
    gate = await stack.wait_state(other, _awaiting)
    assert gate.reason == Reason.CHECKPOINT_UNKNOWN and not gate.can_continue
    with pytest.raises(tk.DecisionRefused, match="context is unavailable"):
        await stack.decide(other, "continue", gate.recovery_id)
    dismissed = await stack.decide(other, "dismiss", gate.recovery_id)
    assert dismissed.status == TurnStatus.RECOVERED and dismissed.reason == Reason.DISMISSED
    await run.result()  # the answer comes before the closing row is written
    assert [m["role"] for m in await stack.history(other)] == ["user", "assistant"]


async def test_pending_follow_ups_wait_and_a_newer_message_supersedes(stack: Stack) -> None:
    with FakeChatServer() as server:
        server.script([{"status": 400, "message": "bad request", "delay": 1.5}, {"text": "answering both"}])
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
            "first",
            SUPERSEDED_TEXT,
            "pending before the gate",
            "newer",
            "answering both",
        ]


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
        done = await stack.decide(chat, "dismiss", gate.recovery_id)
        assert done.reason == Reason.DISMISSED
        assert [m["content"] for m in await stack.history(chat)][:1] == ["first"]
        assert [m["role"] for m in await stack.history(chat)].count("user") == 1


async def test_a_retry_that_comes_while_the_gate_checks_another_does_not_supersede(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate asks the store whether a message is a retry of one it holds. A
    second retry that comes while it asks is judged on its own: whether the SDK
    hands it to the workflow before or after the store's answer must not matter
    (here before: the check outlives the workflow task, whose heartbeat brings the
    signal in first). Earlier, a newcomer seen after the answer let the supersede
    stand, and a retry closed the turn."""
    from turnkeeper.store.core import SQLStore

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
        assert (state.turn, state.status, state.recovery_id) == (
            3,
            TurnStatus.AWAITING_USER,
            gate.recovery_id,
        )
        assert state.pending_followups == []
        monkeypatch.setattr(SQLStore, "held_message_ids", checked)
        done = await stack.decide(chat, "dismiss", gate.recovery_id)
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
        done = await stack.decide(chat, "dismiss", gate.recovery_id)
        assert done.reason == Reason.DISMISSED
        handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
        await handle.result()
        hist = await stack.history(chat)
        assert [m["role"] for m in hist] == ["user", "user", "assistant"]
        assert [m["content"] for m in hist][:2] == ["first", "second"]
        assert len(server.requests) == 1


async def test_new_message_supersedes_a_running_recovery(stack: Stack) -> None:
    with FakeChatServer() as server:
        server.script(
            [
                {"status": 400, "message": "bad"},
                {"text": "slow resumed answer", "delay": 20},
                {"text": "the new turn"},
            ]
        )
        _fake_model(stack, server)
        await stack.start_worker()
        chat = stack.chat()
        handle = await stack.send(chat, "one", message_id="m1")
        gate = await stack.wait_state(chat, _awaiting)
        await stack.decide(chat, "continue", gate.recovery_id)
        await until(lambda: len(server.requests) == 2, what="resumed call under way")
        await stack.send(chat, "two", message_id="m2")
        done = await stack.wait_turn_done(chat, 2, timeout=30)
        assert done.status == TurnStatus.COMPLETED
        turn1 = await (await stack.store()).get_turn(chat, 1)
        assert (turn1.status, turn1.reason) == (TurnStatus.RECOVERED, Reason.SUPERSEDED)
        hist = await stack.history(chat)
        assert [m["content"] for m in hist] == ["one", SUPERSEDED_TEXT, "two", "the new turn"]
        # "two" supersedes only once the store has said it is no late retry: its check
        # comes first, then the resumed call is cancelled.
        first = await stack.client.get_workflow_handle(
            tk.workflow_id(chat), run_id=handle.first_execution_run_id
        ).fetch_history()
        assert _steps_around_the_cancel(first) == [
            activity_io.HELD_MESSAGES,
            f"cancel {activity_io.MODEL_CALL}",
        ]


async def test_a_newer_message_that_comes_with_a_continued_steps_end_starts_the_next_turn(
    stack: Stack,
) -> None:
    """A newer message sent while a continued turn's tool runs and no worker takes
    workflow tasks, then a worker that caches no run (it replays the whole history
    at every task, as one taking the run over does): the message supersedes the
    continuation and starts the next turn, whichever of the two it takes first."""
    with FakeChatServer() as server:
        server.script(
            [
                {"status": 400, "message": "bad"},
                {"tool_calls": [_call("slow_write", path="s.txt", content="s", seconds=2)]},
                {"text": "continued answer"},
                {"text": "the new turn"},
            ]
        )
        _fake_model(stack, server)
        _slow_tools(stack)
        settings = stack.settings()
        check_tools(settings)  # the ledger tools, as the worker loads them
        store = open_store(settings)
        await store.open()
        provider = load_provider(settings.model, env=settings.provider_env())

        def activities() -> list[Any]:
            return build_activities(settings, store, provider, default_registry())

        def workflows_only(cached: int = 100) -> Worker:  # workflow tasks only
            return Worker(
                stack.client,
                task_queue=stack.task_queue,
                workflows=[ChatTurn],
                no_remote_activities=True,
                max_cached_workflows=cached,
                interceptors=[StepTimeouts(settings)],
            )

        steps = Worker(stack.client, task_queue=stack.task_queue, activities=activities())  # and store writes
        chat = stack.chat()
        try:
            async with steps:
                async with workflows_only():
                    handle = await stack.send(chat, "one", message_id="m1")
                    gate = await stack.wait_state(chat, _awaiting)
                    await stack.decide(chat, "continue", gate.recovery_id)
                    await stack.wait_state(
                        chat, lambda s: any(c.status == ToolCallStatus.RUNNING for c in s.tool_calls)
                    )
                # No worker takes workflow tasks now: the message and the tool's end
                # wait for the next one together.
                await stack.send(chat, "two", message_id="m2")
                events = stack.client.get_workflow_handle(tk.workflow_id(chat), run_id=handle.result_run_id)

                async def tool_done() -> bool:
                    history = await events.fetch_history()
                    return any(
                        e.HasField("activity_task_completed_event_attributes") for e in history.events[-4:]
                    )

                await until_async(tool_done, timeout=20, what="the tool's end in the history")
                # Caching no run, it replays the whole history at every task, as a worker
                # that takes the run over does: there the message comes first.
                async with workflows_only(cached=0):
                    done = await stack.wait_turn_done(chat, 2, timeout=30)
            assert done.status == TurnStatus.COMPLETED
            rows = await (await stack.store()).transcript_rows(chat)
            assert [(r.message.content, r.turn) for r in rows if r.message.role == "user"] == [
                ("one", 1),
                ("two", 2),
            ]
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
        elif e.HasField("activity_task_cancel_requested_event_attributes"):
            scheduled = e.activity_task_cancel_requested_event_attributes.scheduled_event_id
            return [*seen, f"cancel {names[scheduled]}"]
    return seen


async def test_stop_keeps_completed_results_and_interrupts_running_tools(stack: Stack) -> None:
    ledger = stack.ws / "ledger.txt"  # in-process worker: the tools' default ledger
    _slow_tools(stack)
    stack.script(
        [
            {
                "tool_calls": [
                    _call("write_file", path="fast.txt", content="f"),
                    _call("slow_write", path="slow.txt", content="s", seconds=20),
                ]
            }
        ]
    )
    await stack.start_worker()
    chat = stack.chat()
    handle = await stack.send(chat, "do both")
    await stack.wait_state(
        chat, lambda s: [c.status for c in s.tool_calls] == [ToolCallStatus.DONE, ToolCallStatus.RUNNING]
    )
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
    # Workflow tasks only: no worker takes the model call (nor, for now, a store write).
    workflows_only = Worker(
        stack.client,
        task_queue=stack.task_queue,
        workflows=[ChatTurn],
        no_remote_activities=True,
        interceptors=[StepTimeouts(settings)],
    )
    chat = stack.chat()
    async with workflows_only:
        handle = await stack.send(chat, "anyone there?")

        async def window_passed() -> bool:
            events = (await handle.fetch_history()).events
            return any(e.HasField("activity_task_timed_out_event_attributes") for e in events)

        await until_async(window_passed, timeout=20, what="the model call's resume window passed")
        # A process: one client holds one worker per queue. It numbers the turn the lost
        # call never began, then writes the gate; serving before the decision, or the
        # 2 s window could pass again while it starts.
        await stack.wait_serving(stack.spawn_worker(TURNKEEPER_RESUME_WINDOW="2"))
        gate = await stack.wait_state(chat, _awaiting, timeout=20)
        assert (gate.turn, gate.reason) == (1, Reason.RESTART_REQUIRES_CONFIRMATION)
        await stack.decide(chat, "continue", gate.recovery_id)
        done = await stack.wait_turn_done(chat, 1)
        assert done.reason == Reason.CONTINUED
        assert [m["content"] for m in await stack.history(chat)] == ["anyone there?", "finally"]


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
    stack.script(
        [{"tool_calls": [_call("slow_write", path="g.txt", content="g", seconds=3)]}, {"text": "finished"}]
    )
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
    stack.script(
        [
            {"tool_calls": [_call("slow_write", path="k.txt", content="k", seconds=30)]},
            {"text": "unused: the superseded row is assistant call 1"},
            {"text": "read all 21"},
        ]
        + [{"text": "spare"}] * 20
    )  # late ones may make more turns
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
        if (
            state.status == TurnStatus.COMPLETED
            and not state.pending_followups
            and len(users) >= 22
            and hist[-1]["role"] == "assistant"
        ):
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
    assert any(
        "message row id=2 does not decode" in e.activity_task_failed_event_attributes.failure.message
        for e in failure
        if e.HasField("activity_task_failed_event_attributes")
    )
    with pytest.raises(tk.DecisionRefused, match="context is unavailable"):
        await stack.decide(chat, "continue", gate.recovery_id)
    done = await stack.decide(chat, "dismiss", gate.recovery_id)
    assert (done.status, done.reason) == (TurnStatus.RECOVERED, Reason.DISMISSED)


ORDERS = list(itertools.permutations(("continue", "dismiss", "stop")))
ENDING_REASON = {"dismiss": Reason.DISMISSED, "stop": Reason.STOPPED}
OPEN = ("running", "awaiting_user", "resuming")


def _table_answers(order: Sequence[str]) -> dict[str, str | None]:
    """What each decision is answered, judged in `order` at a gate (the resumed call
    outlasts them all): None for accepted, else the refusal's words."""
    status, answers = "awaiting", {}
    for action in order:
        if status == "ended":
            answers[action] = "no turn is running" if action == "stop" else "not waiting for confirmation"
        elif action == "continue" and status == "resuming":
            answers[action] = "not waiting for confirmation"
        else:
            answers[action] = None
            status = "resuming" if action == "continue" else "ended"
    return answers


async def _closed(handle: WorkflowHandle[Any, Any]) -> bool:
    return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING


async def _answer(decision: Awaitable[TurnState]) -> TurnState | str:
    try:
        return await decision
    except tk.DecisionRefused as refused:
        return str(refused)


async def test_continue_dismiss_and_stop_within_milliseconds_after_a_crash_agree_with_the_turn(
    stack: Stack,
) -> None:
    """A gate after a crash, then Continue, Dismiss and Stop sent back to back, in
    every order: each client's answer holds. The turn ends as the accepted Dismiss or
    Stop said (a Continue accepted before it counts an attempt) in `state`, the store's
    row and the TurnStatus search attribute, and the run is not listed as open."""
    chats = [stack.chat(f"race{i}") for i in range(len(ORDERS))]
    # The first calls are lost with their worker; a resumed call outlasts the decisions.
    with FakeChatServer(
        [{"text": "never delivered", "delay": 60}] * len(chats),
        responder=lambda request: {"text": "resumed answer", "delay": 3},
    ) as server:
        _fake_model(stack, server)
        first = stack.spawn_worker()
        await stack.wait_serving(first)
        for chat in chats:
            await stack.send(chat, f"hello from {chat}")
        await until(lambda: len(server.requests) == len(chats), what="every model call under way")
        stack.kill(first)
        await stack.wait_serving(stack.spawn_worker())
        for chat in chats:
            await stack.wait_state(chat, _awaiting, timeout=45)

        for chat, order in zip(chats, ORDERS, strict=False):
            handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
            run_id = (await handle.describe()).run_id
            gate = await stack.state(chat)
            assert (gate.turn, gate.reason) == (1, Reason.RESTART_REQUIRES_CONFIRMATION)
            sent = []
            for action in order:  # each signal leaves a few milliseconds after the one before
                sent.append(
                    asyncio.create_task(
                        _answer(
                            tk.decide(stack.client, chat, action, gate.recovery_id, run_id=run_id, timeout=20)
                        )
                    )
                )
                await asyncio.sleep(0.002)
            answers = dict(zip(order, await asyncio.gather(*sent), strict=False))
            context = f"{chat}, sent {order}: {answers}"

            run = stack.client.get_workflow_handle(tk.workflow_id(chat), run_id=run_id)
            judged = [
                e.workflow_execution_signaled_event_attributes.signal_name
                for e in (await run.fetch_history()).events
                if e.HasField("workflow_execution_signaled_event_attributes")
                and e.workflow_execution_signaled_event_attributes.signal_name != "user_message"
            ]
            words = {a: None if isinstance(answer, TurnState) else answer for a, answer in answers.items()}
            assert words == _table_answers(judged), f"{context}; judged in the order {judged}"
            [ending] = [a for a in ("dismiss", "stop") if words[a] is None]
            reason = ENDING_REASON[ending]
            attempts = 1 if words["continue"] is None else 0
            accepted = answers[ending]
            assert isinstance(accepted, TurnState)
            assert (accepted.status, accepted.reason) == (TurnStatus.RECOVERED, reason), context

            # The run that judged them, and the chat as clients read it once its runs are done.
            await until_async(partial(_closed, handle), timeout=30, what=f"{chat}'s runs closed")
            for final in (await run.query("state", result_type=TurnState), await stack.state(chat)):
                assert (final.turn, final.status, final.reason, final.attempts) == (
                    1,
                    TurnStatus.RECOVERED,
                    reason,
                    attempts,
                ), f"{context}; state: {final}"
            record = await (await stack.store()).get_turn(chat, 1)
            assert record is not None
            assert (record.status, record.reason, record.attempts) == (
                TurnStatus.RECOVERED,
                reason,
                attempts,
            ), context
            attributes = (await run.describe()).typed_search_attributes
            assert (attributes.get(TURN_STATUS_ATTR), attributes.get(RECOVERY_REASON_ATTR)) == (
                "recovered",
                reason.value,
            ), context
            closing = STOPPED_TEXT if ending == "stop" else DISMISSED_TEXT
            assert (await stack.history(chat))[-1]["content"] == closing, context

            statuses = ", ".join(f"'{s}'" for s in OPEN)
            query = f"WorkflowId='{tk.workflow_id(chat)}' AND TurnStatus IN ({statuses})"

            async def listed_open(query: str = query) -> bool:
                return not [wf async for wf in stack.client.list_workflows(query)]

            await until_async(listed_open, timeout=10, what=f"{chat} no longer listed as open")
