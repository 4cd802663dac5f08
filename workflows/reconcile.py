"""`Reconcile`: one pass of the reconciler (docs/contract.md, "Reconciler"), started by the
schedule `turnkeeper-reconcile`. The pass is one activity: it talks to Temporal and
the store, and a workflow would add nothing but history. A second activity then
deletes the earlier passes that found nothing, and the run records its own
outcome for the passes after it (activities/quiet_passes.py)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from turnkeeper.reconcile_io import (
        DELETE_QUIET_PASSES,
        RECONCILE_PASS,
        RECONCILE_WORKFLOW,
        QuietPassCleanup,
        ReconcileSummary,
    )
    from turnkeeper.search_attributes import RECONCILE_OUTCOME_ATTR

PASS_TIMEOUT = timedelta(minutes=5)
# Long enough for a slow describe or store call between two chats.
PASS_HEARTBEAT = timedelta(seconds=60)
# Passes repeat every interval anyway; one retry covers a worker that died mid-pass.
PASS_RETRY = RetryPolicy(maximum_attempts=2, initial_interval=timedelta(seconds=1))
# One listing and at most DELETES_PER_PASS deletions.
CLEANUP_TIMEOUT = timedelta(minutes=1)


@workflow.defn(name=RECONCILE_WORKFLOW)
class Reconcile:
    @workflow.run
    async def run(self) -> ReconcileSummary:
        summary: ReconcileSummary = await workflow.execute_activity(
            RECONCILE_PASS,
            result_type=ReconcileSummary,
            start_to_close_timeout=PASS_TIMEOUT,
            heartbeat_timeout=PASS_HEARTBEAT,
            retry_policy=PASS_RETRY,
        )
        try:
            cleanup = await workflow.execute_activity(
                DELETE_QUIET_PASSES,
                result_type=QuietPassCleanup,
                start_to_close_timeout=CLEANUP_TIMEOUT,
                retry_policy=PASS_RETRY,
            )
        except ActivityError as err:
            # The pass is done; this run just stays listed without an outcome.
            workflow.logger.warning("could not delete earlier quiet reconcile passes: %s", err.cause or err)
            return summary
        if cleanup.outcome_attribute:
            # Set last: a run is never listed as quiet before its pass is over.
            workflow.upsert_search_attributes([RECONCILE_OUTCOME_ATTR.value_set(summary.outcome.value)])
        return summary
