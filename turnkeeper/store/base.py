"""The session store interface: committed transcript, per-chat event log, turns.

Every write is idempotent (keyed by message id, (turn, step), tool call id or
idempotency key) because activities that call it may be retried; a retried
write never adds a row or an event twice. Each method is one transaction: the
rows and the events that announce them are written together or not at all.
"""

from __future__ import annotations

import contextlib
import contextvars
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from turnkeeper.models import (  # noqa: F401  (the texts are re-exported)
    INTERRUPTED_TOOL_TEXT,
    INTERRUPTED_TURN_TEXT,
    SUPERSEDED_TEXT,
    ChatMessage,
    Event,
    LazyModel,
    ModelReply,
    NewEvent,
    Reason,
    ToolCall,
    TurnRecord,
    TurnStatus,
    UserMessage,
)

_INLINE = contextvars.ContextVar("turnkeeper_store_inline", default=False)


@contextlib.contextmanager
def inline_calls() -> Iterator[None]:
    """Store calls made in here (and in tasks started in here) may run on the event
    loop where the backend can do so without waiting on a lock or a disk sync
    (SQLite: see sqlite.py). The model and tool activities use it; the web
    process and the CLI keep to the store's thread."""
    token = _INLINE.set(True)
    try:
        yield
    finally:
        _INLINE.reset(token)


def inline_allowed() -> bool:
    return _INLINE.get()


class StoreError(RuntimeError):
    """The store cannot serve the request (bad rows, unreachable database)."""


class StoreUnavailable(StoreError):
    """The store does not answer now (locked, read-only, unreachable, its file gone);
    the same call may work later. Turns wait for it instead of failing."""


class CorruptRowError(StoreError):
    """A stored row does not decode; the message names the chat and the row."""


class BeginTurn(LazyModel):
    turn: int | None = None
    """The new turn's number; None when every message was already committed (no turn)."""
    duplicate_ids: list[str] = Field(default_factory=list)
    """Message ids among those offered that the chat already holds."""
    closed_turn: int | None = None
    """An earlier turn that was still open and has now been closed as superseded."""


class TurnUpdate(LazyModel):
    """A turn's new status; written with `recovery_state` + `session_updated` events."""

    status: TurnStatus
    reason: Reason | None = None
    recovery_id: str | None = None
    can_continue: bool = True
    attempts: int = 0
    detail: str | None = None
    """Why the gate opened, announced in `recovery_state` (not stored in the row)."""


def recovery_state_payload(turn: int, update: TurnUpdate) -> dict[str, Any]:
    """The `recovery_state` event that announces `update`."""
    payload: dict[str, Any] = {
        "turn": turn,
        "status": update.status.value,
        "reason": update.reason.value if update.reason else None,
        "recovery_id": update.recovery_id,
        "can_continue": update.can_continue,
        "attempts": update.attempts,
    }
    if update.detail:
        payload["detail"] = update.detail
    return payload


def superseded(record: TurnRecord) -> TurnUpdate:
    """The ending of a turn a newer message closed: its recovery fields kept."""
    return TurnUpdate(
        status=TurnStatus.RECOVERED,
        reason=Reason.SUPERSEDED,
        recovery_id=record.recovery_id,
        can_continue=record.can_continue,
        attempts=record.attempts,
    )


class Draft(LazyModel):
    """The text a model call has streamed so far (`attempt` counts the calls of
    that step; a client shows the newest one's text)."""

    chat_id: str
    turn: int
    step: int
    attempt: int
    text: str
    version: int
    recorded: bool = False
    """The step's reply is in the transcript: nothing to show."""


class Summary(LazyModel):
    """What the model made of a chat's older rows: it stands in for every message row
    with id <= `upto_id` in what later model calls see. Made once, kept like any row;
    the transcript itself is never shortened."""

    upto_id: int
    text: str
    tokens: int
    """Its size as the context counts it (bytes / 4)."""
    assistant_rows: int
    """Assistant rows among those it covers: model calls go on numbering from there."""


class StoredRow(LazyModel):
    """A transcript row with its place: `id` orders the transcript, `turn` groups it."""

    id: int
    turn: int
    message: ChatMessage


class TranscriptRow(StoredRow):
    """A transcript row with the keys it was written under, for readers that check
    the store itself (the chaos harness's checker)."""

    message_id: str | None = None
    """A user row's message id (the client's idempotency key)."""
    step: int | None = None
    """An assistant row's model call; None for a closing row (superseded, stopped, ...)."""


class ContextRows(LazyModel):
    """What a model call loads: the latest summary and the rows after it, read together."""

    summary: Summary | None = None
    rows: list[StoredRow] = Field(default_factory=list)


@dataclass(frozen=True)
class PreparedCall:
    """`SessionStore.prepare_model_call`: the ids it committed and the context it read."""

    committed: list[str]
    context: ContextRows | CorruptRowError


