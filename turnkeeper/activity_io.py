"""Activity names and their inputs and outputs: the seam between workflow and world.

Names are explicit and stable: they are written into every workflow history, so
renaming one breaks the replay of turns already running.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from turnkeeper.models import (
    ModelReply,
    NewEvent,
    Reason,
    SubagentLink,
    ToolCall,
    TurnState,
    TurnStatus,
    UserMessage,
)

BEGIN_TURN = "turnkeeper.begin_turn"
ADOPT_TURN = "turnkeeper.adopt_turn"
HELD_MESSAGES = "turnkeeper.held_messages"
MODEL_CALL = "turnkeeper.model_call"
TOOL_CALL = "turnkeeper.tool_call"
RECORD_TOOL_RESULT = "turnkeeper.record_tool_result"
UPDATE_TURN = "turnkeeper.update_turn"
FINISH_TURN = "turnkeeper.finish_turn"
APPEND_EVENTS = "turnkeeper.append_events"
COMMIT_MESSAGES = "turnkeeper.commit_messages"
RECORD_ASSISTANT = "turnkeeper.record_assistant"
SUBAGENT_START = "turnkeeper.subagent_start"
SUBAGENT_RESULT = "turnkeeper.subagent_result"
REPORT_TO_PARENT = "turnkeeper.report_to_parent"

# Raised by the model activity when its worker is shutting down: nothing happened
# outside, so the workflow schedules the call again for the next worker.
WORKER_SHUTDOWN_ERROR = "WorkerShutdown"
# A provider failure that its own retries could not fix.
MODEL_FAILED_ERROR = "ModelFailed"
# The chat's stored transcript has a row that does not decode: no model call can
# be made from it until the row is repaired, so Continue is not offered.
CHECKPOINT_INVALID_ERROR = "CheckpointInvalid"
# The session store does not answer (locked, read-only, unreachable, its file
# gone). Raised before anything happened outside: the workflow waits and tries again.
STORE_UNAVAILABLE_ERROR = "StoreUnavailable"


class SubagentLimits(BaseModel):
    max_depth: int = 2
    """How deep subagents may nest: 1 lets a chat's turn delegate, its subagents not."""
    max_fanout: int = 4
    """Delegate calls one model reply may make; the rest are refused in words."""
    profiles: list[str] = Field(default_factory=list)
    """The configured profiles' names (their instructions, model and tools stay with the worker)."""


class TurnSettings(BaseModel):
    """The worker's configuration as the turn's decisions need it. It reaches the
    workflow as an activity result, so it is recorded in history and replays
    deterministically. (How long a step may take is the worker's alone: its
    interceptor sets the step's timeouts, turnkeeper/step_timeouts.py.)"""

    max_message_bytes: int = 64 * 1024
    max_pending_bytes: int = 1024 * 1024
    confirm_tools: list[str] = Field(default_factory=list)
    """Tools whose calls wait for the user's approval before they are scheduled."""
    subagents: SubagentLimits | None = None
    """Set when the `delegate` tool is enabled."""


class BeginTurnInput(BaseModel):
    chat_id: str
    run_id: str
    message_ids: list[str]
    message_sizes: list[int] = Field(default_factory=list)
    """Text bytes of each message: those over the configured limit are refused."""
    only_existing: bool = False
    """Report the turn this run began, if any, and begin none."""


class BeginTurnResult(BaseModel):
    turn: int | None
    latest_turn: int = 0
    """The chat's latest turn, reported when no turn was opened (all duplicates)."""
    duplicate_ids: list[str] = Field(default_factory=list)
    closed_turn: int | None = None
    settings: TurnSettings
    oversized_ids: list[str] = Field(default_factory=list)
    """Messages over TURNKEEPER_MAX_MESSAGE_BYTES: refused, not part of the turn."""


class AdoptTurnInput(BaseModel):
    chat_id: str
    turn: int
    run_id: str


class AdoptTurnResult(BaseModel):
    next_step: int
    settings: TurnSettings


class ModelCallInput(BaseModel):
    chat_id: str
    turn: int
    step: int
    new_messages: list[UserMessage] = Field(default_factory=list)
    """User rows to commit before the call: the turn's message(s) or follow-ups."""
    closes_turn: bool = True
    """A final answer closes the turn as completed in the same store write; a
    resumed turn is closed by the workflow instead (recovered/continued)."""
    answer_lost_calls: bool = False
    """The step before was lost: first give any tool call it may have written an
    interrupted result, so the model sees a balanced transcript."""
    begins_turn: bool = False
    """The run's first call: number the turn first (as `begin_turn`, by the run's id),
    refusing messages over the configured limit and leaving out those the chat holds."""
    subagent: SubagentLink | None = None
    """A subagent's call: its profile's instructions and tools apply, and `delegate`
    only below the depth limit."""


