"""How `turnkeeper` commands print: a turn's state, the transcript, events, chats."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from turnkeeper.statuses import Reason, TurnStatus

if TYPE_CHECKING:
    from turnkeeper.models import ChatMessage, Event, SubagentView, TurnState


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
    elif state.status == TurnStatus.AWAITING_USER and state.reason == Reason.SUBAGENT_WAITING:
        lines.extend(_subagent_gate(state))
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


def _waiting_subagent(state: TurnState) -> SubagentView | None:
    """The subagent whose gate this turn shows: the one with the gate's recovery id."""
    gated = [v for v in state.subagents if v.status == TurnStatus.AWAITING_USER]
    return next((v for v in gated if v.recovery_id == state.recovery_id), None)


def _subagent_gate(state: TurnState) -> list[str]:
    """A subagent's gate, shown by the turn that waits for it: decided in this chat,
    which hands Continue and Dismiss on to the subagent (docs/subagents.md)."""
    chat, view = state.chat_id, _waiting_subagent(state)
    sub = view.chat_id if view else "the subagent"
    lines = [f"recovery id: {state.recovery_id} (the gate of subagent {sub}: decide it here, in chat {chat})"]
    if view is not None and view.reason == Reason.APPROVAL_REQUIRED:
        lines.append(f"  turnkeeper continue {chat}   # approve: the calls the subagent asks for run, once")
        lines.append(f"  turnkeeper dismiss {chat}    # deny them: this turn ends, its subagents with it")
    else:
        if state.can_continue:
            lines.append(
                f"  turnkeeper continue {chat}   # the subagent goes on from its saved context "
                "(interrupted tools are not run again); this turn waits for its answer"
            )
        else:
            lines.append("  (continue is not possible: the subagent's saved context is unavailable)")
        lines.append(
            f"  turnkeeper dismiss {chat}    # close this turn; its subagents are dismissed or stopped"
        )
    if view is not None:
        lines.append(f"  turnkeeper status {view.chat_id}   # the subagent's own turn and gate")
        lines.append(f"  turnkeeper history {view.chat_id}  # its transcript")
    return lines


def one_line(text: str) -> str:
    """Text a model wrote, on one line of a terminal: no line breaks, no control characters."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def describe_subagents(state: TurnState) -> list[str]:
    """The turn's subagents, one line each (sub-chat, mode, status[/reason], task),
    and how to read a sub-chat: it is a chat of its own."""
    views = state.subagents
    if not views:
        return []
    shown = [v.status.value + (f"/{v.reason.value}" if v.reason else "") for v in views]
    id_width = max(len(v.chat_id) for v in views)
    status_width = max(len(s) for s in shown)
    lines = ["subagents:"]
    for v, status in zip(views, shown, strict=True):
        lines.append(f"  {v.chat_id:<{id_width}}  {v.mode:<10}  {status:<{status_width}}  {one_line(v.task)}")
    for v in views:
        if v.mode == "background" and v.status in (TurnStatus.AWAITING_USER, TurnStatus.FAILED):
            # Its parent's turn may have ended: its gate is decided in its own chat.
            lines.append(
                f"  {v.chat_id} waits in its own chat: "
                f"turnkeeper continue {v.chat_id} | turnkeeper dismiss {v.chat_id}"
            )
    if len(views) == 1:
        sub = views[0].chat_id
        lines.append(f"transcript: turnkeeper history {sub}   its turn: turnkeeper status {sub}")
    else:
        lines.append("transcripts: turnkeeper history SUB-CHAT   their turns: turnkeeper status SUB-CHAT")
    return lines


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
