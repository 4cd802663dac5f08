"""The plain views of what the CLI's short commands read: a turn's state (the
worker's `state` answer, the store's turn row), the transcript and the event
log, decoded without pydantic.

Importing pydantic and the models takes longer than `turnkeeper status` may
take in all. So `status`, `history` and `events` decode what they read into
the views below, which have the models' attributes (all that
turnkeeper.cli.output uses). The views decode strictly: anything the models
would read otherwise (a value they would coerce, a field unknown here, a row
that does not decode) is never guessed at: the decoders raise `NotPlain`, and
the command reads it the models' way instead, so that it prints the same
either way. tests/unit/test_cli_reads.py keeps the views in step with the
models. turnkeeper.cli_reads reads the SQLite file into them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from turnkeeper.statuses import Reason, ToolCallStatus, TurnStatus

if TYPE_CHECKING:
    import sqlite3

    from turnkeeper.models import TurnState


class NotPlain(ValueError):
    """Something the views do not decode exactly as the models would: read it the models' way."""


# --- strict decoding: JSON and SQLite values of exactly the type the model declares ---


def _str(value: Any) -> str:
    if type(value) is not str:
        raise NotPlain(f"not a string: {value!r}")
    return value


def _opt_str(value: Any) -> str | None:
    return None if value is None else _str(value)


def _int(value: Any) -> int:
    if type(value) is not int:  # a bool is an int too; the models would read it otherwise
        raise NotPlain(f"not an int: {value!r}")
    return value


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise NotPlain(f"not a bool: {value!r}")
    return value


def _enum(kind: type[TurnStatus] | type[Reason] | type[ToolCallStatus], value: Any) -> Any:
    try:
        return kind(_str(value))
    except ValueError:
        raise NotPlain(f"not a {kind.__name__}: {value!r}") from None


def _opt_enum(kind: type[Reason], value: Any) -> Reason | None:
    return None if value is None else _enum(kind, value)


def _object(value: Any, required: tuple[str, ...], fields: tuple[str, ...]) -> dict[str, Any]:
    """A JSON object with the `required` keys and no key outside `fields` (the models
    would drop an unknown one: a sign of another version, read the models' way)."""
    if type(value) is not dict or not set(required) <= value.keys() <= set(fields):
        raise NotPlain(f"not an object of {fields}: {value!r}")
    return value


def _list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise NotPlain(f"not a list: {value!r}")
    return value


# The store writes its times as `datetime.isoformat(timespec="microseconds")` in UTC;
# anything else is left to the models' parser.
_STORE_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00")


def _store_time(value: Any) -> datetime:
    if type(value) is not str or not _STORE_TIME.fullmatch(value):
        raise NotPlain(f"not a store time: {value!r}")
    try:
        return datetime.fromisoformat(value)
    except ValueError:  # e.g. month 13
        raise NotPlain(f"not a store time: {value!r}") from None


# --- a turn's state (TurnState) ------------------------------------------------------
# The views are printed, never compared nor shown: without the __repr__ and __eq__
# a dataclass compiles at import, the module loads faster.


@dataclass(repr=False, eq=False)
class ToolCallItem:
    """models.ToolCallView"""

    id: str
    name: str
    status: ToolCallStatus


@dataclass(repr=False, eq=False)
class ApprovalItem:
    """models.ApprovalRequest"""

    id: str
    name: str
    arguments: str
    idempotency_key: str


@dataclass(repr=False, eq=False)
class DecisionItem:
    """models.DecisionRecord"""

    request_id: str
    action: str
    refusal: str | None = None


@dataclass(repr=False, eq=False)
class StateView:
    """models.TurnState: the same fields, in the same order, with the same defaults."""

    chat_id: str
    turn: int = 0
    status: TurnStatus = TurnStatus.RUNNING
    reason: Reason | None = None
    recovery_id: str | None = None
    can_continue: bool = True
    attempts: int = 0
    pending_followups: list[str] = field(default_factory=list)
    tool_calls: list[ToolCallItem] = field(default_factory=list)
    detail: str | None = None
    store_unavailable: bool = False
    approvals: list[ApprovalItem] = field(default_factory=list)
    decisions: list[DecisionItem] = field(default_factory=list)

    def model_dump(self, *, mode: str) -> dict[str, Any]:
        """What `TurnState.model_dump(mode="json")` gives (the only mode asked for)."""
        if mode != "json":
            raise ValueError(f"only mode='json', not {mode!r}")
        return {
            "chat_id": self.chat_id,
            "turn": self.turn,
            "status": self.status.value,
            "reason": None if self.reason is None else self.reason.value,
            "recovery_id": self.recovery_id,
            "can_continue": self.can_continue,
            "attempts": self.attempts,
            "pending_followups": list(self.pending_followups),
            "tool_calls": [{"id": c.id, "name": c.name, "status": c.status.value} for c in self.tool_calls],
            "detail": self.detail,
            "store_unavailable": self.store_unavailable,
            "approvals": [
                {"id": a.id, "name": a.name, "arguments": a.arguments, "idempotency_key": a.idempotency_key}
                for a in self.approvals
            ],
            "decisions": [
                {"request_id": d.request_id, "action": d.action, "refusal": d.refusal} for d in self.decisions
            ],
        }


STATE_FIELDS = tuple(f.name for f in fields(StateView))
TOOL_CALL_VIEW_FIELDS = tuple(f.name for f in fields(ToolCallItem))
APPROVAL_FIELDS = tuple(f.name for f in fields(ApprovalItem))
DECISION_FIELDS = tuple(f.name for f in fields(DecisionItem))


