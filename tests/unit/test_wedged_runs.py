"""Which runs the reconciler ends for a workflow task that keeps failing (activities/reconcile/wedged_runs.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionResponse

from turnkeeper.activities.reconcile import wedged_runs

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _event(kind: str, ago_s: float, started: bool = True) -> HistoryEvent:
    event = HistoryEvent(event_type=getattr(EventType, f"EVENT_TYPE_WORKFLOW_TASK_{kind}"))
    event.event_time.FromDatetime(NOW - timedelta(seconds=ago_s))
    if kind == "FAILED":
        event.workflow_task_failed_event_attributes.failure.message = "the server refused the completion"
    elif kind == "TIMED_OUT" and started:
        event.workflow_task_timed_out_event_attributes.started_event_id = 7
    return event


class _Handle:
    def __init__(self, events: list[HistoryEvent]) -> None:
        self.events = events

    async def fetch_history(self) -> Any:
        return SimpleNamespace(events=self.events)


def _described(attempt: int = 1, reported: bool = False) -> Any:
    raw = DescribeWorkflowExecutionResponse()
    raw.pending_workflow_task.attempt = attempt
    if reported:
        raw.workflow_execution_info.search_attributes.indexed_fields[
            wedged_runs.REPORTED_PROBLEMS
        ].data = b"[]"
    return SimpleNamespace(raw_description=raw)


async def _wedged(events: list[HistoryEvent], **described: Any) -> wedged_runs.Wedged | None:
    return await wedged_runs.wedged(_Handle(events), _described(**described), now=NOW)  # type: ignore[arg-type]


async def test_three_failures_in_a_row_over_a_minute_end_the_run() -> None:
    found = await _wedged(
        [_event("COMPLETED", 100), _event("FAILED", 70), _event("FAILED", 40), _event("FAILED", 5)],
        reported=True,
    )
    assert found is not None and found.failures == 3 and found.since == NOW - timedelta(seconds=70)
    assert "the server refused the completion" in found.describe()


@pytest.mark.parametrize(
    ("events", "described"),
    [
        # A healthy run: the describe alone says so, the history is not read.
        ([_event("FAILED", 70), _event("FAILED", 40), _event("FAILED", 5)], {}),
        # Failing, but for less than a minute.
        ([_event("FAILED", 50), _event("FAILED", 30), _event("FAILED", 5)], {"reported": True}),
        # A task completed since: the streak is two.
        (
            [_event("FAILED", 90), _event("COMPLETED", 80), _event("FAILED", 70), _event("FAILED", 5)],
            {"reported": True},
        ),
        # Tasks that waited for a worker and never started are not failures.
        (
            [
                _event("TIMED_OUT", 90, started=False),
                _event("TIMED_OUT", 70, started=False),
                _event("FAILED", 65),
            ],
            {"attempt": 2},
        ),
    ],
)
async def test_runs_left_alone(events: list[HistoryEvent], described: dict[str, Any]) -> None:
    assert await _wedged(events, **described) is None


async def test_retries_the_history_does_not_show_count() -> None:
    """After the first failure the server keeps retrying without writing the
    attempts down; the pending task's attempt counts them."""
    found = await _wedged([_event("COMPLETED", 100), _event("FAILED", 80)], attempt=5)
    assert found is not None and found.failures == 4


def test_the_server_marks_failing_runs_as_soon_as_the_reconciler_would_end_them() -> None:
    """The embedded server's TemporalReportedProblems threshold is the rule's count:
    a run with no open turn is listed by the time it has failed enough to be ended."""
    from turnkeeper.worker.dev_server import TASK_PROBLEMS_MARKED_AFTER

    assert TASK_PROBLEMS_MARKED_AFTER == wedged_runs.WEDGED_TASK_FAILURES
