"""The activity side of subagents (docs/subagents.md, docs/tools.md): which tools a
subagent's calls may see and run, and the store writes and the message a `delegate`
call needs around its child workflow. Each write is idempotent; like the other store
writes, a `StoreUnavailable` is raised as it is (its failure's type is
`activity_io.STORE_UNAVAILABLE_ERROR`), and the step's retry policy decides."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Literal

from temporalio import activity
from temporalio.client import WorkflowQueryFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from turnkeeper import activity_io
from turnkeeper import client as tk
from turnkeeper.activities.store_activities import beating
from turnkeeper.activities.tools.registry import truncate_output
from turnkeeper.config import Settings
from turnkeeper.models import Event, Reason, SubagentLink, TurnStatus, UserMessage
from turnkeeper.store import CorruptRowError, SessionStore
from turnkeeper.subagents import (
    DELEGATE_TOOL,
    SUBAGENT_SENDER,
    report_message_id,
    shown_task,
)

# A sub-turn that ended so has a final answer as its last assistant row.
ANSWERED = frozenset(
    {
        (TurnStatus.COMPLETED, None),
        (TurnStatus.RECOVERED, Reason.CONTINUED),
        (TurnStatus.RECOVERED, Reason.ANSWER_RESTORED),
    }
)
ANSWERED_HEAD = "Subagent (chat {chat}, task: {task}) answered:\n"
UNANSWERED_HEAD = "Subagent (chat {chat}, task: {task}) ended without an answer:\n"

# A report is sent until the parent's chat has taken it: a chat holding nearly its
# pending bound refuses it (`message_rejected`), and remembers nothing of it.
PARENT_CHAT_FULL = "ParentChatFull"
REPORT_NOT_JUDGED = "ReportNotJudged"
# Of the attempt's start_to_close: the rest is the margin for a slow store read.
WAIT_SHARE = 2 / 3
POLL_S = 0.25
QUERY_EVERY_S = 1.0
QUERY_S = 5.0
EVENT_PAGE = 1000
# The parent frees its pending bytes as a model call that took them ends (its reply
# row) or its turn does; the report goes again a moment after, once its run has seen it.
ROOM_EVENTS = frozenset({"assistant_message", "turn_end"})
ROOM_PAUSE_S = 0.5
# An attempt that found the chat full has waited for room already: the next one
# need not back off further.
NEXT_ATTEMPT = timedelta(seconds=1)


def allowed_tools(settings: Settings, subagent: SubagentLink | None) -> tuple[str, ...]:
    """The tools a call may see and run, in the worker's order: the worker's enabled ones;
    for a subagent, its profile's among them, and `delegate` only below the depth limit.
    Never more than the worker enables. A profile the worker does not know gives none:
    what it would allow cannot be told."""
    enabled = settings.tools
    if subagent is None:
        return enabled
    if subagent.profile is not None:
        profile = settings.subagent_profile(subagent.profile)
        enabled = tuple(n for n in enabled if profile is not None and n in profile.tools)
    if subagent.depth >= settings.subagent_max_depth:
        enabled = tuple(n for n in enabled if n != DELEGATE_TOOL)
    return enabled


def instructions(settings: Settings, subagent: SubagentLink | None) -> str | None:
    """The profile's instructions a subagent's model call sees first, if any."""
    if subagent is None or subagent.profile is None:
        return None
    profile = settings.subagent_profile(subagent.profile)
    return profile.instructions if profile is not None and profile.instructions.strip() else None


def not_allowed_text(settings: Settings, name: str, subagent: SubagentLink) -> str:
    """Why a subagent's call of `name` did not run, in words the model reads."""
    kind = f"subagent profile {subagent.profile!r}" if subagent.profile else "this subagent"
    if name == DELEGATE_TOOL and subagent.depth >= settings.subagent_max_depth:
        return (
            f"Error: subagents nest at most {settings.subagent_max_depth} deep and this one is at depth "
            f"{subagent.depth}: it may not delegate; the call did not run."
        )
    listing = ", ".join(allowed_tools(settings, subagent)) or "none"
    return f"Error: {kind} may not use the tool {name!r}; the call did not run. Its tools: {listing}"


