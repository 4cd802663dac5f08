"""What an activity's failure says, as the turn loop reads it: the error type an
activity raised (activity_io names them), its message, or a step no worker took.
Pure: safe in workflow code."""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeoutError


def cause(err: BaseException) -> BaseException | None:
    return err.cause if isinstance(err, ActivityError) else err


def error_type(err: BaseException) -> str | None:
    c = cause(err)
    return c.type if isinstance(c, ApplicationError) else None


def failure_text(err: BaseException) -> str | None:
    c = cause(err)
    return c.message if isinstance(c, ApplicationError) else None


def never_started(err: BaseException) -> bool:
    """No worker took the step within the resume window: it did not run."""
    c = cause(err)
    return isinstance(c, TemporalTimeoutError) and c.type == TimeoutType.SCHEDULE_TO_START
