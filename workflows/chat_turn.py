"""`ChatTurn`: one run per chat turn, workflow id `chat-<chat_id>`.

The turn loop: model call -> tool calls -> model call ... -> final answer. Each
model and tool call is an activity that is never retried by Temporal: a lost
step opens a gate and the turn waits, visibly, for its user's Continue or
Dismiss. Follow-up messages join the turn at the next model call; whatever the
turn did not consume is handed to the next run of the same workflow id.

`ChatTurn` drives; the modules beside it decide: `turn_start` (how a run begins
or adopts its turn), `gate` (gates and the user's decisions), `intake` (which
messages are taken), `approval` (calls held for the user's approval),
`tool_outcomes` (what a tool call leaves), `turn_persistence` (store calls and
announcements), `activity_calls` (how activities are called), `recovery` (the
rules), `patches` and `patch_flags` (what older runs replay as they were).
"""
from __future__ import annotations

import asyncio
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    # Passed through: re-importing pydantic models in every run's sandbox is slow.
    from turnkeeper import activity_io
    from turnkeeper import metrics
    from turnkeeper.models import (
        OPEN_STATUSES,
        TURN_TASK_TIMEOUT,
        ChatTurnInput,
        ModelReply,
        NewEvent,
        Reason,
        RecoveryAction,
        ToolCall,
        ToolCallStatus,
        ToolCallView,
        TurnState,
        TurnStatus,
        UserMessage,
    )
    from turnkeeper.workflows import recovery
    from turnkeeper.workflows.activity_calls import error_type, failure_text, start_model_call, start_tool_call
    from turnkeeper.workflows.inbox import CHUNK_BYTES, Inbox, chunks, wire_size
    from turnkeeper.workflows.patch_flags import PatchFlags
    from turnkeeper.workflows.patches import REFUSE_UNDECODABLE
    from turnkeeper.workflows.payloads import decode_payload, readable
    from turnkeeper.workflows.recovery import Input
    from turnkeeper.workflows.tool_outcomes import ToolOutcomes, show_result
    from turnkeeper.workflows.turn_persistence import STORE_WAIT_FIRST_S
    from turnkeeper.workflows.turn_start import TurnStart

# A model call cut off by a graceful shutdown is scheduled again this many times.
MAX_SHUTDOWN_RESCHEDULES = 5


class _Cancelled(Exception):
    """Stop, Dismiss or a message that superseded the gate cancelled the running step."""


class _Interrupted(Exception):
    """A step was lost; carries the reason the gate opens with."""

    def __init__(self, reason: Reason, committed: bool = False, can_continue: bool = True,
                 detail: str | None = None) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.committed = committed  # the call's messages are in the store for sure
        self.can_continue = can_continue
        self.detail = detail


