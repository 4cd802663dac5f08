"""Tools that ask first, as a mixin of `ChatTurn`.

A call of a tool that must be approved (`confirm=True`, TURNKEEPER_CONFIRM_TOOLS)
is held back: the calls that need no approval run, then the turn waits at an
approval gate (`awaiting_user/approval_required`, a workflow wait like any gate).
Continue runs the held calls once; Dismiss gives each the tool row `denied by
the user`; a turn that ends any other way while calls are held answers them as
not run. Which tools ask first comes with the run's settings (recorded in its
history), so a replay holds the same calls.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from turnkeeper import activity_io
    from turnkeeper.models import (
        DENIED_TOOL_TEXT,
        UNAPPROVED_TOOL_TEXT,
        ApprovalRequest,
        Reason,
        ToolCall,
        ToolCallStatus,
        ToolCallView,
        UserMessage,
    )
    from turnkeeper.workflows.gate import TurnGate


def split_for_approval(calls: list[ToolCall], confirm_tools: list[str]) -> tuple[list[ToolCall], list[ToolCall]]:
    """(the calls that run now, the calls that wait for the user's approval), each in order."""
    held = [c for c in calls if c.name in confirm_tools]
    return [c for c in calls if c.name not in confirm_tools], held


class Approvals(TurnGate):
    """Needs `_settings`, `_approvals` (the patch flag), `_held` and the tool step from the workflow."""

    _settings: activity_io.TurnSettings
    _approvals: bool
    _held: list[ToolCall]
    _tool_step: Callable[[list[ToolCall], bool], Awaitable[Reason | None | Literal["ended"]]]

    async def _run_approved(self, held: list[ToolCall]) -> bool:
        """Wait for the user's approval of `held`, then run them. True when the turn
        goes on to its next model call; False when it ended (Dismiss denied them,
        Stop or a newer message ended it) or a tool of theirs was lost and its gate
        ended the turn."""
        self._held = held
        self._show_waiting()
        if await self._gate(Reason.APPROVAL_REQUIRED) != "continue":
            return False
        lost = await self._tool_step(self._release(), True)
        if lost == "ended":
            return False
        return lost is None or await self._gate(lost) == "continue"

    def _hold(self, calls: list[ToolCall]) -> tuple[list[ToolCall], list[ToolCall]]:
        """Split the model's calls; the held ones are the turn's to answer from now on."""
        if not self._approvals:
            return calls, []
        free, held = split_for_approval(calls, self._settings.confirm_tools)
        self._held = held
        return free, held

    def _show_waiting(self) -> None:
        """The approval gate's calls, in `state`: pending, with their arguments and keys."""
        s = self._state
        known = {v.id for v in s.tool_calls}
        s.tool_calls.extend(ToolCallView(id=c.id, name=c.name, status=ToolCallStatus.PENDING)
                            for c in self._held if c.id not in known)
        s.approvals = [ApprovalRequest(id=c.id, name=c.name, arguments=c.arguments,
                                       idempotency_key=f"{s.chat_id}/{s.turn}/{c.id}") for c in self._held]

    def _release(self) -> list[ToolCall]:
        """Approved: the calls are the tool step's now."""
        held, self._held = self._held, []
        self._state.approvals = []
        return held

    async def _finish_turn(self, closing_text: str | None = None,
                           commit_messages: list[UserMessage] | None = None) -> None:
        # Held calls never ran: each gets its row before the turn closes (which would
        # otherwise answer them as interrupted, outcome unknown).
        if self._held:
            denied = self._state.reason == Reason.DISMISSED
            held = self._release()
            # Shown before the writes: `state` already says the turn ended, and a
            # query between two writes must not show a call still waiting.
            held_ids = {c.id for c in held}
            for view in self._state.tool_calls:
                if view.id in held_ids:
                    view.status = ToolCallStatus.ERROR
            for call in held:
                await self._store_call(activity_io.RECORD_TOOL_RESULT, activity_io.RecordToolResultInput(
                    chat_id=self._state.chat_id, turn=self._state.turn, tool_call_id=call.id, name=call.name,
                    status="error", content=DENIED_TOOL_TEXT if denied else UNAPPROVED_TOOL_TEXT))
        await super()._finish_turn(closing_text, commit_messages)
