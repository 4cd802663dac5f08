"""A workflow runner that refuses a query's catch-up before any workflow code sees it.

A worker without a run in its cache that is asked to answer a query (the `state`
query, the UI's own) rebuilds the run from its history. When that history ends in
events of a workflow task no worker has started yet (a step's end, a signal), the
SDK applies them too, live, and keeps what the run did with them for that task's
completion. The task, when it starts, may bring more events; a replay later
applies all of them in one activation, signals first, while the live run took
them in two. The run then no longer replays (tests/replay/test_sdk_query_order.py).

So this runner fails such an activation before the workflow runs it: the query
fails with `QueryCatchUp` in its message, the SDK drops the run from the cache,
and the task, when it starts, is taken whole from the history. Clients ask once
more (turnkeeper.client: `query_state`, `decide`).

Three signs are read from the activations, which the SDK's core fills from the
history: `history_length` is the last event applied; `history_size_bytes` and
`timestamp` come only from a workflow task's start (and from local activities,
which turnkeeper never runs).

- **No task started.** New events, while size and time stay where the run's
  previous activation left them: only a query's catch-up applies events
  without a task's start. Every task a worker completes starts with a new size
  and time, so none is refused.
- **A lost task's start.** When the events include the start of a task a killed
  worker held, size and time move to that start, which lies at least the run's
  workflow task timeout in the past (the task had to time out). No activation of
  a live task is that old: its task would be timed out, and its completion
  refused by the server anyway. Age is read on this worker's clock, less the
  smallest lag among its last 64 live activations, so a clock apart from the
  server's is no sign (docs/decisions/0002).
- **The query behind a rebuild.** A history that ends at the start of
  a task another worker holds at that moment carries that task's own length,
  size and time, exactly as the task does; the SDK applies it live and keeps
  what the run did for a later completion. Only what follows tells: the query
  of a query task (`legacy_query`) at the very event of the live activation
  just before it. A run this worker holds shows the same after every task it
  completes (a query task to a worker's own cache carries no events), and so
  does a new run after its first task; so only a run this worker has just
  rebuilt from its history is looked at, and only at its first live
  activation. A run rebuilt for a real task and queried at once pays one
  refused query and one more replay, once on this worker (`Once`): the query
  asked again may wait at the server behind the run's next task, whose
  rebuild would look the same.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from datetime import timedelta

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner

from turnkeeper.runner_wrap import WrappedInstance, WrappedRunner

log = logging.getLogger(__name__)

QUERY_CATCH_UP = "QueryCatchUp"
CATCH_UP_MESSAGE = (
    f"{QUERY_CATCH_UP}: a query applied events of a workflow task this worker does not hold; "
    "this worker drops the run and the task replays it whole. Ask again."
)


# Which sign refused an activation, as the worker's log line says.
NO_TASK, LOST_TASK, QUERY_BEHIND = "no task started", "a lost task's start", "the query behind it"


@dataclass(frozen=True)
class Mark:
    """Where an activation leaves a run: its last event, and its last task's start."""

    length: int
    size: int
    time_ns: int

    @classmethod
    def of(cls, act: WorkflowActivation) -> Mark:
        time_ns = act.timestamp.ToNanoseconds() if act.HasField("timestamp") else 0
        return cls(act.history_length, act.history_size_bytes, time_ns)


# The query id the SDK's core gives the query of a query task (as against one that
# rides on a workflow task); tests/replay/test_sdk_query_order.py pins it.
LEGACY_QUERY_ID = "legacy_query"


def applies_events(act: WorkflowActivation) -> bool:
    """Jobs from the history (a query or an eviction applies none)."""
    return any(job.WhichOneof("variant") not in ("query_workflow", "remove_from_cache") for job in act.jobs)


def is_catch_up(previous: Mark | None, act: WorkflowActivation) -> bool:
    """No task started: new events while size and time stayed."""
    if previous is None or act.is_replaying or not applies_events(act):
        return False
    now = Mark.of(act)
    return now.length != previous.length and (now.size, now.time_ns) == (previous.size, previous.time_ns)


