"""A message that reaches the server as a run ends is taken by the next turn: one
sent while the turn's closing store write is under way, and one that lands while
the run's last workflow task runs (the server refuses the run's end, and the
retried task takes the message and hands it on)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import WorkflowTaskFailedCause
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from tests.support import Stack, until, until_async
from turnkeeper.client import workflow_id
from turnkeeper.models import Reason, TurnStatus


class _AtTheEnd(Interceptor):
    """Calls `on_end()` in the workflow's thread when a live run has returned, before
    the task that completes it reaches the server. The call holds that task."""

    def __init__(self, on_end: Callable[[], None]) -> None:
        self.on_end = on_end

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        on_end = self.on_end

        class _Inbound(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                result = await super().execute_workflow(input)
                if not workflow.unsafe.is_replaying():
                    on_end()
                return result

        return _Inbound


@contextlib.asynccontextmanager
async def _worker(
    stack: Stack,
    *,
    finish_delay: float = 0.0,
    on_finish: Callable[[], None] = lambda: None,
    on_end: Callable[[], None] = lambda: None,
) -> AsyncIterator[None]:
    """The workflows and every activity in this process (workflow tasks on a thread of
    their own); `finish_turn` writes call `on_finish` and take `finish_delay` seconds longer."""
    from turnkeeper.activities.assemble import build_activities
    from turnkeeper.activities.providers import load_provider
    from turnkeeper.activities.tools import default_registry
    from turnkeeper.step_timeouts import StepTimeouts
    from turnkeeper.store import open_store
    from turnkeeper.workflows.chat_turn import ChatTurn

    settings = stack.settings()
    store = open_store(settings)
    await store.open()
    finish = store.finish_turn

    async def slow_finish(*args: Any, **kwargs: Any) -> Any:
        on_finish()
        await asyncio.sleep(finish_delay)
        return await finish(*args, **kwargs)

    store.finish_turn = slow_finish  # type: ignore[method-assign]
    try:
        async with Worker(
            stack.client,
            task_queue=stack.task_queue,
            workflows=[ChatTurn],
            activities=build_activities(settings, store, load_provider(settings.model), default_registry()),
            interceptors=[StepTimeouts(settings), _AtTheEnd(on_end)],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            yield
    finally:
        await store.close()


async def _user_rows(stack: Stack, chat: str) -> list[str]:
    return [r["content"] for r in await stack.history(chat) if r["role"] == "user"]


async def _answered(stack: Stack, chat: str, rows: list[str]) -> None:
    async def done() -> bool:
        return [r["content"] for r in await stack.history(chat)][-len(rows) :] == rows

    await until_async(done, timeout=15, what=f"the transcript to end with {rows}")


async def test_a_message_sent_while_a_dismissed_turn_writes_its_end_is_taken(stack: Stack) -> None:
    stack.script([{"error": "the model is down"}, {"text": "answered"}])
    chat = stack.chat()
    finishing = asyncio.Event()
    async with _worker(stack, finish_delay=1.0, on_finish=finishing.set):
        await stack.send(chat, "hello", message_id="m1")
        gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
        assert gate.reason == Reason.MODEL_FAILED
        dismissed = await stack.decide(chat, "dismiss", gate.recovery_id)
        assert (dismissed.status, dismissed.reason) == (TurnStatus.RECOVERED, Reason.DISMISSED)
        await asyncio.wait_for(finishing.wait(), 10)
        await stack.send(chat, "late", message_id="m2")  # while the closing row is written
        await _answered(stack, chat, ["late", "answered"])
    assert await _user_rows(stack, chat) == ["hello", "late"]
    turn1 = await (await stack.store()).get_turn(chat, 1)
    assert turn1 is not None and (turn1.status, turn1.reason) == (TurnStatus.RECOVERED, Reason.DISMISSED)


@pytest.mark.parametrize("ending", ["answered", "dismissed"])
async def test_a_message_that_lands_during_the_runs_last_task_is_taken(stack: Stack, ending: str) -> None:
    stack.script(
        [
            {"text": "first answer"} if ending == "answered" else {"error": "the model is down"},
            {"text": "answered"},
        ]
    )
    chat = stack.chat()
    loop = asyncio.get_running_loop()
    sent: list[bool] = []

    def on_end() -> None:
        # The run's last task waits for this message to reach the server.
        if not sent:
            sent.append(True)
            asyncio.run_coroutine_threadsafe(stack.send(chat, "late", message_id="m2"), loop).result(
                timeout=5
            )

    async with _worker(stack, on_end=on_end):
        first = await stack.send(chat, "hello", message_id="m1")
        if ending == "dismissed":
            gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
            await stack.decide(chat, "dismiss", gate.recovery_id)
        await until(lambda: bool(sent), timeout=15, what="the run's last task")
        await _answered(stack, chat, ["late", "answered"])
    assert await _user_rows(stack, chat) == ["hello", "late"]
    # The server refused the run's end for the message, and the run handed it on.
    history = await stack.client.get_workflow_handle(
        workflow_id(chat), run_id=first.first_execution_run_id
    ).fetch_history()
    causes = [
        e.workflow_task_failed_event_attributes.cause
        for e in history.events
        if e.HasField("workflow_task_failed_event_attributes")
    ]
    assert causes == [WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND]
    assert history.events[-1].HasField("workflow_execution_continued_as_new_event_attributes")
