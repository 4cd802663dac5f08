"""`end_of_run`: an activity that does nothing but complete.

A run must end on a history event, never on a store call's result: the SDK may
hand that result to a live run one workflow task later than a replay does, and a
message signalled in between would then be taken by a run that has already ended
(workflows/patches.py, RECOVERY_MACHINE_9). An activity's completion is an event
in the history, so live and replayed runs end in the same task, after the same
signals. For the same reason a run waits for it before it judges a store check
of superseding messages, or goes on from refusals written at a gate
(RECOVERY_MACHINE_10): the name stays, as recorded histories hold it.
"""
from __future__ import annotations

from temporalio import activity

from turnkeeper import activity_io


@activity.defn(name=activity_io.END_OF_RUN)
async def end_of_run() -> None:
    return None
