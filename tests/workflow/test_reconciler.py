"""The reconciler (README "Running on several machines" and the reconciler rows of the reason table):
the pure verdict (activities/reconcile/history_read.py) on a turn's history, then real passes on the dev
server over runs ended with `terminate()`, deleted histories and corrupted rows,
the schedule, the cost of a pass over many healthy chats, and quiet passes
deleted by the passes after them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import pytest
from temporalio import activity, workflow
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import (
    Client,
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionStartWorkflow,
    ScheduleOverlapPolicy,
    WorkflowExecutionStatus,
    WorkflowHistory,
)
from temporalio.common import SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.support import HISTORIES, Stack
from turnkeeper import activity_io
from turnkeeper import client as tk
from turnkeeper.activities.assemble import build_activities
from turnkeeper.activities.providers import load_provider
from turnkeeper.activities.reconcile import history_read, quiet_passes
from turnkeeper.activities.reconcile import verdict as reconcile_verdict
from turnkeeper.activities.reconcile.quiet_passes import QuietPasses, quiet_passes_query
from turnkeeper.activities.reconcile.reconciler import Reconciler
from turnkeeper.activities.reconcile.verdict import UnansweredCall
from turnkeeper.activities.tools import default_registry
from turnkeeper.config import Settings
from turnkeeper.models import (
    INTERRUPTED_TOOL_TEXT,
    ChatMessage,
    ChatTurnInput,
    ModelReply,
    Reason,
    RecoveryStart,
    ToolCall,
    TurnStatus,
    UserMessage,
)
from turnkeeper.reconcile_io import (
    DELETE_QUIET_PASSES,
    RECONCILE_PASS,
    RECONCILE_WORKFLOW,
    SCHEDULE_ID,
    PassOutcome,
    QuietPassCleanup,
    ReconcileSummary,
    pass_workflow_id,
)
from turnkeeper.reconcile_io import schedule_id as queue_schedule_id
from turnkeeper.search_attributes import RECONCILE_OUTCOME_ATTR, RECOVERY_REASON_ATTR, TURN_STATUS_ATTR
from turnkeeper.store import SessionStore, StoreError
from turnkeeper.testing import FakeChatServer
from turnkeeper.worker.dev_server import temporal_binary
from turnkeeper.worker.main import run_worker
from turnkeeper.worker.reconcile_schedule import ensure_reconcile_schedule
from turnkeeper.workflows.chat_turn import ChatTurn
from turnkeeper.workflows.reconcile import Reconcile

# -- history_read.py on a run's history -------------------------------------------------------
#
# One turn, recorded once for these tests: model call (its reply asks for call_0_0
# write_file), the tool, a model call (call_1_0 read_file), the tool, a model call
# (the final answer "a.txt says alpha"), the run completed. The tests cut or edit it.

USER = ChatMessage(role="user", content="write then read")
ASK_0 = ChatMessage(
    role="assistant",
    tool_calls=[
        ToolCall(id="call_0_0", name="write_file", arguments='{"path": "notes/a.txt", "content": "alpha"}')
    ],
)
DONE_0 = ChatMessage(
    role="tool", content="wrote 5 bytes to notes/a.txt", tool_call_id="call_0_0", name="write_file"
)
ASK_1 = ChatMessage(
    role="assistant",
    tool_calls=[ToolCall(id="call_1_0", name="read_file", arguments='{"path": "notes/a.txt"}')],
)
DONE_1 = ChatMessage(role="tool", content="alpha", tool_call_id="call_1_0", name="read_file")
FINAL = ChatMessage(role="assistant", content="a.txt says alpha")


@dataclass(frozen=True)
class Recorded:
    """The turn's history as JSON, and where its steps are in it."""

    raw: dict[str, Any]
    model_scheduled: list[int]
    model_completed: list[int]
    tool_scheduled: list[int]
    tool_completed: list[int]

    def copy(self) -> dict[str, Any]:
        return cast(dict[str, Any], json.loads(json.dumps(self.raw)))


@pytest.fixture(scope="module")
async def recorded(
    temporal_env: Any,
    temporal_address: str,
    temporal_http_address: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Recorded]:
    stack = Stack(
        temporal_env.client,
        temporal_address,
        tmp_path_factory.mktemp("verdict"),
        http_address=temporal_http_address,
    )
    try:
        stack.script(
            [
                {
                    "tool_calls": [
                        {"name": "write_file", "arguments": {"path": "notes/a.txt", "content": "alpha"}}
                    ]
                },
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes/a.txt"}}]},
                {"text": "a.txt says alpha"},
            ]
        )
        await stack.start_worker()
        handle = await stack.send(stack.chat(), "write then read")
        assert (await handle.result()).status == TurnStatus.COMPLETED
        history = await stack.client.get_workflow_handle(
            handle.id, run_id=handle.first_execution_run_id
        ).fetch_history()
    finally:
        await stack.close()
    raw = cast(dict[str, Any], json.loads(history.to_json()))
    scheduled = {
        int(e["eventId"]): e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
        for e in raw["events"]
        if "activityTaskScheduledEventAttributes" in e
    }
    completed = {
        int(e["eventId"]): int(e["activityTaskCompletedEventAttributes"]["scheduledEventId"])
        for e in raw["events"]
        if "activityTaskCompletedEventAttributes" in e
    }

    def of(name: str) -> tuple[list[int], list[int]]:
        ids = sorted(i for i, n in scheduled.items() if n == name)
        return ids, [next(c for c, s in completed.items() if s == i) for i in ids]

    model = of(activity_io.MODEL_CALL)
    tool = of(activity_io.TOOL_CALL)
    assert (len(model[0]), len(tool[0])) == (3, 2), scheduled  # the turn described above
    yield Recorded(raw, model[0], model[1], tool[0], tool[1])


def _events(raw: dict[str, Any], through: int | None = None) -> list[HistoryEvent]:
    if through is not None:
        raw = {**raw, "events": [e for e in raw["events"] if int(e["eventId"]) <= through]}
    return list(WorkflowHistory.from_json("wf", raw).events)


def _payload(raw: dict[str, Any], event_id: int) -> dict[str, Any]:
    """The (first) input or result payload of one event, as JSON."""
    event = next(e for e in raw["events"] if int(e["eventId"]) == event_id)
    attrs = next(v for k, v in event.items() if k.endswith("Attributes"))
    holder = attrs.get("input") or attrs.get("result")
    return cast(dict[str, Any], holder["payloads"][0])


def _edit(raw: dict[str, Any], event_id: int, change: Callable[[dict[str, Any]], None]) -> None:
    payload = _payload(raw, event_id)
    body = json.loads(base64.b64decode(payload["data"]))
    change(body)
    payload["data"] = base64.b64encode(json.dumps(body).encode()).decode()


