"""What a finished, failed or cancelled tool call leaves, as a mixin of `ChatTurn`.

A tool that may have acted is never run again: its call is answered as
interrupted. One refused for a store outage before it acted may run again.
"""
from __future__ import annotations

import asyncio
from typing import Literal

from temporalio import workflow
from temporalio.exceptions import ActivityError, TimeoutType

with workflow.unsafe.imports_passed_through():
    from turnkeeper import activity_io
    from turnkeeper.models import (
        INTERRUPTED_TOOL_TEXT,
        UNSTARTED_TOOL_TEXT,
        Reason,
        ToolCall,
        ToolCallStatus,
        ToolCallView,
    )
    from turnkeeper.workflows.activity_calls import error_type, timeout_type
    from turnkeeper.workflows.turn_persistence import TurnPersistence


class ToolOutcomes(TurnPersistence):
    async def _tool_outcome(self, call: ToolCall, view: ToolCallView,
                            handle: workflow.ActivityHandle[activity_io.ToolCallResult],
                            may_run_again: bool) -> Reason | None | Literal["again"]:
        try:
            result = await handle
        except (ActivityError, asyncio.CancelledError) as err:
            refused = isinstance(err, ActivityError) and error_type(err) == activity_io.STORE_UNAVAILABLE_ERROR
            if refused and may_run_again:
                view.status = ToolCallStatus.PENDING
                return "again"  # it never acted: its start could not be recorded
            # The tool may or may not have acted: it is never run again by us. If it
            # did record a result before it died, the store keeps that one.
            view.status = ToolCallStatus.INTERRUPTED
            never_started = refused or (isinstance(err, ActivityError)
                                        and timeout_type(err) == TimeoutType.SCHEDULE_TO_START)
            await self._store_call(
                activity_io.RECORD_TOOL_RESULT,
                activity_io.RecordToolResultInput(
                    chat_id=self._state.chat_id, turn=self._state.turn, tool_call_id=call.id,
                    name=call.name, status="interrupted",
                    content=UNSTARTED_TOOL_TEXT if never_started else INTERRUPTED_TOOL_TEXT))
            return Reason.RESTART_REQUIRES_CONFIRMATION if never_started else Reason.TOOL_STATE_UNKNOWN
        if not result.recorded:
            await self._store_call(activity_io.RECORD_TOOL_RESULT, activity_io.RecordToolResultInput(
                chat_id=self._state.chat_id, turn=self._state.turn, tool_call_id=call.id, name=call.name,
                status=result.status, content=result.content))
        view.status = ToolCallStatus.DONE if result.status == "done" else ToolCallStatus.ERROR
        return None


def show_result(handle: "asyncio.Future[activity_io.ToolCallResult]", view: ToolCallView) -> None:
    """A finished call shows in `state` at once, while its siblings still run."""
    if not handle.cancelled() and handle.exception() is None:
        view.status = ToolCallStatus.DONE if handle.result().status == "done" else ToolCallStatus.ERROR
