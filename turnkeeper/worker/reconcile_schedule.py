"""The reconciler's Temporal Schedule (docs/contract.md, "Reconciler"), one per task
queue, created by the worker at start-up when missing. `temporal schedule trigger
--schedule-id turnkeeper-reconcile` runs a pass at once (the default queue's)."""

from __future__ import annotations

import logging
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
)

from turnkeeper.config import Settings
from turnkeeper.reconcile_io import RECONCILE_WORKFLOW, SCHEDULE_ID, pass_workflow_id

log = logging.getLogger("turnkeeper.reconcile")

# A pass no worker picks up (all workers down) times out instead of holding the
# schedule (overlap SKIP) forever; the next interval starts a fresh one.
PASS_RUN_TIMEOUT = timedelta(minutes=15)


def reconcile_schedule(settings: Settings, schedule_id: str = SCHEDULE_ID) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            RECONCILE_WORKFLOW,
            id=pass_workflow_id(schedule_id),
            task_queue=settings.task_queue,
            run_timeout=PASS_RUN_TIMEOUT,
        ),
        spec=ScheduleSpec(
            intervals=[ScheduleIntervalSpec(every=timedelta(seconds=settings.reconcile_every))]
        ),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


async def ensure_reconcile_schedule(
    client: Client, settings: Settings, schedule_id: str = SCHEDULE_ID
) -> bool:
    """Create the schedule unless it exists; True when this call created it. An
    existing schedule is left as it is: several workers start at once, and an
    operator may have paused or retuned it."""
    try:
        await client.create_schedule(schedule_id, reconcile_schedule(settings, schedule_id))
    except ScheduleAlreadyRunningError:
        action = (await client.get_schedule_handle(schedule_id).describe()).schedule.action
        queue = action.task_queue if isinstance(action, ScheduleActionStartWorkflow) else None
        if queue != settings.task_queue:
            log.error(
                "schedule %r starts its passes on task queue %r, not this worker's %r: this "
                "deployment's interrupted turns are not reconciled until it does (delete the "
                "schedule, and a worker creates it again)",
                schedule_id,
                queue,
                settings.task_queue,
            )
        return False
    log.info(
        "created schedule %r: a reconcile pass every %d s on task queue %r",
        schedule_id,
        settings.reconcile_every,
        settings.task_queue,
    )
    return True
