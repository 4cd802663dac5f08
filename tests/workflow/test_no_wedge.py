"""No wedge, no loss: the paths that used to hang a chat or lose a message. Each
ends with the chat answering its next message and every acknowledged message
committed once (or refused visibly, with its id)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import WorkflowExecutionStatus
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.support import Stack, until, until_async
from tests.workflow.test_cli import tk as cli
from turnkeeper import activity_io
from turnkeeper import client as tk
from turnkeeper.models import Reason, TurnState, TurnStatus
from turnkeeper.testing import FakeChatServer

pytestmark = pytest.mark.crash


def _fake_model(stack: Stack, server: FakeChatServer) -> None:
    stack.env_extra.update(
        {"TURNKEEPER_MODEL": "openai:fake", "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "k"}
    )


def _ok(request: dict[str, Any]) -> dict[str, Any]:
    return {"text": "ok"}


async def _answers_next_message(stack: Stack, chat: str, timeout: float = 30) -> None:
    """Sends a probe; returns once an assistant row follows it in the transcript and
    the chat's run has ended."""
    await stack.send(chat, "are you there?", message_id="probe")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = await stack.history(chat)
        at = next((i for i, r in enumerate(rows) if r.get("content") == "are you there?"), None)
        if at is not None and any(r["role"] == "assistant" for r in rows[at + 1 :]):
            await _no_run_lingers(stack, chat)
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"chat {chat} did not answer its next message: {await stack.history(chat)}")


async def _no_run_lingers(stack: Stack, chat: str, timeout: float = 10) -> None:
    """Once its turn has answered, the chat's run closes: none stays open with nothing to do."""
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))

    async def closed() -> bool:
        return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING

    await until_async(closed, timeout=timeout, what=f"chat {chat}: its run to close after the answer")


async def _answered_at_once(
    stack: Stack, chat: str, action: str, recovery_id: str | None = None, bound: float = 2.0
) -> TurnState:
    """The decision and the state it led to, within `bound` seconds of sending it."""
    started = time.monotonic()
    state = await stack.decide(chat, action, recovery_id)
    assert time.monotonic() - started < bound, f"{action} answered after {time.monotonic() - started:.1f} s"
    return state


async def _user_rows(stack: Stack, chat: str) -> list[str]:
    return [r["content"] for r in await stack.history(chat) if r["role"] == "user"]


async def test_dismiss_while_a_continued_turn_runs_after_a_crash(stack: Stack) -> None:
    ledger = stack.dir / "ledger.txt"
    stack.env_extra.update(
        {
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
            "TURNKEEPER_TOOLS": "slow_write",
            "TK_LEDGER": str(ledger),
        }
    )
    with FakeChatServer(responder=_ok) as server:
        server.script(
            [
                {
                    "tool_calls": [
                        {"name": "slow_write", "arguments": {"path": "k.txt", "content": "x", "seconds": 20}}
                    ]
                },
                {"text": "the continued step, slowly", "delay": 20},
            ]
        )
        _fake_model(stack, server)
        first = stack.spawn_worker()
        chat = stack.chat()
        await stack.send(chat, "write k.txt", message_id="m1")
        await until(lambda: ledger.exists() and "start" in ledger.read_text(), what="tool started")
        stack.kill(first)  # mid-tool
        stack.spawn_worker()
        gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER, timeout=45)
        assert gate.reason == Reason.TOOL_STATE_UNKNOWN
        resumed = await stack.decide(chat, "continue", gate.recovery_id)
        assert (resumed.status, resumed.reason) == (TurnStatus.RESUMING, Reason.USER_CONFIRMED)
        await until(lambda: len(server.requests) == 2, what="the continued model call under way")
        # The answer is the turn's end, at once: the slow model call is cancelled after it.
        started = time.monotonic()
        answer = await _answered_at_once(stack, chat, "dismiss", gate.recovery_id)
        assert (answer.status, answer.reason, answer.recovery_id) == (
            TurnStatus.RECOVERED,
            Reason.DISMISSED,
            gate.recovery_id,
        )

        async def closed_in_the_store() -> bool:
            record = await (await stack.store()).get_turn(chat, 1)
            return record is not None and record.status == TurnStatus.RECOVERED

        await until_async(closed_in_the_store, timeout=5, what="the dismissed turn closed in the store")
        assert time.monotonic() - started < 5.0
        record = await (await stack.store()).get_turn(chat, 1)
        assert record is not None and record.reason == Reason.DISMISSED
        with pytest.raises(tk.DecisionRefused, match="no turn is running"):
            await stack.decide(chat, "stop")  # the answer stays true: nothing runs any more
        await _answers_next_message(stack, chat)
        assert await _user_rows(stack, chat) == ["write k.txt", "are you there?"]
        assert ledger.read_text().count("start") == 1  # the tool never ran again