class TurnRef(LazyModel):
    """An open turn as the reconciler lists it."""

    chat_id: str
    turn: int
    run_id: str | None = None


class SessionStore(ABC):
    """Implementations: `SQLiteStore` (default), `PostgresStore` (several machines)."""

    @abstractmethod
    async def open(self) -> None:
        """Connect and create or migrate the schema. Safe to call more than once."""

    @abstractmethod
    async def close(self) -> None: ...

    # -- turns ---------------------------------------------------------------
    @abstractmethod
    async def begin_turn(self, chat_id: str, run_id: str, message_ids: list[str]) -> BeginTurn:
        """Open the chat's next turn for the run `run_id`.

        In one transaction:
        1. `duplicate_ids` = those of `message_ids` the chat already holds. If no
           id is left, return `BeginTurn(turn=None, duplicate_ids=...)` and write nothing.
        2. If an earlier turn of the chat is still open (running, awaiting_user,
           resuming) or its recovery failed (failed): give each of its assistant
           tool calls without a tool row an interrupted tool row
           (`INTERRUPTED_TOOL_TEXT`, event `tool_interrupted`), append one
           assistant row `SUPERSEDED_TEXT`, set that turn to recovered/superseded
           and append `recovery_state`, `session_updated` (`{"scope": "thread"}`)
           and `turn_end` (turn, status, reason). Report it as `closed_turn`.
        3. Insert turn max+1 as running with `run_id`; event `turn_started`.
        Idempotent: a turn already opened by the same `run_id` is returned as is.
        """

    @abstractmethod
    async def turn_of_run(self, chat_id: str, run_id: str) -> int | None:
        """The turn that the run `run_id` began, if any (a read)."""

    @abstractmethod
    async def update_turn(self, chat_id: str, turn: int, update: TurnUpdate) -> None:
        """Persist a status change, then announce it: `recovery_state` (status,
        reason, recovery_id, can_continue, attempts, turn) and `session_updated`
        (`{"scope": "thread"}`) in the same transaction. No-op (no events) when the
        row already holds exactly this state."""

    @abstractmethod
    async def get_turn(self, chat_id: str, turn: int | None = None) -> TurnRecord | None:
        """One turn row; the chat's latest when `turn` is None."""

    @abstractmethod
    async def open_turns(self, limit: int = 1000) -> list[TurnRecord]:
        """Turns whose status is running, awaiting_user or resuming (indexed)."""

    @abstractmethod
    async def open_turn_refs(self, limit: int = 1000) -> list[TurnRef]:
        """As `open_turns`, but only the keys and run id, oldest update first, and
        without decoding the rest of the row: one corrupt turn row does not keep
        the reconciler from every other chat."""

    @abstractmethod
    async def held_message_ids(self, chat_id: str, message_ids: list[str]) -> list[str]:
        """Those of `message_ids` the chat holds as user rows, in the order offered."""

    @abstractmethod
    async def list_chats(self, status: TurnStatus | None = None, limit: int = 1000) -> list[TurnRecord]:
        """The latest turn of each chat, newest first, optionally by status."""

    # -- transcript ------------------------------------------------------------
    @abstractmethod
    async def commit_user_messages(self, chat_id: str, turn: int, messages: list[UserMessage]) -> list[str]:
        """Append user rows in order, skipping ids the chat already holds; one
        `user_message` event (turn, message_id, text, sender) per new row.
        Returns the ids committed by this call."""

    @abstractmethod
    async def record_assistant(
        self, chat_id: str, turn: int, step: int, reply: ModelReply, final: bool
    ) -> None:
        """Write the assistant row of model call `step` (0-based within the turn),
        replacing one already written for the same (turn, step) — a model call
        re-run after an interruption supersedes the lost one. Event
        `assistant_message` (turn, step, text, tool_calls). With `final`, close the
        turn as completed and append `turn_end` (turn, status) in the same
        transaction."""

    @abstractmethod
    async def tool_started(self, chat_id: str, turn: int, call: ToolCall, idempotency_key: str) -> bool:
        """Record that a tool call is about to act (event `tool_started`), durably:
        synced to disk before it returns. Returns False when the key was recorded
        before: the call has run already."""

    @abstractmethod
    async def record_tool_result(
        self, chat_id: str, turn: int, tool_call_id: str, name: str, content: str, status: str
    ) -> bool:
        """Append the tool row answering `tool_call_id` unless one exists; event
        `tool_finished` (status done/error) or `tool_interrupted` (status
        interrupted). Returns whether a row was written."""

    @abstractmethod
    async def finish_turn(
        self,
        chat_id: str,
        turn: int,
        update: TurnUpdate,
        closing_text: str | None = None,
        only_from: frozenset[TurnStatus] | None = None,
    ) -> bool:
        """Close a turn with a terminal status: optionally append an assistant row
        `closing_text`, then as `update_turn`, then `turn_end`. With `only_from`,
        a turn whose status is not in it is left as it is and False returned: a
        caller that read the status earlier cannot overwrite a newer ending."""

    @abstractmethod
    async def close_unanswered_calls(self, chat_id: str, turn: int) -> list[str]:
        """Give every tool call of the turn that has no tool row an interrupted one
        (`INTERRUPTED_TOOL_TEXT`, event `tool_interrupted`), so the transcript stays
        balanced after a lost model call. Returns the call ids answered."""

    @abstractmethod
    async def adopt_turn(self, chat_id: str, turn: int, run_id: str) -> int:
        """A recovery run takes the turn over: record its run id (the reconciler
        examines that run from now on) and return the next free model-call step."""

    @abstractmethod
    async def turn_messages(self, chat_id: str, turn: int) -> list[ChatMessage]:
        """The transcript rows of one turn, in order; `CorruptRowError` as `history`."""

    @abstractmethod
    async def history(self, chat_id: str) -> list[ChatMessage]:
        """The committed transcript in order. Raises `CorruptRowError` naming the
        row when one does not decode."""

    @abstractmethod
    async def transcript_rows(self, chat_id: str) -> list[TranscriptRow]:
        """As `history`, each row with its id, turn, message id and step: what a
        check of the store (each acknowledged message one user row, in order)
        needs and a model call does not."""

    # -- drafts: the answer as it streams ------------------------------------------
    @abstractmethod
    async def write_draft(
        self, chat_id: str, turn: int, step: int, text: str, attempt: int | None = None
    ) -> int:
        """Set the chat's draft to `text` for model call `step` and return its
        attempt. `attempt=None` starts one: 1, or one more than the draft already
        there for the same (turn, step) (a call that was lost, or retried, even
        after it recorded its reply: `record_assistant` keeps the row). Never
        durable: a draft that a crash takes with it is streamed again."""

    @abstractmethod
    async def drafts_since(self, version: int, limit: int = 1000) -> list[Draft]:
        """Drafts written after `version`, oldest write first."""

    @abstractmethod
    async def draft(self, chat_id: str) -> Draft | None:
        """The chat's draft while its turn is open and its step's reply is not
        recorded, else None."""

    @abstractmethod
    async def draft_version(self) -> int:
        """The newest draft write's version (0 before any)."""

    async def listen(self, on_change: Callable[[str, str], None]) -> Callable[[], Awaitable[None]] | None:
        """Push: `on_change(kind, chat_id)` as writes commit, from any process
        ("events": the chat's log grew; "drafts": its draft changed; "lost", ""
        once the notifications stop). Returns how to stop, or None where the
        backend has no push (SQLite: readers poll)."""
        return None

    # -- what a model call sees --------------------------------------------------
    @abstractmethod
    async def prepare_model_call(
        self, chat_id: str, turn: int, messages: list[UserMessage], answer_lost_calls: bool = False
    ) -> PreparedCall:
        """What a model call writes and reads before it asks the model, in one
        transaction: `close_unanswered_calls` (with `answer_lost_calls`), then
        `commit_user_messages`, then `context_rows`. The writes stand even when a
        row cannot be read: the `CorruptRowError` is returned in `context`."""

    @abstractmethod
    async def context_rows(self, chat_id: str) -> ContextRows:
        """The chat's latest summary and the transcript rows after it, in order, in one
        snapshot (all rows when there is no summary): a model call reads this much
        whatever the chat's length. `CorruptRowError` as `history`."""

    @abstractmethod
    async def add_summary(self, chat_id: str, summary: Summary) -> Summary:
        """Keep a summary unless one covering the same rows exists; the one kept."""

    @abstractmethod
    async def answered_call_ids(self, chat_id: str, tool_call_ids: list[str]) -> list[str]:
        """Those of `tool_call_ids` the chat has a tool row for (indexed), in the order offered."""

    # -- events ----------------------------------------------------------------
    @abstractmethod
    async def append_events(
        self, chat_id: str, events: list[NewEvent], keys: list[str] | None = None
    ) -> None:
        """Append `events` in order. With `keys` (one per event), each once: an event
        whose key the chat has seen before is not added again."""

    @abstractmethod
    async def events(self, chat_id: str, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        """Events with seq > after_seq, in order."""

    @abstractmethod
    async def follow_from(self, chat_id: str, message_id: str | None = None) -> int:
        """Where a client starts following the turn that takes `message_id`: the seq
        just before the chat's `user_message` event for it if the chat holds the
        message already (a retry), else the chat's latest seq (0 for a new chat).
        Cheap however long the chat: clients call it before every message."""
