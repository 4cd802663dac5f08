"""How store rows are written and read back, the same for SQLite and PostgreSQL:
bodies and payloads are compact JSON text, enums their values, and a row that
does not decode raises `CorruptRowError` naming the row, never a bare
ValidationError from deep inside a turn."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import ValidationError

from turnkeeper.models import ChatMessage, Event, Reason, ToolCall, TurnRecord, TurnStatus
from turnkeeper.store.base import CorruptRowError, Draft, StoredRow, Summary, TranscriptRow

TOOL_RESULT_STATUSES = frozenset({"done", "error", "interrupted"})

_TURN_COLUMNS = (
    "chat_id",
    "turn",
    "run_id",
    "status",
    "reason",
    "recovery_id",
    "can_continue",
    "attempts",
    "started_at",
    "updated_at",
)


class Row(Protocol):
    """`sqlite3.Row` and `asyncpg.Record` alike: columns by name or position."""

    def __getitem__(self, key: str | int, /) -> Any: ...


def json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def message_body(message: ChatMessage) -> str:
    return message.model_dump_json(exclude_none=True)


def enum_value(enum: TurnStatus | Reason | None) -> str | None:
    return None if enum is None else enum.value


def decode_message(chat_id: str, row: Row) -> ChatMessage:
    try:
        return ChatMessage.model_validate(json.loads(row["body"]))
    except (TypeError, ValueError) as exc:  # JSONDecodeError and ValidationError are ValueErrors
        raise CorruptRowError(
            f"chat {chat_id!r}: message row id={row['id']} does not decode: {short_error(exc)}"
        ) from exc


def decode_stored_row(chat_id: str, row: Row) -> StoredRow:
    """A message row with its id and turn (columns id, turn, body)."""
    return StoredRow(id=int(row["id"]), turn=int(row["turn"]), message=decode_message(chat_id, row))


def decode_transcript_row(chat_id: str, row: Row) -> TranscriptRow:
    """A message row with its id, turn and keys (columns id, turn, message_id, step, body)."""
    return TranscriptRow(
        id=int(row["id"]),
        turn=int(row["turn"]),
        message_id=row["message_id"],
        step=row["step"],
        message=decode_message(chat_id, row),
    )


def decode_summary(chat_id: str, row: Row) -> Summary:
    try:
        return Summary(
            upto_id=row["upto_id"],
            text=row["text"],
            tokens=row["tokens"],
            assistant_rows=row["assistant_rows"],
        )
    except (TypeError, ValueError) as exc:
        raise CorruptRowError(
            f"chat {chat_id!r}: summary row upto_id={row['upto_id']} does not decode: {short_error(exc)}"
        ) from exc


def tool_calls_of(chat_id: str, row: Row) -> list[ToolCall]:
    """The tool calls of an assistant row, or none if it does not decode: closing
    a turn must work whatever the store holds (Dismiss is always possible), and
    the calls of an unreadable row cannot be answered anyway."""
    try:
        return decode_message(chat_id, row).tool_calls or []
    except CorruptRowError:
        return []


def decode_turn(row: Row) -> TurnRecord:
    try:
        return TurnRecord.model_validate({k: row[k] for k in _TURN_COLUMNS})
    except ValidationError as exc:
        raise CorruptRowError(
            f"chat {row['chat_id']!r}: turn row turn={row['turn']} does not decode: {short_error(exc)}"
        ) from exc


CORRUPT_EVENT = "corrupt_event"


def decode_event(row: Row) -> Event:
    """One event row. A row that does not decode stands in the log as a
    `corrupt_event` naming the problem: one bad row never hides the rest."""
    try:
        return Event.model_validate(
            {
                "chat_id": row["chat_id"],
                "seq": row["seq"],
                "type": row["type"],
                "payload": json.loads(row["payload"]),
                "created_at": row["created_at"],
            }
        )
    except (TypeError, ValueError) as exc:
        error = f"chat {row['chat_id']!r}: event row seq={row['seq']} does not decode: {short_error(exc)}"
    try:
        created_at = Event.model_validate(
            {"chat_id": "", "seq": 0, "type": "", "created_at": row["created_at"]}
        ).created_at
    except (TypeError, ValueError):
        created_at = datetime.fromtimestamp(0, UTC)
    try:
        return Event(
            chat_id=str(row["chat_id"]),
            seq=int(row["seq"]),
            type=CORRUPT_EVENT,
            payload={"error": error, "type": str(row["type"])},
            created_at=created_at,
        )
    except (TypeError, ValueError) as exc:  # not even its seq reads: it cannot be placed
        raise CorruptRowError(error) from exc


def seq_before_message(rows: Iterable[Row], message_id: str) -> int | None:
    """The seq just before the first of these `user_message` event rows that names
    `message_id`; None if none does. A payload that does not decode names nothing."""
    for row in rows:
        try:
            payload = json.loads(row["payload"])
        except ValueError:
            continue
        if isinstance(payload, dict) and payload.get("message_id") == message_id:
            return int(row["seq"]) - 1
    return None


def short_error(exc: Exception) -> str:
    """The first validation error as `field: message`, or the exception's text."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        return f"{loc}: {first['msg']}" if loc else first["msg"]
    return str(exc)


def decode_draft(row: Row) -> Draft:
    return Draft(
        chat_id=str(row["chat_id"]),
        turn=int(row["turn"]),
        step=int(row["step"]),
        attempt=int(row["attempt"]),
        text=str(row["text"]),
        version=int(row["version"]),
        recorded=bool(row["recorded"]),
    )
