"""A timer fires (or a child workflow ends) while the worker holding the run is dead; another
worker answers a query meanwhile and applies that event to answer it; a signal then joins the same
workflow task. Live, the run reacts to the event, then to the signal (two activations); replay
applies both in one activation, signal first: the run does not replay. The worker's runner
(turnkeeper/worker/catch_up.py) fails the activation that applies events of a workflow task not
started yet, before the workflow sees it: the query fails, the run is dropped, and live and replay
stay alike."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections import deque
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError
from temporalio.service import RPCError
from temporalio.worker import (
    Replayer,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkflowInstance,
    WorkflowInstanceDetails,
)

from tests.support import ROOT
from turnkeeper.runner_wrap import WrappedInstance, WrappedRunner
from turnkeeper.worker.catch_up import CATCH_UP_MESSAGE, LEGACY_QUERY_ID, CatchUpGuard

# Sticky-queue timing (STICKY_S): one xdist process runs this file and test_sdk_update_order.py
# one test at a time (`--dist loadgroup`).
pytestmark = [pytest.mark.crash, pytest.mark.xdist_group("sdk_order")]
STICKY_S = 3.0  # worker A's sticky schedule-to-start timeout: also how long a query waits for A
TAKES: list[tuple[str, bool, int, int]] = []  # (input, is_replaying, history length, history size)
CHILD_QUEUE = "sdk-query-order-children"  # served by this process throughout (`_children`)


@activity.defn
async def on_timer() -> None:
    pass


@activity.defn
async def on_signal() -> None:
    pass


@workflow.defn(sandboxed=False)
class Sleeper:
    @workflow.run
    async def run(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@workflow.defn(sandboxed=False)
class TimerAndSignal:
    """Takes an event's end (a timer's or a child's) and a signal one at a time, in the order
    they came, one activity each."""

    def __init__(self) -> None:
        self.inputs: deque[str] = deque()
        self.taken: list[str] = []

    @workflow.run
    async def run(self, timer_s: float, source: str) -> list[str]:
        if source == "child":
            end: asyncio.Future = await workflow.start_child_workflow(
                Sleeper.run, timer_s, id=f"{workflow.info().workflow_id}-child", task_queue=CHILD_QUEUE
            )
        else:
            end = asyncio.ensure_future(asyncio.sleep(timer_s))
        end.add_done_callback(lambda _: self.inputs.append("timer"))
        while len(self.taken) < 2:
            await workflow.wait_condition(lambda: bool(self.inputs))
            info = workflow.info()
            TAKES.append(
                (
                    self.inputs[0],
                    workflow.unsafe.is_replaying(),
                    info.get_current_history_length(),
                    info.get_current_history_size(),
                )
            )
            entry = self.inputs.popleft()
            self.taken.append(entry)
            workflow.start_activity(
                on_timer if entry == "timer" else on_signal, start_to_close_timeout=timedelta(seconds=10)
            )
        return self.taken

    @workflow.signal
    def poke(self) -> None:
        self.inputs.append("signal")

    @workflow.query
    def taken_so_far(self) -> list[str]:
        return self.taken


async def _tasks_done(handle: WorkflowHandle, count: int) -> None:
    while [e.event_type for e in (await handle.fetch_history()).events].count(
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ) < count:
        await asyncio.sleep(0.02)


async def _query_while_a_is_dead(
    client: Client, order: str, source: str = "timer", guard: bool = False
) -> tuple[object, list[str], WorkflowHandle]:
    """`_race` until the query met the event it races (on a loaded machine it can come
    first, or B can start too late for the query's own deadline: None)."""
    for _ in range(3):
        answer, result, handle = await _race(client, order, source, guard)
        if answer not in ([], None):
            break
    return answer, result, handle


async def _race(
    client: Client, order: str, source: str, guard: bool
) -> tuple[object, list[str], WorkflowHandle]:
    """Worker A (another process) takes the first tasks and is SIGKILLed; the run is queried and
    worker B started: the query waits STICKY_S for A, then B answers it. `timer_first`: the timer
    (or the child) ends during that wait and the signal comes after the answer; `signal_first`:
    the signal comes during the wait and the end after the answer, both before A's pending task
    times out. The signal is sent before B starts, so however long B takes to start it comes
    during the wait. `guard`: B runs the workflow under turnkeeper's runner."""
    queue = f"sdk-query-order-{uuid.uuid4()}"
    worker_a = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.replay.test_sdk_query_order",
        client.service_client.config.target_host,
        queue,
        cwd=ROOT,
    )
    timer_s = STICKY_S - 1 if order == "timer_first" else STICKY_S + 0.8
    try:
        handle = await client.start_workflow(
            TimerAndSignal.run, args=[timer_s, source], id=queue, task_queue=queue
        )
        # A child's start is a task of its own: A holds the run past it.
        await asyncio.wait_for(_tasks_done(handle, 2 if source == "child" else 1), 30)
        os.kill(worker_a.pid, signal.SIGKILL)
    finally:
        if worker_a.returncode is None:
            worker_a.kill()
        await worker_a.wait()
    TAKES.clear()

    async def query() -> object:
        try:
            return await handle.query(TimerAndSignal.taken_so_far)
        except WorkflowQueryFailedError as err:
            return err
        except RPCError as err:
            if "Timeout expired" not in err.message:
                raise
            return None

    answer = asyncio.create_task(query())
    if order == "signal_first":
        await asyncio.sleep(STICKY_S / 2)
        await handle.signal(TimerAndSignal.poke)
    runner = UnsandboxedWorkflowRunner()  # the runner of `sandboxed=False` workflows
    async with Worker(
        client,
        task_queue=queue,
        workflows=[TimerAndSignal],
        activities=[on_timer, on_signal],
        unsandboxed_workflow_runner=CatchUpGuard(runner) if guard else runner,
    ):
        if order == "timer_first":
            await answer
            await handle.signal(TimerAndSignal.poke)
        return await answer, await handle.result(), handle


