"""Subagents: the `delegate` tool's words, its arguments, the ids it derives, and the
records a delegating turn keeps and sends of its subagents (views, results, events).

A delegated task runs as a turn of its own in a sub-chat, as a child workflow of
the turn that delegated it (docs/subagents.md). Everything here is pure: the
workflow, the activities, the CLI and the page use it alike.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnkeeper.activity_io import ReportToParentInput, SubagentLimits, SubagentResultInput, ToolCallResult
from turnkeeper.models import (
    ChatTurnInput,
    DelegateMode,
    NewEvent,
    SubagentLink,
    SubagentView,
    ToolCall,
    TurnState,
    TurnStatus,
    UserMessage,
)

DELEGATE_TOOL = "delegate"
DELEGATE_DESCRIPTION = (
    "Hand a task to a subagent: a turn of its own in a sub-chat, with its own transcript. "
    "mode 'wait' (the default) returns its final answer as this call's result; "
    "'background' returns at once, and the answer arrives later as a message in this chat."
)
SUBAGENT_SENDER = "subagent"
TASK_SHOWN = 200


class DelegateArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, description="what the subagent should do, in full")
    mode: DelegateMode = Field("wait", description="'wait' for the answer, or 'background'")
    profile: str | None = Field(None, description="a configured subagent profile's name")


class DelegateRefused(ValueError):
    """A delegate call that starts no subagent: the reason is the call's result."""


def parse_args(arguments: str) -> DelegateArgs:
    """The call's arguments, or `DelegateRefused` saying what is wrong with them."""
    try:
        raw = json.loads(arguments or "{}")
        return DelegateArgs.model_validate(raw)
    except json.JSONDecodeError as err:
        raise DelegateRefused(f"Error: delegate arguments are not JSON ({err.msg})") from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "arguments"
        raise DelegateRefused(f"Error: delegate {where}: {first.get('msg')}") from None


def sub_chat_id(parent_chat_id: str, turn: int, tool_call_id: str) -> str:
    """The sub-chat of one delegate call: the same call always names the same chat
    (and so the same child workflow, `chat-<id>`), and every id is a valid chat id."""
    digest = hashlib.sha256(f"{parent_chat_id}\0{turn}\0{tool_call_id}".encode()).hexdigest()[:12]
    return f"{parent_chat_id[:96]}.sub{turn}-{digest}"


def task_message_id(tool_call_id: str) -> str:
    return f"delegated:{tool_call_id}"[:200]


def report_message_id(sub_chat_id: str, turn: int) -> str:
    """The message a background subagent's answer becomes in its parent's chat:
    one id per answer, so a report sent twice is one message."""
    return f"subagent:{sub_chat_id}:{turn}"[:200]


def shown_task(task: str) -> str:
    return task if len(task) <= TASK_SHOWN else task[: TASK_SHOWN - 3] + "..."


def refusal(limits: SubagentLimits, depth: int, nth_in_step: int, args: DelegateArgs) -> str | None:
    """Why a delegate call at `depth` (1: a chat's own turn delegates), the `nth_in_step`
    delegate call of one model reply, starts no subagent; None when it may."""
    if depth > limits.max_depth:
        return f"Error: subagents nest at most {limits.max_depth} deep; this one would be at depth {depth}"
    if nth_in_step > limits.max_fanout:
        return f"Error: at most {limits.max_fanout} delegate calls run in one step; this one did not start"
    if args.profile is not None and args.profile not in limits.profiles:
        known = ", ".join(limits.profiles) or "none"
        return f"Error: no subagent profile {args.profile!r} (profiles: {known})"
    return None


def view_of(state: TurnState, link: SubagentLink, workflow_id: str) -> SubagentView:
    """A subagent's own state as its parent lists it."""
    return SubagentView(
        chat_id=state.chat_id,
        workflow_id=workflow_id,
        tool_call_id=link.tool_call_id,
        task=shown_task(link.task),
        mode=link.mode,
        status=state.status,
        reason=state.reason,
        recovery_id=state.recovery_id,
        can_continue=state.can_continue,
    )


# -- the delegating turn's bookkeeping (the workflow sends, starts and records) ------


def link_of(
    parent: TurnState, parent_workflow_id: str, call_id: str, depth: int, args: DelegateArgs
) -> SubagentLink:
    """What the subagent of one delegate call knows of its parent: where its news goes,
    which call it answers, how deep it runs, and its task."""
    return SubagentLink(
        parent_chat_id=parent.chat_id,
        parent_workflow_id=parent_workflow_id,
        parent_turn=parent.turn,
        tool_call_id=call_id,
        depth=depth,
        mode=args.mode,
        profile=args.profile,
        task=args.task,
    )


