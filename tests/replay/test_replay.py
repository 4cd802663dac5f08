"""Replay the recorded histories in tests/histories/ against today's workflow code:
a change that would break turns already running fails here, not in production.
Record them with `TK_RECORD_HISTORIES=1 .venv/bin/pytest <test files>` (tests/README.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from tests.support import HISTORIES as HISTORIES_DIR
from turnkeeper.replay_watch import FailureWatch
from turnkeeper.workflows.chat_turn import ChatTurn
from turnkeeper.workflows.reconcile import Reconcile

HISTORIES = sorted(HISTORIES_DIR.rglob("*.json")) if HISTORIES_DIR.is_dir() else []


async def _replayed(paths: list[Path]) -> AsyncIterator[WorkflowHistory]:
    for path in paths:
        yield WorkflowHistory.from_json(f"{path.parent.name}/{path.stem}", path.read_text())


async def replay_failures(paths: list[Path]) -> tuple[int, list[str]]:
    """How many of `paths` replayed, and each one that does not, named."""
    # Unsandboxed, as the worker runs them by default; the in-process worker tests run
    # the same code in the sandbox. Watched: a failure in the task after a history's
    # last completed one is named too.
    watch = FailureWatch(UnsandboxedWorkflowRunner())
    replayer = Replayer(
        workflows=[ChatTurn, Reconcile], data_converter=pydantic_data_converter, workflow_runner=watch
    )
    failures: list[str] = []
    replayed = 0
    async with replayer.workflow_replay_iterator(_replayed(paths)) as results:
        async for result in results:
            replayed += 1
            if result.replay_failure is not None:
                failures.append(f"{result.history.workflow_id}: {result.replay_failure!r}")
            elif (failed := watch.next_task_failure(result.history.run_id)) is not None:
                failures.append(f"{result.history.workflow_id}: {failed}")
    return replayed, failures


@pytest.mark.skipif(
    not HISTORIES,
    reason="no recorded histories in tests/histories/ yet: "
    "record them with TK_RECORD_HISTORIES=1 (tests/README.md)",
)
async def test_recorded_histories_replay() -> None:
    """Every kept history, through one replayer (one worker for all of them: half the
    time of a replayer each); every history that does not replay is named."""
    replayed, failures = await replay_failures(HISTORIES)
    assert replayed == len(HISTORIES)
    assert not failures, "\n".join(failures)