@pytest.fixture
async def children(client: Client) -> AsyncIterator[None]:
    async with Worker(client, task_queue=CHILD_QUEUE, workflows=[Sleeper]):
        yield


@pytest.mark.parametrize("source", ["timer", "child"])
async def test_a_query_applies_an_end_before_a_signal_that_replay_applies_first(
    client: Client, children: None, source: str
) -> None:
    answer, result, handle = await _query_while_a_is_dead(client, "timer_first", source)
    assert answer == ["timer"] and result == ["timer", "signal"]
    events = (await handle.fetch_history()).events
    started = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED]
    # Live, the end was taken in an activation no workflow task started: not replaying, with
    # the history size of the task before it, at the length of its unstarted task's
    # WorkflowTaskScheduled.
    assert TAKES[0][:2] == ("timer", False)
    before = [e for e in started if e.event_id < TAKES[0][2]][-1]
    assert TAKES[0][3] == before.workflow_task_started_event_attributes.history_size_bytes
    assert events[TAKES[0][2] - 1].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
    TAKES.clear()
    with pytest.raises(workflow.NondeterminismError, match="'on_timer' does not match .* 'on_signal'"):
        await Replayer(workflows=[TimerAndSignal]).replay_workflow(await handle.fetch_history())
    assert [t[:2] for t in TAKES] == [("signal", True), ("timer", True)]


async def test_a_signal_applied_by_a_query_replays(client: Client) -> None:
    answer, result, handle = await _query_while_a_is_dead(client, "signal_first")
    assert answer == ["signal"] and result == ["signal", "timer"]
    await Replayer(workflows=[TimerAndSignal]).replay_workflow(await handle.fetch_history())


