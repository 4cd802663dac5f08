"""An update that reaches a worker holding no cached copy of the run is handled before
an activity completion that history shows was already applied, while replay of the history it
records handles it after that completion (temporalio/sdk-python #848, #673): the run does not
replay. A signal sent at the same point replays exactly as it ran."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.worker import Replayer, Worker

# Worker restarts timed against the server: run with test_sdk_query_order.py (`--dist loadgroup`).
pytestmark = pytest.mark.xdist_group("sdk_order")

step_started = asyncio.Event()
step_release = asyncio.Event()


@activity.defn
async def step() -> None:
    step_started.set()
    await step_release.wait()


@workflow.defn(sandboxed=False)
class StepOnce:
    def __init__(self) -> None:
        self.done = False
        self.finished = False
        self.answer = ""

    @workflow.run
    async def run(self) -> str:
        await workflow.execute_activity(step, start_to_close_timeout=timedelta(seconds=30))
        self.done = True
        await workflow.wait_condition(lambda: self.finished and workflow.all_handlers_finished())
        return self.answer

    async def _step_unless_done(self) -> str:
        if not self.done:
            await workflow.execute_activity(step, start_to_close_timeout=timedelta(seconds=30))
            self.answer = "ran the step again"
        else:
            self.answer = "step already done"
        return self.answer

    @workflow.update
    async def ensure(self) -> str:
        return await self._step_unless_done()

    @workflow.signal
    async def ensure_signal(self) -> None:
        await self._step_unless_done()

    @workflow.signal
    def poke(self) -> None:
        pass

    @workflow.signal
    def finish(self) -> None:
        self.finished = True


async def _applied(handle: WorkflowHandle[Any, Any], event_type: int) -> None:
    """Until a workflow task has completed after an event of `event_type`."""
    while True:
        types = [e.event_type for e in (await handle.fetch_history()).events]
        if event_type in types and types[-1] == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            return
        await asyncio.sleep(0.02)


async def _after_a_restart(
    client: Client, send: Callable[[WorkflowHandle[Any, Any]], Awaitable[Any]]
) -> tuple[str, WorkflowHistory]:
    """Worker A applies the step's completion in a task with no command, after another such task
    (a signal); A stops; `send` reaches the run, which worker B must replay cold."""
    queue = f"sdk-update-order-{uuid.uuid4()}"
    step_started.clear()
    step_release.clear()
    async with Worker(client, task_queue=queue, activities=[step]):
        async with Worker(client, task_queue=queue, workflows=[StepOnce]):
            handle = await client.start_workflow(StepOnce.run, id=queue, task_queue=queue)
            await step_started.wait()
            await handle.signal(StepOnce.poke)
            await _applied(handle, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
            step_release.set()
            await _applied(handle, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
        sent = asyncio.create_task(send(handle))
        async with Worker(client, task_queue=queue, workflows=[StepOnce]):
            await sent
            await handle.signal(StepOnce.finish)
            answer = await handle.result()
    return answer, await handle.fetch_history()


async def test_update_after_a_restart_is_handled_before_an_applied_completion(client: Client) -> None:
    answer, history = await _after_a_restart(client, lambda h: h.execute_update(StepOnce.ensure))
    assert answer == "ran the step again"
    with pytest.raises(workflow.NondeterminismError, match="ActivityTaskScheduled"):
        await Replayer(workflows=[StepOnce]).replay_workflow(history)


async def test_signal_after_a_restart_replays_as_it_ran(client: Client) -> None:
    answer, history = await _after_a_restart(client, lambda h: h.signal(StepOnce.ensure_signal))
    assert answer == "step already done"
    await Replayer(workflows=[StepOnce]).replay_workflow(history)
