"""Delegation: a `delegate` call runs as a child workflow, a turn of its own in a sub-chat.

The loop treats a delegation as any tool call: one future, whose end is an input.
The future's own steps — record the call as started, start the child, await its
answer, record that as the call's result — are Temporal operations only and take
no input. What the loop takes is the child's news of its gate (the `subagent`
signal) and the user's decisions for that gate, which go on to the child.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ChildWorkflowError
from temporalio.workflow import ChildWorkflowCancellationType, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from turnkeeper import activity_io, recovery, search_attributes, subagents
    from turnkeeper.models import (
        TURN_TASK_TIMEOUT,
        SubagentLink,
        SubagentView,
        ToolCall,
        TurnState,
        TurnStatus,
    )
    from turnkeeper.payloads.raw import Malformed, read_news
    from turnkeeper.workflows import steps

if TYPE_CHECKING:
    from turnkeeper.workflows.turn_loop import Turn

Result = activity_io.ToolCallResult


class Delegations:
    def __init__(self, turn: Turn, link: SubagentLink | None) -> None:
        self._turn = turn
        self.link = link  # set in a subagent's own run
        self._in_step = 0
        self._views: dict[asyncio.Future[Result], SubagentView] = {}
        self._children: dict[str, asyncio.Future[TurnState]] = {}  # by sub-chat, once started
        self._stopping: set[str] = set()

    def stop(self, future: asyncio.Future[Any]) -> bool:
        """The turn is ending: a waiting child is stopped (a child workflow's cancellation
        is its Stop), or never started; False for a future that is no delegation.
        The delegation's own future is never cancelled: it records how the child ended."""
        view = self._views.get(future)
        if view is None:
            return False
        if view.mode == "wait" and view.status != TurnStatus.RECOVERED:  # not dismissed already
            self._stopping.add(view.chat_id)
            child = self._children.get(view.chat_id)
            if child is not None and not child.done():
                child.cancel()
        return True

    def begin_step(self) -> None:
        self._in_step = 0

    # -- the delegating turn ------------------------------------------------------------
    def call(self, call: ToolCall) -> asyncio.Future[Result]:
        """The delegate call's future: its result, recorded, or a refusal in words."""
        self._in_step += 1
        s, limits = self._turn.state, self._turn.settings.subagents
        assert limits is not None  # the loop delegates only when the tool is enabled
        depth = (self.link.depth if self.link else 0) + 1
        try:
            args = subagents.parse_args(call.arguments)
            why = subagents.refusal(limits, depth, self._in_step, args)
        except subagents.DelegateRefused as refused:
            why = str(refused)
        if why is not None:
            done: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
            done.set_result(subagents.error_result(call, why))
            return done
        link = subagents.link_of(s, workflow.info().workflow_id, call.id, depth, args)
        view = subagents.first_view(link)
        s.subagents.append(view)
        future = asyncio.ensure_future(self._delegate(call, link, view))
        self._views[future] = view
        return future

    async def _delegate(self, call: ToolCall, link: SubagentLink, view: SubagentView) -> Result:
        s = self._turn.state
        start = activity_io.SubagentStartInput(chat_id=s.chat_id, turn=s.turn, call=call)
        await steps.store_write(
            activity_io.SUBAGENT_START, start, summary="delegate: record start", patient=True
        )
        wait = link.mode == "wait"
        if view.chat_id in self._stopping or (not wait and self._turn.ending is not None):
            view.status = TurnStatus.RECOVERED
            why = "Error: the turn ended before the subagent started; it did not start"
            return subagents.error_result(call, why)
        try:
            child = await workflow.start_child_workflow(
                "ChatTurn",
                subagents.child_input(view.chat_id, link),
                id=view.workflow_id,
                result_type=TurnState,
                task_timeout=TURN_TASK_TIMEOUT,
                # A waiting turn's child ends with it; a background one goes on alone.
                parent_close_policy=ParentClosePolicy.REQUEST_CANCEL if wait else ParentClosePolicy.ABANDON,
                cancellation_type=ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
                search_attributes=search_attributes.at_start(view.chat_id),
                static_summary=f"subagent: {subagents.shown_task(link.task)[:100]}",
            )
            self._children[view.chat_id] = child
            if view.chat_id in self._stopping:  # the Stop came while it started
                child.cancel()
            ended: TurnState | None = await child if wait else None
        except ChildWorkflowError as err:
            view.status = TurnStatus.FAILED
            why = f"Error: the subagent in chat {view.chat_id} failed: {err.cause or err}"
            return subagents.error_result(call, why)
        if ended is not None:
            view.status, view.reason, view.recovery_id = ended.status, ended.reason, ended.recovery_id
        record = subagents.result_record(s, call, view.chat_id, ended, background=not wait)
        handle = steps.store_write(
            activity_io.SUBAGENT_RESULT, record, Result, summary="delegate: record answer", patient=True
        )
        result: Result = await handle
        return result

    def news(self, payload: RawValue | None) -> None:
        """A waiting subagent's gate opened or closed: its parent shows it."""
        try:
            news = read_news(payload)
        except Malformed:
            workflow.logger.warning("chat %s: unreadable subagent news", self._turn.state.chat_id)
            return
        before = recovery.shown(self._turn.state)
        subagents.take_news(self._turn.state.subagents, news)
        self._shown_since(before)

    def forward(self, action: str, recovery_id: str | None) -> None:
        """Continue or Dismiss given here for a subagent's gate: the subagent takes it."""
        before = recovery.shown(self._turn.state)
        for view in subagents.decide(self._turn.state.subagents, action, recovery_id):
            _signal(view.workflow_id, action, {"recovery_id": recovery_id})
        self._shown_since(before)

    def _shown_since(self, before: TurnState) -> None:
        """A subagent's gate shown or gone: the search attributes and the chat's event log say so."""
        self._turn.upsert()
        event = subagents.gate_event(before, recovery.shown(self._turn.state))
        if event is not None:
            self._turn.store.announce(event)
            self.tell_parent()

    def dismiss_waiting(self) -> None:
        """The delegating turn is dismissed: so are its subagents waiting at a gate."""
        for view in self._turn.state.subagents:
            if view.mode == "wait" and view.status == TurnStatus.AWAITING_USER:
                self.forward("dismiss", view.recovery_id)

    # -- a subagent's own run ------------------------------------------------------------
    def tell_parent(self) -> None:
        """The gate of a subagent its parent waits for reaches the parent's chat, from any depth."""
        if self.link is None or self.link.mode != "wait":
            return
        # As its own user would see it: a gate of its own subagent climbs on up.
        news = subagents.view_of(recovery.shown(self._turn.state), self.link, workflow.info().workflow_id)
        _signal(self.link.parent_workflow_id, "subagent", news)

    def task_id(self) -> str | None:
        """The message id of a subagent's task (its sub-chat's first message)."""
        return subagents.task_message_id(self.link.tool_call_id) if self.link else None

    def report(self) -> activity_io.ReportToParentInput | None:
        """What a background subagent's ended turn sends its parent's chat."""
        return subagents.report(self._turn.state, self.link)


def _signal(workflow_id: str, name: str, arg: Any) -> None:
    """Fire and forget: a run that has ended needs no news."""
    sent = asyncio.ensure_future(workflow.get_external_workflow_handle(workflow_id).signal(name, arg))
    sent.add_done_callback(lambda f: f.cancelled() or f.exception())
