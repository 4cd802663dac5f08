"""How `turnkeeper` commands print: a turn's state, the transcript, events, chats."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from turnkeeper.statuses import Reason, TurnStatus

if TYPE_CHECKING:
    from turnkeeper.models import ChatMessage, Event, TurnState


def print_json(obj: Any) -> None:
    print(json.dumps(obj, ensure_ascii=False, default=str))


@contextlib.contextmanager
def quiet_if(quiet: bool) -> Iterator[None]:
    """With --json, what a command shows as it goes is left out: only its result is printed."""
    if not quiet:
        yield
        return
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield


async def print_turn_json(store: Any, chat_id: str) -> None:
    """The chat's latest turn as the store holds it (`status --json`'s shape)."""
    from turnkeeper.failed_turns import state_of

    record = await store.get_turn(chat_id)
    print_json(None if record is None else json.loads(state_of(record).model_dump_json()))


def describe_gate(state: TurnState) -> str:
    if not state.turn and state.status == TurnStatus.RUNNING:
        # A run started without a usable message (e.g. only refused ones) waits for one.
        return f"chat {state.chat_id}: no turn yet, waiting for its first message"
    lines = [
        f"chat {state.chat_id}, turn {state.turn}: {state.status.value}"
        + (f" ({state.reason.value})" if state.reason else "")
    ]
    if state.detail:
        lines.append(f"why: {state.detail}")
    if state.store_unavailable:
        lines.append(
            "the session store does not answer: the turn waits for it and goes on, in order, "
            "when it is back (see the worker's log)"
        )
    if state.status == TurnStatus.AWAITING_USER and state.reason == Reason.APPROVAL_REQUIRED:
        lines.append("the model asks to run, once you approve:")
        lines.extend(f"  {a.name} {a.arguments}   [key {a.idempotency_key}]" for a in state.approvals)
        lines.append(f"recovery id: {state.recovery_id}")
        lines.append(f"  turnkeeper continue {state.chat_id}   # approve: the calls above run, once")
        lines.append(f"  turnkeeper dismiss {state.chat_id}    # deny: none of them runs, and the turn ends")
    elif state.status in (TurnStatus.AWAITING_USER, TurnStatus.FAILED):
        lines.append(f"recovery id: {state.recovery_id}")
        if state.can_continue:
            lines.append(
                f"  turnkeeper continue {state.chat_id}   # run the model again from the saved "
                "context; interrupted tools are not run again"
            )
        else:
            lines.append("  (continue is not possible: the saved context is unavailable)")
        lines.append(f"  turnkeeper dismiss {state.chat_id}    # close the turn and keep what is known")
    return "\n".join(lines)


def event_line(ev: Event) -> str:
    return json.dumps(
        {"seq": ev.seq, "type": ev.type, "payload": ev.payload, "created_at": ev.created_at.isoformat()},
        ensure_ascii=False,
    )


def event_text(ev: Event) -> str:
    return f"{ev.seq:>5} {ev.created_at:%H:%M:%S} {ev.type:<24} {json.dumps(ev.payload, ensure_ascii=False)}"


def transcript_line(m: ChatMessage) -> str:
    if m.role == "tool":
        return f"[tool {m.name}] {m.content}"
    if m.tool_calls:
        calls = ", ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
        lead = f"{m.content} " if m.content else ""
        return f"[assistant] {lead}-> {calls}"
    return f"[{m.role}] {m.content}"


def chat_row(r: dict[str, Any]) -> str:
    return f"{r['chat_id']:<24} {r['status'] or '-':<14} {r['reason'] or '':<32} {r['started']}"
