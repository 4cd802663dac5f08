"""Signal payloads as any Temporal client may send them: read raw, so a payload
the converter cannot decode is refused in words instead of dropped. Pure; used
by `ChatTurn` as it takes its inputs."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError


class Undecodable(Exception):
    """A signal payload the data converter cannot read (unknown encoding, not JSON)."""


def decode_payload(payload: RawValue | None) -> Any:
    if payload is None:
        return None
    try:
        return workflow.payload_converter().from_payload(payload.payload)
    except ValidationError as err:  # the JSON itself is broken
        raise Undecodable(f"not JSON ({err.errors()[0].get('msg')})") from None
    except Exception as err:
        raise Undecodable(err.args[0] if isinstance(err, KeyError) and err.args else str(err)) from None


def readable(payload: RawValue | None) -> bool:
    try:
        decode_payload(payload)
    except Undecodable:
        return False
    return True


def message_id_of(raw: Any) -> str | None:
    """The client's message id of a payload that failed validation, if it is a valid one."""
    candidate = raw.get("message_id") if isinstance(raw, dict) else None
    return candidate if isinstance(candidate, str) and 0 < len(candidate) <= 200 else None


def first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "payload"
    return f"{where}: {first.get('msg')}"