async def test_a_burst_of_follow_ups_over_2_mb_is_bounded_and_loses_nothing(stack: Stack) -> None:
    stack.env_extra.update(
        {"TURNKEEPER_TOOL_MODULES": "tests.ledger_tools", "TURNKEEPER_TOOLS": "slow_write"}
    )
    with FakeChatServer(responder=_ok) as server:
        server.script(
            [
                {
                    "tool_calls": [
                        {"name": "slow_write", "arguments": {"path": "k.txt", "content": "x", "seconds": 4}}
                    ]
                }
            ]
        )
        _fake_model(stack, server)
        await stack.start_worker()
        chat = stack.chat()
        await stack.send(chat, "start", message_id="m0")
        await stack.wait_state(chat, lambda s: bool(s.tool_calls))
        ids = [f"f{i:02d}" for i in range(40)]
        await asyncio.gather(*(stack.send(chat, f"{i} " + "y" * 60_000, message_id=i) for i in ids))
        final = await stack.wait_state(
            chat, lambda s: s.status == TurnStatus.COMPLETED and not s.pending_followups, timeout=90
        )
        assert final.status == TurnStatus.COMPLETED
        store = await stack.store()
        rejected = {
            e.payload["message_id"]: e.payload["reason"]
            for e in await store.events(chat, limit=10_000)
            if e.type == "message_rejected"
        }
        committed = [t.split(" ", 1)[0] for t in await _user_rows(stack, chat)][1:]
        assert len(committed) == len(set(committed))  # once each
        assert set(committed) | set(rejected) == set(ids) and not set(committed) & set(rejected)
        assert rejected and all("limit" in why for why in rejected.values())
        assert sum(60_000 for _ in committed) > 256 * 1024  # more than one chunk's worth
        await _answers_next_message(stack, chat)


async def test_a_message_sent_while_the_store_file_is_gone_waits_and_lands_once(stack: Stack) -> None:
    stack.script([{"text": "first"}, {"text": "second"}, {"text": "third"}])
    await stack.start_worker()
    chat = stack.chat()
    await (await stack.send(chat, "one")).result()
    db = stack.data / "sessions.db"
    aside = stack.data / "sessions.db.aside"
    db.rename(aside)  # as an operator deleting it by mistake
    try:
        await stack.send(chat, "two", message_id="m2")
        waiting = await stack.wait_state(chat, lambda s: s.store_unavailable, timeout=20)
        assert waiting.status == TurnStatus.RUNNING
    finally:
        aside.rename(db)
    done = await stack.wait_state(
        chat,
        lambda s: s.turn == 2 and s.status == TurnStatus.COMPLETED and not s.store_unavailable,
        timeout=60,
    )
    assert done.pending_followups == []
    assert await _user_rows(stack, chat) == ["one", "two"]
    await _answers_next_message(stack, chat)


