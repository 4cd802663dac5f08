"""How `ChatTurn` calls its activities, with their options defined once.

Model and tool calls are steps: never retried by Temporal, so a lost one opens a
gate instead of acting twice. Store calls are local activities, retried (they are
idempotent) until the store is reported unavailable, which the turn waits out.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    TimeoutError as TemporalTimeoutError,
    TimeoutType,
)
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from turnkeeper import activity_io
    from turnkeeper.models import ToolCall

NO_RETRY = RetryPolicy(maximum_attempts=1)
# Store calls are idempotent, so retrying them is safe. A store that stays
# unavailable past these attempts is waited for (`_wait_for_store`), visibly;
# any other store error fails the run, and the reconciler finds the turn.
STORE_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=6,
                          maximum_interval=timedelta(seconds=2),
                          non_retryable_error_types=[activity_io.STORE_UNAVAILABLE_ERROR])
STORE_TIMEOUT = timedelta(seconds=30)
# It does nothing; retried (the default policy) until a worker has run it.
END_OF_RUN_TIMEOUT = timedelta(seconds=10)


def start_model_call(arg: activity_io.ModelCallInput,
                     settings: activity_io.TurnSettings) -> workflow.ActivityHandle[activity_io.ModelCallResult]:
    return workflow.start_activity(
        activity_io.MODEL_CALL, arg,
        result_type=activity_io.ModelCallResult, summary=f"model call {arg.step + 1} of turn {arg.turn}",
        **_step_options(settings, settings.model_timeout_s))


def start_tool_call(arg: activity_io.ToolCallInput,
                    settings: activity_io.TurnSettings) -> workflow.ActivityHandle[activity_io.ToolCallResult]:
    return workflow.start_activity(
        activity_io.TOOL_CALL, arg,
        result_type=activity_io.ToolCallResult, summary=tool_summary(arg.call),
        **_step_options(settings, settings.tool_timeout_s))


def _step_options(settings: activity_io.TurnSettings, timeout_s: int) -> dict[str, Any]:
    """A model or tool call: never retried by Temporal, lost within seconds of its
    worker's death, and on the resume window's clock when no worker takes it."""
    return dict(
        start_to_close_timeout=timedelta(seconds=timeout_s),
        schedule_to_start_timeout=timedelta(seconds=settings.resume_window_s),
        heartbeat_timeout=timedelta(seconds=settings.heartbeat_timeout_s),
        retry_policy=NO_RETRY,
        # A cancelled call must have stopped before the turn writes its closing row.
        cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
    )


async def call_store(activity: str, arg: Any, result_type: Any = None) -> Any:
    """One store local activity; its outage is the caller's to wait out."""
    return await workflow.execute_local_activity(
        activity, arg, result_type=result_type,
        start_to_close_timeout=STORE_TIMEOUT, retry_policy=STORE_RETRY)


async def end_of_run() -> None:
    """The activity a run ends after: its completion is a history event (patches.RECOVERY_MACHINE_9)."""
    await workflow.execute_activity(activity_io.END_OF_RUN, start_to_close_timeout=END_OF_RUN_TIMEOUT,
                                    summary="end of run: messages sent meanwhile are taken first")


def error_type(err: ActivityError | ApplicationError) -> str | None:
    cause = err if isinstance(err, ApplicationError) else err.cause
    return cause.type if isinstance(cause, ApplicationError) else None


def failure_text(err: ActivityError | ApplicationError) -> str | None:
    cause = err if isinstance(err, ApplicationError) else err.cause
    return cause.message if isinstance(cause, ApplicationError) else None


def timeout_type(err: ActivityError) -> TimeoutType | None:
    cause = err.cause
    return cause.type if isinstance(cause, TemporalTimeoutError) else None


def tool_summary(call: ToolCall) -> str:
    args = call.arguments if len(call.arguments) <= 80 else call.arguments[:77] + "..."
    return f"{call.name}({args})"
