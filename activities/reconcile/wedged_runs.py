"""Runs whose workflow task fails over and over: running to the server, going nowhere.

A task that fails for a fault of the code or the SDK (say, a completion the server
refuses every time) is retried forever; nothing ends the run, so nothing recovers its
turn, and its chat never answers again. The reconciler ends such a run after a
minute of failures and recovers the turn like any run that ended abnormally: a gate
with what is known, and its messages handed on. A task that waits for a worker is not
failing: only failures and timeouts of started tasks count.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionDescription, WorkflowHandle

# Failed or timed-out tasks in a row, for at least this long, before the run is ended:
# a few workers killed one after another time out a task a few times within seconds.
WEDGED_TASK_FAILURES = 3
WEDGED_AFTER = timedelta(seconds=60)
# The server marks a run with this search attribute once its tasks keep failing.
REPORTED_PROBLEMS = "TemporalReportedProblems"


@dataclass(frozen=True)
class Wedged:
    failures: int
    since: datetime
    cause: str

    def describe(self) -> str:
        return (
            f"its workflow task failed {self.failures} times in a row since "
            f"{self.since.isoformat(timespec='seconds')} ({self.cause})"
        )


def may_be_wedged(described: WorkflowExecutionDescription) -> bool:
    """Cheap, from the describe a pass makes anyway: is the history worth reading?"""
    raw = described.raw_description
    if raw.HasField("pending_workflow_task") and raw.pending_workflow_task.attempt > 1:
        return True
    return REPORTED_PROBLEMS in raw.workflow_execution_info.search_attributes.indexed_fields


async def wedged(
    handle: WorkflowHandle[Any, Any], described: WorkflowExecutionDescription, now: datetime | None = None
) -> Wedged | None:
    """The run's failing streak if it is long enough to end the run, else None."""
    if not may_be_wedged(described):
        return None
    events = (await handle.fetch_history()).events
    failures, first, cause = 0, None, "unknown cause"
    for event in reversed(events):
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            break
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            why = event.workflow_task_failed_event_attributes.failure.message or "failed"
        elif (
            kind == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
            and event.workflow_task_timed_out_event_attributes.started_event_id
        ):
            why = "timed out"
        else:
            continue  # another event, or a task that only waited for a worker
        if failures == 0:
            cause = why  # the latest
        failures += 1
        first = event.event_time.ToDatetime(tzinfo=UTC)
    raw = described.raw_description
    if raw.HasField("pending_workflow_task"):
        # Retries after the first failure are not written to the history until one completes.
        failures = max(failures, raw.pending_workflow_task.attempt - 1)
    now = now or datetime.now(UTC)
    if first is None or failures < WEDGED_TASK_FAILURES or now - first < WEDGED_AFTER:
        return None
    return Wedged(failures=failures, since=first, cause=cause[:300])
