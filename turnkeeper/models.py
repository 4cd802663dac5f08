"""Data shared by the workflow, the activities, the store and the clients.

Everything here is plain pydantic: no I/O, safe to import from workflow code.
The shapes marked *contract* are part of the public contract in docs/contract.md.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from turnkeeper.statuses import (  # noqa: F401  (re-exported)
    CHAT_ID,
    OPEN_STATUSES,
    RECONCILE_OUTCOME,
    RECOVERY_REASON,
    SEARCH_ATTRIBUTE_NAMES,
    SUPERSEDABLE_STATUSES,
    TURN_STATUS,
    TURN_TASK_TIMEOUT,
    Reason,
    ToolCallStatus,
    TurnStatus,
)


class LazyModel(BaseModel):
    # Schemas are built on first use, not at import: the CLI's short commands use
    # one or two of these models and start without paying for the rest.
    model_config = ConfigDict(defer_build=True)


# --- rows the system writes into a transcript ------------------------------------

INTERRUPTED_TOOL_TEXT = "Error: the tool was interrupted before it finished; its outcome is unknown."
UNSTARTED_TOOL_TEXT = "Error: no worker picked this tool call up in time; it did not run."
INTERRUPTED_TURN_TEXT = "Error: the turn was interrupted before a response was generated."
SUPERSEDED_TEXT = "The interrupted turn was superseded by a newer message."
DISMISSED_TEXT = "The interrupted turn was dismissed."
# Dismiss (Deny) at an approval gate: nothing was interrupted.
DENIED_TURN_TEXT = "The turn ended: the user denied the tool calls it asked for."
STOPPED_TEXT = "The turn was stopped by the user."
# A tool call that needed the user's approval and did not get it (Deny at its gate).
DENIED_TOOL_TEXT = "denied by the user"
# One that waited for approval when the turn ended otherwise (Stop, a newer message, a Dismiss elsewhere).
UNAPPROVED_TOOL_TEXT = (
    "Error: the tool did not run: it waited for the user's approval and the turn ended first."
)


def closing_text(reason: Reason, denied: bool) -> str:
    """The closing row of a turn its user ended: Stop, Dismiss (Deny at an approval
    gate, `denied`) or a newer message."""
    if reason == Reason.DISMISSED:
        return DENIED_TURN_TEXT if denied else DISMISSED_TEXT
    return SUPERSEDED_TEXT if reason == Reason.SUPERSEDED else STOPPED_TEXT


# --- search attributes, statuses and reasons (contract), a turn's task timeout ---
# In turnkeeper.statuses, re-exported above: plain Python, so the CLI's short
# commands use them without loading pydantic.


class EffectClass(str, Enum):
    """What a tool does to the world; `write` (the default) is never assumed safe to repeat."""

    READ = "read"
    IDEMPOTENT = "idempotent"
    WRITE = "write"


# --- signal payloads (contract) -------------------------------------------------


class UserMessage(LazyModel):
    """Payload of the `user_message` signal; `message_id` is the client's idempotency key."""

    model_config = ConfigDict(extra="ignore")

    message_id: str = Field(min_length=1, max_length=200)
    text: str
    sender: str | None = None


class RecoveryAction(LazyModel):
    """Payload of the `continue` and `dismiss` signals."""

    model_config = ConfigDict(extra="ignore")

    recovery_id: str = Field(min_length=1)
    request_id: str | None = Field(default=None, max_length=200)
    """A client's id for this decision: `state.decisions` answers it (turnkeeper.client.decide)."""


class StopRequest(LazyModel):
    """Payload of the `stop` signal: anything, or `{"request_id": ...}` to read the answer back."""

    model_config = ConfigDict(extra="ignore")

    request_id: str | None = Field(default=None, max_length=200)


class DecisionRecord(LazyModel):
    """How the turn judged a `continue`, `dismiss` or `stop` that carried a `request_id`."""

    request_id: str
    action: Literal["continue", "dismiss", "stop"]
    refusal: str | None = None
    """None: accepted; else why it was refused, in the recovery table's words."""


class RecoveryStart(LazyModel):
    """How the reconciler starts a run for a turn whose own run ended abnormally:
    the run opens at a gate for that turn, so Continue and Dismiss reach it."""

    turn: int
    reason: Reason
    can_continue: bool = True
    recovery_id: str | None = None
    """The gate's id when a waiting run hands itself on (continue-as-new): kept."""
    attempts: int = 0
    detail: str | None = None
    approvals: list[ToolCall] = Field(default_factory=list)
    """Tool calls that waited for the user's approval when a gate handed itself on."""


DelegateMode = Literal["wait", "background"]


class SubagentLink(LazyModel):
    """What a subagent's run knows of the turn that delegated to it."""

    parent_chat_id: str
    parent_workflow_id: str
    parent_turn: int
    tool_call_id: str
    depth: int = 1
    """1 for a subagent of a chat's own turn, 2 for its subagent, and so on."""
    mode: DelegateMode = "wait"
    profile: str | None = None
    task: str = ""