@pytest.mark.timeout(120)
async def test_a_message_acknowledged_while_the_store_is_locked_lands_once(stack: Stack) -> None:
    """The store refuses every write for longer than its busy timeout (another
    process holds the lock): the turn waits visibly and goes on."""
    stack.script([{"text": "first"}, {"text": "second"}])
    await stack.start_worker()
    chat = stack.chat()
    await (await stack.send(chat, "one")).result()
    blocker = sqlite3.connect(stack.data / "sessions.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        await stack.send(chat, "two", message_id="m2")
        await stack.wait_state(chat, lambda s: s.store_unavailable, timeout=40)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    await stack.wait_state(chat, lambda s: s.turn == 2 and s.status == TurnStatus.COMPLETED, timeout=60)
    assert await _user_rows(stack, chat) == ["one", "two"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("action", ["continue", "dismiss"])
async def test_a_decision_during_a_store_outage_is_answered_at_once(stack: Stack, action: str) -> None:
    """The store goes out while the turn waits at its gate. Continue and Dismiss still
    answer within 2 s, with the state they lead to; the turn's store write waits,
    visibly, and the turn acts on the decision once the store is back."""
    with FakeChatServer(responder=_ok) as server:
        server.script([{"status": 401, "message": "bad key"}, {"text": "after the outage"}])
        _fake_model(stack, server)
        await stack.start_worker()
        chat = stack.chat()
        await stack.send(chat, "one")
        gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER, timeout=20)
        assert gate.reason == Reason.MODEL_FAILED
        blocker = sqlite3.connect(stack.data / "sessions.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            answer = await _answered_at_once(stack, chat, action, gate.recovery_id)
            if action == "continue":
                assert (answer.status, answer.reason, answer.attempts) == (
                    TurnStatus.RESUMING,
                    Reason.USER_CONFIRMED,
                    1,
                )
            else:
                assert (answer.status, answer.reason) == (TurnStatus.RECOVERED, Reason.DISMISSED)
            await stack.wait_state(chat, lambda s: s.store_unavailable, timeout=40)  # its write waits
            assert len(server.requests) == 1  # nothing acted on yet
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        ended = Reason.CONTINUED if action == "continue" else Reason.DISMISSED
        await stack.wait_state(
            chat,
            lambda s: s.status == TurnStatus.RECOVERED and s.reason == ended and not s.store_unavailable,
            timeout=60,
        )
        record = await (await stack.store()).get_turn(chat, 1)
        assert record is not None and (record.status, record.reason) == (TurnStatus.RECOVERED, ended)
        assert await _user_rows(stack, chat) == ["one"]
        await _answers_next_message(stack, chat)


async def test_the_configured_limit_applies_to_a_runs_first_message(stack: Stack) -> None:
    stack.script([{"text": "fine"}])
    await stack.start_worker(TURNKEEPER_MAX_MESSAGE_BYTES="100000")
    chat = stack.chat()
    big = "z" * 80_000  # over the 64 KiB default, under the configured limit
    handle = await stack.client.start_workflow(
        tk.WORKFLOW_TYPE,
        {"chat_id": chat},
        id=tk.workflow_id(chat),
        task_queue=stack.task_queue,
        start_signal="user_message",
        start_signal_args=[{"message_id": "big", "text": big}],
        result_type=TurnState,
    )
    final = await asyncio.wait_for(handle.result(), 30)
    assert final.status == TurnStatus.COMPLETED
    assert await _user_rows(stack, chat) == [big]


async def test_a_first_message_over_a_smaller_limit_is_refused_and_the_run_takes_the_next(
    stack: Stack,
) -> None:
    stack.script([{"text": "fine"}])
    await stack.start_worker(TURNKEEPER_MAX_MESSAGE_BYTES="1000")
    chat = stack.chat()
    handle = await stack.client.start_workflow(
        tk.WORKFLOW_TYPE,
        {"chat_id": chat},
        id=tk.workflow_id(chat),
        task_queue=stack.task_queue,
        start_signal="user_message",
        start_signal_args=[{"message_id": "big", "text": "q" * 2000}],
        result_type=TurnState,
    )
    await handle.signal("user_message", {"message_id": "small", "text": "hi"})
    final = await asyncio.wait_for(handle.result(), 30)
    assert final.status == TurnStatus.COMPLETED
    assert await _user_rows(stack, chat) == ["hi"]
    rejected = [e.payload for e in await (await stack.store()).events(chat) if e.type == "message_rejected"]
    assert rejected == [{"message_id": "big", "reason": "message is 2000 bytes; the limit is 1000"}]


async def test_a_malformed_message_keeps_its_id_and_a_malformed_decision_is_refused_in_words(
    stack: Stack,
) -> None:
    with FakeChatServer([{"status": 400, "message": "API error 401: unauthorized"}], responder=_ok) as server:
        _fake_model(stack, server)
        await stack.start_worker()
        chat = stack.chat()
        handle = await stack.send(chat, "hello")
        gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
        # The provider's own words reach `state` and the event log.
        assert gate.reason == Reason.MODEL_FAILED and "unauthorized" in (gate.detail or "")
        store = await stack.store()
        events = await store.events(chat)
        assert any(
            e.type == "recovery_state" and "unauthorized" in e.payload.get("detail", "") for e in events
        )

        await handle.signal("user_message", {"message_id": "mine", "text": 5})
        # A client that can read its request id back reads the refusal's words.
        await handle.signal("dismiss", {"recoveryid": gate.recovery_id, "request_id": "typo"})
        refused = await stack.wait_state(
            chat, lambda s: any(d.request_id == "typo" for d in s.decisions), timeout=10
        )
        [decision] = [d for d in refused.decisions if d.request_id == "typo"]
        assert "malformed dismiss payload" in (decision.refusal or "") and "recovery_id" in (
            decision.refusal or ""
        )
        assert (refused.status, refused.recovery_id) == (TurnStatus.AWAITING_USER, gate.recovery_id)
        with pytest.raises(tk.DecisionRefused, match="malformed continue payload"):
            await stack.decide(chat, "continue", "")  # no recovery id at all

        async def rejected() -> bool:
            types = [(e.type, e.payload) for e in await store.events(chat)]
            return [p["message_id"] for t, p in types if t == "message_rejected"] == ["mine"] and sum(
                t == "recovery_action_rejected" for t, _ in types
            ) == 2

        await until_async(rejected, timeout=10, what="both refusals in the event log")
        state = await stack.decide(chat, "dismiss", gate.recovery_id)
        assert state.status == TurnStatus.RECOVERED
        await _answers_next_message(stack, chat)


async def test_one_corrupt_event_row_does_not_hide_the_event_log(stack: Stack) -> None:
    stack.script([{"text": "fine"}])
    await stack.start_worker()
    chat = stack.chat()
    await (await stack.send(chat, "hello")).result()
    db = sqlite3.connect(Path(stack.data) / "sessions.db", isolation_level=None)
    db.execute("UPDATE events SET payload = '{not json' WHERE chat_id = ? AND seq = 1", (chat,))
    db.close()
    events = await (await stack.store()).events(chat)
    assert events[0].type == "corrupt_event" and "does not decode" in events[0].payload["error"]
    assert [e.type for e in events][-1] == "turn_end"


async def test_a_run_that_ends_before_its_turn_is_recorded_loses_no_message(stack: Stack) -> None:
    """Terminated while the store was gone (no turn row points to it): a reconcile
    pass finds the run by its close and hands its message on."""
    from tests.workflow.test_reconciler import run_pass

    stack.script([{"text": "first"}, {"text": "second"}])
    await stack.start_worker()
    chat = stack.chat()
    await (await stack.send(chat, "one")).result()
    db = stack.data / "sessions.db"
    aside = stack.data / "sessions.db.aside"
    db.rename(aside)
    try:
        handle = await stack.send(chat, "two", message_id="m2")
        await stack.wait_state(chat, lambda s: s.store_unavailable, timeout=20)
        await handle.terminate(reason="an operator's mistake")
    finally:
        aside.rename(db)
    await asyncio.sleep(1)  # visibility shows the close a moment later
    summary = await run_pass(stack)
    assert summary.handed_on == 1
    await stack.wait_state(chat, lambda s: s.turn == 2 and s.status == TurnStatus.COMPLETED, timeout=30)
    assert await _user_rows(stack, chat) == ["one", "two"]
    assert (await run_pass(stack)).handed_on == 0  # once


async def test_a_gate_whose_history_grows_long_hands_itself_on(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused signals at a gate add to its history: past the bound the gate goes on
    in a fresh run of the same turn, with the same recovery id and pending messages."""
    from turnkeeper import long_history

    monkeypatch.setattr(long_history, "RUN_HISTORY_EVENTS", 60)
    with FakeChatServer([{"status": 400, "message": "no"}], responder=_ok) as server:
        _fake_model(stack, server)
        await stack.start_worker(TURNKEEPER_WORKFLOW_SANDBOX="off")  # so the bound above applies
        chat = stack.chat()
        first = await stack.send(chat, "hello")
        gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
        for i in range(30):
            await first.signal("dismiss", {"recovery_id": f"stale-{i}"})
        handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
        deadline = time.monotonic() + 20
        while (await handle.describe()).run_id == first.first_execution_run_id:
            assert time.monotonic() < deadline, "the gate was not handed on"
            await asyncio.sleep(0.2)
        again = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
        assert (again.turn, again.reason, again.recovery_id) == (1, Reason.MODEL_FAILED, gate.recovery_id)
        done = await stack.decide(chat, "continue", gate.recovery_id)
        assert (done.status, done.reason) == (TurnStatus.RESUMING, Reason.USER_CONFIRMED)
        await stack.wait_turn_done(chat, 1)
        rejected = [
            e
            for e in await (await stack.store()).events(chat, limit=10_000)
            if e.type == "recovery_action_rejected"
        ]
        assert len(rejected) == 30
        await _answers_next_message(stack, chat)


async def test_a_running_turn_whose_history_grows_long_hands_itself_on(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between two steps, a run past the history bound hands the turn on to a fresh
    run (continue-as-new), which takes the next step: every tool runs once, a
    follow-up sent meanwhile lands once, and the turn ends as one turn."""
    from turnkeeper import long_history

    monkeypatch.setattr(long_history, "RUN_HISTORY_EVENTS", 25)
    ledger = stack.dir / "ledger.txt"
    monkeypatch.setenv("TK_LEDGER", str(ledger))  # the tools run in this process
    stack.env_extra.update(
        {
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
            "TURNKEEPER_TOOLS": "slow_write",
            "TK_LEDGER": str(ledger),
        }
    )
    steps = 8
    stack.script(
        [
            {
                "tool_calls": [
                    {"name": "slow_write", "arguments": {"path": f"k{i}.txt", "content": "x", "seconds": 0.2}}
                ]
            }
            for i in range(steps)
        ]
        + [{"text": "all written"}, {"text": "here"}]
    )
    await stack.start_worker(TURNKEEPER_WORKFLOW_SANDBOX="off")  # so the bound above applies
    chat = stack.chat()
    first = await stack.send(chat, "write them all")
    await until(lambda: ledger.exists() and "start" in ledger.read_text(), 30, "the first tool to start")
    await stack.send(chat, "and then say so", message_id="follow-up")
    done = await stack.wait_turn_done(chat, 1, timeout=60)
    assert done.status == TurnStatus.COMPLETED, done
    runs = [wf async for wf in stack.client.list_workflows(f"WorkflowId='{tk.workflow_id(chat)}'")]
    assert len(runs) >= 3, [r.status for r in runs]
    assert sum(r.status == WorkflowExecutionStatus.CONTINUED_AS_NEW for r in runs) == len(runs) - 1
    assert first.first_execution_run_id in {r.run_id for r in runs}
    assert ledger.read_text().count("start") == steps and ledger.read_text().count("done") == steps
    rows = await stack.history(chat)
    assert [r["content"] for r in rows if r["role"] == "user"] == ["write them all", "and then say so"]
    assert sum(r["role"] == "tool" for r in rows) == steps
    assert rows[-1] == {**rows[-1], "role": "assistant", "content": "all written"}
    turn = await (await stack.store()).get_turn(chat)
    assert turn is not None and turn.turn == 1 and turn.status == TurnStatus.COMPLETED
    await _answers_next_message(stack, chat)


async def test_a_turn_of_many_steps_goes_on_in_fresh_runs_at_the_real_bound(stack: Stack) -> None:
    """At the shipped bound: a turn of 150 steps is taken by at least two runs, none of
    whose histories passes the bound by more than one step, and ends as one turn."""
    from turnkeeper.long_history import RUN_HISTORY_EVENTS

    steps = 150
    stack.script(
        [{"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}] * steps + [{"text": "listed"}]
    )
    await stack.start_worker()
    chat = stack.chat()
    await stack.send(chat, "list it again and again")
    done = await stack.wait_turn_done(chat, 1, timeout=120)
    assert done.status == TurnStatus.COMPLETED, done
    runs = [wf async for wf in stack.client.list_workflows(f"WorkflowId='{tk.workflow_id(chat)}'")]
    assert len(runs) >= 2
    for run in runs:
        length = (await stack.client.get_workflow_handle(run.id, run_id=run.run_id).describe()).history_length
        assert length < RUN_HISTORY_EVENTS + 30, (run.run_id, length)
    rows = await stack.history(chat)
    assert sum(r["role"] == "tool" for r in rows) == steps
    assert rows[-1]["content"] == "listed"


@workflow.defn(name="ChatTurn")
class _OtherChatTurn:
    """What another release's `ChatTurn` might have recorded: a history that today's
    code cannot replay."""

    @workflow.run
    async def run(self, input: dict[str, Any]) -> None:
        await workflow.sleep(timedelta(hours=1))

    @workflow.signal(name="user_message")
    def user_message(self, payload: dict[str, Any]) -> None:
        pass


async def test_a_run_whose_history_does_not_replay_is_recovered(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workflow task that fails on nondeterminism is retried, not turned into a
    failed run: a message sent meanwhile joins the run. Once the task has failed
    long enough, a reconcile pass ends the run and hands its messages on in order,
    and the chat answers."""
    from tests.workflow.test_reconciler import run_pass
    from turnkeeper.activities.reconcile import wedged_runs

    # One or two turns, as the hand-on finds the messages, then the probe's.
    stack.script([{"text": "answered"}, {"text": "answered again"}, {"text": "and again"}])
    chat = stack.chat()
    async with Worker(
        stack.client,
        task_queue=stack.task_queue,
        workflows=[_OtherChatTurn],
        max_cached_workflows=0,
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await stack.send(chat, "one", message_id="m1")
        await until_async(lambda: _has_timer(handle), what="the other release's timer")
    await stack.start_worker()
    await stack.send(chat, "two", message_id="m2")  # a new workflow task: today's code replays it
    failed_run = stack.client.get_workflow_handle(
        tk.workflow_id(chat), run_id=(await handle.describe()).run_id
    )
    await _until_failing_and_marked(stack, chat, failed_run.run_id or "")
    await stack.send(chat, "three", message_id="m3")  # joins the failing run, behind "two"
    assert (await failed_run.describe()).status == WorkflowExecutionStatus.RUNNING
    monkeypatch.setattr(wedged_runs, "WEDGED_AFTER", timedelta(seconds=0))
    summary = await run_pass(stack)
    assert (summary.ended_wedged, summary.handed_on) == (1, 3), summary
    assert (await failed_run.describe()).status == WorkflowExecutionStatus.TERMINATED

    async def answered() -> bool:
        return [r["role"] for r in await stack.history(chat)][-1:] == ["assistant"] and await _user_rows(
            stack, chat
        ) == ["one", "two", "three"]

    await until_async(answered, timeout=30, what="the three messages answered, in order")
    await _answers_next_message(stack, chat)


async def _until_failing_and_marked(stack: Stack, chat: str, run_id: str) -> None:
    """The run still runs, its task has failed more often than the wedge rule counts,
    and the server has marked it (TemporalReportedProblems), so a pass can list it."""
    from turnkeeper.activities.reconcile import wedged_runs

    run = stack.client.get_workflow_handle(tk.workflow_id(chat), run_id=run_id)
    marked = f"WorkflowId = '{tk.workflow_id(chat)}' AND {wedged_runs.REPORTED_PROBLEMS} IS NOT NULL"

    async def failing_and_marked() -> bool:
        described = await run.describe()
        return (
            described.status == WorkflowExecutionStatus.RUNNING
            and described.raw_description.pending_workflow_task.attempt > wedged_runs.WEDGED_TASK_FAILURES
            and [r.run_id async for r in stack.client.list_workflows(marked)] == [run_id]
        )

    await until_async(
        failing_and_marked, timeout=30, what="the run's task failing again and again, and marked so"
    )


async def _has_timer(handle: Any) -> bool:
    history = await handle.fetch_history()
    return any(e.HasField("timer_started_event_attributes") for e in history.events)


async def _status_is(handle: Any, status: WorkflowExecutionStatus) -> bool:
    return (await handle.describe()).status == status


async def _listed(stack: Stack, query: str) -> bool:
    return bool([r async for r in stack.client.list_workflows(query)])


async def test_a_follow_up_of_a_run_that_ended_abnormally_survives_a_newer_message(stack: Stack) -> None:
    """The run holding an uncommitted follow-up is terminated, and a newer message
    closes its turn before any reconcile pass looks: the next pass still hands the
    follow-up on."""
    from tests.workflow.test_reconciler import run_pass

    with FakeChatServer(responder=_ok) as server:
        server.script([{"text": "never seen", "delay": 30}])
        _fake_model(stack, server)
        await stack.start_worker()
        chat = stack.chat()
        handle = await stack.send(chat, "one", message_id="m1")
        await until(lambda: len(server.requests) == 1, what="the model call")
        await stack.send(chat, "two", message_id="m2")  # waits for the next model call
        await stack.wait_state(chat, lambda s: "m2" in s.pending_followups)
        await handle.terminate(reason="an operator's mistake")
        await (await stack.send(chat, "three", message_id="m3")).result()  # closes turn 1
        await asyncio.sleep(1)  # visibility shows the close a moment later
        assert (await run_pass(stack)).handed_on == 1

        async def answered() -> bool:
            rows = await _user_rows(stack, chat)
            return "two" in rows and [r["role"] for r in await stack.history(chat)][-1] == "assistant"

        await until_async(answered, timeout=30, what="the follow-up answered")
        assert sorted(await _user_rows(stack, chat)) == ["one", "three", "two"]
        assert (await run_pass(stack)).handed_on == 0  # once


@contextlib.asynccontextmanager
async def _losing_the_first_model_call(stack: Stack) -> AsyncIterator[Any]:
    """Every workflow task and activity in this process, with the turn's first model
    call lost before it reached the store (its worker gone: the run cannot tell) and
    every later one made as usual. Yields the store, whose methods a test may wrap."""
    from turnkeeper.activities.assemble import build_activities
    from turnkeeper.activities.providers import load_provider
    from turnkeeper.activities.tools import default_registry
    from turnkeeper.step_timeouts import StepTimeouts
    from turnkeeper.store import open_store
    from turnkeeper.workflows.chat_turn import ChatTurn

    settings = stack.settings()
    store = open_store(settings)
    await store.open()
    activities = build_activities(settings, store, load_provider(settings.model), default_registry())
    [real] = [
        a for a in activities if activity._Definition.must_from_callable(a).name == activity_io.MODEL_CALL
    ]
    calls: list[activity_io.ModelCallInput] = []

    @activity.defn(name=activity_io.MODEL_CALL)
    async def model_call(inp: activity_io.ModelCallInput) -> activity_io.ModelCallResult:
        calls.append(inp)
        if len(calls) == 1:
            raise RuntimeError("the worker running the model call was lost")
        return await real(inp)

    try:
        async with Worker(
            stack.client,
            task_queue=stack.task_queue,
            workflows=[ChatTurn],
            activities=[model_call if a is real else a for a in activities],
            interceptors=[StepTimeouts(settings)],
        ):
            yield store
    finally:
        await store.close()


async def _turn_1_stopped_and_its_message_answered_in_turn_2(stack: Stack, chat: str) -> None:
    """Turn 1 stays as the store ended it; the lost call's message is turn 2's, answered once."""
    done = await stack.wait_turn_done(chat, 2)
    assert done.status == TurnStatus.COMPLETED
    turn1 = await (await stack.store()).get_turn(chat, 1)
    assert turn1 is not None and (turn1.status, turn1.reason) == (TurnStatus.RECOVERED, Reason.STOPPED)
    assert await _user_rows(stack, chat) == ["hello"]
    assert [r["content"] for r in await stack.history(chat)] == ["hello", "answered in turn 2"]


async def test_a_gate_that_finds_its_turn_closed_hands_the_lost_calls_messages_on(stack: Stack) -> None:
    """A lost model call held a message the store never took; between the store
    numbering the turn for its gate and the gate's first write, another writer ended
    the turn. The gate follows the store, and the message starts the next turn
    instead of vanishing with the lost call."""
    from turnkeeper.store.base import TurnUpdate

    stack.script([{"text": "answered in turn 2"}, {"text": "ok"}])
    chat = stack.chat()
    async with _losing_the_first_model_call(stack) as store:
        begin = store.begin_turn

        async def begin_then_ended_elsewhere(chat_id: str, run_id: str, message_ids: list[str]) -> Any:
            begun = await begin(chat_id, run_id, message_ids)
            if chat_id == chat and begun.turn == 1:  # what another writer did meanwhile: a Stop's end
                assert await store.finish_turn(
                    chat, 1, TurnUpdate(status=TurnStatus.RECOVERED, reason=Reason.STOPPED)
                )
            return begun

        store.begin_turn = begin_then_ended_elsewhere
        await stack.send(chat, "hello", message_id="m1")
        await _turn_1_stopped_and_its_message_answered_in_turn_2(stack, chat)
        await _answers_next_message(stack, chat)


async def test_a_continue_that_finds_its_turn_closed_hands_the_lost_calls_messages_on(stack: Stack) -> None:
    """As above, at the Continue: the gate opened and was answered, and the store
    write of the Continue finds the turn ended by another writer. The ending stands,
    nothing is resumed, and the lost call's message starts the next turn."""
    from turnkeeper.store.base import TurnUpdate

    stack.script([{"text": "answered in turn 2"}, {"text": "ok"}])
    chat = stack.chat()
    async with _losing_the_first_model_call(stack) as store:
        await stack.send(chat, "hello", message_id="m1")
        gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER, timeout=20)
        assert gate.reason == Reason.RESTART_REQUIRES_CONFIRMATION and gate.pending_followups == ["m1"]
        assert await store.finish_turn(
            chat,
            1,
            TurnUpdate(status=TurnStatus.RECOVERED, reason=Reason.STOPPED, recovery_id=gate.recovery_id),
        )
        answer = await stack.decide(chat, "continue", gate.recovery_id)
        assert answer.status == TurnStatus.RESUMING  # judged against the gate the run showed
        await _turn_1_stopped_and_its_message_answered_in_turn_2(stack, chat)
        await _answers_next_message(stack, chat)


@pytest.mark.timeout(120)
async def test_a_stop_while_the_first_model_call_waits_for_the_store_loses_no_message(stack: Stack) -> None:
    """A Stop that reaches the run while its first model call waits out a store
    outage (before the store has numbered the turn) is answered at once, and the
    call never asks the model. Nothing is lost: the message, never committed, is
    the next run's, answered once, and the chat answers its next message."""
    with FakeChatServer(responder=_ok) as server:
        server.script([{"text": "warm"}, {"text": "answered after the stop"}])
        _fake_model(stack, server)
        await stack.start_worker()
        await (await stack.send(stack.chat("warm"), "warm up")).result()  # the store exists
        chat = stack.chat()
        blocker = sqlite3.connect(stack.data / "sessions.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            await stack.send(chat, "one", message_id="m1")
            await stack.wait_state(chat, lambda s: s.store_unavailable, timeout=40)
            stopped = await _answered_at_once(stack, chat, "stop")
            assert (stopped.status, stopped.reason) == (TurnStatus.RECOVERED, Reason.STOPPED)
            await asyncio.sleep(0.5)
            assert len(server.requests) == 1  # the warm chat's
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()

        async def answered() -> bool:
            return [r["content"] for r in await stack.history(chat)] == ["one", "answered after the stop"]

        await until_async(answered, timeout=60, what="the message answered once")
        assert len(server.requests) == 2
        await _answers_next_message(stack, chat)


@workflow.defn(name="ChatTurn", sandboxed=False)
class _FailsEveryTask:
    """A fault no retry mends (in the code, or in the SDK: chaos seed 531's runs had
    their every completion refused): each workflow task of the run fails."""

    @workflow.run
    async def run(self, input: Any) -> None:
        raise ValueError("this run's every workflow task fails")


@contextlib.asynccontextmanager
async def _failing_run(stack: Stack, chat: str) -> AsyncIterator[tuple[Any, str]]:
    """The chat's run, started by "hello" (m1), while a worker fails its every task."""
    async with Worker(
        stack.client,
        task_queue=stack.task_queue,
        workflows=[_FailsEveryTask],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await stack.send(chat, "hello", message_id="m1")
        yield handle, (await handle.describe()).run_id


async def test_a_run_whose_workflow_task_keeps_failing_is_ended_and_its_turn_recovered(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Running to the server and going nowhere: a pass leaves such a run alone for a
    minute of failures, then ends it and recovers the turn like any run that ended
    abnormally. Its message is kept, and the chat answers again."""
    from temporalio.testing import ActivityEnvironment

    from turnkeeper.activities.reconcile import wedged_runs
    from turnkeeper.activities.reconcile.reconciler import Reconciler

    stack.script([{"text": "answered after the recovery"}, {"text": "ok"}])
    chat = stack.chat()
    store = await stack.store()
    async with _failing_run(stack, chat) as (handle, run_id):
        await store.begin_turn(chat, run_id, ["m1"])  # as the run's first model call would have

        async def failing() -> bool:
            raw = (await handle.describe()).raw_description
            return raw.pending_workflow_task.attempt > wedged_runs.WEDGED_TASK_FAILURES

        await until_async(failing, what="the run's task failing again and again")
        shown = await cli(stack, "status", chat)  # says so, not that no worker serves
        assert shown.returncode == 0 and "workflow task keeps failing" in shown.stderr, shown.stderr
    reconciler = Reconciler(stack.settings(), store)
    env = ActivityEnvironment(client=stack.client)
    summary = await env.run(reconciler.reconcile_pass)
    assert (summary.examined, summary.healthy) == (1, 1), summary  # within the minute: left alone

    monkeypatch.setattr(wedged_runs, "WEDGED_AFTER", timedelta(seconds=0))
    await stack.start_worker()
    summary = await env.run(reconciler.reconcile_pass)
    assert sum(summary.outcomes.values()) == 1 and summary.failed == 0, summary
    ended = await stack.client.get_workflow_handle(tk.workflow_id(chat), run_id=run_id).describe()
    assert ended.status == WorkflowExecutionStatus.TERMINATED
    gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER, timeout=20)
    await stack.decide(chat, "dismiss", gate.recovery_id)
    await _answers_next_message(stack, chat)
    assert (await _user_rows(stack, chat)).count("hello") == 1


@pytest.mark.parametrize("turn", ["never numbered", "closed"])
async def test_a_failing_run_that_no_open_turn_leads_to_is_ended_and_its_messages_kept_in_order(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, turn: str
) -> None:
    """A run can wedge where no open turn row leads to it: before the store numbered
    its turn, or after its turn closed while it held the next turn's messages. The
    server marks it (TemporalReportedProblems); a pass ends it and hands its messages
    on at once, in order, so a message sent right after the pass comes after them."""
    from temporalio.testing import ActivityEnvironment

    from turnkeeper.activities.reconcile import wedged_runs
    from turnkeeper.activities.reconcile.reconciler import Reconciler
    from turnkeeper.models import UserMessage
    from turnkeeper.store import TurnUpdate

    chat = stack.chat()
    store = await stack.store()
    async with _failing_run(stack, chat) as (_, run_id):
        if turn == "closed":  # as the run had done before it wedged: "hello" answered, its turn closed
            await store.begin_turn(chat, run_id, ["m1"])
            await store.commit_user_messages(chat, 1, [UserMessage(message_id="m1", text="hello")])
            assert await store.finish_turn(
                chat, 1, TurnUpdate(status=TurnStatus.COMPLETED), closing_text="hi"
            )
        await stack.send(chat, "two", message_id="m2")
        await stack.send(chat, "three", message_id="m3")
        await _until_failing_and_marked(stack, chat, run_id)
    assert await store.open_turn_refs() == []  # no open turn leads a pass to this run
    reconciler = Reconciler(stack.settings(), store)
    env = ActivityEnvironment(client=stack.client)
    summary = await env.run(reconciler.reconcile_pass)
    assert (summary.ended_wedged, summary.handed_on) == (0, 0), summary  # within the minute: left alone

    monkeypatch.setattr(wedged_runs, "WEDGED_AFTER", timedelta(seconds=0))
    summary = await env.run(reconciler.reconcile_pass)
    await stack.send(chat, "later", message_id="m4")  # right after the pass
    handed = 3 if turn == "never numbered" else 2
    assert (summary.ended_wedged, summary.handed_on) == (1, handed), summary
    ended = await stack.client.get_workflow_handle(tk.workflow_id(chat), run_id=run_id).describe()
    assert ended.status == WorkflowExecutionStatus.TERMINATED
    with FakeChatServer(responder=_ok) as server:
        _fake_model(stack, server)
        await stack.start_worker()  # a worker that serves the chat's next run
        await _answers_next_message(stack, chat)
    assert await _user_rows(stack, chat) == ["hello", "two", "three", "later", "are you there?"]


async def test_refusals_made_while_the_runs_last_events_are_written_are_announced(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn has ended, and its run's announcement of a refused message waits out
    a store outage; a message refused meanwhile is announced too, in order, and the
    run ends only after both are written: neither is dropped with it."""
    from turnkeeper.models import NewEvent
    from turnkeeper.store import StoreUnavailable
    from turnkeeper.store.core import SQLStore

    written = SQLStore.append_events
    outage = {"on": True}

    async def append_events(
        self: SQLStore, chat_id: str, events: list[NewEvent], keys: list[str] | None = None
    ) -> None:
        if outage["on"] and any(e.type == "message_rejected" for e in events):
            raise StoreUnavailable("the store is out (test)")
        await written(self, chat_id, events, keys=keys)

    ledger = stack.dir / "ledger.txt"
    monkeypatch.setenv("TK_LEDGER", str(ledger))  # the tool runs in this process
    stack.env_extra.update(
        {"TURNKEEPER_TOOL_MODULES": "tests.ledger_tools", "TURNKEEPER_TOOLS": "slow_write"}
    )
    stack.script(
        [
            {
                "tool_calls": [
                    {"name": "slow_write", "arguments": {"path": "k.txt", "content": "x", "seconds": 30}}
                ]
            }
        ]
    )
    await stack.start_worker(TURNKEEPER_MAX_MESSAGE_BYTES="200")
    chat = stack.chat()
    handle = await stack.send(chat, "one", message_id="m1")
    await until(lambda: ledger.exists() and "start" in ledger.read_text(), what="the tool to start")
    monkeypatch.setattr(SQLStore, "append_events", append_events)
    stopped = await stack.decide(chat, "stop")
    assert (stopped.status, stopped.reason) == (TurnStatus.RECOVERED, Reason.STOPPED)
    await stack.send(chat, "x" * 500, message_id="over-1")  # over the worker's 200 bytes
    store = await stack.store()

    async def closed() -> bool:
        record = await store.get_turn(chat, 1)
        return record is not None and record.status == TurnStatus.RECOVERED

    await until_async(closed, what="the stopped turn closed in the store")
    await asyncio.sleep(1.0)
    # The turn has ended; its run waits to write the first refusal.
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    await stack.send(chat, "y" * 500, message_id="over-2")
    await asyncio.sleep(1.0)
    outage["on"] = False
    await asyncio.wait_for(handle.result(), 60)
    refused = [e.payload["message_id"] for e in await store.events(chat) if e.type == "message_rejected"]
    assert refused == ["over-1", "over-2"]


async def test_a_run_started_by_hand_with_a_blank_chat_id_fails_once(stack: Stack) -> None:
    """`ChatTurn` fails a run whose chat id is blank, and our clients never start one
    (turnkeeper/chat_ids.py); the `temporal` CLI can. A pass used to hand its message
    on to a run that failed the same way, one more failed run every pass, forever."""
    from temporalio.common import WorkflowIDConflictPolicy
    from temporalio.testing import ActivityEnvironment

    from turnkeeper.activities.reconcile.reconciler import Reconciler
    from turnkeeper.models import ChatTurnInput, UserMessage

    await stack.start_worker()
    blank = " "
    handle = await stack.client.start_workflow(
        tk.WORKFLOW_TYPE,
        ChatTurnInput(chat_id=blank),
        id=tk.workflow_id(blank),
        task_queue=stack.settings().task_queue,
        start_signal="user_message",
        start_signal_args=[UserMessage(message_id="m1", text="hello")],
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    await until_async(lambda: _status_is(handle, WorkflowExecutionStatus.FAILED), what="the run to fail")
    query = f"WorkflowId = '{tk.workflow_id(blank)}' AND ExecutionStatus = 'Failed'"
    await until_async(
        lambda: _listed(stack, query), what="the failed run in visibility, where a pass finds it"
    )

    reconciler = Reconciler(stack.settings(), await stack.store())
    env = ActivityEnvironment(client=stack.client)
    for _ in range(2):
        summary = await env.run(reconciler.reconcile_pass)
        assert summary.handed_on == 0, summary
    await asyncio.sleep(1.0)  # a run handed the message would have failed by now
    runs = [r async for r in stack.client.list_workflows(f"WorkflowId = '{tk.workflow_id(blank)}'")]
    assert len(runs) == 1, [(r.run_id, r.status) for r in runs]


async def _status_is(handle: Any, status: WorkflowExecutionStatus) -> bool:
    return (await handle.describe()).status == status


async def _listed(stack: Stack, query: str) -> bool:
    return bool([r async for r in stack.client.list_workflows(query)])