def state_view(data: Any) -> StateView:
    """The worker's `state` answer (its JSON, decoded), or NotPlain."""
    data = _object(data, ("chat_id",), STATE_FIELDS)
    calls = [
        _object(c, TOOL_CALL_VIEW_FIELDS, TOOL_CALL_VIEW_FIELDS) for c in _list(data.get("tool_calls", []))
    ]
    approvals = [_object(a, APPROVAL_FIELDS, APPROVAL_FIELDS) for a in _list(data.get("approvals", []))]
    decisions = [
        _object(d, ("request_id", "action"), DECISION_FIELDS) for d in _list(data.get("decisions", []))
    ]
    return StateView(
        chat_id=_str(data["chat_id"]),
        turn=_int(data.get("turn", 0)),
        status=_enum(TurnStatus, data.get("status", TurnStatus.RUNNING.value)),
        reason=_opt_enum(Reason, data.get("reason")),
        recovery_id=_opt_str(data.get("recovery_id")),
        can_continue=_bool(data.get("can_continue", True)),
        attempts=_int(data.get("attempts", 0)),
        pending_followups=[_str(m) for m in _list(data.get("pending_followups", []))],
        tool_calls=[
            ToolCallItem(id=_str(c["id"]), name=_str(c["name"]), status=_enum(ToolCallStatus, c["status"]))
            for c in calls
        ],
        detail=_opt_str(data.get("detail")),
        store_unavailable=_bool(data.get("store_unavailable", False)),
        approvals=[
            ApprovalItem(
                id=_str(a["id"]),
                name=_str(a["name"]),
                arguments=_str(a["arguments"]),
                idempotency_key=_str(a["idempotency_key"]),
            )
            for a in approvals
        ],
        decisions=[
            DecisionItem(
                request_id=_str(d["request_id"]), action=_str(d["action"]), refusal=_opt_str(d.get("refusal"))
            )
            for d in decisions
        ],
    )


def turn_state(data: Any) -> StateView | TurnState:
    """The worker's `state` answer as the CLI prints it: a view, or the model when
    the view would not read it as the model does."""
    try:
        return state_view(data)
    except NotPlain:
        from turnkeeper.models import TurnState

        return TurnState.model_validate(data)


def turn_row_state(row: sqlite3.Row) -> StateView:
    """A row of the store's `turns` table as failed_turns.state_of shows it, or
    NotPlain: every column is checked as models.TurnRecord checks it."""
    can_continue = row["can_continue"]
    if type(can_continue) is not int or can_continue not in (0, 1):  # SQLite's booleans
        raise NotPlain(f"not a stored boolean: {can_continue!r}")
    _opt_str(row["run_id"])
    _store_time(row["started_at"])
    _store_time(row["updated_at"])
    return StateView(
        chat_id=_str(row["chat_id"]),
        turn=_int(row["turn"]),
        status=_enum(TurnStatus, row["status"]),
        reason=_opt_enum(Reason, row["reason"]),
        recovery_id=_opt_str(row["recovery_id"]),
        can_continue=bool(can_continue),
        attempts=_int(row["attempts"]),
    )


# --- the transcript (ChatMessage) and the event log (Event) ---------------------------

MESSAGE_FIELDS = ("role", "content", "tool_calls", "tool_call_id", "name")
TOOL_CALL_FIELDS = ("id", "name", "arguments")
ROLES = ("user", "assistant", "tool", "system")


@dataclass(repr=False, eq=False)
class CallItem:
    """models.ToolCall"""

    id: str
    name: str
    arguments: str = "{}"


@dataclass(repr=False, eq=False)
class MessageView:
    """models.ChatMessage"""

    role: str
    content: str | None = None
    tool_calls: list[CallItem] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def public(self) -> dict[str, Any]:
        """ChatMessage.public(): the fields in order, those that are None left out."""
        shown: dict[str, Any] = {"role": self.role}
        if self.content is not None:
            shown["content"] = self.content
        if self.tool_calls is not None:
            shown["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            shown["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            shown["name"] = self.name
        return shown


def message_view(body: Any) -> MessageView:
    """A `messages` row's body (JSON text), or NotPlain."""
    text = _str(body)
    try:
        data = json.loads(text)
    except ValueError:
        raise NotPlain("the body is not JSON") from None
    data = _object(data, ("role",), MESSAGE_FIELDS)
    role = _str(data["role"])
    if role not in ROLES:
        raise NotPlain(f"not a role: {role!r}")
    calls = data.get("tool_calls")
    return MessageView(
        role=role,
        content=_opt_str(data.get("content")),
        tool_calls=None
        if calls is None
        else [
            CallItem(id=_str(c["id"]), name=_str(c["name"]), arguments=_str(c.get("arguments", "{}")))
            for c in (_object(c, ("id", "name"), TOOL_CALL_FIELDS) for c in _list(calls))
        ],
        tool_call_id=_opt_str(data.get("tool_call_id")),
        name=_opt_str(data.get("name")),
    )


@dataclass(repr=False, eq=False)
class EventView:
    """models.Event"""

    chat_id: str
    seq: int
    type: str
    payload: dict[str, Any]
    created_at: datetime


def event_view(row: sqlite3.Row) -> EventView:
    """An `events` row, or NotPlain (the store shows a row that does not decode as a
    `corrupt_event`: its way)."""
    text = _str(row["payload"])
    try:
        payload = json.loads(text)
    except ValueError:
        raise NotPlain("the payload is not JSON") from None
    if type(payload) is not dict:
        raise NotPlain("the payload is not an object")
    return EventView(
        chat_id=_str(row["chat_id"]),
        seq=_int(row["seq"]),
        type=_str(row["type"]),
        payload=payload,
        created_at=_store_time(row["created_at"]),
    )