@pytest.mark.parametrize(
    ("order", "source"), [("timer_first", "timer"), ("signal_first", "timer"), ("timer_first", "child")]
)
async def test_the_runner_refuses_the_catch_up_and_replay_stays_alike(
    client: Client, children: None, order: str, source: str
) -> None:
    answer, result, handle = await _query_while_a_is_dead(client, order, source, guard=True)
    assert isinstance(answer, WorkflowQueryFailedError) and CATCH_UP_MESSAGE in str(answer)
    # Live, both were taken in the one activation a replay gives them.
    assert [(take, length) for take, replaying, length, _ in TAKES if not replaying] == [
        ("signal", TAKES[-1][2]),
        ("timer", TAKES[-1][2]),
    ]
    assert result == ["signal", "timer"]
    history = await handle.fetch_history()
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in [e.event_type for e in history.events]
    await Replayer(workflows=[TimerAndSignal]).replay_workflow(history)


@workflow.defn(sandboxed=False)
class Notes:
    """Keeps every signal it is sent; never ends by itself."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.signal
    def note(self, text: str) -> None:
        self.notes.append(text)

    @workflow.query
    def noted(self) -> list[str]:
        return self.notes


async def test_a_run_rebuilt_for_a_task_and_queried_at_once_is_refused_once(client: Client) -> None:
    """What the runner's third sign costs a run it mistakes for a catch-up: the first query
    of a run rebuilt for a real task fails once; asked again it is answered, and the run,
    rebuilt by that query, stays cached. A new run's first query is answered."""
    queue = f"sdk-query-order-{uuid.uuid4()}"
    guarded = {"unsandboxed_workflow_runner": CatchUpGuard(UnsandboxedWorkflowRunner())}
    async with Worker(client, task_queue=queue, workflows=[Notes], **guarded):
        handle = await client.start_workflow(Notes.run, id=queue, task_queue=queue)
        await _tasks_done(handle, 1)
        assert await handle.query(Notes.noted) == []  # a new run
    async with Worker(client, task_queue=queue, workflows=[Notes], **guarded):
        await handle.signal(Notes.note, "a")
        await _tasks_done(handle, 2)
        with pytest.raises(WorkflowQueryFailedError, match=CATCH_UP_MESSAGE):
            await handle.query(Notes.noted)
        assert await handle.query(Notes.noted) == ["a"]
        await handle.signal(Notes.note, "b")
        await _tasks_done(handle, 3)
        assert await handle.query(Notes.noted) == ["a", "b"]
    await handle.terminate()


class QueryIds(WrappedRunner):
    """The unsandboxed runner, noting the id of every query it is handed."""

    seen: list[str] = []

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _Noted(self._runner.create_instance(det))


class _Noted(WrappedInstance):
    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        QueryIds.seen.extend(j.query_workflow.query_id for j in act.jobs if j.HasField("query_workflow"))
        return self._inner.activate(act)


async def test_a_query_task_s_query_carries_the_id_the_runner_knows_it_by(client: Client) -> None:
    """The runner tells a query task's query (not one riding on a workflow task) by this id."""
    queue = f"sdk-query-order-{uuid.uuid4()}"
    async with Worker(client, task_queue=queue, workflows=[Sleeper]):
        handle = await client.start_workflow(Sleeper.run, 60.0, id=queue, task_queue=queue)
        await _tasks_done(handle, 1)
    runner = QueryIds(UnsandboxedWorkflowRunner())
    async with Worker(client, task_queue=queue, workflows=[Sleeper], unsandboxed_workflow_runner=runner):
        await handle.query("__stack_trace")
    await handle.terminate()
    assert QueryIds.seen == [LEGACY_QUERY_ID]


async def _worker_a(target: str, queue: str) -> None:
    client = await Client.connect(target)
    async with Worker(
        client,
        task_queue=queue,
        workflows=[TimerAndSignal],
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=STICKY_S),
    ):
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_worker_a(*sys.argv[1:3]))
