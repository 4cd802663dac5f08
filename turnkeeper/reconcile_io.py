"""Names and the result of a reconcile pass: shared by the `Reconcile` workflow,
the reconciler's activities and the schedule. No I/O: safe to import from workflow code."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field

from turnkeeper.models import Reason

RECONCILE_WORKFLOW = "Reconcile"
RECONCILE_PASS = "turnkeeper.reconcile_pass"
DELETE_QUIET_PASSES = "turnkeeper.delete_quiet_passes"
# Contract (docs/contract.md, "Reconciler"): operators trigger it with
# `temporal schedule trigger --schedule-id turnkeeper-reconcile`.
SCHEDULE_ID = "turnkeeper-reconcile"
DEFAULT_TASK_QUEUE = "turnkeeper"


def schedule_id(task_queue: str) -> str:
    """One schedule per task queue: a second deployment in the namespace (another
    queue) gets its own passes. The default queue's is the contract's id."""
    return SCHEDULE_ID if task_queue == DEFAULT_TASK_QUEUE else f"{SCHEDULE_ID}-{task_queue}"


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
    ended_wedged: int = 0
    """Runs that no open turn leads to, ended because their workflow task kept
    failing; their messages are counted in `handed_on`."""
    handed_on: int = 0
    """Messages of runs that ended abnormally before the store recorded a turn for
    them (e.g. while the store was down), handed on to their chats."""

    def count(self, reason: Reason) -> None:
        self.outcomes[reason] = self.outcomes.get(reason, 0) + 1

    @property
    def outcome(self) -> PassOutcome:
        if self.outcomes or self.failed or self.handed_on or self.ended_wedged:
            return PassOutcome.ACTED
        if self.deferred:
            return PassOutcome.DEFERRED
        return PassOutcome.QUIET


class PassOutcome(str, Enum):
    """A `Reconcile` run's `ReconcileOutcome` search attribute."""

    QUIET = "quiet"
    """Nothing to do: every open turn was healthy, settled or busy. Deleted by a later pass."""
    ACTED = "acted"
    """Closed or recovered a turn, marked one failed, ended a wedged run or handed messages on. Kept."""
    DEFERRED = "deferred"
    """Nothing done, but a turn was left for the next pass (Temporal or the store unreachable). Kept."""


class QuietPassCleanup(BaseModel):
    """What `turnkeeper.delete_quiet_passes` did before its run ends."""

    deleted: int = 0
    """Earlier quiet passes deleted (or found deleted already)."""
    not_deleted: int = 0
    """Deletions Temporal refused; the next pass tries them again."""
    outcome_attribute: bool = True
    """`ReconcileOutcome` is registered, so the run may set it: where it is not, an
    upsert would fail the run's workflow task until its run timeout."""
