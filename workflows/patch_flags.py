"""Which behaviour a run of `ChatTurn` takes, from the patch markers it recorded
(workflows/patches.py), as a mixin of `ChatTurn`.

New runs record the one marker that stands for the ones before it: each marker
costs the run a search-attribute upsert (TemporalChangeVersion). Asked once, in
the run's first activation, in this order: a run recorded with an earlier marker
replays as it ran.
"""
from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnkeeper.workflows.patches import (
        APPROVALS,
        COMPLETE_MACHINE,
        RECOVERY_MACHINE,
        RECOVERY_MACHINE_3,
        RECOVERY_MACHINE_4,
        RECOVERY_MACHINE_5,
        RECOVERY_MACHINE_6,
        RECOVERY_MACHINE_8,
        RECOVERY_MACHINE_9,
        RECOVERY_MACHINE_10,
        RECOVERY_MACHINE_11,
        SIGNALS_AT_WAIT_POINTS,
        WAIT_POINTS,
    )


class PatchFlags:
    def _ask_patches(self) -> None:
        self._machine_11 = workflow.patched(RECOVERY_MACHINE_11)
        self._machine_10 = self._machine_11 or workflow.patched(RECOVERY_MACHINE_10)
        self._machine_9 = self._machine_10 or workflow.patched(RECOVERY_MACHINE_9)
        self._machine_8 = self._machine_9 or workflow.patched(RECOVERY_MACHINE_8)
        self._machine_6 = self._machine_8 or workflow.patched(RECOVERY_MACHINE_6)
        self._machine_5 = self._machine_6 or workflow.patched(RECOVERY_MACHINE_5)
        self._machine_4 = self._machine_5 or workflow.patched(RECOVERY_MACHINE_4)
        self._machine_3 = self._machine_4 or workflow.patched(RECOVERY_MACHINE_3)
        self._machine = self._machine_3 or workflow.patched(RECOVERY_MACHINE)
        self._complete = self._machine or workflow.patched(COMPLETE_MACHINE)
        self._at_wait_points = self._machine or (self._complete and workflow.patched(WAIT_POINTS))
        self._signals_at_wait_points = self._machine or (
            self._at_wait_points and workflow.patched(SIGNALS_AT_WAIT_POINTS))
        self._approvals = self._machine_3 or (self._signals_at_wait_points and workflow.patched(APPROVALS))
