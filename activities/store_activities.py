"""Store writes the workflow asks for directly, as ordinary activities: each is
idempotent, and its result is an event in the run's history like any step's.
The common writes ride inside the steps instead (activities/model_call.py,
activities/tool_call.py); these are for gates, endings and the rarer paths."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio import activity

from turnkeeper import activity_io
from turnkeeper.activities.heartbeat import heartbeating
from turnkeeper.config import Settings
from turnkeeper.models import OPEN_STATUSES
from turnkeeper.store import SessionStore, TurnUpdate
from turnkeeper.subagents import DELEGATE_TOOL

T = TypeVar("T")


def beating(fn: Callable[[Any, Any], Awaitable[T]]) -> Callable[[Any, Any], Awaitable[T]]:
    """Heartbeats while the write runs: a write held by a dead worker is noticed in
    seconds and made again elsewhere, instead of after its 30 s timeout."""

    @functools.wraps(fn)
    async def run(self: Any, inp: Any) -> T:
        async with heartbeating():
            return await fn(self, inp)

    return run


class StoreActivities:
    def __init__(
        self, settings: Settings, store: SessionStore, confirm_tools: list[str] | None = None
    ) -> None:
        self._settings = settings
        self._store = store
        self._confirm_tools = list(confirm_tools if confirm_tools is not None else settings.confirm_tools)

    @activity.defn(name=activity_io.BEGIN_TURN)
    @beating
    async def begin_turn(self, inp: activity_io.BeginTurnInput) -> activity_io.BeginTurnResult:
        return await self.begin(inp)

    async def begin(self, inp: activity_io.BeginTurnInput) -> activity_io.BeginTurnResult:
        """Number the run's turn (idempotent by run id). A run learns the configured
        message limit here: its first messages are judged now."""
        if inp.only_existing:
            numbered = await self._store.turn_of_run(inp.chat_id, inp.run_id)
            return activity_io.BeginTurnResult(
                turn=numbered, latest_turn=numbered or 0, settings=self._turn_settings()
            )
        limit = self._settings.max_message_bytes
        oversized = [i for i, size in zip(inp.message_ids, inp.message_sizes, strict=False) if size > limit]
        offered = [i for i in inp.message_ids if i not in oversized]
        begun = await self._store.begin_turn(inp.chat_id, inp.run_id, offered) if offered else None
        turn = begun.turn if begun else None
        latest = turn
        if latest is None:
            record = await self._store.get_turn(inp.chat_id)
            latest = record.turn if record else 0
        return activity_io.BeginTurnResult(
            turn=turn,
            latest_turn=latest,
            duplicate_ids=begun.duplicate_ids if begun else [],
            closed_turn=begun.closed_turn if begun else None,
            settings=self._turn_settings(),
            oversized_ids=oversized,
        )

    @activity.defn(name=activity_io.ADOPT_TURN)
    @beating
    async def adopt_turn(self, inp: activity_io.AdoptTurnInput) -> activity_io.AdoptTurnResult:
        next_step = await self._store.adopt_turn(inp.chat_id, inp.turn, inp.run_id)
        return activity_io.AdoptTurnResult(next_step=next_step, settings=self._turn_settings())

    def _turn_settings(self) -> activity_io.TurnSettings:
        s = self._settings
        return activity_io.TurnSettings(
            max_message_bytes=s.max_message_bytes,
            max_pending_bytes=s.max_pending_bytes,
            confirm_tools=self._confirm_tools,
            subagents=activity_io.SubagentLimits(
                max_depth=s.subagent_max_depth,
                max_fanout=s.subagent_max_fanout,
                profiles=sorted(p.name for p in s.subagent_profiles),
            )
            if DELEGATE_TOOL in s.tools
            else None,
        )

    @activity.defn(name=activity_io.RECORD_TOOL_RESULT)
    @beating
    async def record_tool_result(self, inp: activity_io.RecordToolResultInput) -> None:
        await self._store.record_tool_result(
            inp.chat_id, inp.turn, inp.tool_call_id, inp.name, inp.content, inp.status
        )

    @activity.defn(name=activity_io.COMMIT_MESSAGES)
    @beating
    async def commit_messages(self, inp: activity_io.CommitMessagesInput) -> list[str]:
        if inp.answer_lost_calls:
            await self._store.close_unanswered_calls(inp.chat_id, inp.turn)
        return await self._store.commit_user_messages(inp.chat_id, inp.turn, inp.messages)

    @activity.defn(name=activity_io.RECORD_ASSISTANT)
    @beating
    async def record_assistant(self, inp: activity_io.RecordAssistantInput) -> None:
        await self._store.record_assistant(inp.chat_id, inp.turn, inp.step, inp.reply, final=inp.final)

    @activity.defn(name=activity_io.UPDATE_TURN)
    @beating
    async def update_turn(self, inp: activity_io.UpdateTurnInput) -> activity_io.TurnWriteResult:
        ended = await self._ended(inp)
        if ended is not None:
            return ended
        await self._store.update_turn(inp.chat_id, inp.turn, _update(inp))
        return activity_io.TurnWriteResult(status=inp.status, reason=inp.reason)

    @activity.defn(name=activity_io.FINISH_TURN)
    @beating
    async def finish_turn(self, inp: activity_io.UpdateTurnInput) -> activity_io.TurnWriteResult:
        # A model call lost or cancelled after writing its tool calls: answer them first,
        # so each tool row follows its call before any user row (providers refuse else).
        await self._store.close_unanswered_calls(inp.chat_id, inp.turn)
        if inp.commit_messages:
            await self._store.commit_user_messages(inp.chat_id, inp.turn, inp.commit_messages)
        ended = await self._ended(inp)
        if ended is not None:
            return ended
        await self._store.finish_turn(inp.chat_id, inp.turn, _update(inp), closing_text=inp.closing_text)
        return activity_io.TurnWriteResult(status=inp.status, reason=inp.reason)

    async def _ended(self, inp: activity_io.UpdateTurnInput) -> activity_io.TurnWriteResult | None:
        """The turn's ending if the store already has one: e.g. a final answer
        committed by a model call whose completion was then lost."""
        record = await self._store.get_turn(inp.chat_id, inp.turn)
        if record is None or record.status in OPEN_STATUSES:
            return None
        if (record.status, record.reason) == (inp.status, inp.reason):
            return None  # a retry of this very write: idempotent in the store
        return activity_io.TurnWriteResult(status=record.status, reason=record.reason, written=False)

    @activity.defn(name=activity_io.HELD_MESSAGES)
    @beating
    async def held_messages(self, inp: activity_io.HeldMessagesInput) -> activity_io.HeldMessagesResult:
        held = await self._store.held_message_ids(inp.chat_id, inp.message_ids)
        return activity_io.HeldMessagesResult(asked=inp.message_ids, held=held)

    @activity.defn(name=activity_io.APPEND_EVENTS)
    @beating
    async def append_events(self, inp: activity_io.AppendEventsInput) -> None:
        await self._store.append_events(inp.chat_id, inp.events, keys=inp.keys)


def _update(inp: activity_io.UpdateTurnInput) -> TurnUpdate:
    return TurnUpdate(
        status=inp.status,
        reason=inp.reason,
        recovery_id=inp.recovery_id,
        can_continue=inp.can_continue,
        attempts=inp.attempts,
        detail=inp.detail,
    )
