"""The turn loop: model call -> tool calls -> model call ... -> final answer.

One `Turn` per run. Signal handlers and ending activities only append inputs
(workflows/inputs.py); wherever the turn waits, it takes them one at a time in
the order of the run's history, so what it decides never depends on how a
worker grouped events into activations, live or on replay. Every activity is an
ordinary one; the store writes of a plain turn ride inside its steps (the model
call numbers the turn, commits messages and records the reply; the tool call
records its start and its outcome), and the rest — a gate opening or closing, a
turn ended by its user — are store activities of their own.

A lost step opens a gate; the turn waits, visibly, for Continue or Dismiss. Stop,
Dismiss or a newer message end the turn as soon as they are judged: what runs is
cancelled, completed results stand, and one closing row is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from enum import Enum
from functools import partial
from typing import Any, cast

from temporalio import workflow
from temporalio.exceptions import ActivityError
from temporalio.workflow import ContinueAsNewVersioningBehavior

with workflow.unsafe.imports_passed_through():
    from turnkeeper import activity_io, long_history, recovery, search_attributes, step_errors
    from turnkeeper import models as rows
    from turnkeeper.inbox import CHUNK_BYTES, Inbox, chunks, too_large, wire_size
    from turnkeeper.models import (
        OPEN_STATUSES,
        TURN_TASK_TIMEOUT,
        CarryOn,
        ChatTurnInput,
        ModelReply,
        Reason,
        RecoveryStart,
        ToolCall,
        ToolCallStatus,
        ToolCallView,
        TurnState,
        TurnStatus,
        UserMessage,
    )
    from turnkeeper.search_attributes import CHAT_ID_ATTR, TURN_STATUS_ATTR
    from turnkeeper.subagents import DELEGATE_TOOL
    from turnkeeper.telemetry import metrics
    from turnkeeper.workflows import steps
    from turnkeeper.workflows.delegation import Delegations
    from turnkeeper.workflows.inputs import (
        Action,
        Done,
        InputQueue,
        TurnInput,
        refuse_message,
        supersedes,
        take_decision,
        take_message,
    )
    from turnkeeper.workflows.store_writes import StoreWrites

# A run started without a message (`temporal workflow start`, say) waits this long.
IDLE_TIMEOUT = timedelta(minutes=10)
# A model call cut off by a graceful shutdown goes to the next worker this many times.
MAX_SHUTDOWN_RESCHEDULES = 5


class Flow(Enum):
    """Where the loop goes next, beside a gate's reason."""

    CONTINUE = "continue"
    ENDED = "ended"
    NO_TURN = "no_turn"
    AGAIN = "again"


CONTINUE, ENDED, NO_TURN, AGAIN = Flow.CONTINUE, Flow.ENDED, Flow.NO_TURN, Flow.AGAIN