def test_a_final_answer_in_the_history_is_restored(recorded: Recorded) -> None:
    verdict = history_read.judge_history(_events(recorded.raw), [USER, ASK_0, DONE_0, ASK_1, DONE_1])
    assert verdict.reason == Reason.ANSWER_RESTORED and verdict.final_text == "a.txt says alpha"
    assert [m.text for m in verdict.messages] == ["write then read"]


def test_a_persisted_completion_wins(recorded: Recorded) -> None:
    raw = recorded.copy()
    _payload(raw, recorded.tool_completed[0])["metadata"]["encoding"] = base64.b64encode(
        b"binary/encrypted"
    ).decode()
    verdict = history_read.judge_history(_events(raw), [USER, ASK_0, DONE_0, ASK_1, DONE_1, FINAL])
    assert verdict.reason == Reason.COMMITTED and verdict.closes_turn


def test_a_tool_scheduled_without_a_close_event_may_have_acted(recorded: Recorded) -> None:
    through = recorded.tool_scheduled[1]
    verdict = history_read.judge_history(_events(recorded.raw, through), [USER, ASK_0, DONE_0, ASK_1])
    assert (verdict.reason, verdict.can_continue) == (Reason.TOOL_STATE_UNKNOWN, True)
    assert verdict.unanswered == (UnansweredCall("call_1_0", "read_file", started=True),)
    # Once its interrupted row exists, nothing is left to answer (idempotent).
    answered = ChatMessage(
        role="tool", content=INTERRUPTED_TOOL_TEXT, tool_call_id="call_1_0", name="read_file"
    )
    again = history_read.judge_history(_events(recorded.raw, through), [USER, ASK_0, DONE_0, ASK_1, answered])
    assert again.reason == Reason.TOOL_STATE_UNKNOWN and again.unanswered == ()


def test_only_completed_steps_ask_to_restart(recorded: Recorded) -> None:
    lost_model_call = history_read.judge_history(
        _events(recorded.raw, recorded.model_scheduled[1]), [USER, ASK_0, DONE_0]
    )
    assert (lost_model_call.reason, lost_model_call.can_continue) == (
        Reason.RESTART_REQUIRES_CONFIRMATION,
        True,
    )
    assert lost_model_call.unanswered == ()
    # A reply whose tool was never scheduled: it did not run, and its row says so.
    unscheduled = history_read.judge_history(
        _events(recorded.raw, recorded.model_completed[1]), [USER, ASK_0, DONE_0, ASK_1]
    )
    assert unscheduled.reason == Reason.RESTART_REQUIRES_CONFIRMATION
    assert unscheduled.unanswered == (UnansweredCall("call_1_0", "read_file", started=False),)
    # The resumed step lost again: the live run would have said loop_guard too.
    resumed = history_read.judge_history(
        _events(recorded.raw, recorded.model_scheduled[1]), [USER, ASK_0, DONE_0], resuming=True
    )
    assert resumed.reason == Reason.LOOP_GUARD


@pytest.mark.parametrize("case", ["encoding", "schema", "input"])
def test_an_undecodable_payload_is_checkpoint_unknown(recorded: Recorded, case: str) -> None:
    raw = recorded.copy()
    if case == "encoding":
        _payload(raw, recorded.model_completed[1])["metadata"]["encoding"] = base64.b64encode(
            b"json/protobuf"
        ).decode()
    elif case == "schema":
        _payload(raw, recorded.model_completed[1])["data"] = base64.b64encode(
            b'{"schema": 99, "reply": "v2"}'
        ).decode()
    else:
        _edit(raw, recorded.tool_scheduled[1], lambda body: body.pop("call"))
    verdict = history_read.judge_history(_events(raw), [USER, ASK_0, DONE_0, ASK_1, DONE_1])
    assert (verdict.reason, verdict.can_continue) == (Reason.CHECKPOINT_UNKNOWN, False)


def _rename_call(body: dict[str, Any]) -> None:
    body["reply"]["tool_calls"][0]["id"] = "call_0_0"


def _ghost_call(body: dict[str, Any]) -> None:
    body["call"]["id"] = "ghost"


def _blank_answer(body: dict[str, Any]) -> None:
    body["reply"]["text"] = "  "


@pytest.mark.parametrize(
    "where,change,why",
    [
        ("second reply", _rename_call, "appears twice"),
        ("second tool", _ghost_call, "no model reply asked for it"),
        ("final answer", _blank_answer, "empty"),
    ],
)
def test_a_malformed_history_is_checkpoint_invalid(
    recorded: Recorded, where: str, change: Callable[[dict[str, Any]], None], why: str
) -> None:
    raw = recorded.copy()
    event_id = {
        "second reply": recorded.model_completed[1],
        "second tool": recorded.tool_scheduled[1],
        "final answer": recorded.model_completed[2],
    }[where]
    _edit(raw, event_id, change)
    verdict = history_read.judge_history(_events(raw), [USER, ASK_0, DONE_0, ASK_1, DONE_1])
    assert (verdict.reason, verdict.can_continue) == (Reason.CHECKPOINT_INVALID, False)
    assert why in verdict.detail


def test_a_recovery_run_that_ended_at_its_gate_opens_the_same_gate(recorded: Recorded) -> None:
    raw = recorded.copy()
    start = ChatTurnInput(
        chat_id="c-a46b3629",
        recovery=RecoveryStart(turn=1, reason=Reason.CHECKPOINT_INVALID, can_continue=False),
    )
    _payload(raw, 1)["data"] = base64.b64encode(start.model_dump_json().encode()).decode()
    verdict = history_read.judge_history(_events(raw, through=recorded.model_scheduled[0] - 1), [USER])
    assert (verdict.reason, verdict.can_continue) == (Reason.CHECKPOINT_INVALID, False)


def test_a_run_that_ended_at_an_approval_gate_asks_to_continue_not_to_approve(recorded: Recorded) -> None:
    """Its waiting calls were never scheduled: the reconciler answers them as not run."""
    raw = recorded.copy()
    start = ChatTurnInput(
        chat_id="c-a46b3629",
        recovery=RecoveryStart(
            turn=1, reason=Reason.APPROVAL_REQUIRED, approvals=[ToolCall(id="call_0_0", name="write_file")]
        ),
    )
    _payload(raw, 1)["data"] = base64.b64encode(start.model_dump_json().encode()).decode()
    verdict = history_read.judge_history(_events(raw, through=recorded.model_scheduled[0] - 1), [USER, ASK_0])
    assert (verdict.reason, verdict.can_continue) == (Reason.RESTART_REQUIRES_CONFIRMATION, True)
    assert verdict.unanswered == (UnansweredCall("call_0_0", "write_file", started=False),)


