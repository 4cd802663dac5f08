"""Names and the result of a reconcile pass: shared by the `Reconcile` workflow,
the reconciler activity and the schedule. No I/O: safe to import from workflow code."""
from __future__ import annotations

from pydantic import BaseModel, Field

from turnkeeper.models import Reason

RECONCILE_WORKFLOW = "Reconcile"
RECONCILE_PASS = "turnkeeper.reconcile_pass"
# Contract (docs/contract.md, "Reconciler"): operators trigger it with
# `temporal schedule trigger --schedule-id turnkeeper-reconcile`.
SCHEDULE_ID = "turnkeeper-reconcile"


def pass_workflow_id(schedule_id: str = SCHEDULE_ID) -> str:
    """The id the schedule starts its passes with (Temporal appends the start time)."""
    return f"{schedule_id}-pass"


class ReconcileSummary(BaseModel):
    """What one pass did, by open turn examined."""

    examined: int = 0
    healthy: int = 0
    """The turn's run is still running: nothing read beyond its description, nothing written."""
    settled: int = 0
    """The turn closed, or another run took it over, while the pass looked at it."""
    busy: int = 0
    """Judged, but a run already owns the chat (e.g. the recovery run of an earlier
    pass not yet at its gate): left alone this pass."""
    outcomes: dict[Reason, int] = Field(default_factory=dict)
    """Turns recovered this pass, by verdict."""
    failed: int = 0
    """Turns whose recovery raised: marked failed/recovery_failed."""
    deferred: int = 0
    """Turns skipped for a transient error (Temporal or the store unreachable): tried again next pass."""
    handed_on: int = 0
    """Messages of runs that ended abnormally before the store recorded a turn for
    them (e.g. while the store was down), handed on to their chats."""

    def count(self, reason: Reason) -> None:
        self.outcomes[reason] = self.outcomes.get(reason, 0) + 1
