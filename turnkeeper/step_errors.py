"""What an activity's failure says, as the turn loop reads it: the error type an
activity raised (activity_io names them), its message, a step no worker took, and
the gate a lost model call opens. Pure: safe in workflow code."""

from __future__ import annotations

from dataclasses import dataclass

from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from turnkeeper import activity_io
from turnkeeper.models import Reason


@dataclass(frozen=True)
class Lost:
    """A step that did not answer: the gate it opens."""

    reason: Reason
    committed: bool = False  # the call's messages are in the store for sure
    can_continue: bool = True
    detail: str | None = None


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


def lost_model_call(err: BaseException) -> Lost:
    """The gate of a model call that failed for good. MODEL_FAILED is raised after
    the call committed its messages; anything else may have ended it anywhere."""
    kind, text = error_type(err), failure_text(err)
    if kind == activity_io.MODEL_FAILED_ERROR:
        return Lost(Reason.MODEL_FAILED, committed=True, detail=text)
    if kind == activity_io.CHECKPOINT_INVALID_ERROR:
        return Lost(Reason.CHECKPOINT_INVALID, can_continue=False, detail=text)
    return Lost(Reason.RESTART_REQUIRES_CONFIRMATION)