class Turn:
    def __init__(self, input: ChatTurnInput) -> None:
        link = input.parent
        self.state = TurnState(chat_id=input.chat_id, delegated_by=link.parent_chat_id if link else None)
        self.inbox = Inbox()
        for message in input.pending:
            self.inbox.offer(message)
        self.inputs = InputQueue()
        self.delegations = Delegations(self, input.parent)
        self.settings = activity_io.TurnSettings()
        self.settings_known = False
        self.under_way = False  # a message was handed to a model call: there is a turn to stop
        self.decided = False  # Continue (or Approve) accepted at the open gate
        self.ending: Reason | None = None  # Stop, Dismiss or a newer message ends the turn
        self.dismissed: set[str] = set()  # pending when Dismiss came: committed as user rows
        self.held: list[ToolCall] = []  # calls waiting for the user's approval
        self.store = StoreWrites(self)
        self._superseding: list[str] = []
        self._checking: list[str] = []
        self._call_running = False
        self._count_gate = True
        self._upserted: tuple[TurnStatus, Reason | None] | None = None
        self._turn_taken = False

    # -- what `state` shows ------------------------------------------------------------
    def query(self) -> TurnState:
        held_back = [] if self._call_running else self.inbox.in_flight
        pending = [m.message_id for m in held_back + self.inbox.waiting]
        return recovery.shown(self.state).model_copy(update={"pending_followups": pending})

    # -- inputs: taken one at a time, in history order -------------------------------------
    def take(self, inp: TurnInput) -> None:
        if isinstance(inp, Done):
            self.inputs.take_end(inp)
        elif inp.name == "user_message":
            take_message(self, inp.payload)
        elif inp.name == "subagent":
            self.delegations.news(inp.payload)
        else:
            take_decision(self, cast(Action, inp.name), inp.payload)

    async def until(self, done: Callable[[], bool]) -> None:
        while not done():
            self.take(await self.inputs.next())

    async def wait(self, futures: list[Any], cancel_on_end: bool = True) -> None:
        """Take inputs until every future has ended; Stop, Dismiss or a newer message
        cancel them (`cancel_on_end`) and the wait goes on until they have stopped."""
        for future in futures:
            self.inputs.watch(future)
        cancelled = False
        while not all(f in self.inputs.ended for f in futures):
            if cancel_on_end and self.ending is not None and not cancelled:
                cancelled = True
                for future in futures:
                    if not self.delegations.stop(future):
                        future.cancel()
            self.take(await self.inputs.next())
        self.inputs.ended.difference_update(futures)

    def end_by_user(self, reason: Reason) -> None:
        """Judged: Stop, Dismiss or a newer message ends the turn (the loop acts on it)."""
        if self.ending is None:
            self.ending = reason
            recovery.end_recovered(self.state, reason)
            if reason == Reason.DISMISSED:
                # Newer messages under their retry check are no follow-ups of this turn.
                self.dismissed = set(self.inbox.ids()) - set(self._checking) - set(self._superseding)
                self.delegations.dismiss_waiting()

    def check_superseding(self, message_id: str) -> None:
        self._superseding.append(message_id)
        if self._checking:
            return  # judged once the check under way has answered
        self._checking, self._superseding = self._superseding, []
        check = steps.store_write(
            activity_io.HELD_MESSAGES,
            activity_io.HeldMessagesInput(chat_id=self.state.chat_id, message_ids=self._checking),
            activity_io.HeldMessagesResult,
            summary="is the newer message a retry?",
            patient=True,
        )
        self.inputs.watch(check, self._superseding_checked)

    def _superseding_checked(self, check: asyncio.Future[Any]) -> None:
        held = set(check.result().held)
        self.inbox.drop(held)  # a client's late retry of a message the chat holds
        asked, self._checking = self._checking, []
        if any(i not in held for i in asked) and supersedes(self):
            self.end_by_user(Reason.SUPERSEDED)
        later, self._superseding = self._superseding, []
        for message_id in later:
            if supersedes(self):
                self.check_superseding(message_id)

    # -- the run ----------------------------------------------------------------------------
    async def run(self, input: ChatTurnInput) -> TurnState:
        current = workflow.info().typed_search_attributes
        if current.get(CHAT_ID_ATTR) == self.state.chat_id and current.get(TURN_STATUS_ATTR) == "running":
            self._upserted = (TurnStatus.RUNNING, None)  # our client sets them at start
        else:
            self.upsert()  # an operator's signal-with-start does not
        if input.recovery is not None:
            await self._recover(input.recovery)
        elif input.carry_on is not None:
            await self._carry_on(input.carry_on)
        elif await self._first_message():
            await self._turn_loop(step=0)
        elif self._stopped_by_parent() and self.inbox.waiting:
            # Stopped before its first step: its chat still holds its task, and how it ended.
            self.end_by_user(Reason.STOPPED)
            self.inbox.in_flight = self.inbox.take()
            await self._end()
        else:
            self.state.status = TurnStatus.COMPLETED
        await self._quiet()
        if self._turn_taken and (report := self.delegations.report()) is not None:
            await self.store.write(activity_io.REPORT_TO_PARENT, report, patient=True)  # a background answer
        self.upsert()  # a run that began no turn ends listed as it ended
        if self._turn_taken and self.state.status not in OPEN_STATUSES:
            metrics.turn_ended(workflow.metric_meter(), self.state.status, self.state.reason)
        if self.inbox.waiting:
            # What this turn did not take is the next turn, in order; a new turn starts
            # on the current build (a versioned worker pins a run to the one it began on).
            link = self.delegations.link
            next_turn = ChatTurnInput(chat_id=self.state.chat_id, pending=self.inbox.waiting, parent=link)
            workflow.continue_as_new(
                next_turn,
                task_timeout=TURN_TASK_TIMEOUT,
                initial_versioning_behavior=ContinueAsNewVersioningBehavior.AUTO_UPGRADE,
            )
        return self.query()

    async def _first_message(self) -> bool:
        idle = asyncio.ensure_future(asyncio.sleep(IDLE_TIMEOUT.total_seconds()))
        self.inputs.watch(idle)
        await self.until(
            lambda: bool(self.inbox.waiting) or idle in self.inputs.ended or self.inputs.cancel_requested
        )
        idle.cancel()
        return bool(self.inbox.waiting) and not self.inputs.cancel_requested

    async def _quiet(self) -> None:
        """Take what came meanwhile; announce every refusal before the run ends."""
        while self.inputs.items or self.store.announcing or self._checking:
            self.take(await self.inputs.next())

    async def _recover(self, start: RecoveryStart) -> None:
        """A run started by the reconciler, or handed on by a long gate: adopt the turn, ask its user."""
        adopted = await self._adopt(start.turn)
        # A gate handed on by a long run (continue-as-new) was counted where it opened.
        self._count_gate = workflow.info().continued_run_id is None
        self.state.recovery_id, self.state.attempts = start.recovery_id, start.attempts
        approvals_only = start.reason == Reason.APPROVAL_REQUIRED and bool(start.approvals)
        goes_on = (
            approvals_only or await self._gate(start.reason, start.can_continue, start.detail) == CONTINUE
        )
        if goes_on and start.approvals:
            self.held = list(start.approvals)
            goes_on = await self._approval()
        if goes_on:
            await self._turn_loop(step=adopted.next_step)

    async def _carry_on(self, carry: CarryOn) -> None:
        """A running turn handed on between steps: adopt it and take its next step."""
        self.state = carry.state.model_copy(update={"chat_id": self.state.chat_id})
        await self._adopt(carry.state.turn)
        await self._turn_loop(step=carry.step)

    async def _adopt(self, turn: int) -> activity_io.AdoptTurnResult:
        self.state.turn, self._turn_taken, self.under_way = turn, True, True
        arg = activity_io.AdoptTurnInput(chat_id=self.state.chat_id, turn=turn, run_id=workflow.info().run_id)
        adopted = await self.store.write(activity_io.ADOPT_TURN, arg, activity_io.AdoptTurnResult)
        self.settings, self.settings_known = adopted.settings, True
        return adopted

    # -- the loop -----------------------------------------------------------------------------
    async def _turn_loop(self, step: int) -> None:
        # Messages handed to a model call stay ours until it succeeds: a lost call may
        # not have committed them (the store's commit is idempotent).
        self.inbox.in_flight = self.inbox.take()
        self.under_way = True  # messages taken: a Stop has a turn to stop, numbered or not yet
        after_loss = False
        while True:
            outcome = await self._model_step(step, after_loss)
            if outcome in (ENDED, NO_TURN):
                if outcome == ENDED:
                    await self._end()
                return
            if isinstance(outcome, step_errors.Lost):
                if outcome.committed:
                    self.inbox.in_flight = []
                if await self._gate(outcome.reason, outcome.can_continue, outcome.detail) != CONTINUE:
                    return
                # A new step: the lost one may have written tool calls that never ran;
                # they are answered as interrupted, never replaced.
                step, after_loss = step + 1, True
                continue
            assert isinstance(outcome, ModelReply)
            after_loss = False
            if outcome.is_final:
                resumed = self.state.status == TurnStatus.RESUMING
                recovery.finish(self.state)
                if resumed:
                    await self._finish()  # recovered/continued
                else:
                    self.upsert()  # the model call closed the turn in the store
                return
            self.held = [c for c in outcome.tool_calls if c.name in self.settings.confirm_tools]
            free = [c for c in outcome.tool_calls if c not in self.held]
            if free and not await self._tools(free):
                return
            step += 1
            if self.held and not await self._approval():
                return
            # A newer message under its retry check is no follow-up yet: the check decides.
            await self.until(lambda: not self._checking)
            if await self._ended():
                return
            self._hand_on_if_long(step)
            self.inbox.in_flight = self.inbox.take()

    async def _model_step(self, step: int, after_loss: bool) -> ModelReply | step_errors.Lost | Flow:
        resuming = self.state.status == TurnStatus.RESUMING
        if sum(map(wire_size, self.inbox.in_flight)) > CHUNK_BYTES:
            # Too much for one activity input: committed first, in chunks.
            if not await self._ensure_turn():
                return NO_TURN
            for chunk in chunks(self.inbox.in_flight):
                arg = activity_io.CommitMessagesInput(
                    **self._at(), messages=chunk, answer_lost_calls=after_loss
                )
                await self.store.write(activity_io.COMMIT_MESSAGES, arg, list[str])
                self.inbox.in_flight = self.inbox.in_flight[len(chunk) :]
        shutdowns = 0
        while True:
            # The log's order: a subagent's gate shown or gone, then the answer.
            await self.until(self.store.states_written)
            if self.ending is not None:
                return ENDED
            call = steps.model_call(
                activity_io.ModelCallInput(
                    **self._at(),
                    step=step,
                    new_messages=self.inbox.in_flight,
                    closes_turn=not resuming,
                    answer_lost_calls=after_loss,
                    begins_turn=not self.state.turn,
                    subagent=self.delegations.link,
                )
            )
            self.under_way = self._call_running = True
            await self.wait([call])
            self._call_running = False
            try:
                result = call.result()
            except (ActivityError, asyncio.CancelledError) as err:
                if self.ending is not None:
                    return ENDED
                kind = step_errors.error_type(err)
                if kind == activity_io.WORKER_SHUTDOWN_ERROR:
                    shutdowns += 1
                    if shutdowns < MAX_SHUTDOWN_RESCHEDULES:
                        continue  # nothing happened outside: the next worker takes it
                elif kind == activity_io.STORE_UNAVAILABLE_ERROR:  # raised before the provider was asked
                    await self.store.wait_out(step_errors.failure_text(err))
                    continue
                return step_errors.lost_model_call(err)
            self.store.answered()
            if result.began is not None:
                self._begun(result.began)
            if result.reply is None:
                return NO_TURN
            self.inbox.in_flight = []  # committed by the call
            if not result.recorded:
                final = result.reply.is_final and not resuming
                record = activity_io.RecordAssistantInput(
                    **self._at(), step=step, reply=result.reply, final=final
                )
                await self.store.write(activity_io.RECORD_ASSISTANT, record)
            # Stop, Dismiss or a newer message judged meanwhile: the reply stands in the
            # store, and the turn ends as its user said.
            return ENDED if self.ending is not None else result.reply

    def _begun(self, began: activity_io.BeginTurnResult) -> None:
        self.settings, self.settings_known = began.settings, True
        for message in self.inbox.in_flight:
            if message.message_id in began.oversized_ids:
                refuse_message(self, message.message_id, too_large(message, began.settings.max_message_bytes))
        left_out = set(began.duplicate_ids) | set(began.oversized_ids)
        self.inbox.in_flight = [m for m in self.inbox.in_flight if m.message_id not in left_out]
        if began.turn is None:  # every message was one the chat holds, or refused: no turn
            self.state.turn = began.latest_turn
            if self.ending is None:
                self.state.status = TurnStatus.COMPLETED
            return
        self.state.turn, self._turn_taken = began.turn, True

    async def _ensure_turn(self, create: bool = True) -> bool:
        """The turn's number, when the call that took it was lost or cancelled first."""
        if self.state.turn and self._turn_taken:
            return True
        # With no message in hand (the lost call committed them), only the turn it began is asked for.
        arg = activity_io.BeginTurnInput(
            chat_id=self.state.chat_id,
            run_id=workflow.info().run_id,
            only_existing=not create or not self.inbox.in_flight,
            message_ids=[m.message_id for m in self.inbox.in_flight],
            message_sizes=[len(m.text.encode()) for m in self.inbox.in_flight],
        )
        began = await self.store.write(activity_io.BEGIN_TURN, arg, activity_io.BeginTurnResult)
        self._begun(began)
        return began.turn is not None

    async def _tool_step(self, calls: list[ToolCall], approved: bool = False) -> Reason | Flow | None:
        """Run the model's tool calls in parallel: the reason for a gate if one was lost,
        ENDED when the turn's user ended it meanwhile. A call refused for a store
        outage before it acted runs again once the store is back."""
        todo = list(zip(calls, recovery.show_running(self.state, calls), strict=False))
        lost: list[Reason] = []
        self.delegations.begin_step()
        while True:
            handles = []
            for call, view in todo:
                view.status = ToolCallStatus.RUNNING
                if call.name == DELEGATE_TOOL and self.settings.subagents is not None:
                    handle = self.delegations.call(call)
                else:
                    link = self.delegations.link
                    arg = activity_io.ToolCallInput(**self._at(), call=call, approved=approved, subagent=link)
                    handle = steps.tool_call(arg)
                self.inputs.watch(handle, partial(_show_result, view=view))  # shown as each ends
                handles.append(handle)
            await self.wait(handles)
            again = []
            for (call, view), handle in zip(todo, handles, strict=False):
                outcome = await self._tool_outcome(call, view, handle)
                if outcome == AGAIN:
                    again.append((call, view))
                elif isinstance(outcome, Reason):
                    lost.append(outcome)
            if self.ending is not None:
                return ENDED
            if not again:
                break
            await self.store.wait_out("a tool could not record its start")
            todo = again
        # A call that may have acted says more than one that never ran.
        return next(
            (r for r in (Reason.TOOL_STATE_UNKNOWN, Reason.RESTART_REQUIRES_CONFIRMATION) if r in lost), None
        )

    async def _tool_outcome(
        self, call: ToolCall, view: ToolCallView, handle: asyncio.Future[activity_io.ToolCallResult]
    ) -> Reason | Flow | None:
        try:
            result = handle.result()
        except (ActivityError, asyncio.CancelledError) as err:
            refused = step_errors.error_type(err) == activity_io.STORE_UNAVAILABLE_ERROR
            if refused and self.ending is None:
                view.status = ToolCallStatus.PENDING
                return AGAIN  # it never acted: its start could not be recorded
            # It may or may not have acted: never run again. A result it recorded stands.
            view.status = ToolCallStatus.INTERRUPTED
            unstarted = refused or step_errors.never_started(err)
            text = rows.UNSTARTED_TOOL_TEXT if unstarted else rows.INTERRUPTED_TOOL_TEXT
            await self._record_tool(call, "interrupted", text)
            return Reason.RESTART_REQUIRES_CONFIRMATION if unstarted else Reason.TOOL_STATE_UNKNOWN
        if not result.recorded:
            await self._record_tool(call, result.status, result.content)
        return None

    async def _record_tool(self, call: ToolCall, status: str, content: str) -> None:
        arg = activity_io.RecordToolResultInput(
            **self._at(), tool_call_id=call.id, name=call.name, status=status, content=content
        )
        await self.store.write(activity_io.RECORD_TOOL_RESULT, arg)

    # -- gates ------------------------------------------------------------------------------
    async def _gate(self, reason: Reason, can_continue: bool = True, detail: str | None = None) -> Flow:
        """Wait for the user's decision: CONTINUE (resuming) or ENDED."""
        if await self._ended():
            return ENDED
        if not await self._ensure_turn():
            return ENDED
        opened = self.state.model_copy(deep=True)
        recovery.open_gate(opened, reason, str(workflow.uuid4()), can_continue)
        opened.detail = detail
        # Persist, then announce: decisions are taken against the gate once it is written.
        written = await self.store.write_turn(activity_io.UpdateTurnInput.of(opened))
        if await self._ended():
            return ENDED
        if not written.written:
            return await self._store_ended(written)
        # Inputs taken while the gate was written changed the rest of the state: keep it.
        for name in ("status", "reason", "recovery_id", "can_continue", "detail"):
            setattr(self.state, name, getattr(opened, name))
        self.decided = False
        self.upsert()
        self.delegations.tell_parent()
        ask = f"Continue or Dismiss with recovery id {opened.recovery_id}."
        workflow.set_current_details(f"Waiting for the user: {reason.value}. {ask}")
        if self._count_gate:
            metrics.gate_opened(workflow.metric_meter(), reason.value)
        self._count_gate = True
        while not self.decided and self.ending is None:
            self._hand_on_if_long()
            self.take(await self.inputs.next())
        workflow.set_current_details("")
        if await self._ended():
            return ENDED
        self.delegations.tell_parent()
        written = await self.store.write_turn(activity_io.UpdateTurnInput.of(self.state))
        if not written.written:
            return await self._store_ended(written)
        self.decided = False
        self.upsert()
        return CONTINUE

    async def _store_ended(self, written: activity_io.TurnWriteResult) -> Flow:
        """The store had ended the turn (a lost call committed its final answer): its
        ending stands. What the lost call held goes to the next turn unless the store has it."""
        self.state.status, self.state.reason, self.state.approvals = written.status, written.reason, []
        await self._return_unstored()
        self.upsert()
        return ENDED

    async def _approval(self) -> bool:
        """The held calls wait for approval, then run once. True when the turn goes on."""
        recovery.ask_approval(self.state, self.held)
        if await self._gate(Reason.APPROVAL_REQUIRED) != CONTINUE:
            return False
        calls, self.held, self.state.approvals = self.held, [], []
        return await self._tools(calls, approved=True)

    async def _tools(self, calls: list[ToolCall], approved: bool = False) -> bool:
        """The tool step, then a gate if a call was lost. True when the turn goes on."""
        lost = await self._tool_step(calls, approved)
        if await self._ended():  # the step returns ENDED then
            return False
        return not isinstance(lost, Reason) or await self._gate(lost) == CONTINUE

    # -- endings --------------------------------------------------------------------------------
    async def _ended(self) -> bool:
        """The turn's user ended it: it is closed now."""
        if self.ending is None:
            return False
        await self._end()
        return True

    async def _end(self) -> None:
        """Stop, Dismiss or a newer message ended the turn: keep what is known, add one
        closing row. Dismiss commits the follow-ups pending when it came as user rows;
        every other message becomes the next turn, in order."""
        reason = self.ending or Reason.STOPPED
        if not await self._ensure_turn(create=self._stopped_by_parent()):
            self.inbox.return_in_flight()  # no call of this run began a turn: nothing to close
            return
        await self._return_unstored()
        denied = bool(self.held) and reason == Reason.DISMISSED
        if self.held:
            # Held calls never ran: each gets its row (the closing write would call them interrupted).
            held, self.held = self.held, []
            recovery.refuse_held(self.state, held)
            for call in held:
                await self._record_tool(
                    call, "error", rows.DENIED_TOOL_TEXT if denied else rows.UNAPPROVED_TOOL_TEXT
                )
        commit: list[UserMessage] = []
        if reason == Reason.DISMISSED:
            commit = self.inbox.pull(self.dismissed)
        elif self._stopped_by_parent():  # its task is no next turn: the transcript keeps it
            commit = self.inbox.pull({self.delegations.task_id()})
        await self._finish(rows.closing_text(reason, denied), commit)

    def _stopped_by_parent(self) -> bool:
        """A subagent's run cancelled: its parent's turn ended (Stop, Dismiss, a newer message)."""
        return self.delegations.link is not None and self.inputs.cancel_requested

    async def _finish(self, closing_text: str | None = None, commit: list[UserMessage] | None = None) -> None:
        await self.until(self.store.states_written)
        update = activity_io.UpdateTurnInput.of(self.state)
        update.closing_text, update.commit_messages = closing_text, commit or []
        written = await self.store.write_turn(update, activity_io.FINISH_TURN)
        if not written.written:  # a persisted completion wins
            self.state.status, self.state.reason = written.status, written.reason
        self.upsert()

    def _at(self) -> dict[str, Any]:
        """The chat and turn every step and write names."""
        return {"chat_id": self.state.chat_id, "turn": self.state.turn}

    async def _return_unstored(self) -> None:
        """Messages a lost call held go back to the inbox, for the next turn, unless
        the store holds them: the call may have committed them."""
        if self.inbox.in_flight:
            ids = [m.message_id for m in self.inbox.in_flight]
            arg = activity_io.HeldMessagesInput(chat_id=self.state.chat_id, message_ids=ids)
            held = await self.store.write(activity_io.HELD_MESSAGES, arg, activity_io.HeldMessagesResult)
            self.inbox.in_flight = [m for m in self.inbox.in_flight if m.message_id not in held.held]
        self.inbox.return_in_flight()

    def upsert(self) -> None:
        """The search attributes say what `state` shows."""
        status, reason = (shown := recovery.shown(self.state)).status, shown.reason
        if self._upserted == (status, reason):
            return
        self._upserted = (status, reason)
        workflow.upsert_search_attributes(search_attributes.of_turn(self.state.chat_id, status, reason))

    # -- long histories: a fresh run of the same turn -------------------------------------------
    def _quiet_now(self) -> bool:
        taking = self.inputs.items or self.store.announcing or self._checking or self._superseding
        return not (taking or self.ending or self.decided)

    def _hand_on_if_long(self, step: int | None = None) -> None:
        """A long history goes on in a fresh run of the same turn: between steps
        (`step`) as a carried-on turn, at a gate as the same gate."""
        info = workflow.info()
        if not long_history.too_long(info.get_current_history_length(), info.is_continue_as_new_suggested()):
            return
        if not self._quiet_now() or (step is not None and self.held):
            return
        if step is None:
            self.inbox.return_in_flight()
        next_run = long_history.next_run(
            self.state, self.inbox.waiting, self.delegations.link, step=step, held=self.held
        )
        workflow.continue_as_new(next_run, task_timeout=TURN_TASK_TIMEOUT)


def _show_result(handle: asyncio.Future[Any], view: ToolCallView) -> None:
    """A finished call shows in `state` at once, while its siblings still run."""
    if not handle.cancelled() and handle.exception() is None:
        view.status = ToolCallStatus.DONE if handle.result().status == "done" else ToolCallStatus.ERROR