class SubagentView(LazyModel):
    """A subagent of this turn, as `state` lists it: its own chat holds its transcript."""

    chat_id: str
    workflow_id: str
    tool_call_id: str
    task: str
    """The task's first 200 characters."""
    mode: DelegateMode
    status: TurnStatus = TurnStatus.RUNNING
    reason: Reason | None = None
    recovery_id: str | None = None
    can_continue: bool = True


class ChatTurnInput(LazyModel):
    """`ChatTurn`'s input (contract): `{"chat_id": ...}` starts a turn; the other
    fields are the workflow's own."""

    chat_id: str
    pending: list[UserMessage] = Field(default_factory=list)
    """Messages acknowledged by an earlier run and not yet committed (continue-as-new)."""
    recovery: RecoveryStart | None = None
    """Set by the reconciler: take over this turn at a gate instead of starting one."""
    carry_on: CarryOn | None = None
    """Set by a running turn whose history grew long: take its next step in this run."""
    parent: SubagentLink | None = None
    """Set when a turn delegated this one (a subagent's chat, docs/subagents.md)."""


# --- transcript rows ------------------------------------------------------------


class ToolCall(LazyModel):
    """A tool call as the model asked for it. `arguments` is the JSON text the model
    produced, kept verbatim: malformed arguments are the tool activity's to report."""

    id: str
    name: str
    arguments: str = "{}"


class ChatMessage(LazyModel):
    """One committed transcript row, in the shape `history --json` prints (contract).
    `system` is never stored: a model call sees the chat's summary in such a row."""

    role: Literal["user", "assistant", "tool", "system"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def public(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class ModelReply(LazyModel):
    """What a provider returns: a final text answer, or tool calls (possibly with text)."""

    text: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)

    @property
    def is_final(self) -> bool:
        return not self.tool_calls


class ToolSpec(LazyModel):
    """A tool as the model sees it."""

    name: str
    description: str
    parameters: dict[str, Any]
    effect: EffectClass = EffectClass.WRITE


# --- the turn's state (query `state`, contract) -----------------------------------


class ToolCallView(LazyModel):
    id: str
    name: str
    status: ToolCallStatus


class ApprovalRequest(LazyModel):
    """A tool call waiting for the user's approval (`approval_required`), as `state` lists it."""

    id: str
    name: str
    arguments: str
    idempotency_key: str
    """`<chat_id>/<turn>/<tool call id>`, the key the tool gets when it runs."""


class TurnState(LazyModel):
    chat_id: str
    turn: int = 0
    status: TurnStatus = TurnStatus.RUNNING
    reason: Reason | None = None
    recovery_id: str | None = None
    can_continue: bool = True
    attempts: int = 0
    pending_followups: list[str] = Field(default_factory=list)
    tool_calls: list[ToolCallView] = Field(default_factory=list)
    detail: str | None = None
    """Why the gate opened, in the words of what failed (a provider's error, a bad row)."""
    store_unavailable: bool = False
    """The session store does not answer: the turn waits and goes on when it returns."""
    approvals: list[ApprovalRequest] = Field(default_factory=list)
    """With `approval_required`: the calls that run once the user approves (Continue)."""
    decisions: list[DecisionRecord] = Field(default_factory=list)
    """The latest decisions that carried a `request_id`, oldest first."""
    subagents: list[SubagentView] = Field(default_factory=list)
    """The subagents this turn delegated to, in the order it started them."""
    delegated_by: str | None = None
    """In a sub-chat: the chat whose turn delegated this one."""


class CarryOn(LazyModel):
    """A running turn handed on to a fresh run between two steps (continue-as-new),
    so that no run's history grows too long to replay: the turn as it stood, and
    the step it takes next."""

    state: TurnState
    step: int


# --- event log (contract: the store's per-chat ordered log) ------------------------

EventType = Literal[
    "turn_started",
    "user_message",
    "message_rejected",
    "assistant_message",
    "tool_started",
    "tool_finished",
    "tool_interrupted",
    "recovery_state",
    "session_updated",
    "recovery_action_rejected",
    "turn_end",
]


class Event(LazyModel):
    chat_id: str
    seq: int
    type: str
    payload: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime


class NewEvent(LazyModel):
    """An event to append; the store assigns `seq` and the time."""

    type: EventType
    payload: dict[str, Any] = Field(default_factory=dict)


class TurnRecord(LazyModel):
    """A row of the store's turns table."""

    chat_id: str
    turn: int
    run_id: str | None = None
    status: TurnStatus
    reason: Reason | None = None
    recovery_id: str | None = None
    can_continue: bool = True
    attempts: int = 0
    started_at: datetime
    updated_at: datetime