def how_it_ended(status: TurnStatus, reason: Reason | None) -> str:
    return f"{status.value}/{reason.value}" if reason else status.value


def fit_message(text: str, max_bytes: int) -> str:
    """`text` cut to at most `max_bytes` UTF-8 bytes on a character boundary, with a
    note of the cut when there is room for one: a report is never refused for its size."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    note = f"\n[cut to fit a message: {len(data)} bytes in all]".encode()
    room = max_bytes - len(note) if max_bytes > 2 * len(note) else max_bytes
    head = data[: max(room, 0)].decode("utf-8", errors="ignore")
    return head + note.decode() if room < max_bytes else head


def report_text(sub_chat_id: str, task: str, answered: bool, words: str) -> str:
    """The report a parent's chat gets; the demo model knows its heads (providers/demo.py)."""
    head = ANSWERED_HEAD if answered else UNANSWERED_HEAD
    return head.format(chat=sub_chat_id, task=shown_task(task)) + words


class SubagentActivities:
    def __init__(self, settings: Settings, store: SessionStore) -> None:
        self._settings = settings
        self._store = store

    @activity.defn(name=activity_io.SUBAGENT_START)
    @beating
    async def subagent_start(self, inp: activity_io.SubagentStartInput) -> None:
        """The parent's `delegate` call is recorded as started before its child starts:
        the store can tell a delegation that may have begun. A retry finds it recorded."""
        await self._store.tool_started(inp.chat_id, inp.turn, inp.call, inp.idempotency_key)

    @activity.defn(name=activity_io.SUBAGENT_RESULT)
    @beating
    async def subagent_result(self, inp: activity_io.SubagentResultInput) -> activity_io.ToolCallResult:
        """The parent's `delegate` row: the sub-turn's answer, where a background one
        will arrive, or how the sub-turn ended. A retry writes no second row."""
        if inp.background:
            answered, content = (
                True,
                f"Started subagent in chat {inp.sub_chat_id}; its answer will arrive as a message in this chat.",
            )
        else:
            answered, content = await self._ending(
                inp.sub_chat_id, inp.sub_turn, inp.sub_status, inp.sub_reason
            )
        content = truncate_output(content, self._settings.max_tool_output_bytes)
        status = "done" if answered else "error"
        await self._store.record_tool_result(
            inp.chat_id, inp.turn, inp.call.id, inp.call.name, content, status
        )
        return activity_io.ToolCallResult(
            tool_call_id=inp.call.id, name=inp.call.name, status=status, content=content
        )

    @activity.defn(name=activity_io.REPORT_TO_PARENT)
    @beating
    async def report_to_parent(self, inp: activity_io.ReportToParentInput) -> None:
        """A background subagent's answer becomes a user message in its parent's chat,
        sent with the worker's own client. One message id per sub-turn: a retry is
        the same message, which the chat takes once. Returns once the parent's chat
        holds it (a user row, or pending in its run); while the chat refuses it for
        being full, it is sent again as the chat frees room, and the attempt fails
        retryably when its time is up without the chat's word."""
        limit = activity.info().start_to_close_timeout or timedelta(seconds=30)
        deadline = time.monotonic() + limit.total_seconds() * WAIT_SHARE
        parent = inp.parent.parent_chat_id
        message_id = report_message_id(inp.sub_chat_id, inp.sub_turn)
        if await self._store.held_message_ids(parent, [message_id]):
            return  # a retry after the chat committed it
        answered, words = await self._ending(inp.sub_chat_id, inp.sub_turn, inp.sub_status, inp.sub_reason)
        message = UserMessage(
            message_id=message_id,
            text=self.report_message_text(inp.sub_chat_id, inp.parent.task, answered, words),
            sender=SUBAGENT_SENDER,
        )
        while True:
            # Only a refusal after this send counts: an earlier attempt's may come late.
            after = await self._store.follow_from(parent)
            await tk.send_message(activity.client(), self._settings, parent, message)
            verdict = await self._verdict(parent, message_id, after, deadline)
            if verdict is True:
                return
            if verdict is None:
                raise ApplicationError(
                    f"the parent chat {parent} has neither taken nor refused report {message_id} yet; "
                    "it is sent again",
                    type=REPORT_NOT_JUDGED,  # the parent's run or the store is slow: back off
                )
            refused_at, why = verdict
            if not await self._room(parent, refused_at, deadline):
                raise ApplicationError(
                    f"the parent chat {parent} is full ({why}); report {message_id} is sent again",
                    type=PARENT_CHAT_FULL,
                    next_retry_delay=NEXT_ATTEMPT,
                )

    async def _verdict(
        self, parent: str, message_id: str, after: int, deadline: float
    ) -> Literal[True] | tuple[int, str] | None:
        """True once the parent's chat holds the message (a user row, or pending in its
        run: the next run's after a continue-as-new), (seq, reason) of a refusal logged
        after `after`, None when neither is known by `deadline`."""
        query_at = time.monotonic()
        while time.monotonic() < deadline:
            if await self._store.held_message_ids(parent, [message_id]):
                return True
            for event in await self._events_after(parent, after):
                after = event.seq
                if event.type == "message_rejected" and event.payload.get("message_id") == message_id:
                    return event.seq, str(event.payload.get("reason"))
            if time.monotonic() >= query_at:
                if await self._pending_in_run(parent, message_id, deadline):
                    return True
                query_at = time.monotonic() + QUERY_EVERY_S
            await asyncio.sleep(POLL_S)
        return None

    async def _room(self, parent: str, after: int, deadline: float) -> bool:
        """Whether a model call or the turn of the parent's chat ended after `after`,
        before `deadline`."""
        while time.monotonic() < deadline:
            events = await self._events_after(parent, after)
            if any(e.type in ROOM_EVENTS for e in events):
                await asyncio.sleep(ROOM_PAUSE_S)
                return True
            after = events[-1].seq if events else after
            await asyncio.sleep(POLL_S)
        return False

    async def _events_after(self, chat_id: str, after: int) -> list[Event]:
        out: list[Event] = []
        while True:
            page = await self._store.events(chat_id, after_seq=after, limit=EVENT_PAGE)
            out.extend(page)
            if len(page) < EVENT_PAGE:
                return out
            after = page[-1].seq

    async def _pending_in_run(self, chat_id: str, message_id: str, deadline: float) -> bool:
        """Whether the chat's run lists the message among its pending ones; False when
        its `state` query is not answered in time."""
        wait = min(QUERY_S, max(deadline - time.monotonic(), 0.1))
        try:
            state = await tk.query_state(activity.client(), chat_id, rpc_timeout=timedelta(seconds=wait))
        except (RPCError, WorkflowQueryFailedError):
            return False
        return message_id in state.pending_followups

    def report_message_text(self, sub_chat_id: str, task: str, answered: bool, words: str) -> str:
        # Within both limits the parent's run judges a message by (its text, and the
        # chat's pending messages together): over either it would be refused, and lost.
        limit = min(self._settings.max_message_bytes, self._settings.max_pending_bytes // 2)
        return fit_message(report_text(sub_chat_id, task, answered, words), limit)

    async def _ending(
        self, sub_chat_id: str, sub_turn: int, status: TurnStatus, reason: Reason | None
    ) -> tuple[bool, str]:
        """(whether the sub-turn answered, its answer or how it ended, in words)."""
        how = how_it_ended(status, reason)
        where = f"its transcript is in chat {sub_chat_id}"
        if (status, reason if status == TurnStatus.RECOVERED else None) not in ANSWERED:
            return False, f"Error: the subagent's turn ended {how}; {where}"
        try:
            rows = await self._store.turn_messages(sub_chat_id, sub_turn)
        except CorruptRowError as err:
            return False, f"Error: the subagent's turn ended {how}, and its transcript cannot be read: {err}"
        text = next((m.content for m in reversed(rows) if m.role == "assistant"), None)
        if not text or not text.strip():
            return False, f"Error: the subagent's turn ended {how} without an answer; {where}"
        return True, text
