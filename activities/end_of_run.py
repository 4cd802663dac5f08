"""`end_of_run`: an activity that does nothing but complete.

A run must end on a history event, never on a store call's result: the SDK may
hand that result to a live run one workflow task later than a replay does, and a
message signalled in between would then be taken by a run that has already ended
(workflows/patches.py, RECOVERY_MACHINE_9). An activity's completion is an event
in the history, so live and replayed runs end in the same task, after the same
signals.
"""
from __future__ import annotations

from temporalio import activity

from turnkeeper import activity_io


@activity.defn(name=activity_io.END_OF_RUN)
async def end_of_run() -> None:
    return None
