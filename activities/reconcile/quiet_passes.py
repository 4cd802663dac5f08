"""Quiet reconcile passes leave no run behind (docs/operations.md, "A quiet reconciler").

The schedule starts a `Reconcile` run every interval; nearly all find nothing.
Each run records how it went in `ReconcileOutcome`, and before it ends deletes
the earlier runs that were quiet, keeping the latest one, so the workflow list
shows the reconciler alive and the passes that acted, not 1,440 empty runs a day.
A run cannot delete itself (it is running): the next pass does.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.service import RPCError, RPCStatusCode

from turnkeeper.config import Settings
from turnkeeper.reconcile_io import DELETE_QUIET_PASSES, RECONCILE_WORKFLOW, PassOutcome, QuietPassCleanup
from turnkeeper.search_attributes import RECONCILE_OUTCOME_ATTR

log = logging.getLogger("turnkeeper.reconciler")

# The latest completed quiet pass stays: the list shows when the reconciler last ran.
QUIET_PASSES_KEPT = 1
# Bounded work per pass: a backlog (deletions refused for a while) drains over a
# few passes instead of one long one.
DELETES_PER_PASS = 25

_EPOCH = datetime.min.replace(tzinfo=UTC)


def quiet_passes_query(task_queue: str) -> str:
    return (
        f"WorkflowType = '{RECONCILE_WORKFLOW}' AND TaskQueue = '{task_queue}' AND "
        f"ExecutionStatus = 'Completed' AND {RECONCILE_OUTCOME_ATTR.name} = '{PassOutcome.QUIET.value}'"
    )


class QuietPasses:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._warned_unregistered = False

    @activity.defn(name=DELETE_QUIET_PASSES)
    async def delete_quiet_passes(self) -> QuietPassCleanup:
        """Delete the completed quiet passes of this task queue but the latest, at most
        `DELETES_PER_PASS`. Idempotent: a run deleted already (a retry, a concurrent
        pass, visibility lagging behind a deletion) counts as deleted."""
        client = activity.client()
        try:
            runs = [
                run
                async for run in client.list_workflows(
                    quiet_passes_query(self._settings.task_queue), limit=QUIET_PASSES_KEPT + DELETES_PER_PASS
                )
            ]
        except RPCError as err:
            if not _unregistered_attribute(err):
                raise
            if not self._warned_unregistered:
                log.warning(
                    "search attribute %s is not registered (%s): reconcile passes stay listed; "
                    "register it as Keyword",
                    RECONCILE_OUTCOME_ATTR.name,
                    err.message,
                )
                self._warned_unregistered = True
            return QuietPassCleanup(outcome_attribute=False)
        self._warned_unregistered = False
        # Newest first whatever order the server lists in: never the latest one.
        runs.sort(key=lambda run: run.close_time or _EPOCH, reverse=True)
        result = QuietPassCleanup()
        for run in runs[QUIET_PASSES_KEPT:]:
            try:
                await client.workflow_service.delete_workflow_execution(
                    DeleteWorkflowExecutionRequest(
                        namespace=client.namespace,
                        workflow_execution=WorkflowExecution(workflow_id=run.id, run_id=run.run_id),
                    )
                )
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    # One line a pass, not one a run: the rest would be refused alike.
                    log.warning(
                        "could not delete quiet reconcile pass %s (%s); the next pass tries again",
                        run.id,
                        err,
                    )
                    result.not_deleted = len(runs) - QUIET_PASSES_KEPT - result.deleted
                    break
            result.deleted += 1
        return result


def _unregistered_attribute(err: RPCError) -> bool:
    # What visibility answers a query on an attribute it does not know (also for
    # a while after a worker registered it, until the server's cache refreshes).
    return err.status == RPCStatusCode.INVALID_ARGUMENT and RECONCILE_OUTCOME_ATTR.name in err.message
