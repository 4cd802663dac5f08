"""The tool activity: one call of one tool, never retried.

`tool_started` is written under the call's idempotency key before the tool
acts, so the store can always tell a tool that may have acted from one that
never started."""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.exceptions import ApplicationError

from turnkeeper import activity_io
from turnkeeper.activities.heartbeat import heartbeating
from turnkeeper.activities.subagent_activities import allowed_tools, not_allowed_text
from turnkeeper.activities.tools import ToolContext, ToolRegistry
from turnkeeper.config import Settings
from turnkeeper.store import SessionStore, StoreUnavailable, inline_calls
from turnkeeper.telemetry import metrics

ALREADY_STARTED_TEXT = "Error: this tool call was started before and may have acted; it is not run again."
# The `outcome` label of turnkeeper_tool_calls_total: `done` and `error` are the
# tool's; the rest are calls the tool never finished or never saw.
NOT_RUN_AGAIN = "not_run_again"
NOT_APPROVED = "not_approved"
NOT_ALLOWED = "not_allowed"
STORE_UNAVAILABLE = "store_unavailable"
CANCELLED = "cancelled"
FAILED = "failed"
NOT_APPROVED_TEXT = "Error: this tool runs only once the user has approved the call; it did not run."


class ToolCallActivity:
    def __init__(self, settings: Settings, store: SessionStore, registry: ToolRegistry) -> None:
        self._settings = settings
        self._store = store
        self._registry = registry

    @activity.defn(name=activity_io.TOOL_CALL)
    async def tool_call(self, inp: activity_io.ToolCallInput) -> activity_io.ToolCallResult:
        outcome = FAILED
        try:
            with inline_calls():
                result, outcome = await self._call(inp)
            return result
        except asyncio.CancelledError:
            outcome = CANCELLED  # a Stop, a Dismiss, or the end of the shutdown grace
            raise
        except ApplicationError as err:
            if err.type == activity_io.STORE_UNAVAILABLE_ERROR:
                outcome = STORE_UNAVAILABLE
            raise
        finally:
            # The model chose the name: only an enabled tool's becomes a label value.
            name = inp.call.name
            known = name in self._settings.tools and self._registry.get(name) is not None
            metrics.tool_called(activity.metric_meter(), name if known else metrics.UNKNOWN_TOOL, outcome)

    async def _call(self, inp: activity_io.ToolCallInput) -> tuple[activity_io.ToolCallResult, str]:
        """The call's result, and its outcome for the metric."""
        call = inp.call
        enabled = allowed_tools(self._settings, inp.subagent)
        async with heartbeating():
            # A subagent's call of a tool outside its profile is refused, never run.
            refused = inp.subagent is not None and call.name not in enabled
            # The workflow asks first; this holds should a run's settings know less than this worker.
            unapproved = (
                not refused
                and not inp.approved
                and call.name in self._settings.tools
                and self._registry.needs_approval(call.name, self._settings.confirm_tools)
            )
            try:
                first = (
                    refused
                    or unapproved
                    or await self._store.tool_started(inp.chat_id, inp.turn, call, inp.idempotency_key)
                )
            except StoreUnavailable as err:
                # Not recorded, so not run: the workflow runs the call once the store is back.
                raise ApplicationError(
                    str(err), type=activity_io.STORE_UNAVAILABLE_ERROR, non_retryable=True
                ) from None
            if inp.subagent is not None and refused:
                status, content = "error", not_allowed_text(self._settings, call.name, inp.subagent)
                outcome = NOT_ALLOWED
            elif unapproved:
                status, content = "error", NOT_APPROVED_TEXT
                outcome = NOT_APPROVED
            elif not first:
                status, content = "error", ALREADY_STARTED_TEXT
                outcome = NOT_RUN_AGAIN
            else:
                ctx = ToolContext(
                    workspace=self._settings.workspace,
                    chat_id=inp.chat_id,
                    turn=inp.turn,
                    tool_call_id=call.id,
                    idempotency_key=inp.idempotency_key,
                    exec_timeout=float(self._settings.exec_timeout),
                    heartbeat=activity.heartbeat,
                )
                ran = await self._registry.run(
                    call.name,
                    call.arguments,
                    ctx,
                    enabled=enabled,
                    max_output_bytes=self._settings.max_tool_output_bytes,
                )
                status, content = ran.status, ran.content
                outcome = ran.status
            try:
                await self._store.record_tool_result(
                    inp.chat_id, inp.turn, call.id, call.name, content, status
                )
            except StoreUnavailable as err:
                # The tool has acted: its result goes back to the workflow, which records it later.
                activity.logger.warning("the result of %s is recorded later: %s", inp.idempotency_key, err)
                return activity_io.ToolCallResult(
                    tool_call_id=call.id, name=call.name, status=status, content=content, recorded=False
                ), outcome
            return activity_io.ToolCallResult(
                tool_call_id=call.id, name=call.name, status=status, content=content
            ), outcome