def live_events(act: WorkflowActivation) -> int | None:
    """The last event of a live activation that applies events, else None."""
    return None if act.is_replaying or not applies_events(act) else act.history_length


def queries_behind(live_at: int | None, act: WorkflowActivation) -> bool:
    """A query task's query at the event of the live activation just before it."""
    legacy = any(job.query_workflow.query_id == LEGACY_QUERY_ID for job in act.jobs)
    return legacy and live_at is not None and act.history_length == live_at


class Lag:
    """How far this worker's clock runs ahead of live activations' task starts, at least:
    the smallest lag among its last `KEEP` live activations, so that a clock set anew
    is learnt again, not held forever."""

    KEEP = 64

    def __init__(self) -> None:
        self._lags: deque[int] = deque(maxlen=self.KEEP)

    def is_stale(self, act: WorkflowActivation, task_timeout: timedelta, now_ns: int) -> bool:
        """A live activation whose task started more than `task_timeout` ago (its lag is noted)."""
        if act.is_replaying or not applies_events(act) or not act.HasField("timestamp"):
            return False
        lag = now_ns - act.timestamp.ToNanoseconds()
        self._lags.append(lag)
        return lag - min(self._lags) > task_timeout.total_seconds() * 1e9


class Once:
    """The runs whose query this worker refused behind a rebuild: a run is refused so at most
    once, or a query asked again, held back by the server until the next task of the run
    (rebuilt once more) is done, would be refused again and again. The latest `KEEP`."""

    KEEP = 10_000

    def __init__(self) -> None:
        self._runs: OrderedDict[str, None] = OrderedDict()

    def first(self, run_id: str) -> bool:
        if run_id in self._runs:
            return False
        self._runs[run_id] = None
        if len(self._runs) > self.KEEP:
            self._runs.popitem(last=False)
        return True


class CatchUpGuard(WrappedRunner):
    """`runner`, with every run's catch-up activations failed unseen."""

    def __init__(self, runner: WorkflowRunner) -> None:
        super().__init__(runner)
        self._lag = Lag()
        self._behind = Once()

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        inner = self._runner.create_instance(det)
        return _GuardedInstance(inner, self._lag, self._behind, det.info.task_timeout)


class _GuardedInstance(WrappedInstance):
    def __init__(
        self, inner: WorkflowInstance, lag: Lag, behind: Once, task_timeout: timedelta | None
    ) -> None:
        super().__init__(inner)
        self._lag = lag
        self._behind = behind
        self._task_timeout = task_timeout or timedelta(seconds=10)  # the server's default
        self._mark: Mark | None = None
        self._rebuilt: bool | None = None  # rebuilt from history, and no live activation or query yet
        self._live_at: int | None = None  # the rebuilt run's first live activation, just before

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        stale = self._lag.is_stale(act, self._task_timeout, time.time_ns())
        no_task = is_catch_up(self._mark, act)
        behind = queries_behind(self._live_at, act) and self._behind.first(act.run_id)
        if stale or no_task or behind:
            why = NO_TASK if no_task else LOST_TASK if stale else QUERY_BEHIND
            log.warning("%s run %s at event %d (%s)", QUERY_CATCH_UP, act.run_id, act.history_length, why)
            completion = WorkflowActivationCompletion(run_id=act.run_id)
            completion.failed.failure.message = CATCH_UP_MESSAGE
            completion.failed.failure.application_failure_info.type = QUERY_CATCH_UP
            self._live_at, self._rebuilt = None, False  # the run is dropped
            return completion
        if self._rebuilt is None:
            self._rebuilt = act.is_replaying  # a new run's first activation is live
        self._live_at = live_events(act) if self._rebuilt else None
        if self._live_at is not None or not applies_events(act):
            self._rebuilt = False
        if applies_events(act):
            self._mark = Mark.of(act)
        return self._inner.activate(act)
