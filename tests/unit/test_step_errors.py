"""How the turn loop reads a step's failure (turnkeeper/step_errors.py); the gates
these open in real turns: tests/workflow/test_recovery.py."""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

from turnkeeper import activity_io, step_errors
from turnkeeper.models import Reason


def failed(cause: BaseException) -> ActivityError:
    err = ActivityError(
        "activity error",
        scheduled_event_id=5,
        started_event_id=6,
        identity="worker",
        activity_type=activity_io.MODEL_CALL,
        activity_id="1",
        retry_state=None,
    )
    err.__cause__ = cause
    return err


def test_a_model_failure_opens_a_gate_with_its_messages_committed_and_its_words() -> None:
    lost = step_errors.lost_model_call(
        failed(ApplicationError("429 from the provider", type=activity_io.MODEL_FAILED_ERROR))
    )
    assert lost == step_errors.Lost(Reason.MODEL_FAILED, committed=True, detail="429 from the provider")


def test_an_invalid_checkpoint_rules_continue_out() -> None:
    err = failed(ApplicationError("bad row", type=activity_io.CHECKPOINT_INVALID_ERROR))
    assert step_errors.lost_model_call(err) == step_errors.Lost(
        Reason.CHECKPOINT_INVALID, can_continue=False, detail="bad row"
    )


def test_anything_else_may_have_ended_the_call_anywhere() -> None:
    timed_out = failed(TimeoutError("heartbeat", type=TimeoutType.HEARTBEAT, last_heartbeat_details=[]))
    for err in (timed_out, failed(ApplicationError("boom")), RuntimeError("cancelled")):
        assert step_errors.lost_model_call(err) == step_errors.Lost(Reason.RESTART_REQUIRES_CONFIRMATION)
    assert step_errors.error_type(timed_out) is None and step_errors.failure_text(timed_out) is None


def test_a_step_no_worker_took_never_started() -> None:
    unstarted = failed(
        TimeoutError("not taken", type=TimeoutType.SCHEDULE_TO_START, last_heartbeat_details=[])
    )
    heartbeat = failed(TimeoutError("heartbeat", type=TimeoutType.HEARTBEAT, last_heartbeat_details=[]))
    assert step_errors.never_started(unstarted) and not step_errors.never_started(heartbeat)