class ModelCallResult(BaseModel):
    reply: ModelReply | None
    """None only when `begins_turn` found no message to take (`began.turn` is None)."""
    began: BeginTurnResult | None = None
    committed_ids: list[str] = Field(default_factory=list)
    recorded: bool = True
    """False: the store failed after the provider answered; the workflow records the reply."""


class ToolCallInput(BaseModel):
    chat_id: str
    turn: int
    call: ToolCall
    approved: bool = False
    """The user approved this call at its gate; a tool that asks first runs only then."""
    subagent: SubagentLink | None = None
    """A subagent's call: only its profile's tools (never more than the worker enables) run."""

    @property
    def idempotency_key(self) -> str:
        return f"{self.chat_id}/{self.turn}/{self.call.id}"


class ToolCallResult(BaseModel):
    tool_call_id: str
    name: str
    status: str  # done | error
    content: str
    recorded: bool = True
    """False: the store failed after the tool acted; the workflow records the result."""


class RecordToolResultInput(BaseModel):
    chat_id: str
    turn: int
    tool_call_id: str
    name: str
    content: str
    status: str


class UpdateTurnInput(BaseModel):
    chat_id: str
    turn: int
    status: TurnStatus
    reason: Reason | None = None
    recovery_id: str | None = None
    can_continue: bool = True
    attempts: int = 0
    detail: str | None = None
    """Why the gate opened, for the `recovery_state` event."""
    closing_text: str | None = None
    """With FINISH_TURN: an assistant row that closes the turn (interruption notice)."""
    commit_messages: list[UserMessage] = Field(default_factory=list)
    """With FINISH_TURN: follow-ups to commit as user rows without model work."""

    @classmethod
    def of(cls, s: TurnState) -> UpdateTurnInput:
        """The turn row as the workflow's state has it."""
        fields = ("chat_id", "turn", "status", "reason", "recovery_id", "can_continue", "attempts", "detail")
        return cls(**{name: getattr(s, name) for name in fields})


class TurnWriteResult(BaseModel):
    """The turn row after a write. A turn the store has already ended keeps its
    ending (a persisted completion wins): the workflow then follows the store."""

    status: TurnStatus
    reason: Reason | None = None
    written: bool = True


class HeldMessagesInput(BaseModel):
    chat_id: str
    message_ids: list[str]


class HeldMessagesResult(BaseModel):
    """Which of the asked messages the store holds, and which were asked: a result
    recorded in a history can answer another question than its replay asks (a
    `state` query's replay ran the check before a later message came, and the
    worker kept its answer). Earlier releases recorded the held ids alone."""

    asked: list[str]
    held: list[str]


class AppendEventsInput(BaseModel):
    chat_id: str
    events: list[NewEvent]
    keys: list[str] | None = None
    """One per event, `<run id>/<n>`: a retried workflow task appends each once."""


class CommitMessagesInput(BaseModel):
    """A chunk of user rows committed ahead of a model call (a large batch)."""

    chat_id: str
    turn: int
    messages: list[UserMessage]
    answer_lost_calls: bool = False
    """As `ModelCallInput.answer_lost_calls`: tool rows first, so the transcript stays balanced."""


class RecordAssistantInput(BaseModel):
    chat_id: str
    turn: int
    step: int
    reply: ModelReply
    final: bool


class SubagentStartInput(BaseModel):
    """Records the parent's `delegate` call as started (`tool_started`) before its
    child workflow starts: the store tells a delegation that may have begun."""

    chat_id: str
    turn: int
    call: ToolCall

    @property
    def idempotency_key(self) -> str:
        return f"{self.chat_id}/{self.turn}/{self.call.id}"


class SubagentResultInput(BaseModel):
    """Records the parent's `delegate` call's result from the sub-chat's transcript:
    the subagent's final answer, or what ended its turn otherwise."""

    chat_id: str
    turn: int
    call: ToolCall
    sub_chat_id: str
    sub_turn: int
    sub_status: TurnStatus
    sub_reason: Reason | None = None
    background: bool = False
    """The child goes on by itself: the result says where its answer will arrive."""


class ReportToParentInput(BaseModel):
    """A background subagent's answer, sent to its parent's chat as a message."""

    sub_chat_id: str
    sub_turn: int
    sub_status: TurnStatus
    sub_reason: Reason | None = None
    parent: SubagentLink
