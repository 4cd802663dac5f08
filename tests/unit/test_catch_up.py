"""turnkeeper/worker/catch_up.py on activations built by hand; tests/replay/test_sdk_query_order.py
shows the same runner against a real server and a SIGKILLed worker."""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner

from turnkeeper.worker.catch_up import (
    LEGACY_QUERY_ID,
    QUERY_CATCH_UP,
    CatchUpGuard,
    Lag,
    Mark,
    is_catch_up,
    queries_behind,
)

# What the guard reads of a run's details: its workflow task timeout.
DETAILS = SimpleNamespace(info=SimpleNamespace(task_timeout=timedelta(seconds=2)))


def act(
    length: int, size: int, time_s: int, *jobs: str, replaying: bool = False, run_id: str = "r"
) -> WorkflowActivation:
    a = WorkflowActivation(
        run_id=run_id, history_length=length, history_size_bytes=size, is_replaying=replaying
    )
    a.timestamp.FromSeconds(time_s)
    for job in jobs:
        getattr(a.jobs.add(), job).SetInParent()
    return a


def query_task(length: int, size: int, time_s: int, run_id: str = "r") -> WorkflowActivation:
    """The query of a query task, as the SDK's core hands it over."""
    a = act(length, size, time_s, "query_workflow", replaying=True, run_id=run_id)
    a.jobs[0].query_workflow.query_id = LEGACY_QUERY_ID
    return a


