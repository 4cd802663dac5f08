"""How `ChatTurn` starts its activities, each kind's options written once.

Every activity is an ordinary one: its result is an event in the run's history,
taken by the turn loop in history order like any signal. (A local activity's
result reaches a live run inside a workflow task, where a replay may place it
elsewhere relative to the signals around it.) Model and tool calls are never
retried by Temporal: a lost one opens a gate instead of acting twice; their
timeouts are the worker's (turnkeeper/step_timeouts.py). Store writes are
idempotent, retried a few times, then waited out by the turn, visibly; they
heartbeat too, so one held by a dead worker runs again within seconds.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from turnkeeper import activity_io
    from turnkeeper.models import ToolCall

R = TypeVar("R")

NO_RETRY = RetryPolicy(maximum_attempts=1)
STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_attempts=4,
    maximum_interval=timedelta(seconds=1),
    non_retryable_error_types=[activity_io.STORE_UNAVAILABLE_ERROR],
)
# Announcements and store checks never give up: the store returns, and they are idempotent.
PATIENT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))
STORE_TIMEOUT = timedelta(seconds=30)
# Defaults for a worker without turnkeeper.step_timeouts (a test's, a replayer's).
STEP_TIMEOUT = timedelta(minutes=10)
RESUME_WINDOW = timedelta(seconds=60)
HEARTBEAT_TIMEOUT = timedelta(seconds=2)


def model_call(arg: activity_io.ModelCallInput) -> workflow.ActivityHandle[activity_io.ModelCallResult]:
    summary = f"model call {arg.step + 1} of turn {arg.turn or 'new'}"
    return _step(activity_io.MODEL_CALL, arg, activity_io.ModelCallResult, summary)


def tool_call(arg: activity_io.ToolCallInput) -> workflow.ActivityHandle[activity_io.ToolCallResult]:
    return _step(activity_io.TOOL_CALL, arg, activity_io.ToolCallResult, tool_summary(arg.call))


def _step(activity: str, arg: Any, result_type: type[R], summary: str) -> workflow.ActivityHandle[R]:
    return workflow.start_activity(
        activity,
        arg,
        result_type=result_type,
        summary=summary,
        start_to_close_timeout=STEP_TIMEOUT,
        schedule_to_start_timeout=RESUME_WINDOW,
        heartbeat_timeout=HEARTBEAT_TIMEOUT,
        retry_policy=NO_RETRY,
        # A cancelled call has stopped before the turn writes its closing row.
        cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
    )


def store_write(
    activity: str, arg: Any, result_type: Any = None, summary: str | None = None, patient: bool = False
) -> workflow.ActivityHandle[Any]:
    return workflow.start_activity(
        activity,
        arg,
        result_type=result_type,
        start_to_close_timeout=STORE_TIMEOUT,
        heartbeat_timeout=HEARTBEAT_TIMEOUT,
        retry_policy=PATIENT_RETRY if patient else STORE_RETRY,
        summary=summary or activity.split(".")[-1],
    )


def tool_summary(call: ToolCall) -> str:
    args = call.arguments if len(call.arguments) <= 80 else call.arguments[:77] + "..."
    return f"{call.name}({args})"