def first_view(link: SubagentLink) -> SubagentView:
    """A delegate call's subagent as its parent lists it before it has run: its sub-chat,
    and so its workflow `chat-<sub-chat>`, follow from the call alone."""
    sub = sub_chat_id(link.parent_chat_id, link.parent_turn, link.tool_call_id)
    return view_of(TurnState(chat_id=sub), link, f"chat-{sub}")


def child_input(sub: str, link: SubagentLink) -> ChatTurnInput:
    """The subagent's turn in its sub-chat `sub`: the task is the sub-chat's first message
    (sent by "delegate", with the id `task_message_id` gives), and the link says whose it is."""
    task = UserMessage(message_id=task_message_id(link.tool_call_id), text=link.task, sender="delegate")
    return ChatTurnInput(chat_id=sub, pending=[task], parent=link)


def error_result(call: ToolCall, why: str) -> ToolCallResult:
    """A delegate call that ends in words (refused, not started, failed), not in an answer.
    The store has not recorded it: the loop does, as a tool result the store could not take at once."""
    return ToolCallResult(tool_call_id=call.id, name=call.name, status="error", content=why, recorded=False)


def result_record(
    parent: TurnState, call: ToolCall, sub: str, ended: TurnState | None, background: bool
) -> SubagentResultInput:
    """What records a delegate call's result: the turn the subagent in chat `sub` ended,
    or (`ended` None) a background subagent started, its answer to come as a message."""
    return SubagentResultInput(
        chat_id=parent.chat_id,
        turn=parent.turn,
        call=call,
        sub_chat_id=sub,
        sub_turn=ended.turn if ended else 0,
        sub_status=ended.status if ended else TurnStatus.RUNNING,
        sub_reason=ended.reason if ended else None,
        background=background,
    )


_AWAITING = TurnStatus.AWAITING_USER
_LIVE = (TurnStatus.RUNNING, _AWAITING, TurnStatus.RESUMING)


def take_news(views: list[SubagentView], news: SubagentView) -> None:
    """A waiting subagent's news of its gate (opened, closed) onto its parent's view of it.
    A view that no longer runs or waits (its end recorded, or dismissed) keeps what it says:
    news sent before that end may arrive after it."""
    for view in views:
        if view.chat_id == news.chat_id and view.status in _LIVE:
            view.status, view.reason = news.status, news.reason
            view.recovery_id, view.can_continue = news.recovery_id, news.can_continue


def decide(views: list[SubagentView], action: str, recovery_id: str | None) -> list[SubagentView]:
    """The user's Continue (`action` "continue") or Dismiss, given in the parent's chat for
    the gate `recovery_id` names: the waiting subagents at that gate, now shown resuming or
    recovered. The caller sends each of them the decision."""
    decided = [
        v for v in views if v.mode == "wait" and v.status == _AWAITING and v.recovery_id == recovery_id
    ]
    for view in decided:
        view.status = TurnStatus.RESUMING if action == "continue" else TurnStatus.RECOVERED
    return decided


def gate_event(before: TurnState, after: TurnState) -> NewEvent | None:
    """The `recovery_state` event for the chat's event log when the gate a turn shows its user
    changed (both states as `recovery.shown` gives them): a subagent's gate shown, gone or
    another one. None when nothing the user sees changed."""
    if (after.status, after.reason, after.recovery_id) == (before.status, before.reason, before.recovery_id):
        return None
    shown = {
        "turn": after.turn,
        "status": after.status.value,
        "reason": after.reason.value if after.reason else None,
    }
    more = {"recovery_id": after.recovery_id, "can_continue": after.can_continue, "attempts": after.attempts}
    return NewEvent(type="recovery_state", payload={**shown, **more, "detail": after.detail})


def report(state: TurnState, link: SubagentLink | None) -> ReportToParentInput | None:
    """What a background subagent's ended turn sends its parent's chat; None for a chat's own
    turn, for a subagent its parent waits for (its answer is the call's result), and for a
    run that took no turn."""
    if link is None or link.mode != "background" or not state.turn:
        return None
    return ReportToParentInput(
        sub_chat_id=state.chat_id,
        sub_turn=state.turn,
        sub_status=state.status,
        sub_reason=state.reason,
        parent=link,
    )
