"""What the Temporal UI and CLI show of a turn: a static summary per run, current
details at a gate (why it waits, what to do), descriptions on every handler, and
visibility queries that count only the runs that really wait."""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest

from tests.support import Stack, until_async
from turnkeeper import client as tk
from turnkeeper.models import Reason, TurnState, TurnStatus

WAITING = "TurnStatus='awaiting_user' AND ExecutionStatus='Running'"


def _asks(s: TurnState) -> bool:
    return s.status == TurnStatus.AWAITING_USER and s.reason == Reason.APPROVAL_REQUIRED


async def _gate(stack: Stack, chat: str) -> TurnState:
    stack.env_extra["TURNKEEPER_CONFIRM_TOOLS"] = "write_file"
    stack.script(
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "a"}}]},
            {"text": "ok"},
        ]
    )
    await stack.start_worker()
    await stack.send(chat, "write a")
    return await stack.wait_state(chat, _asks)


async def test_a_waiting_turns_page_says_why_and_what_to_do(stack: Stack) -> None:
    chat = stack.chat("ui")
    gate = await _gate(stack, chat)
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
    described = await handle.describe()
    assert await described.static_summary() == f"chat {chat}: a turn"
    details = await described.static_details()
    assert details is not None and "continue" in details and "dismiss" in details

    # What `temporal workflow metadata` prints: the current details and each handler's description.
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert "approval_required" in meta.current_details and str(gate.recovery_id) in meta.current_details
    handlers = {s.name: s.description for s in meta.definition.signal_definitions}
    handlers.update({q.name: q.description for q in meta.definition.query_definitions})
    for name in ("user_message", "continue", "dismiss", "stop", "state"):
        assert handlers.get(name), f"{name} has no description"

    await stack.decide(chat, "continue", gate.recovery_id)
    await stack.wait_state(chat, lambda s: s.status == TurnStatus.COMPLETED)
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert meta.current_details == ""


async def _count(stack: Stack, query: str) -> int:
    return (await stack.client.count_workflows(query)).count


async def test_a_terminated_run_at_a_gate_no_longer_counts_as_waiting(stack: Stack) -> None:
    """A run terminated at its gate keeps the search attributes it last upserted
    (`awaiting_user`): the documented query adds `ExecutionStatus='Running'`."""
    chat = stack.chat("term")
    await _gate(stack, chat)
    mine = f"ChatId='{chat}'"
    await until_async(lambda: _count_is(stack, f"{WAITING} AND {mine}", 1), what="the gate listed")
    await stack.client.get_workflow_handle(tk.workflow_id(chat)).terminate("operator")
    await until_async(lambda: _count_is(stack, f"{WAITING} AND {mine}", 0), what="the gate unlisted")
    # Why the clause is needed: the bare query still counts the terminated run.
    assert await _count(stack, f"TurnStatus='awaiting_user' AND {mine}") == 1


async def _count_is(stack: Stack, query: str, n: int) -> bool:
    return await _count(stack, query) == n


async def _reset_to(stack: Stack, chat: str, activity: int) -> None:
    """`temporal workflow reset` to the workflow task that scheduled the chat run's
    `activity`-th activity: the new run schedules it, and what came after, again."""
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
    events = [e async for e in handle.fetch_history_events()]
    scheduled = [
        i for i, e in enumerate(events) if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    task = next(
        e
        for e in reversed(events[: scheduled[activity - 1]])
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    await stack.client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=stack.client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=tk.workflow_id(chat)),
            reason="operator reset",
            workflow_task_finish_event_id=task.event_id,
            request_id=str(uuid.uuid4()),
        )
    )


async def test_a_reset_never_runs_a_tool_again(stack: Stack) -> None:
    """Reset replays a run up to a point and schedules again what came after it. A
    finished turn reset to its first model call runs nothing (its messages are the
    store's already). Reset to its tool call, the tool is not run again (its start is
    recorded; its recorded result stands) and the model is asked again: its answer
    replaces the step's recorded one, in place."""
    stack.env_extra.update(
        {"TURNKEEPER_TOOL_MODULES": "tests.ledger_tools", "TURNKEEPER_TOOLS": "slow_write"}
    )
    write = {"name": "slow_write", "arguments": {"path": "r.txt", "content": "r", "seconds": 0}}
    stack.script([{"tool_calls": [write]}, {"text": "written"}, {"text": "asked again"}])
    await stack.start_worker()
    ledger = stack.ws / "ledger.txt"  # the in-process worker's tools write it there

    async def finished_turn(name: str) -> tuple[str, list[dict[str, Any]]]:
        chat = stack.chat(name)
        done = await (await stack.send(chat, "write r")).result()
        assert done.status == TurnStatus.COMPLETED
        return chat, await stack.history(chat)

    chat, transcript = await finished_turn("whole")
    await _reset_to(stack, chat, activity=1)  # the first model call
    await stack.wait_state(chat, lambda s: s.status == TurnStatus.COMPLETED)
    assert ledger.read_text().count("start ") == 1 and await stack.history(chat) == transcript

    chat, transcript = await finished_turn("tool")
    await _reset_to(stack, chat, activity=2)  # the tool call
    await stack.wait_state(chat, lambda s: s.status == TurnStatus.COMPLETED)
    assert ledger.read_text().count("start ") == 2  # one for each chat
    again = await stack.history(chat)
    assert again[:-1] == transcript[:-1] and again[-1] == {"role": "assistant", "content": "asked again"}