@workflow.defn(name="ChatTurn")
class ChatTurn(TurnStart, ToolOutcomes, PatchFlags):
    @workflow.init
    def __init__(self, input: ChatTurnInput) -> None:
        self._state = TurnState(chat_id=input.chat_id)
        self._inbox = Inbox()
        self._events: list[NewEvent] = []  # announced at the next boundary
        self._settings = activity_io.TurnSettings()
        self._settings_known = False
        self._decision: recovery.Action | None = None
        self._decision_id: str | None = None
        self._interrupt: Reason | None = None  # Stop, Dismiss, or a message that supersedes a gate
        self._superseding: list[str] = []  # ids received at a gate, to check against the store
        self._dismissed_pending: set[str] = set()  # pending when Dismiss cancelled a continuation
        self._store_wait_s = STORE_WAIT_FIRST_S
        self._event_keys_seen: dict[str, int] = {}  # how often this run announced each event
        self._ask_patches()
        self._signalled: list[tuple[recovery.Action, str | None]] = []  # judged at the next wait point
        self._held: list[ToolCall] = []  # calls waiting for the user's approval
        self._numbering = False  # the store is numbering this run's turn (machine 6)
        self._stop_while_numbering = False  # judged once the turn has its number
        # Until a turn begins no step announces events: refusals are announced by a task of their own.
        self._before_turn = input.recovery is None and input.carry_on is None
        self._idle_refusals: asyncio.Task[None] | None = None
        self._turn_taken = False  # this run began or adopted a turn: its end is counted here
        for message in input.pending:
            self._inbox.offer(message)

    # -- handlers: they only change state; `run` acts on it -------------------
    @workflow.signal(name="user_message")
    def user_message(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        self._take_message(payload)

    @workflow.signal(name="stop")
    def stop(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        # Whatever it carries: Stop needs no argument.
        if not readable(payload) and not (self._complete or workflow.patched(REFUSE_UNDECODABLE)):
            return  # earlier runs never saw such a signal
        if self._numbering:
            # Before or after the store call's result, as the SDK hands them over:
            # either way the turn being numbered stops (patches.RECOVERY_MACHINE_6).
            self._stop_while_numbering = True
            return
        self._take_stop()

    def _take_stop(self) -> None:
        if self._state.turn and recovery.decide(self._state.status, Input.STOP).accepted:
            self._interrupt = Reason.STOPPED  # the user's explicit word wins

    @workflow.signal(name="continue")
    def continue_signal(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        self._act_by_signal("continue", payload)

    @workflow.signal(name="dismiss")
    def dismiss_signal(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        self._act_by_signal("dismiss", payload)

    # Raw payloads: a malformed one is rejected with words, never a converter's traceback.
    @workflow.update(name="continue_turn")
    async def continue_turn(self, payload: RawValue = None) -> TurnState:  # type: ignore[assignment]
        return await self._act_by_update("continue", RecoveryAction.model_validate(decode_payload(payload)).recovery_id)

    @continue_turn.validator
    def _validate_continue(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        self._validate("continue", payload)

    @workflow.update(name="dismiss_turn")
    async def dismiss_turn(self, payload: RawValue = None) -> TurnState:  # type: ignore[assignment]
        return await self._act_by_update("dismiss", RecoveryAction.model_validate(decode_payload(payload)).recovery_id)

    @dismiss_turn.validator
    def _validate_dismiss(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        self._validate("dismiss", payload)

    @workflow.query(name="state")
    def state(self) -> TurnState:
        return self._state.model_copy(update={"pending_followups": self._inbox.ids()})

    # -- the turn ------------------------------------------------------------
    @workflow.run
    async def run(self, input: ChatTurnInput) -> TurnState:
        if not input.chat_id.strip():
            raise ApplicationError("chat_id must not be empty", non_retryable=True)
        if not self._search_attributes_current():
            self._upsert_search_attributes()
        if input.recovery is not None:
            await self._recover(input.recovery)
        elif input.carry_on is not None:
            await self._carry_on(input.carry_on)
        else:
            while await self._wait_for_first_message():
                begun = await self._begin()
                if begun == "begun":
                    self._turn_taken = True
                    await self._turn_loop(step=0, batch=self._inbox.take())
                if begun != "refused":
                    break
                # Every message was over the configured limit: refused, and the run
                # waits for a message it can take, as it does after any refusal.
                await self._flush_events()
                self._before_turn = True
        if self._turn_taken and self._state.status not in OPEN_STATUSES:
            # Where the turn ends; a replay records nothing (the SDK's workflow meter).
            reason = self._state.reason.value if self._state.reason else None
            metrics.turn_ended(workflow.metric_meter(), self._state.status.value, reason)
        while True:
            # Woken by a store call's result, the run reads nothing signals left until
            # an event wakes it: live, the SDK may have applied signals that its replay
            # applies only after that result (patches.RECOVERY_MACHINE_9).
            await self._wake_on_an_event()
            self._judge_signalled()  # the turn has ended: what is left is refused, and recorded
            await self._flush_events()
            await workflow.wait_condition(workflow.all_handlers_finished)
            # Refused while the store wrote the last refusals (a store outage makes that
            # seconds): announced too, or the run would hand on without them. A run that
            # has just written them goes round once more, through `end_of_run`.
            if self._machine_8 and (self._events or self._signalled
                                    or (self._machine_9 and self._store_result_last)):
                continue
            break
        if self._inbox.waiting:
            # What this turn did not consume is the next turn, in order.
            workflow.continue_as_new(ChatTurnInput(chat_id=input.chat_id, pending=self._inbox.waiting),
                                     task_timeout=TURN_TASK_TIMEOUT)
        return self.state()

    async def _turn_loop(self, step: int, batch: list[UserMessage]) -> None:
        # Messages handed to a model call stay ours until it succeeds: a lost call
        # may not have committed them (the store's commit is idempotent).
        self._inbox.in_flight = batch
        after_loss = False
        while True:
            try:
                reply = await self._call_model(step, after_loss)
            except _Interrupted as lost:
                if lost.committed:
                    self._inbox.in_flight = []
                if await self._gate(lost.reason, can_continue=lost.can_continue, detail=lost.detail) != "continue":
                    return
                # A new step: the lost one may have written tool calls that never
                # ran; they are answered as interrupted, never replaced.
                step += 1
                after_loss = True
                continue
            except _Cancelled:
                await self._end_by_user()
                return
            self._inbox.in_flight = []
            after_loss = False
            if reply.is_final:
                resumed = self._state.status == TurnStatus.RESUMING
                recovery.finish(self._state)
                if resumed:
                    await self._finish_turn()  # recovered/continued, written here
                else:
                    self._upsert_search_attributes()  # the model activity closed the turn
                return
            free, held = self._hold(reply.tool_calls)
            lost = await self._tool_step(free) if free else None
            if lost == "ended":
                return
            step += 1
            if lost is not None and await self._gate(lost) != "continue":
                return
            if held and not await self._run_approved(held):
                return
            if self._machine_5:
                self._hand_on_if_long(step)  # returns only when it does not
            # A step that a Stop, Dismiss or newer message is about to cancel takes no
            # messages: whether one came before or after the last step's end depends
            # on how the SDK groups them (patches.RECOVERY_MACHINE_11).
            self._inbox.in_flight = [] if self._machine_11 and self._interrupt is not None else self._inbox.take()

    async def _call_model(self, step: int, after_loss: bool) -> ModelReply:
        if not self._at_wait_points:
            await self._flush_events()
        resuming = self._state.status == TurnStatus.RESUMING
        batch = self._inbox.in_flight
        if sum(map(wire_size, batch)) > CHUNK_BYTES and self._complete:
            # Too much for one activity input: committed first, in chunks, and so no
            # longer the call's to lose.
            for chunk in chunks(batch):
                await self._store_call(activity_io.COMMIT_MESSAGES, activity_io.CommitMessagesInput(
                    chat_id=self._state.chat_id, turn=self._state.turn, messages=chunk,
                    answer_lost_calls=after_loss), list[str])
                self._inbox.in_flight = self._inbox.in_flight[len(chunk):]
        shutdowns = 0
        while True:
            if self._interrupt is not None and not self._at_wait_points:
                raise _Cancelled()  # later runs: `_settle` cancels the call it has just started
            handle = start_model_call(
                activity_io.ModelCallInput(chat_id=self._state.chat_id, turn=self._state.turn, step=step,
                                           new_messages=self._inbox.in_flight, closes_turn=not resuming,
                                           answer_lost_calls=after_loss),
                self._settings)
            if await self._settle([handle]):
                raise _Cancelled()
            try:
                result = await handle
            except ActivityError as err:
                kind = error_type(err)
                if kind == activity_io.WORKER_SHUTDOWN_ERROR:
                    shutdowns += 1
                    if shutdowns < MAX_SHUTDOWN_RESCHEDULES:
                        continue  # nothing happened outside: the next worker takes it
                    raise _Interrupted(Reason.RESTART_REQUIRES_CONFIRMATION) from None
                if kind == activity_io.STORE_UNAVAILABLE_ERROR:
                    await self._wait_for_store(failure_text(err))  # raised before the provider was asked
                    continue
                if kind == activity_io.MODEL_FAILED_ERROR:
                    # Raised after the activity committed the messages.
                    raise _Interrupted(Reason.MODEL_FAILED, committed=True, detail=failure_text(err)) from None
                if kind == activity_io.CHECKPOINT_INVALID_ERROR:
                    raise _Interrupted(Reason.CHECKPOINT_INVALID, can_continue=False,
                                       detail=failure_text(err)) from None
                raise _Interrupted(Reason.RESTART_REQUIRES_CONFIRMATION) from None
            self._store_answers()
            if not result.recorded:
                await self._store_call(activity_io.RECORD_ASSISTANT, activity_io.RecordAssistantInput(
                    chat_id=self._state.chat_id, turn=self._state.turn, step=step, reply=result.reply,
                    final=result.reply.is_final and not resuming))
            return result.reply

    async def _tool_step(self, calls: list[ToolCall], approved: bool = False) -> Reason | None | Literal["ended"]:
        """`_run_tools`; "ended" when Stop, Dismiss or a newer message ended the turn meanwhile."""
        try:
            return await self._run_tools(calls, approved)
        except _Cancelled:
            await self._end_by_user()
            return "ended"

    async def _run_tools(self, calls: list[ToolCall], approved: bool = False) -> Reason | None:
        """Run the model's tool calls in parallel; the reason to stop, if any was lost.
        Raises `_Cancelled` after Stop, Dismiss or a superseding message, once every
        call has either finished or been marked interrupted. A call refused for a
        store outage before it acted runs again once the store is back."""
        shown = {v.id: v for v in self._state.tool_calls}  # approved calls showed as pending
        views = [shown.get(c.id) or ToolCallView(id=c.id, name=c.name, status=ToolCallStatus.RUNNING)
                 for c in calls]
        self._state.tool_calls.extend(v for v in views if v.id not in shown)
        for view in views:
            view.status = ToolCallStatus.RUNNING
        todo = list(zip(calls, views))
        lost: list[Reason | None] = []
        while True:
            handles = [start_tool_call(activity_io.ToolCallInput(chat_id=self._state.chat_id, turn=self._state.turn,
                                                                 call=call, approved=approved), self._settings)
                       for call, _ in todo]
            for handle, (_, view) in zip(handles, todo):
                handle.add_done_callback(lambda h, v=view: show_result(h, v))
            cancelled = await self._settle(handles, finished_stands=not self._machine_4)
            again: list[tuple[ToolCall, ToolCallView]] = []
            for (call, view), handle in zip(todo, handles):
                outcome = await self._tool_outcome(call, view, handle, may_run_again=not cancelled)
                if outcome == "again":
                    again.append((call, view))
                else:
                    lost.append(outcome)
            if cancelled:
                raise _Cancelled()
            if not again:
                break
            await self._wait_for_store("a tool could not record its start")
            todo = again
        if Reason.TOOL_STATE_UNKNOWN in lost:
            return Reason.TOOL_STATE_UNKNOWN
        if Reason.RESTART_REQUIRES_CONFIRMATION in lost:
            return Reason.RESTART_REQUIRES_CONFIRMATION
        return None

    async def _settle(self, handles: list[workflow.ActivityHandle[Any]], finished_stands: bool = True) -> bool:
        """Wait for the step; on Stop, Dismiss or a superseding message cancel what
        still runs and wait for it to stop. True when the step was cancelled, or
        (`finished_stands` false) when it finished anyway after the cancel."""
        while True:
            await workflow.wait_condition(
                lambda: all(h.done() for h in handles) or self._interrupt is not None
                or (self._at_wait_points and bool(self._events)) or bool(self._signalled))
            if all(h.done() for h in handles):
                self._woke_at_store_calls = self._store_calls
                self._store_result_last = False
                return False
            self._judge_signalled()
            if self._interrupt is None:
                await self._flush_events()  # refusals, announced while the step runs
                continue
            if await self._interrupt_stands():
                break
        for h in handles:
            h.cancel()
        await asyncio.gather(*handles, return_exceptions=True)
        if not finished_stands:
            # Tools that finished anyway keep their results, and the turn ends here:
            # a model call started now would only be cancelled, after a store check
            # racing it in the same workflow task.
            return True
        # A model call that finished anyway (its answer raced the cancel) stands.
        return not all(not h.cancelled() and h.exception() is None for h in handles)
