"""A timer fires while the worker holding the run is dead; another worker answers a query meanwhile
and applies the timer to answer it; a signal then joins the same workflow task. Live, the run
reacts to the timer, then to the signal (two activations); replay applies both in one activation,
signal first: the run does not replay. Failing the activation that applies events of a workflow
task not started yet (the query fails, the run is evicted) keeps live and replay alike."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections import deque
from datetime import timedelta

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError
from temporalio.worker import Replayer, Worker

from tests.support import ROOT

# Sticky-queue timing (STICKY_S): one xdist process runs this file and test_sdk_update_order.py
# one test at a time (`--dist loadgroup`).
pytestmark = [pytest.mark.crash, pytest.mark.xdist_group("sdk_order")]
STICKY_S = 3.0  # worker A's sticky schedule-to-start timeout: also how long a query waits for A
TAKES: list[tuple[str, bool, int, int]] = []  # (input, is_replaying, history length, history size)


@activity.defn
async def on_timer() -> None:
    pass


@activity.defn
async def on_signal() -> None:
    pass


@workflow.defn(sandboxed=False)
class TimerAndSignal:
    """Takes a timer's end and a signal one at a time, in the order they came, one activity each."""

    def __init__(self) -> None:
        self.inputs: deque[str] = deque()
        self.taken: list[str] = []
        self.seen: tuple | None = None

    @workflow.run
    async def run(self, timer_s: float, guard: bool) -> list[str]:
        self._catching_up()
        timer = asyncio.ensure_future(asyncio.sleep(timer_s))
        timer.add_done_callback(lambda _: self.inputs.append("timer"))
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
            if self._catching_up() and guard:
                raise RuntimeError("events of a workflow task not started yet")
            entry = self.inputs.popleft()
            self.taken.append(entry)
            workflow.start_activity(
                on_timer if entry == "timer" else on_signal, start_to_close_timeout=timedelta(seconds=10)
            )
        return self.taken

    def _catching_up(self) -> bool:
        """History grew, but history size and time (set by a workflow task's start) did not."""
        info = workflow.info()
        now = (info.get_current_history_length(), info.get_current_history_size(), workflow.now())
        seen, self.seen = self.seen, now
        return seen is not None and now[0] != seen[0] and now[1:] == seen[1:]

    @workflow.signal
    def poke(self) -> None:
        self.inputs.append("signal")

    @workflow.query
    def taken_so_far(self) -> list[str]:
        return self.taken


async def _first_task_done(handle: WorkflowHandle) -> None:
    while EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED not in [
        e.event_type for e in (await handle.fetch_history()).events
    ]:
        await asyncio.sleep(0.02)


async def _query_while_a_is_dead(
    client: Client, order: str, guard: bool
) -> tuple[object, list[str], WorkflowHandle]:
    """Worker A (another process) takes the first task and is SIGKILLed; the run is queried and
    worker B started: the query waits STICKY_S for A, then B answers it. `timer_first`: the timer
    fires during that wait and the signal comes after the answer; `signal_first`: the signal comes
    during the wait and the timer fires after the answer, both before A's pending task times out.
    The signal is sent before B starts, so however long B takes to start it comes during the wait."""
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
            TimerAndSignal.run, args=[timer_s, guard], id=queue, task_queue=queue
        )
        await asyncio.wait_for(_first_task_done(handle), 30)
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

    answer = asyncio.create_task(query())
    if order == "signal_first":
        await asyncio.sleep(STICKY_S / 2)
        await handle.signal(TimerAndSignal.poke)
    async with Worker(client, task_queue=queue, workflows=[TimerAndSignal], activities=[on_timer, on_signal]):
        if order == "timer_first":
            await answer
            await handle.signal(TimerAndSignal.poke)
        return await answer, await handle.result(), handle


async def test_a_query_applies_a_timer_before_a_signal_that_replay_applies_first(client: Client) -> None:
    answer, result, handle = await _query_while_a_is_dead(client, "timer_first", guard=False)
    assert answer == ["timer"] and result == ["timer", "signal"]
    first_started = (await handle.fetch_history()).events[2].workflow_task_started_event_attributes
    # Live, the timer was taken in an activation no workflow task started: not replaying, at the
    # length of its unstarted task's WorkflowTaskScheduled, with the history size of the first task.
    assert TAKES[0] == ("timer", False, 7, first_started.history_size_bytes)
    TAKES.clear()
    with pytest.raises(workflow.NondeterminismError, match="'on_timer' does not match .* 'on_signal'"):
        await Replayer(workflows=[TimerAndSignal]).replay_workflow(await handle.fetch_history())
    assert [t[:3] for t in TAKES] == [("signal", True, 11), ("timer", True, 11)]


async def test_a_signal_applied_by_a_query_replays(client: Client) -> None:
    answer, result, handle = await _query_while_a_is_dead(client, "signal_first", guard=False)
    assert answer == ["signal"] and result == ["signal", "timer"]
    await Replayer(workflows=[TimerAndSignal]).replay_workflow(await handle.fetch_history())


@pytest.mark.parametrize("order", ["timer_first", "signal_first"])
async def test_failing_the_activation_of_an_unstarted_task_keeps_replay_alike(
    client: Client, order: str
) -> None:
    answer, result, handle = await _query_while_a_is_dead(client, order, guard=True)
    assert isinstance(answer, WorkflowQueryFailedError) and "not started yet" in str(answer)
    assert result == ["signal", "timer"]
    history = await handle.fetch_history()
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in [e.event_type for e in history.events]
    await Replayer(workflows=[TimerAndSignal]).replay_workflow(history)


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