def _event_with(kind: str, payload: Any, signal: str | None = None) -> HistoryEvent:
    event = HistoryEvent(event_type=getattr(EventType, f"EVENT_TYPE_WORKFLOW_EXECUTION_{kind}"))
    if kind == "STARTED":
        event.workflow_execution_started_event_attributes.input.payloads.extend(
            pydantic_data_converter.payload_converter.to_payloads([payload])
        )
    else:
        attrs = event.workflow_execution_signaled_event_attributes
        attrs.signal_name = signal or "user_message"
        attrs.input.payloads.extend(pydantic_data_converter.payload_converter.to_payloads([payload]))
    return event


def test_follow_ups_the_run_acknowledged_are_reported_in_order() -> None:
    """The run's input first (messages an earlier run handed on), then its message
    signals in history order: each once, and none the run refused as unreadable."""

    def message(i: str) -> UserMessage:
        return UserMessage(message_id=i, text=f"text of {i}")

    events = [
        _event_with("STARTED", ChatTurnInput(chat_id="c", pending=[message("m1"), message("m2")])),
        _event_with("SIGNALED", message("m3")),
        _event_with("SIGNALED", {"recovery_id": "r"}, signal="dismiss"),
        _event_with("SIGNALED", {"message_id": "bad", "text": 5}),
        _event_with("SIGNALED", message("m2")),  # a client's retry
        _event_with("SIGNALED", message("m4")),
    ]
    assert [m.message_id for m in history_read.acknowledged(events)] == ["m1", "m2", "m3", "m4"]


def test_judging_the_store_alone() -> None:
    assert reconcile_verdict.judge_store([USER, FINAL]).reason == Reason.COMMITTED
    alone = reconcile_verdict.judge_store([USER])
    assert (alone.reason, alone.can_continue) == (Reason.INTERRUPTED_WITHOUT_CHECKPOINT, False)
    saved = reconcile_verdict.judge_store([USER, ASK_0, DONE_0, ASK_1])
    assert (saved.reason, saved.can_continue) == (Reason.INTERRUPTED_WITH_SAVED_CONTEXT, True)
    assert saved.unanswered == (UnansweredCall("call_1_0", "read_file"),)
    duplicate = ChatMessage(role="assistant", tool_calls=[ToolCall(id="call_0_0", name="x")])
    orphan = ChatMessage(role="tool", content="?", tool_call_id="nobody", name="x")
    empty = ChatMessage(role="assistant", content=" ")
    for rows in ([USER, ASK_0, duplicate], [USER, ASK_0, orphan], [USER, empty]):
        bad = reconcile_verdict.judge_store(rows)
        assert (bad.reason, bad.can_continue) == (Reason.CHECKPOINT_INVALID, False), rows


# -- passes on the dev server --------------------------------------------------------------


async def run_pass(stack: Stack) -> ReconcileSummary:
    return await stack.client.execute_workflow(
        RECONCILE_WORKFLOW,
        id=f"reconcile-{uuid.uuid4().hex[:8]}",
        task_queue=stack.task_queue,
        result_type=ReconcileSummary,
    )


def raw_db(stack: Stack) -> sqlite3.Connection:
    return sqlite3.connect(stack.data / "sessions.db")


async def run_id_of(stack: Stack, chat: str, turn: int = 1) -> str:
    record = await (await stack.store()).get_turn(chat, turn)
    assert record is not None and record.run_id
    return record.run_id


async def terminate(stack: Stack, chat: str) -> str:
    run_id = await run_id_of(stack, chat)
    await stack.client.get_workflow_handle(tk.workflow_id(chat), run_id=run_id).terminate(reason="test")
    return run_id


async def delete_history(client: Client, chat: str, run_id: str) -> None:
    """Delete a run with its history. Done while it runs: the server then terminates
    and deletes it at once (a closed run's deletion is queued for ~30 s)."""
    await client.workflow_service.delete_workflow_execution(
        DeleteWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=tk.workflow_id(chat), run_id=run_id),
        )
    )
    handle = client.get_workflow_handle(tk.workflow_id(chat), run_id=run_id)
    await until(lambda: _gone(handle), "the run's history is deleted")


async def _gone(handle: Any) -> bool:
    try:
        await handle.describe()
    except RPCError as err:
        return err.status == RPCStatusCode.NOT_FOUND
    return False