class Recorder(WorkflowRunner, WorkflowInstance):
    """A runner whose one instance notes what reached the workflow."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def prepare_workflow(self, defn: Any) -> None: ...

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return self

    def set_worker_level_failure_exception_types(self, types: Any) -> None: ...

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        self.seen.append(act.history_length)
        completion = WorkflowActivationCompletion(run_id=act.run_id)
        completion.successful.SetInParent()
        return completion

    def get_serialization_context(self, *args: Any) -> Any: ...

    def get_external_store_context(self, *args: Any) -> Any: ...

    def get_info(self) -> Any: ...

    def get_thread_id(self) -> int | None:
        return None


def test_events_applied_with_no_task_started_are_a_catch_up() -> None:
    last = Mark.of(act(3, 416, 100, "initialize_workflow", replaying=True))
    assert is_catch_up(last, act(7, 416, 100, "fire_timer"))
    assert is_catch_up(last, act(11, 416, 100, "signal_workflow", "resolve_child_workflow_execution"))


def test_a_started_task_is_never_one() -> None:
    last = Mark.of(act(3, 416, 100, "initialize_workflow"))
    assert not is_catch_up(last, act(11, 1041, 105, "signal_workflow", "fire_timer"))  # size and time moved
    assert not is_catch_up(last, act(3, 416, 100, "resolve_activity"))  # the same task's next activation
    assert not is_catch_up(last, act(7, 416, 100, "fire_timer", replaying=True))  # a replay's own grouping
    assert not is_catch_up(last, act(7, 416, 100, "query_workflow"))  # a query applies nothing
    assert not is_catch_up(None, act(7, 416, 100, "initialize_workflow"))  # a run's first activation


def test_the_guard_fails_the_catch_up_unseen_and_passes_the_rest() -> None:
    inner = Recorder()
    instance = CatchUpGuard(inner).create_instance(DETAILS)  # type: ignore[arg-type]
    assert instance.activate(act(3, 416, 100, "initialize_workflow", replaying=True)).HasField("successful")
    refused = instance.activate(act(7, 416, 100, "fire_timer"))
    assert refused.run_id == "r" and refused.HasField("failed")
    assert refused.failed.failure.application_failure_info.type == QUERY_CATCH_UP
    assert QUERY_CATCH_UP in refused.failed.failure.message
    assert instance.activate(act(7, 416, 100, "query_workflow")).HasField("successful")
    assert instance.activate(act(11, 1041, 105, "signal_workflow", "fire_timer")).HasField("successful")
    assert inner.seen == [3, 7, 11]  # the workflow never saw the refused activation


def test_an_activation_older_than_its_task_timeout_is_stale_on_the_clock_offset_seen() -> None:
    lag, timeout, s = Lag(), timedelta(seconds=2), 1_000_000_000
    # This worker's clock runs 30 s ahead of the server's: live tasks arrive 30.01 s "old".
    assert not lag.is_stale(act(3, 416, 100, "initialize_workflow"), timeout, 130 * s + s // 100)
    assert not lag.is_stale(act(9, 900, 200, "fire_timer"), timeout, 231 * s)  # 1 s late: still live
    assert not lag.is_stale(act(9, 900, 200, "fire_timer", replaying=True), timeout, 500 * s)  # history
    assert not lag.is_stale(act(9, 900, 200, "query_workflow"), timeout, 500 * s)
    # Events past a task a killed worker started (time 300) and lost, applied at 303 + 30.
    assert lag.is_stale(act(14, 1400, 300, "signal_workflow", "resolve_activity"), timeout, 333 * s)


def test_the_guard_refuses_a_stale_activation_too() -> None:
    inner = Recorder()
    instance = CatchUpGuard(inner).create_instance(DETAILS)  # type: ignore[arg-type]
    now = time.time()
    assert instance.activate(act(3, 416, int(now), "initialize_workflow")).HasField("successful")
    assert instance.activate(act(14, 1400, int(now) - 60, "fire_timer")).HasField("failed")
    assert inner.seen == [3]


def test_a_query_task_at_the_event_of_the_live_activation_before_it_is_behind_a_catch_up() -> None:
    # A history that ends at the start of a task another worker holds: its activation
    # looks like a task's own; only the query task's query right behind it tells.
    assert queries_behind(122, query_task(122, 5000, 300))
    assert not queries_behind(122, query_task(125, 5100, 300))  # a task of ours completed first
    assert not queries_behind(None, query_task(122, 5000, 300))  # the activation before was a replay
    on_a_task = act(122, 5000, 300, "query_workflow", replaying=True)
    on_a_task.jobs[0].query_workflow.query_id = "q-1"
    assert not queries_behind(122, on_a_task)  # a query that rides on a workflow task


def test_the_guard_fails_the_query_behind_a_rebuilt_run_s_first_live_activation_only() -> None:
    inner = Recorder()
    guard = CatchUpGuard(inner)
    now = int(time.time())
    rebuilt = guard.create_instance(DETAILS)  # type: ignore[arg-type]
    assert rebuilt.activate(act(118, 4000, now - 1, "initialize_workflow", replaying=True)).HasField(
        "successful"
    )
    assert rebuilt.activate(act(122, 5000, now, "resolve_activity")).HasField("successful")
    refused = rebuilt.activate(query_task(122, 5000, now))
    assert refused.HasField("failed") and QUERY_CATCH_UP in refused.failed.failure.message
    # Asked again: the query rebuilds the run (a replay only); its tasks are looked at no more.
    again = guard.create_instance(DETAILS)  # type: ignore[arg-type]
    assert again.activate(act(124, 5000, now, "initialize_workflow", replaying=True)).HasField("successful")
    assert again.activate(query_task(124, 5000, now)).HasField("successful")
    assert again.activate(act(130, 6000, now, "signal_workflow")).HasField("successful")
    assert again.activate(query_task(130, 6000, now)).HasField("successful")
    # A new run: its first task, then a query task to this worker's cache (no events).
    new = guard.create_instance(DETAILS)  # type: ignore[arg-type]
    assert new.activate(act(3, 400, now, "initialize_workflow")).HasField("successful")
    assert new.activate(query_task(3, 400, now)).HasField("successful")
    # Rebuilt for a task, then more tasks: only the first live activation is looked at.
    held = guard.create_instance(DETAILS)  # type: ignore[arg-type]
    assert held.activate(act(40, 2000, now, "initialize_workflow", replaying=True)).HasField("successful")
    assert held.activate(act(44, 2100, now, "signal_workflow")).HasField("successful")
    assert held.activate(act(48, 2200, now, "signal_workflow")).HasField("successful")
    assert held.activate(query_task(48, 2200, now)).HasField("successful")
    assert inner.seen == [118, 122, 124, 124, 130, 130, 3, 3, 40, 44, 48, 48]


def test_a_run_is_refused_behind_a_rebuild_once_on_a_worker() -> None:
    # The query asked again can wait at the server behind the run's next task, rebuilt
    # once more: that rebuild's query is answered.
    guard, now = CatchUpGuard(Recorder()), int(time.time())

    def rebuilt_then_queried(run_id: str) -> WorkflowActivationCompletion:
        instance = guard.create_instance(DETAILS)  # type: ignore[arg-type]
        instance.activate(act(118, 4000, now - 1, "initialize_workflow", replaying=True, run_id=run_id))
        instance.activate(act(122, 5000, now, "resolve_activity", run_id=run_id))
        return instance.activate(query_task(122, 5000, now, run_id=run_id))

    assert rebuilt_then_queried("r1").HasField("failed")
    assert rebuilt_then_queried("r1").HasField("successful")
    assert rebuilt_then_queried("r2").HasField("failed")


def test_the_query_after_a_refused_catch_up_is_not_refused_twice() -> None:
    inner = Recorder()
    instance = CatchUpGuard(inner).create_instance(DETAILS)  # type: ignore[arg-type]
    assert instance.activate(act(3, 416, 100, "initialize_workflow", replaying=True)).HasField("successful")
    assert instance.activate(act(7, 416, 100, "fire_timer")).HasField("failed")  # no task started
    assert instance.activate(query_task(7, 416, 100)).HasField("successful")
    assert inner.seen == [3, 7]
