"""`turnkeeper replay`: the deploy gate (docs/operations.md, "Before a deploy").

Lists the recent runs of the workflows the worker serves on its task queue
(every running one, and those closed within `since`), fetches their histories
and replays them with `temporalio.worker.Replayer` against this code, with the
worker's workflows and the client's data converter. A history that does not
replay is a run that would fail on the new code, and so is a running one whose
next workflow task fails on it (turnkeeper/replay_watch.py).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from turnkeeper.config import Settings

if TYPE_CHECKING:
    from temporalio.client import Client, WorkflowHistory

T = TypeVar("T")
R = TypeVar("R")

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


# The workflow types `registered_workflows` defines.
WORKFLOW_TYPES = ("ChatTurn", "Reconcile")


def registered_workflows() -> list[type]:
    """The workflow classes a worker registers (turnkeeper/worker/main.py uses this list)."""
    from turnkeeper.workflows.chat_turn import ChatTurn
    from turnkeeper.workflows.reconcile import Reconcile

    return [ChatTurn, Reconcile]


def parse_since(raw: str) -> timedelta:
    """`30m`, `24h`, `7d`: how far back closed runs are replayed."""
    match = _DURATION.match(raw.strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"must be a number and a unit (s, m, h, d), such as 24h; got {raw!r}")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


@dataclass(frozen=True)
class Failure:
    workflow_id: str
    run_id: str
    workflow_type: str
    running: bool
    error: str


@dataclass
class ReplayReport:
    replayed: int = 0
    running: int = 0
    failures: list[Failure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def visibility_query(workflow_types: Sequence[str], task_queue: str, closed_after: datetime) -> str:
    types = ", ".join(f"'{t}'" for t in workflow_types)
    since = closed_after.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        f"WorkflowType IN ({types}) AND TaskQueue = '{task_queue}' AND "
        f"(ExecutionStatus = 'Running' OR CloseTime > '{since}')"
    )


async def replay_recent(
    client: Client,
    settings: Settings,
    *,
    limit: int,
    since: timedelta,
    workflows: Sequence[type] | None = None,
) -> ReplayReport:
    """Replay up to `limit` recent histories, as the server lists them (running
    ones first, then the latest closed). One that does not replay is in the
    report, never raised."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.worker import Replayer, UnsandboxedWorkflowRunner
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

    from turnkeeper.replay_watch import FailureWatch

    classes = list(workflows) if workflows is not None else registered_workflows()
    query = visibility_query(WORKFLOW_TYPES, settings.task_queue, datetime.now(UTC) - since)
    runs = [r async for r in client.list_workflows(query, limit=limit)]

    async def histories() -> AsyncIterator[WorkflowHistory]:
        for r in runs:
            yield await client.get_workflow_handle(r.id, run_id=r.run_id).fetch_history()

    # As the worker runs them (TURNKEEPER_WORKFLOW_SANDBOX).
    watch = FailureWatch(
        SandboxedWorkflowRunner() if settings.workflow_sandbox else UnsandboxedWorkflowRunner()
    )
    replayer = Replayer(workflows=classes, data_converter=client.data_converter, workflow_runner=watch)
    report = ReplayReport()
    async with replayer.workflow_replay_iterator(histories()) as results:
        # One result per history, in their order.
        async for run, result in _zip(runs, results):
            report.replayed += 1
            running = run.status == WorkflowExecutionStatus.RUNNING
            report.running += running
            if result.replay_failure is not None:
                report.failures.append(
                    Failure(
                        run.id, run.run_id, run.workflow_type, running, _first_line(result.replay_failure)
                    )
                )
            elif (failed := watch.next_task_failure(run.run_id)) is not None:
                report.failures.append(Failure(run.id, run.run_id, run.workflow_type, running, failed))
    return report


async def _zip(items: Sequence[T], results: AsyncIterator[R]) -> AsyncIterator[tuple[T, R]]:
    i = 0
    async for result in results:
        yield items[i], result
        i += 1


# The SDK's core reports a task failure as a debug dump; its message is the readable part.
_CORE_MESSAGE = re.compile(r'message: "((?:[^"\\]|\\.)*)"')


def _first_line(err: BaseException) -> str:
    text = str(err)
    core = _CORE_MESSAGE.search(text)
    if core:
        text = core.group(1)
    lines = text.strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
