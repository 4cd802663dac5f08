"""Subagents: the `delegate` tool's words, its arguments, and the ids it derives.

A delegated task runs as a turn of its own in a sub-chat, as a child workflow of
the turn that delegated it (docs/subagents.md). Everything here is pure: the
workflow, the activities, the CLI and the page use it alike.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnkeeper.activity_io import SubagentLimits
from turnkeeper.models import DelegateMode, SubagentLink, SubagentView, TurnState

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
