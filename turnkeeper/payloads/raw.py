"""Signal payloads as any Temporal client may send them: read raw, so a payload
the converter cannot decode is refused in words instead of dropped. Pure; used
by `ChatTurn` as it takes its inputs."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from turnkeeper.models import RecoveryAction, StopRequest, SubagentView, UserMessage


class Undecodable(Exception):
    """A signal payload the data converter cannot read (unknown encoding, not JSON)."""


class Malformed(Exception):
    """A payload that is not the signal's model: why, and the client's message id if readable."""

    def __init__(self, why: str, message_id: str | None = None) -> None:
        super().__init__(why)
        self.message_id = message_id


def decode_payload(payload: RawValue | None) -> Any:
    if payload is None:
        return None
    try:
        return workflow.payload_converter().from_payload(payload.payload)
    except ValidationError as err:  # the JSON itself is broken
        raise Undecodable(f"not JSON ({err.errors()[0].get('msg')})") from None
    except Exception as err:
        raise Undecodable(err.args[0] if isinstance(err, KeyError) and err.args else str(err)) from None


def message_id_of(raw: Any) -> str | None:
    """The client's message id of a payload that failed validation, if it is a valid one."""
    candidate = raw.get("message_id") if isinstance(raw, dict) else None
    return candidate if isinstance(candidate, str) and 0 < len(candidate) <= 200 else None


def first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "payload"
    return f"{where}: {first.get('msg')}"


def read_message(payload: RawValue | None) -> UserMessage:
    try:
        raw = decode_payload(payload)
    except Undecodable as err:
        raise Malformed(str(err)) from None
    try:
        return UserMessage.model_validate(raw)
    except ValidationError as err:
        # The id, when readable, so a client following its own message sees the refusal.
        raise Malformed(first_error(err), message_id_of(raw)) from None


def read_news(payload: RawValue | None) -> SubagentView:
    """A waiting subagent's news of its gate (the `subagent` signal)."""
    try:
        return SubagentView.model_validate(decode_payload(payload))
    except (Undecodable, ValidationError) as err:
        raise Malformed(str(err)) from None


def read_decision(action: str, payload: RawValue | None) -> tuple[str | None, str | None, bool]:
    """A decision's request id and recovery id, and whether it is well formed. A
    malformed one keeps a readable request id, so that it is answered too; Stop
    needs no argument, so whatever it carries is well formed."""
    request_id: str | None = None
    recovery_id: str | None = None
    try:
        raw = decode_payload(payload)
        candidate = raw.get("request_id") if isinstance(raw, dict) else None
        if isinstance(candidate, str) and 0 < len(candidate) <= 200:
            request_id = candidate
        if action == "stop":
            request_id = StopRequest.model_validate(raw if isinstance(raw, dict) else {}).request_id
        else:
            parsed = RecoveryAction.model_validate(raw)
            request_id, recovery_id = parsed.request_id, parsed.recovery_id
    except (Undecodable, ValidationError):
        return request_id, recovery_id, action == "stop"
    return request_id, recovery_id, True
