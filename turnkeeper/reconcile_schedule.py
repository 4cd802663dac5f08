"""The reconciler's schedule and its loop (docs/contract.md, "Reconciler"), set up
by every worker.

Passes run in one long-lived workflow, `turnkeeper-reconcile-loop`
(`ReconcileLoop`): a pass every interval in one visible run, where a schedule
firing every minute added 1,440 runs a day to the Temporal UI's workflow list.
Every worker starts the loop when it is not running (also after a terminate or
a failure), once an interval, so the guarantee holds while any worker runs.

The schedule `turnkeeper-reconcile` stays, paused: it starts no runs by itself,
`temporal schedule trigger --schedule-id turnkeeper-reconcile` runs one pass at
once, and its action's task queue and interval are the loop's.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    WorkflowExecutionStatus,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from turnkeeper.config import Settings
from turnkeeper.reconcile_io import (
    RECONCILE_LOOP_WORKFLOW,
    RECONCILE_WORKFLOW,
    SCHEDULE_ID,
    ReconcileLoopInput,
    loop_workflow_id,
    pass_workflow_id,
)

log = logging.getLogger("turnkeeper.reconcile")

# A pass no worker picks up (all workers down) times out instead of holding the
# schedule (overlap SKIP) forever; the next trigger starts a fresh one.
PASS_RUN_TIMEOUT = timedelta(minutes=15)
# The schedule's note says why it is paused (`temporal schedule describe`).
PAUSED_NOTE = ("turnkeeper: passes run in the workflow {loop}; "
               "`temporal schedule trigger` runs one pass now")


def reconcile_schedule(settings: Settings, schedule_id: str = SCHEDULE_ID) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            RECONCILE_WORKFLOW, id=pass_workflow_id(schedule_id), task_queue=settings.task_queue,
            run_timeout=PASS_RUN_TIMEOUT),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=settings.reconcile_every))]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
        state=ScheduleState(paused=True, note=PAUSED_NOTE.format(loop=loop_workflow_id(schedule_id))),
    )


async def ensure_reconcile_schedule(client: Client, settings: Settings, schedule_id: str = SCHEDULE_ID) -> bool:
    """Create the schedule unless it exists; True when this call created it. An
    existing schedule is left as it is (several workers start at once, and an
    operator may have retuned it), except that one an earlier release created,
    running every interval and never paused or unpaused since (no note), is paused."""
    try:
        await client.create_schedule(schedule_id, reconcile_schedule(settings, schedule_id))
    except ScheduleAlreadyRunningError:
        handle = client.get_schedule_handle(schedule_id)
        state = (await handle.describe()).schedule.state
        if not state.paused and not state.note:
            await handle.pause(note=PAUSED_NOTE.format(loop=loop_workflow_id(schedule_id)))
            log.info("paused schedule %r: its passes now run in the workflow %r",
                     schedule_id, loop_workflow_id(schedule_id))
        return False
    log.info("created schedule %r (paused: passes run in the workflow %r)", schedule_id, loop_workflow_id(schedule_id))
    return True


@dataclass(frozen=True)
class LoopPlan:
    task_queue: str
    every_s: int


async def loop_plan(client: Client, settings: Settings, schedule_id: str = SCHEDULE_ID) -> LoopPlan:
    """The loop runs where the schedule's action points, at its interval (the
    worker's settings when the schedule is missing or unreadable)."""
    plan = LoopPlan(settings.task_queue, settings.reconcile_every)
    try:
        schedule = (await client.get_schedule_handle(schedule_id).describe()).schedule
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        return plan
    action, intervals = schedule.action, schedule.spec.intervals
    if isinstance(action, ScheduleActionStartWorkflow) and action.task_queue:
        plan = LoopPlan(action.task_queue, plan.every_s)
    if intervals:
        plan = LoopPlan(plan.task_queue, max(1, int(intervals[0].every.total_seconds())))
    return plan


async def ensure_reconcile_loop(client: Client, settings: Settings, schedule_id: str = SCHEDULE_ID) -> bool:
    """Start the loop unless it runs; False when it was running. Reads only, while
    it runs: no event, no visible run."""
    loop_id = loop_workflow_id(schedule_id)
    try:
        if (await client.get_workflow_handle(loop_id).describe()).status == WorkflowExecutionStatus.RUNNING:
            return False
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
    plan = await loop_plan(client, settings, schedule_id)
    # Several workers may get here at once: the first start wins, the others keep its run.
    await client.start_workflow(
        RECONCILE_LOOP_WORKFLOW, ReconcileLoopInput(every_s=plan.every_s), id=loop_id, task_queue=plan.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )
    log.info("started the reconcile loop %r: a pass every %d s on task queue %r", loop_id, plan.every_s,
             plan.task_queue)
    return True
