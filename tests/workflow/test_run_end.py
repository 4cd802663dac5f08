"""A message that reaches the server while a run's last workflow task runs is
taken by the next turn, also when that task got the run's last store result late.

A store call is a local activity: the SDK hands its result to a live run one
workflow task after the task that asked for it when that task also answered a
`state` query. The run's end (or its `end_of_run` activity, patches.RECOVERY_MACHINE_9)
then goes out with the later task, and a signal that comes meanwhile makes the
server refuse an end: the retried task must take the message and hand it on.
This test makes that happen on purpose; the variant where the store's answer was
recorded with the earlier task (whose replay ended runs before RECOVERY_MACHINE_9
too soon) is timing-dependent, and `tests/workflow/test_no_wedge.py` meets it
in about one run in five with store calls on the event loop.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from temporalio import workflow
from temporalio.worker import (
    Interceptor,
    StartLocalActivityInput,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from tests.support import Stack, until, until_async
from turnkeeper.client import workflow_id
from turnkeeper.models import Reason, TurnStatus


class _LateResult(Interceptor):
    """Calls `on_late()` in the workflow's thread when a live run gets a store
    call's result in a later workflow task than the one that asked for it. The
    call holds that task until it returns."""

    def __init__(self, on_late: Callable[[], None]) -> None:
        self.on_late = on_late

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        on_late = self.on_late

        class _Outbound(WorkflowOutboundInterceptor):
            def start_local_activity(self, input: StartLocalActivityInput) -> workflow.ActivityHandle[Any]:
                handle = super().start_local_activity(input)
                asked_at = workflow.info().get_current_history_length()

                def resolved(_: Any) -> None:
                    if not workflow.unsafe.is_replaying() and workflow.info().get_current_history_length() > asked_at:
                        on_late()
                handle.add_done_callback(resolved)
                return handle

        class _Inbound(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(_Outbound(outbound))

        return _Inbound


@contextlib.asynccontextmanager
async def _worker(stack: Stack, *, finish_delay: float = 0.0,
                  on_late: Callable[[], None] = lambda: None) -> AsyncIterator[None]:
    """The workflows and every activity in this process; `finish_turn` writes
    take `finish_delay` seconds longer."""
    from turnkeeper.activities.assemble import build_activities
    from turnkeeper.activities.providers import load_provider
    from turnkeeper.activities.store import open_store
    from turnkeeper.activities.tools import default_registry
    from turnkeeper.workflows.chat_turn import ChatTurn

    settings = stack.settings()
    store = open_store(settings)
    await store.open()
    finish = store.finish_turn

    async def slow_finish(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(finish_delay)
        return await finish(*args, **kwargs)
    store.finish_turn = slow_finish  # type: ignore[method-assign]
    try:
        async with Worker(stack.client, task_queue=stack.task_queue, workflows=[ChatTurn],
                          activities=build_activities(settings, store, load_provider(settings.model),
                                                      default_registry()),
                          interceptors=[_LateResult(on_late)], workflow_runner=UnsandboxedWorkflowRunner()):
            yield
    finally:
        await store.close()


async def test_a_message_signalled_as_a_dismissed_turn_ends_is_taken(stack: Stack) -> None:
    stack.script([{"error": "the model is down"}, {"text": "answered"}])
    chat = stack.chat()
    async with _worker(stack):
        await stack.send(chat, "hello", message_id="m1")
        gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
    assert gate.reason == Reason.MODEL_FAILED
    handle = stack.client.get_workflow_handle(workflow_id(chat))
    # With no worker, the Dismiss's workflow task waits, and a query sent now is
    # answered by that task: the gate's closing store write (slowed to finish after
    # the query's answer) then reaches the run in the task after it.
    await handle.signal("dismiss", {"recovery_id": gate.recovery_id})
    query = asyncio.create_task(handle.query("state"))
    await asyncio.sleep(0.5)
    loop = asyncio.get_running_loop()
    late: list[bool] = []

    def on_late() -> None:
        # The task that got the result late waits for this message to reach the server.
        if not late:
            late.append(True)
            asyncio.run_coroutine_threadsafe(stack.send(chat, "late", message_id="m2"), loop).result(timeout=1.5)

    async with _worker(stack, finish_delay=0.3, on_late=on_late):
        await query
        await until(lambda: bool(late), timeout=10, what="the store result handed over a task late")

        async def answered() -> bool:
            return [r["content"] for r in await stack.history(chat)][-2:] == ["late", "answered"]
        await until_async(answered, timeout=15, what="the late message answered in the next turn")
    rows = [(r["role"], r["content"]) for r in await stack.history(chat)]
    assert [c for role, c in rows if role == "user"] == ["hello", "late"]
