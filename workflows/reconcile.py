"""The reconciler's workflows (docs/contract.md, "Reconciler"). All the work of a
pass is in one activity: the pass talks to Temporal and the store.

`ReconcileLoop`: the one long-lived run, `turnkeeper-reconcile-loop`, that makes
a pass every interval and continues as new now and then: one row in the Temporal
UI's workflow list instead of one per pass. Workers start it when it is not
running (turnkeeper/reconcile_schedule.py).

`Reconcile`: one pass, and its summary. The paused schedule `turnkeeper-reconcile`
starts one when an operator triggers it.
"""
from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from turnkeeper.reconcile_io import (
        RECONCILE_LOOP_WORKFLOW,
        RECONCILE_PASS,
        RECONCILE_WORKFLOW,
        ReconcileLoopInput,
        ReconcileLoopState,
        ReconcileSummary,
    )

PASS_TIMEOUT = timedelta(minutes=5)
# Long enough for a slow describe or store call between two chats.
PASS_HEARTBEAT = timedelta(seconds=60)
# Passes repeat every interval anyway; one retry covers a worker that died mid-pass.
PASS_RETRY = RetryPolicy(maximum_attempts=2, initial_interval=timedelta(seconds=1))
# About 11 events a pass: a run of the loop stays well under Temporal's history limits.
PASSES_PER_RUN = 500


async def _one_pass() -> ReconcileSummary:
    return await workflow.execute_activity(
        RECONCILE_PASS,
        result_type=ReconcileSummary,
        start_to_close_timeout=PASS_TIMEOUT,
        heartbeat_timeout=PASS_HEARTBEAT,
        retry_policy=PASS_RETRY,
    )


@workflow.defn(name=RECONCILE_WORKFLOW)
class Reconcile:
    @workflow.run
    async def run(self) -> ReconcileSummary:
        return await _one_pass()


@workflow.defn(name=RECONCILE_LOOP_WORKFLOW)
class ReconcileLoop:
    def __init__(self) -> None:
        self._state = ReconcileLoopState()

    @workflow.query(name="state")
    def state(self) -> ReconcileLoopState:
        return self._state

    @workflow.run
    async def run(self, input: ReconcileLoopInput) -> None:
        self._state.passes, self._state.failed_passes = input.passes, input.failed_passes
        for _ in range(PASSES_PER_RUN):
            await workflow.sleep(timedelta(seconds=input.every_s))
            try:
                self._state.last = await _one_pass()
            except ActivityError as err:
                # The loop outlives a failed pass: the next one comes an interval later.
                self._state.failed_passes += 1
                workflow.logger.warning("reconcile pass failed; the next one runs in %d s: %s",
                                        input.every_s, err.cause or err)
            self._state.passes += 1
            if workflow.info().is_continue_as_new_suggested():
                break
        workflow.continue_as_new(ReconcileLoopInput(every_s=input.every_s, passes=self._state.passes,
                                                    failed_passes=self._state.failed_passes))
