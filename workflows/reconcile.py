"""`Reconcile`: one pass of the reconciler (docs/contract.md, "Reconciler"), started by the
schedule `turnkeeper-reconcile`. All the work is in one activity: the pass talks
to Temporal and the store, and a workflow would add nothing but history."""
from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from turnkeeper.reconcile_io import RECONCILE_PASS, RECONCILE_WORKFLOW, ReconcileSummary

PASS_TIMEOUT = timedelta(minutes=5)
# Long enough for a slow describe or store call between two chats.
PASS_HEARTBEAT = timedelta(seconds=60)
# Passes repeat every interval anyway; one retry covers a worker that died mid-pass.
PASS_RETRY = RetryPolicy(maximum_attempts=2, initial_interval=timedelta(seconds=1))


@workflow.defn(name=RECONCILE_WORKFLOW)
class Reconcile:
    @workflow.run
    async def run(self) -> ReconcileSummary:
        return await workflow.execute_activity(
            RECONCILE_PASS,
            result_type=ReconcileSummary,
            start_to_close_timeout=PASS_TIMEOUT,
            heartbeat_timeout=PASS_HEARTBEAT,
            retry_policy=PASS_RETRY,
        )