async def until(check: Callable[[], Awaitable[bool] | bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if await result if isinstance(result, Awaitable) else result:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting until {what}")


async def events_of(stack: Stack, chats: list[str]) -> dict[str, list[tuple[int, str]]]:
    store = await stack.store()
    return {c: [(e.seq, e.type) for e in await store.events(c)] for c in chats}


async def test_a_pass_recovers_each_row_of_the_reason_table(stack: Stack) -> None:
    """One pass over chats whose runs were terminated, deleted, corrupted or
    completed meanwhile; the recovery runs then wait at their gates (contract)."""
    ledger = stack.ws / "ledger.txt"

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        first = next(m["content"] for m in request["messages"] if m["role"] == "user")
        if first.startswith("slow tool"):
            return {
                "tool_calls": [
                    {"name": "slow_write", "arguments": {"path": "k.txt", "content": "x", "seconds": 30}}
                ]
            }
        return {"text": "too late", "delay": 90}  # a model call still under way

    with FakeChatServer(responder=answer) as server:
        stack.env_extra.update(
            {
                "TURNKEEPER_MODEL": "openai:fake-model",
                "OPENAI_BASE_URL": server.base_url,
                "OPENAI_API_KEY": "k",
                "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
                "TURNKEEPER_TOOLS": "slow_write,read_file",
            }
        )
        await stack.start_worker()
        store = await stack.store()
        names = ["tool", "followup", "model", "corrupt", "saved", "nothing", "raising", "done", "healthy"]
        chat = {n: stack.chat(n) for n in names}
        kind = {"tool": "slow tool", "followup": "slow tool", "saved": "slow tool"}

        async def under_way(n: str) -> None:
            text = f"{kind.get(n, 'slow model')} {chat[n]}"
            await stack.send(chat[n], text)
            if kind.get(n) == "slow tool":
                await until(lambda: ledger.exists() and chat[n] in ledger.read_text(), f"{n}: tool started")
            else:
                await until(lambda: any(text in json.dumps(r) for r in server.requests), f"{n}: model called")

        await asyncio.gather(*(under_way(n) for n in names))
        # Acknowledged while the tool ran, never committed: only the run's history has it.
        await stack.send(chat["followup"], "and then?", message_id="later")
        await until(lambda: _has_signal(stack, chat["followup"], "later"), "the follow-up is in the history")

        with raw_db(stack) as db:
            db.execute(
                'UPDATE messages SET body = \'{"role": "robot"}\' WHERE chat_id = ?', (chat["corrupt"],)
            )
        await store.record_assistant(chat["done"], 1, 0, ModelReply(text="all done"), final=False)
        gone = ("saved", "nothing")  # deleted while running: ended, and no history left
        dead = {n: await terminate(stack, chat[n]) for n in names if n not in gone and n != "healthy"}
        for n in gone:
            dead[n] = await run_id_of(stack, chat[n])
        await asyncio.gather(*(delete_history(stack.client, chat[n], dead[n]) for n in gone))
        with raw_db(stack) as db:  # a run id Temporal refuses to describe: recovering this chat raises
            db.execute("UPDATE turns SET run_id = 'not-a-run-id' WHERE chat_id = ?", (chat["raising"],))
        healthy_before = await events_of(stack, [chat["healthy"]])

        summary = await run_pass(stack)
        assert summary.outcomes == {
            Reason.TOOL_STATE_UNKNOWN: 2,
            Reason.RESTART_REQUIRES_CONFIRMATION: 1,
            Reason.CHECKPOINT_INVALID: 1,
            Reason.INTERRUPTED_WITH_SAVED_CONTEXT: 1,
            Reason.INTERRUPTED_WITHOUT_CHECKPOINT: 1,
            Reason.COMMITTED: 1,
        }, summary
        assert (summary.healthy, summary.failed, summary.examined) == (1, 1, 9)
        assert await events_of(stack, [chat["healthy"]]) == healthy_before

        # The reconciler's own writes: interrupted rows, the committed turn, the failed one.
        for n in ("tool", "followup", "saved"):
            last = (await stack.history(chat[n]))[-1]
            assert last["role"] == "tool" and last["content"] == INTERRUPTED_TOOL_TEXT, n
        done = await store.get_turn(chat["done"], 1)
        assert done is not None and (done.status, done.reason) == (TurnStatus.RECOVERED, Reason.COMMITTED)
        assert (await stack.event_types(chat["done"]))[-3:] == [
            "recovery_state",
            "session_updated",
            "turn_end",
        ]
        raising = await store.get_turn(chat["raising"], 1)
        assert raising is not None and (raising.status, raising.reason, raising.can_continue) == (
            TurnStatus.FAILED,
            Reason.RECOVERY_FAILED,
            False,
        )
        assert raising.recovery_id

        # The recovery runs (chat_turn.py's recovery mode) open their gates: state
        # query, store turn row and search attributes agree.
        gates = {
            "tool": (Reason.TOOL_STATE_UNKNOWN, True),
            "followup": (Reason.TOOL_STATE_UNKNOWN, True),
            "model": (Reason.RESTART_REQUIRES_CONFIRMATION, True),
            "corrupt": (Reason.CHECKPOINT_INVALID, False),
            "saved": (Reason.INTERRUPTED_WITH_SAVED_CONTEXT, True),
            "nothing": (Reason.INTERRUPTED_WITHOUT_CHECKPOINT, False),
        }
        for n, (reason, can_continue) in gates.items():
            state = await stack.wait_state(
                chat[n], lambda s: s.status == TurnStatus.AWAITING_USER, timeout=20
            )
            assert (state.turn, state.reason, state.can_continue) == (1, reason, can_continue), n
            assert state.recovery_id
            record = await store.get_turn(chat[n], 1)
            assert record is not None and record.run_id != dead[n], n
            assert (record.status, record.reason, record.can_continue, record.recovery_id) == (
                TurnStatus.AWAITING_USER,
                reason,
                can_continue,
                state.recovery_id,
            ), n
            attrs = (
                await stack.client.get_workflow_handle(tk.workflow_id(chat[n])).describe()
            ).typed_search_attributes
            assert (attrs.get(TURN_STATUS_ATTR), attrs.get(RECOVERY_REASON_ATTR)) == (
                "awaiting_user",
                reason.value,
            ), n

        # The next pass finds them healthy and writes nothing anywhere.
        before = await events_of(stack, list(chat.values()))
        again = await run_pass(stack)
        assert (again.examined, again.healthy, again.outcomes, again.failed) == (7, 7, {}, 0), again
        assert await events_of(stack, list(chat.values())) == before

        # The follow-up the ended run had acknowledged waits behind the new gate (not
        # consent), and Dismiss commits it as a user row: it is not lost.
        state = await stack.state(chat["followup"])
        assert state.pending_followups == ["later"] and state.recovery_id
        await stack.decide(chat["followup"], "dismiss", state.recovery_id)

        async def closed() -> bool:  # the closing store write follows the answer
            record = await store.get_turn(chat["followup"], 1)
            return record is not None and record.status == TurnStatus.RECOVERED

        await until(closed, "the dismissed turn closed in the store")
        assert [m.get("content") for m in await stack.history(chat["followup"])].count("and then?") == 1


async def test_an_answer_in_an_ended_run_is_restored_without_a_model_call(stack: Stack) -> None:
    """A run that got its final answer but whose store lost it: terminated before
    its next workflow task, or completed while the store still shows the turn open."""
    stack.script([{"text": "the answer"}])
    settings = stack.settings()
    store = await stack.store()
    provider = load_provider(settings.model, env=settings.provider_env())
    activities = build_activities(settings, store, provider, default_registry())
    terminated, completed = stack.chat("terminated"), stack.chat("completed")

    # Workflow tasks only: the model call (which numbers the turn) waits for another worker.
    turns = Worker(stack.client, task_queue=stack.task_queue, workflows=[ChatTurn], no_remote_activities=True)
    async with turns:
        handle = await stack.send(terminated, "question")

        async def model_call_scheduled() -> bool:
            pending = (await handle.describe()).raw_description.pending_activities
            return any(a.activity_type.name == activity_io.MODEL_CALL for a in pending)

        await until(model_call_scheduled, "the model call is scheduled")
    # The answer is given and stored while no worker runs the workflow's next task.
    async with Worker(stack.client, task_queue=stack.task_queue, activities=activities):
        await until(lambda: _turn_status(stack, terminated, "completed"), "the model call finished")
    await provider.aclose()
    dead = await terminate(stack, terminated)  # before any worker could finish the run

    await stack.start_worker()
    await stack.send(completed, "question")
    await stack.wait_turn_done(completed, 1)
    for chat in (terminated, completed):  # the store loses the answer; the turn shows open
        with raw_db(stack) as db:
            db.execute("DELETE FROM messages WHERE chat_id = ? AND role = 'assistant'", (chat,))
            db.execute("UPDATE turns SET status = 'running', ended = 0 WHERE chat_id = ?", (chat,))

    summary = await run_pass(stack)
    assert summary.outcomes == {Reason.ANSWER_RESTORED: 2}, summary
    for chat in (terminated, completed):
        assert await stack.history(chat) == [
            {"role": "user", "content": "question"},
            {"role": "assistant", "content": "the answer"},
        ]
        record = await store.get_turn(chat, 1)
        assert record is not None and (record.status, record.reason) == (
            TurnStatus.RECOVERED,
            Reason.ANSWER_RESTORED,
        )
        events = await store.events(chat)
        assert [e.type for e in events[-4:]] == [
            "assistant_message",
            "recovery_state",
            "session_updated",
            "turn_end",
        ]
        assert events[-1].payload == {"turn": 1, "status": "recovered", "reason": "answer_restored"}
    # No recovery run, no model call: the terminated run is still the chat's latest.
    latest = await stack.client.get_workflow_handle(tk.workflow_id(terminated)).describe()
    assert latest.run_id == dead and latest.status == WorkflowExecutionStatus.TERMINATED
    assert (await run_pass(stack)).examined == 0


async def _has_signal(stack: Stack, chat: str, message_id: str) -> bool:
    history = await stack.client.get_workflow_handle(tk.workflow_id(chat)).fetch_history()
    return any(
        message_id.encode() in e.workflow_execution_signaled_event_attributes.input.payloads[0].data
        for e in history.events
        if e.HasField("workflow_execution_signaled_event_attributes")
    )


def _turn_status(stack: Stack, chat: str, status: str) -> bool:
    with raw_db(stack) as db:
        row = db.execute("SELECT status FROM turns WHERE chat_id = ?", (chat,)).fetchone()
    return row is not None and row[0] == status


async def test_the_worker_creates_the_schedule_and_a_trigger_runs_a_pass(stack: Stack) -> None:
    settings = stack.settings(TURNKEEPER_RECONCILE_EVERY="3600")
    schedule_id = f"turnkeeper-reconcile-{uuid.uuid4().hex[:8]}"  # tests share one server
    store = await stack.store()
    chat = stack.chat("stale")  # its completion is stored; its run is long gone
    await store.begin_turn(chat, str(uuid.uuid4()), ["m1"])
    await store.commit_user_messages(chat, 1, [UserMessage(message_id="m1", text="hi")])
    await store.record_assistant(chat, 1, 0, ModelReply(text="hello"), final=False)

    stop = asyncio.Event()
    worker = asyncio.create_task(
        run_worker(settings, client=stack.client, stop=stop, reconcile_schedule_id=schedule_id)
    )
    schedule = stack.client.get_schedule_handle(schedule_id)
    try:
        await until(lambda: _exists(schedule), "the worker created the schedule")
        described = (await schedule.describe()).schedule
        action = described.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        assert (action.workflow, action.task_queue, action.id) == (
            RECONCILE_WORKFLOW,
            stack.task_queue,
            pass_workflow_id(schedule_id),
        )
        assert [i.every.total_seconds() for i in described.spec.intervals] == [3600]
        assert described.policy.overlap == ScheduleOverlapPolicy.SKIP
        # Several workers starting at once: the schedule exists, nobody fails.
        assert await asyncio.gather(
            *(ensure_reconcile_schedule(stack.client, settings, schedule_id) for _ in range(3))
        ) == [False, False, False]

        # What an operator runs (with our schedule id): a pass at once.
        trigger = await asyncio.create_subprocess_exec(
            temporal_binary(),
            "schedule",
            "trigger",
            "--schedule-id",
            schedule_id,
            "--address",
            stack.address,
            "--namespace",
            stack.client.namespace,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await trigger.communicate()
        assert trigger.returncode == 0, out.decode()
        await until(lambda: _turn_status(stack, chat, "recovered"), "the triggered pass closed the turn")
        record = await store.get_turn(chat, 1)
        assert record is not None and record.reason == Reason.COMMITTED

        # A worker started the default way creates its task queue's own schedule (the
        # default queue's is the contract's id), so two deployments in a namespace each
        # get passes on their own queue.
        other = f"{stack.task_queue}-b"
        await stack.start_worker(TURNKEEPER_TASK_QUEUE=other, TURNKEEPER_RECONCILE_EVERY="3600")
        own = stack.client.get_schedule_handle(queue_schedule_id(other))
        await until(lambda: _exists(own), "the second queue's worker created its schedule")
        action = (await own.describe()).schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        assert (action.workflow, action.task_queue) == (RECONCILE_WORKFLOW, other)
        assert queue_schedule_id("turnkeeper") == SCHEDULE_ID
        await own.delete()
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
        with contextlib.suppress(RPCError):
            await schedule.delete()


async def test_a_schedule_serving_another_queue_is_named_in_the_log(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A schedule with this queue's id that starts passes elsewhere (made by hand,
    say) is not taken over, and not shared silently: the worker says so."""
    sid = f"turnkeeper-reconcile-{uuid.uuid4().hex[:8]}"
    await ensure_reconcile_schedule(client, Settings(task_queue="queue-a", reconcile_every=3600), sid)
    try:
        with caplog.at_level(logging.ERROR, logger="turnkeeper.reconcile"):
            created = await ensure_reconcile_schedule(
                client, Settings(task_queue="queue-b", reconcile_every=3600), sid
            )
        assert not created
        assert "'queue-a', not this worker's 'queue-b'" in caplog.text
    finally:
        await client.get_schedule_handle(sid).delete()


async def _exists(schedule: Any) -> bool:
    try:
        await schedule.describe()
    except RPCError:
        return False
    return True


class CountingStore:
    """Records every store call with the chat it names, then passes it on."""

    WRITES = frozenset(
        {
            "begin_turn",
            "update_turn",
            "commit_user_messages",
            "record_assistant",
            "tool_started",
            "record_tool_result",
            "finish_turn",
            "adopt_turn",
            "append_events",
        }
    )

    def __init__(self, inner: SessionStore) -> None:
        self._inner = inner
        self.calls: list[tuple[str, str | None]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            chat = args[0] if args and isinstance(args[0], str) else None
            self.calls.append((name, chat))
            return await method(*args, **kwargs)

        return counted

    def writes(self) -> list[tuple[str, str | None]]:
        return [c for c in self.calls if c[0] in self.WRITES]


async def test_a_pass_reads_and_writes_only_the_broken_chats(stack: Stack) -> None:
    client, store, settings = stack.client, await stack.store(), stack.settings()
    idle = f"idle-{uuid.uuid4().hex[:8]}"  # no worker polls it: these runs stay running

    async def open_turn(chat: str, *, terminated: bool = False) -> str:
        handle = await client.start_workflow(
            ChatTurn.run,
            ChatTurnInput(chat_id=chat),
            id=tk.workflow_id(chat),
            task_queue=idle,
            execution_timeout=timedelta(minutes=3),
        )
        run_id = handle.result_run_id
        assert run_id
        await store.begin_turn(chat, run_id, ["m1"])
        await store.commit_user_messages(chat, 1, [UserMessage(message_id="m1", text="hi")])
        if terminated:
            await handle.terminate(reason="test")
        return run_id

    healthy = [stack.chat("healthy") for _ in range(200)]
    for i in range(0, len(healthy), 50):
        await asyncio.gather(*(open_turn(c) for c in healthy[i : i + 50]))
    closed = [stack.chat("closed") for _ in range(50)]
    for chat in closed:  # completed long ago: not open, never looked at
        await store.begin_turn(chat, str(uuid.uuid4()), ["m1"])
        await store.record_assistant(chat, 1, 0, ModelReply(text="ok"), final=True)

    restart, saved, done = stack.chat("restart"), stack.chat("saved"), stack.chat("done")
    await open_turn(restart, terminated=True)
    saved_run = await open_turn(saved)
    await store.record_assistant(
        saved, 1, 0, ModelReply(tool_calls=[ToolCall(id="t1", name="write_file")]), final=False
    )
    await delete_history(client, saved, saved_run)
    await store.begin_turn(done, str(uuid.uuid4()), ["m1"])
    await store.record_assistant(done, 1, 0, ModelReply(text="answered"), final=False)
    broken = {restart, saved, done}

    counting = CountingStore(store)
    reconciler = Reconciler(settings, cast(SessionStore, counting))
    env = ActivityEnvironment(client=client)
    started = time.monotonic()
    summary = await env.run(reconciler.reconcile_pass)
    elapsed = time.monotonic() - started
    assert summary.healthy == 200 and summary.failed == 0, summary
    assert summary.outcomes == {
        Reason.RESTART_REQUIRES_CONFIRMATION: 1,
        Reason.INTERRUPTED_WITH_SAVED_CONTEXT: 1,
        Reason.COMMITTED: 1,
    }, summary
    assert [c for c in counting.calls if c[1] is None] == [("open_turn_refs", None)]
    assert {c[1] for c in counting.calls if c[1] is not None} == broken
    assert {c[1] for c in counting.writes()} == {saved, done}
    assert elapsed < 20, f"a pass over 203 open turns took {elapsed:.1f} s"

    # The next pass: the recovery runs wait for a worker on the stack's queue, so the
    # two gated chats are judged again but left alone; nothing is written anywhere.
    everyone = healthy + closed + sorted(broken)
    before = await events_of(stack, everyone)
    counting.calls.clear()
    again = await env.run(reconciler.reconcile_pass)
    assert (again.healthy, again.busy, again.outcomes, again.failed) == (200, 2, {}, 0), again
    assert counting.writes() == []
    assert await events_of(stack, everyone) == before
    for chat in (restart, saved):
        with contextlib.suppress(RPCError):
            await client.get_workflow_handle(tk.workflow_id(chat)).terminate(reason="test over")


class FaultyStore:
    """Passes every call on, except that reading one chat's rows raises what
    `faults` names for it."""

    def __init__(self, inner: SessionStore, faults: dict[str, Exception]) -> None:
        self._inner = inner
        self._faults = faults

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def turn_messages(self, chat_id: str, turn: int) -> list[ChatMessage]:
        if chat_id in self._faults:
            raise self._faults[chat_id]
        return await self._inner.turn_messages(chat_id, turn)


_HANDED_ON_QUEUE = f"idle-{uuid.uuid4().hex[:8]}"  # no worker polls it


@workflow.defn(name=tk.WORKFLOW_TYPE)
class _HandsItselfOn:
    """A turn's run that takes a model step asking for a tool, then hands itself on
    before the tool step, into a run no worker takes yet: the moment between a
    hand-on and the new run's first task."""

    @workflow.run
    async def run(self, inp: ChatTurnInput) -> None:
        await workflow.execute_activity(
            activity_io.MODEL_CALL,
            activity_io.ModelCallInput(chat_id=inp.chat_id, turn=1, step=0),
            result_type=activity_io.ModelCallResult,
            start_to_close_timeout=timedelta(seconds=30),
        )
        workflow.continue_as_new(inp, task_queue=_HANDED_ON_QUEUE)


async def test_a_turn_whose_run_handed_itself_on_is_left_to_the_run_it_continued_in(stack: Stack) -> None:
    """The store still names the run that handed on (the new run adopts the turn in
    its first task), and its history ends with a tool call not yet made. While the
    new run runs, a pass leaves the turn alone, writing nothing (the new run makes
    that call); once no run runs, the pass recovers it."""
    client, store, settings = stack.client, await stack.store(), stack.settings()
    chat = stack.chat("handed-on")
    asks_for_a_tool = ModelReply(tool_calls=[ToolCall(id="t1", name="write_file")])
    turn_begun = asyncio.Event()

    @activity.defn(name=activity_io.MODEL_CALL)
    async def model_call(inp: activity_io.ModelCallInput) -> activity_io.ModelCallResult:
        await turn_begun.wait()
        await store.record_assistant(chat, 1, 0, asks_for_a_tool, final=False)
        return activity_io.ModelCallResult(reply=asks_for_a_tool)

    async with Worker(
        client,
        task_queue=stack.task_queue,
        workflows=[_HandsItselfOn],
        activities=[model_call],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await client.start_workflow(
            _HandsItselfOn.run,
            ChatTurnInput(chat_id=chat),
            id=tk.workflow_id(chat),
            task_queue=stack.task_queue,
            execution_timeout=timedelta(minutes=3),
        )
        first_run = handle.result_run_id
        assert first_run
        await store.begin_turn(chat, first_run, ["m1"])
        await store.commit_user_messages(chat, 1, [UserMessage(message_id="m1", text="hi")])
        turn_begun.set()

        async def handed_on() -> bool:
            described = await client.get_workflow_handle(tk.workflow_id(chat), run_id=first_run).describe()
            return described.status == WorkflowExecutionStatus.CONTINUED_AS_NEW

        await _eventually(handed_on, "the run handed itself on")
    rows = [m.public() for m in await store.history(chat)]
    reconciler = Reconciler(settings, store)
    env = ActivityEnvironment(client=client)
    summary = await env.run(reconciler.reconcile_pass)
    assert (summary.examined, summary.busy, summary.outcomes, summary.failed) == (1, 1, {}, 0), summary
    turn = await store.get_turn(chat, 1)
    assert (turn.status, turn.run_id) == (TurnStatus.RUNNING, first_run)
    assert [m.public() for m in await store.history(chat)] == rows  # no "not run" answer to t1

    await client.get_workflow_handle(tk.workflow_id(chat)).terminate(reason="test: the new run is gone")
    summary = await env.run(reconciler.reconcile_pass)
    assert summary.busy == 0 and sum(summary.outcomes.values()) == 1, summary
    with contextlib.suppress(RPCError):
        await client.get_workflow_handle(tk.workflow_id(chat)).terminate(reason="test over")


async def _eventually(pred: Callable[[], Awaitable[bool]], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.1)


async def test_one_bad_chat_is_marked_failed_once_and_an_outage_is_retried(stack: Stack) -> None:
    store, settings = await stack.store(), stack.settings()
    locked, bad, done = stack.chat("locked"), stack.chat("bad"), stack.chat("done")
    for chat in (locked, bad, done):  # runs long gone: judged from the store alone
        await store.begin_turn(chat, str(uuid.uuid4()), ["m1"])
        await store.commit_user_messages(chat, 1, [UserMessage(message_id="m1", text="hi")])
    await store.record_assistant(done, 1, 0, ModelReply(text="answered"), final=False)
    env = ActivityEnvironment(client=stack.client)

    faulty = FaultyStore(store, {locked: StoreError("database is locked"), bad: RuntimeError("bug")})
    first = await env.run(Reconciler(settings, cast(SessionStore, faulty)).reconcile_pass)
    assert (first.deferred, first.failed, first.outcomes) == (1, 1, {Reason.COMMITTED: 1}), first
    record = await store.get_turn(bad, 1)
    assert record is not None and (record.status, record.reason, record.can_continue) == (
        TurnStatus.FAILED,
        Reason.RECOVERY_FAILED,
        False,
    )
    untouched = await store.get_turn(locked, 1)
    assert untouched is not None and untouched.status == TurnStatus.RUNNING

    # Healthy again: the deferred chat is recovered; the failed one is not looked at again.
    before = await events_of(stack, [bad])
    second = await env.run(Reconciler(settings, store).reconcile_pass)
    assert (second.examined, second.outcomes) == (1, {Reason.INTERRUPTED_WITHOUT_CHECKPOINT: 1}), second
    assert await events_of(stack, [bad]) == before
    with contextlib.suppress(RPCError):
        await stack.client.get_workflow_handle(tk.workflow_id(locked)).terminate(reason="test over")


async def test_a_server_that_refuses_the_marked_runs_query_still_gets_the_rest_of_the_pass(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs with no open turn are listed by the server's TemporalReportedProblems mark;
    a server that does not know the attribute refuses that query, and the pass still
    judges its open turns and sweeps the runs that ended."""
    from temporalio.client import Client as TemporalClient

    store, settings = await stack.store(), stack.settings()
    chat = stack.chat("refused")
    await store.begin_turn(chat, str(uuid.uuid4()), ["m1"])  # its run long gone
    await store.commit_user_messages(chat, 1, [UserMessage(message_id="m1", text="hi")])
    await store.record_assistant(chat, 1, 0, ModelReply(text="answered"), final=False)
    listed = TemporalClient.list_workflows

    def list_workflows(self: TemporalClient, query: str | None = None, **kwargs: Any) -> Any:
        if query and "TemporalReportedProblems" in query:
            raise RPCError("invalid query: unknown search attribute", RPCStatusCode.INVALID_ARGUMENT, b"")
        return listed(self, query, **kwargs)

    monkeypatch.setattr(TemporalClient, "list_workflows", list_workflows)
    summary = await ActivityEnvironment(client=stack.client).run(Reconciler(settings, store).reconcile_pass)
    assert (summary.outcomes, summary.ended_wedged, summary.failed) == ({Reason.COMMITTED: 1}, 0, 0), summary


# -- quiet passes leave no run behind --------------------------------------------------------


def test_a_pass_is_quiet_only_when_it_left_everything_as_it_was() -> None:
    assert ReconcileSummary(examined=3, healthy=1, settled=1, busy=1).outcome == PassOutcome.QUIET
    assert ReconcileSummary(deferred=1).outcome == PassOutcome.DEFERRED
    for acted in (
        ReconcileSummary(outcomes={Reason.COMMITTED: 1}, deferred=1),
        ReconcileSummary(failed=1),
        ReconcileSummary(handed_on=2),
        ReconcileSummary(ended_wedged=1),
    ):
        assert acted.outcome == PassOutcome.ACTED, acted


async def _listed(client: Client, query: str) -> set[str]:
    return {w.run_id async for w in client.list_workflows(query)}


async def _listed_becomes(client: Client, query: str, expected: set[str], what: str) -> None:
    """Temporal takes about half a minute to drop a deleted closed run from the list."""

    async def settled() -> bool:
        return await _listed(client, query) == expected

    await until(settled, what, timeout=150)


async def test_quiet_passes_leave_no_run_behind_and_a_pass_that_acted_stays(stack: Stack) -> None:
    """Passes the schedule starts: after several quiet ones the task queue lists the
    latest two; one that closed a turn stays listed after the quiet ones around it
    are gone. The schedule stays active at its interval throughout."""
    settings = stack.settings(TURNKEEPER_RECONCILE_EVERY="3600", TURNKEEPER_WORKFLOW_SANDBOX="on")
    schedule_id = f"turnkeeper-reconcile-{uuid.uuid4().hex[:8]}"  # tests share one server
    passes_query = f"WorkflowType = '{RECONCILE_WORKFLOW}' AND TaskQueue = '{stack.task_queue}'"
    stop = asyncio.Event()
    worker = asyncio.create_task(
        run_worker(settings, client=stack.client, stop=stop, reconcile_schedule_id=schedule_id)
    )
    schedule = stack.client.get_schedule_handle(schedule_id)
    workflow_ids: dict[str, str] = {}  # run id -> workflow id

    async def scheduled_pass() -> tuple[str, ReconcileSummary]:
        """Trigger the schedule (as `temporal schedule trigger` does) and wait for its run."""
        before = (await schedule.describe()).info.num_actions
        await schedule.trigger()

        async def started() -> bool:
            return (await schedule.describe()).info.num_actions > before

        await until(started, "the schedule started a pass")
        action = (await schedule.describe()).info.recent_actions[-1].action
        assert isinstance(action, ScheduleActionExecutionStartWorkflow)
        workflow_ids[action.first_execution_run_id] = action.workflow_id
        handle = stack.client.get_workflow_handle(
            action.workflow_id, run_id=action.first_execution_run_id, result_type=ReconcileSummary
        )
        return action.first_execution_run_id, await asyncio.wait_for(handle.result(), 60)

    async def outcome(run_id: str) -> str | None:
        described = await stack.client.get_workflow_handle(workflow_ids[run_id], run_id=run_id).describe()
        return described.typed_search_attributes.get(RECONCILE_OUTCOME_ATTR)

    try:
        await until(lambda: _exists(schedule), "the worker created the schedule")
        quiet = []
        for _ in range(4):
            run_id, summary = await scheduled_pass()
            assert summary.outcome == PassOutcome.QUIET, summary
            quiet.append(run_id)
        await _listed_becomes(
            stack.client, passes_query, set(quiet[-2:]), "the latest two quiet passes are listed"
        )

        store = await stack.store()
        chat = stack.chat("stale")  # its completion is stored; its run is long gone
        await store.begin_turn(chat, str(uuid.uuid4()), ["m1"])
        await store.commit_user_messages(chat, 1, [UserMessage(message_id="m1", text="hi")])
        await store.record_assistant(chat, 1, 0, ModelReply(text="hello"), final=False)
        acted, summary = await scheduled_pass()
        assert summary.outcomes == {Reason.COMMITTED: 1} and summary.outcome == PassOutcome.ACTED, summary
        later = [(await scheduled_pass())[0] for _ in range(2)]
        await _listed_becomes(
            stack.client,
            passes_query,
            {acted, *later},
            "the pass that acted and the latest two quiet ones are listed",
        )
        assert (await outcome(acted), await outcome(later[-1])) == ("acted", "quiet")

        described = await schedule.describe()
        assert not described.schedule.state.paused
        assert [i.every.total_seconds() for i in described.schedule.spec.intervals] == [3600]
        assert described.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
        if os.environ.get("TK_RECORD_HISTORIES"):  # for tests/replay/test_replay.py
            HISTORIES.mkdir(exist_ok=True)
            for name, run_id in (("reconcile_pass_that_acted", acted), ("reconcile_quiet_pass", later[-1])):
                history = await stack.client.get_workflow_handle(
                    workflow_ids[run_id], run_id=run_id
                ).fetch_history()
                (HISTORIES / f"{name}.json").write_text(history.to_json())
    finally:
        stop.set()
        await asyncio.wait_for(worker, 30)
        with contextlib.suppress(RPCError):
            await schedule.delete()


async def test_a_pass_deletes_a_bounded_number_of_quiet_passes_and_never_the_latest(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real `Reconcile` runs over stub activities, then the real deletion: only completed
    quiet runs are deleted, never the latest, at most DELETES_PER_PASS a call, and a
    repeated call is harmless. A run whose cleanup failed or found the attribute
    unregistered sets no outcome, so it is never deleted."""
    quiet_summary = ReconcileSummary(examined=1, healthy=1)
    plan: list[tuple[str, ReconcileSummary, QuietPassCleanup | None]] = [
        ("q1", quiet_summary, QuietPassCleanup()),
        ("q2", quiet_summary, QuietPassCleanup()),
        ("acted", ReconcileSummary(examined=1, outcomes={Reason.COMMITTED: 1}), QuietPassCleanup()),
        ("q3", quiet_summary, QuietPassCleanup()),
        ("deferred", ReconcileSummary(examined=1, deferred=1), QuietPassCleanup()),
        ("q4", quiet_summary, QuietPassCleanup()),
        ("unregistered", quiet_summary, QuietPassCleanup(outcome_attribute=False)),
        ("cleanup_failed", quiet_summary, None),
    ]
    step: list[tuple[str, ReconcileSummary, QuietPassCleanup | None]] = []

    @activity.defn(name=RECONCILE_PASS)
    async def fake_pass() -> ReconcileSummary:
        return step[0][1]

    @activity.defn(name=DELETE_QUIET_PASSES)
    async def fake_cleanup() -> QuietPassCleanup:
        if step[0][2] is None:
            raise RuntimeError("Temporal refused the listing")
        return step[0][2]

    runs: dict[str, str] = {}
    async with Worker(
        stack.client, task_queue=stack.task_queue, workflows=[Reconcile], activities=[fake_pass, fake_cleanup]
    ):
        for name, summary, cleanup in plan:
            step[:] = [(name, summary, cleanup)]
            handle = await stack.client.start_workflow(
                RECONCILE_WORKFLOW,
                id=f"reconcile-{name}-{uuid.uuid4().hex[:8]}",
                task_queue=stack.task_queue,
                result_type=ReconcileSummary,
            )
            assert await handle.result() == summary
            runs[name] = handle.result_run_id or ""

    async def outcome(name: str) -> str | None:
        found = [w async for w in stack.client.list_workflows(f"RunId = '{runs[name]}'")]
        return found[0].typed_search_attributes.get(RECONCILE_OUTCOME_ATTR) if found else None

    assert [await outcome(n) for n in ("acted", "deferred", "unregistered", "cleanup_failed")] == [
        "acted",
        "deferred",
        None,
        None,
    ]
    query = quiet_passes_query(stack.task_queue)
    everyone = f"WorkflowType = '{RECONCILE_WORKFLOW}' AND TaskQueue = '{stack.task_queue}'"
    await _listed_becomes(
        stack.client, query, {runs[n] for n in ("q1", "q2", "q3", "q4")}, "the quiet runs are listed as quiet"
    )

    monkeypatch.setattr(quiet_passes, "DELETES_PER_PASS", 2)
    cleaner = QuietPasses(stack.settings())
    env = ActivityEnvironment(client=stack.client)
    assert await env.run(cleaner.delete_quiet_passes) == QuietPassCleanup(deleted=2)
    kept = {runs[n] for n in ("q4", "q1", "acted", "deferred", "unregistered", "cleanup_failed")}
    await _listed_becomes(stack.client, everyone, kept, "the two quiet runs after the latest are gone")
    assert await env.run(cleaner.delete_quiet_passes) == QuietPassCleanup(deleted=1)
    # At once again, as a retry would: q1 may still be listed; deleting it again is no error.
    assert (await env.run(cleaner.delete_quiet_passes)).deleted <= 1
    await _listed_becomes(stack.client, everyone, kept - {runs["q1"]}, "only the latest quiet run is left")

    # An attribute the server does not know: no deletion, and the run is told not to set it.
    monkeypatch.setattr(
        quiet_passes, "RECONCILE_OUTCOME_ATTR", SearchAttributeKey.for_keyword("NotRegistered")
    )
    assert await env.run(cleaner.delete_quiet_passes) == QuietPassCleanup(outcome_attribute=False)
