"""The contract's statuses, reasons and search attribute names, and a turn's
task timeout: plain Python.

Apart from turnkeeper.models, which re-exports them, so that the CLI's short
commands (`status`, `list`, `send` ...) use them without loading pydantic.
"""

from __future__ import annotations

from datetime import timedelta
from enum import Enum

# --- search attributes (contract): Keyword, upserted on every transition --------
# Their typed keys are in turnkeeper.search_attributes: the names alone keep the
# CLI from importing the SDK.

CHAT_ID = "ChatId"
TURN_STATUS = "TurnStatus"
RECOVERY_REASON = "RecoveryReason"
# Set by each `Reconcile` run as it ends (quiet, acted, deferred): the next pass
# deletes earlier quiet ones (turnkeeper/reconcile_io.py).
RECONCILE_OUTCOME = "ReconcileOutcome"
SEARCH_ATTRIBUTE_NAMES = (CHAT_ID, TURN_STATUS, RECOVERY_REASON, RECONCILE_OUTCOME)

# A turn's workflow tasks are short (the loop's own decisions; every step and
# store write is an activity): when the worker holding one dies, the next worker
# takes the turn, with the signals that wait behind it, after this instead of
# Temporal's default 10 s. A worker without the turn cached replays its whole
# history within this too, and no run's history grows past what replays in about
# half a second (turnkeeper/long_history.py). Every start and continue-as-new of
# a turn sets it.
TURN_TASK_TIMEOUT = timedelta(seconds=2)

# --- statuses and reasons (contract) -------------------------------------------


class TurnStatus(str, Enum):
    RUNNING = "running"
    AWAITING_USER = "awaiting_user"
    RESUMING = "resuming"
    COMPLETED = "completed"
    RECOVERED = "recovered"
    FAILED = "failed"


OPEN_STATUSES = frozenset({TurnStatus.RUNNING, TurnStatus.AWAITING_USER, TurnStatus.RESUMING})
# What a newer user message closes as `superseded` when the next turn begins: an
# open turn, or one whose recovery failed (nothing else will ever close it).
SUPERSEDABLE_STATUSES = OPEN_STATUSES | {TurnStatus.FAILED}


class Reason(str, Enum):
    RESTART_REQUIRES_CONFIRMATION = "restart_requires_confirmation"
    TOOL_STATE_UNKNOWN = "tool_state_unknown"
    MODEL_FAILED = "model_failed"
    INTERRUPTED_WITH_SAVED_CONTEXT = "interrupted_with_saved_context"
    INTERRUPTED_WITHOUT_CHECKPOINT = "interrupted_without_checkpoint"
    CHECKPOINT_INVALID = "checkpoint_invalid"
    CHECKPOINT_UNKNOWN = "checkpoint_unknown"
    USER_CONFIRMED = "user_confirmed"
    LOOP_GUARD = "loop_guard"
    ANSWER_RESTORED = "answer_restored"
    CONTINUED = "continued"
    COMMITTED = "committed"
    DISMISSED = "dismissed"
    STOPPED = "stopped"
    SUPERSEDED = "superseded"
    RECOVERY_FAILED = "recovery_failed"
    APPROVAL_REQUIRED = "approval_required"
    """Not a loss: the model asked for a tool that must be approved before it runs."""
    SUBAGENT_WAITING = "subagent_waiting"
    """A subagent this turn waits for is at a gate of its own: its recovery id is shown here,
    and Continue or Dismiss given to this chat reach it (docs/subagents.md)."""


class ToolCallStatus(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    ERROR = "error"
    INTERRUPTED = "interrupted"
