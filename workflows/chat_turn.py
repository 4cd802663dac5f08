"""`ChatTurn`: one run per chat turn, workflow id `chat-<chat_id>`.

The turn loop: model call -> tool calls -> model call ... -> final answer. Each
model and tool call is an activity that is never retried by Temporal: a lost
step opens a gate and the turn waits, visibly, for its user's Continue or
Dismiss. Follow-up messages join the turn at the next model call; whatever the
turn did not consume is handed to the next run of the same workflow id.
"""
from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.workflow import ActivityCancellationType
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    TimeoutError as TemporalTimeoutError,
    TimeoutType,
)

with workflow.unsafe.imports_passed_through():
    # Passed through: re-importing pydantic models in every run's sandbox is slow.
    from pydantic import ValidationError

    from turnkeeper import activity_io as io
    from turnkeeper.models import (
        DISMISSED_TEXT,
        INTERRUPTED_TOOL_TEXT,
        STOPPED_TEXT,
        SUPERSEDED_TEXT,
        TURN_TASK_TIMEOUT,
        UNSTARTED_TOOL_TEXT,
        ChatTurnInput,
        RecoveryStart,
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
    from turnkeeper.workflows.inbox import CHUNK_BYTES, Inbox, chunks, wire_size
    from turnkeeper.workflows.recovery import Effect, Input
    from turnkeeper.workflows.payloads import Undecodable, decode_payload, first_error, message_id_of, readable
    from turnkeeper.workflows.turn_persistence import STORE_WAIT_FIRST_S, TurnPersistence, error_type, failure_text


NO_RETRY = RetryPolicy(maximum_attempts=1)
# A run started without a message (e.g. `temporal workflow start`) waits this long.
IDLE_TIMEOUT = timedelta(minutes=10)
# A model call cut off by a graceful shutdown is scheduled again this many times.
MAX_SHUTDOWN_RESCHEDULES = 5
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024
# Before the worker's configuration reaches a new run (with its first store call),
# messages up to this size are taken and then judged against the configured limit.
MESSAGE_BYTES_CEILING = 1024 * 1024
# A gate whose history grows this long (refused signals, say) hands itself on to a
# fresh run of the same turn, long before Temporal's own limits.
GATE_HISTORY_EVENTS = 10_000
# Patch ids: behaviour that running turns recorded without must replay as it was.
REFUSE_UNDECODABLE = "refuse-undecodable-user-message"
ANNOUNCE_IDLE_REFUSALS = "announce-refusals-while-idle"
# One patch for the complete recovery machine: the recovery id kept until the turn
# ends, Dismiss while resuming, updates answered within a bound, the bounded inbox
# and its chunked commits, the configured limit for a run's first message, long
# gates handed on. Asked once, in the run's first activation: a patch first asked
# later (after a local activity) can land in another workflow task on replay than
# it did live. Runs that have it take the earlier patches' behaviour as given
# and never ask for those.
COMPLETE_MACHINE = "complete-recovery-machine"
# Asked in the first activation, like COMPLETE_MACHINE. Runs that have it:
# - answer updates with the state their decision leads to in the task that takes
#   them, not once the gate has written it (a store outage holds the turn, never
#   the user's answer);
# - act on what signals leave (refusals to announce, Stop, a newer message) only
#   while they wait for a step or a decision, never on the way from one store call
#   to the next: the SDK can hand a local activity's result to the workflow
#   together with a signal that came later, and a replay then sees the two apart.
WAIT_POINTS = "act-at-wait-points"


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
class ChatTurn(TurnPersistence):
    @workflow.init
    def __init__(self, input: ChatTurnInput) -> None:
        self._state = TurnState(chat_id=input.chat_id)
        self._inbox = Inbox()
        self._events: list[NewEvent] = []  # announced at the next boundary
        self._settings = io.TurnSettings()
        self._settings_known = False
        self._decision: recovery.Action | None = None
        self._decision_id: str | None = None
        self._interrupt: Reason | None = None  # Stop, Dismiss, or a message that supersedes a gate
        self._superseding: list[str] = []  # ids received at a gate, to check against the store
        self._dismissed_pending: set[str] = set()  # pending when Dismiss cancelled a continuation
        self._store_wait_s = STORE_WAIT_FIRST_S
        self._complete = workflow.patched(COMPLETE_MACHINE)
        self._at_wait_points = self._complete and workflow.patched(WAIT_POINTS)
        # Until a turn begins no step announces events: refusals are announced by a task of their own.
        self._before_turn = input.recovery is None
        self._idle_refusals: asyncio.Task[None] | None = None
        for message in input.pending:
            self._inbox.offer(message)

    def _apply_settings(self, settings: io.TurnSettings) -> None:
        self._settings = settings
        self._settings_known = True

    # -- handlers: they only change state; `run` acts on it -------------------
    @workflow.signal(name="user_message")
    def user_message(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        # Raw, so that a payload the converter cannot decode is refused here
        # instead of being dropped by the SDK with nothing but a worker log line.
        try:
            raw = decode_payload(payload)
        except Undecodable as err:
            if self._complete or workflow.patched(REFUSE_UNDECODABLE):  # earlier runs dropped these unseen
                self._reject_message(None, f"malformed user_message payload: {err}")
            return
        try:
            message = UserMessage.model_validate(raw)
        except ValidationError as err:
            # The id, when it is readable, so a client following its own message sees the refusal.
            self._reject_message(message_id_of(raw), f"malformed user_message payload: {first_error(err)}")
            return
        size = len(message.text.encode())
        limit = self._message_limit()
        if size > limit:
            self._reject_message(message.message_id, f"message is {size} bytes; the limit is {limit}")
            return
        if self._inbox.seen(message.message_id):
            return  # the client's retry: one message
        pending = self._inbox.pending_bytes()
        if (pending + wire_size(message) > self._settings.max_pending_bytes
                and self._complete):
            self._reject_message(message.message_id, (
                f"the chat already holds {pending} bytes of messages not yet answered and this one "
                f"would pass the limit of {self._settings.max_pending_bytes}; send it again once "
                "the turn has answered"))
            return
        self._inbox.offer(message)
        if recovery.decide(self._state.status, Input.USER_MESSAGE).effect == Effect.SUPERSEDE:
            self._superseding.append(message.message_id)
            self._interrupt = self._interrupt or Reason.SUPERSEDED

    @workflow.signal(name="stop")
    def stop(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        # Whatever it carries: Stop needs no argument.
        if not readable(payload) and not (self._complete or workflow.patched(REFUSE_UNDECODABLE)):
            return  # earlier runs never saw such a signal
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
        else:
            while await self._wait_for_first_message():
                begun = await self._begin()
                if begun == "begun":
                    await self._turn_loop(step=0, batch=self._inbox.take())
                if begun != "refused":
                    break
                # Every message was over the configured limit: refused, and the run
                # waits for a message it can take, as it does after any refusal.
                await self._flush_events()
                self._before_turn = True
        await self._flush_events()
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._inbox.waiting:
            # What this turn did not consume is the next turn, in order.
            workflow.continue_as_new(ChatTurnInput(chat_id=input.chat_id, pending=self._inbox.waiting),
                                     task_timeout=TURN_TASK_TIMEOUT)
        return self.state()

    async def _wait_for_first_message(self) -> bool:
        try:
            await workflow.wait_condition(lambda: bool(self._inbox.waiting), timeout=IDLE_TIMEOUT)
        except asyncio.TimeoutError:
            self._state.status = TurnStatus.COMPLETED
            return False
        finally:
            self._before_turn = False
            if self._idle_refusals is not None:
                await self._idle_refusals  # announced before the turn's own events
        return True

    async def _begin(self) -> Literal["begun", "nothing", "refused"]:
        """Number the turn from the store and close any earlier turn left open."""
        while self._inbox.waiting:
            waiting = self._inbox.waiting
            begun: io.BeginTurnResult = await self._store_call(
                io.BEGIN_TURN,
                io.BeginTurnInput(chat_id=self._state.chat_id, run_id=workflow.info().run_id,
                                  message_ids=[m.message_id for m in waiting],
                                  message_sizes=[len(m.text.encode()) for m in waiting]),
                io.BeginTurnResult)
            self._apply_settings(begun.settings)
            for message in waiting:
                if message.message_id in begun.oversized_ids:
                    self._reject_message(message.message_id, (
                        f"message is {len(message.text.encode())} bytes; the limit is "
                        f"{begun.settings.max_message_bytes}"))
            self._inbox.drop(set(begun.duplicate_ids) | set(begun.oversized_ids))
            if begun.turn is not None:
                self._state.turn = begun.turn
                return "begun"
            self._state.turn = begun.latest_turn
            if begun.oversized_ids and not begun.duplicate_ids and not self._inbox.waiting:
                return "refused"
        # Every message was a retry of one already committed: no turn to run.
        self._state.status = TurnStatus.COMPLETED
        return "nothing"

    async def _recover(self, start: RecoveryStart) -> None:
        """A run started by the reconciler, or handed on by a long gate: take the
        turn over and ask its user."""
        adopted: io.AdoptTurnResult = await self._store_call(
            io.ADOPT_TURN,
            io.AdoptTurnInput(chat_id=self._state.chat_id, turn=start.turn, run_id=workflow.info().run_id),
            io.AdoptTurnResult)
        self._apply_settings(adopted.settings)
        self._state.turn = start.turn
        self._state.recovery_id = start.recovery_id
        self._state.attempts = start.attempts
        if await self._gate(start.reason, can_continue=start.can_continue, detail=start.detail) == "continue":
            await self._turn_loop(step=adopted.next_step, batch=self._inbox.take())

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
            try:
                lost = await self._run_tools(reply.tool_calls)
            except _Cancelled:
                await self._end_by_user()
                return
            step += 1
            if lost is not None and await self._gate(lost) != "continue":
                return
            self._inbox.in_flight = self._inbox.take()

    async def _call_model(self, step: int, after_loss: bool) -> ModelReply:
        if not self._at_wait_points:
            await self._flush_events()
        resuming = self._state.status == TurnStatus.RESUMING
        batch = self._inbox.in_flight
        if sum(map(wire_size, batch)) > CHUNK_BYTES and self._complete:
            # Too much for one activity input: committed first, in chunks, and so no
            # longer the call's to lose.
            for chunk in chunks(batch):
                await self._store_call(io.COMMIT_MESSAGES, io.CommitMessagesInput(
                    chat_id=self._state.chat_id, turn=self._state.turn, messages=chunk,
                    answer_lost_calls=after_loss), list[str])
                self._inbox.in_flight = self._inbox.in_flight[len(chunk):]
        shutdowns = 0
        while True:
            if self._interrupt is not None and not self._at_wait_points:
                raise _Cancelled()  # later runs: `_settle` cancels the call it has just started
            handle = workflow.start_activity(
                io.MODEL_CALL,
                io.ModelCallInput(chat_id=self._state.chat_id, turn=self._state.turn, step=step,
                                  new_messages=self._inbox.in_flight, closes_turn=not resuming,
                                  answer_lost_calls=after_loss),
                result_type=io.ModelCallResult, summary=f"model call {step + 1} of turn {self._state.turn}",
                **self._step_options(self._settings.model_timeout_s))
            if await self._settle([handle]):
                raise _Cancelled()
            try:
                result = await handle
            except ActivityError as err:
                kind = error_type(err)
                if kind == io.WORKER_SHUTDOWN_ERROR:
                    shutdowns += 1
                    if shutdowns < MAX_SHUTDOWN_RESCHEDULES:
                        continue  # nothing happened outside: the next worker takes it
                    raise _Interrupted(Reason.RESTART_REQUIRES_CONFIRMATION) from None
                if kind == io.STORE_UNAVAILABLE_ERROR:
                    await self._wait_for_store(failure_text(err))  # raised before the provider was asked
                    continue
                if kind == io.MODEL_FAILED_ERROR:
                    # Raised after the activity committed the messages.
                    raise _Interrupted(Reason.MODEL_FAILED, committed=True, detail=failure_text(err)) from None
                if kind == io.CHECKPOINT_INVALID_ERROR:
                    raise _Interrupted(Reason.CHECKPOINT_INVALID, can_continue=False,
                                       detail=failure_text(err)) from None
                raise _Interrupted(Reason.RESTART_REQUIRES_CONFIRMATION) from None
            self._store_answers()
            if not result.recorded:
                await self._store_call(io.RECORD_ASSISTANT, io.RecordAssistantInput(
                    chat_id=self._state.chat_id, turn=self._state.turn, step=step, reply=result.reply,
                    final=result.reply.is_final and not resuming))
            return result.reply

    async def _run_tools(self, calls: list[ToolCall]) -> Reason | None:
        """Run the model's tool calls in parallel; the reason to stop, if any was lost.
        Raises `_Cancelled` after Stop, Dismiss or a superseding message, once every
        call has either finished or been marked interrupted. A call refused for a
        store outage before it acted runs again once the store is back."""
        views = [ToolCallView(id=c.id, name=c.name, status=ToolCallStatus.RUNNING) for c in calls]
        self._state.tool_calls.extend(views)
        todo = list(zip(calls, views))
        lost: list[Reason | None] = []
        while True:
            handles = [self._start_tool(call) for call, _ in todo]
            for handle, (_, view) in zip(handles, todo):
                handle.add_done_callback(lambda h, v=view: _show_result(h, v))
            cancelled = await self._settle(handles)
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

    def _start_tool(self, call: ToolCall) -> workflow.ActivityHandle[io.ToolCallResult]:
        return workflow.start_activity(
            io.TOOL_CALL,
            io.ToolCallInput(chat_id=self._state.chat_id, turn=self._state.turn, call=call),
            result_type=io.ToolCallResult, summary=_tool_summary(call),
            **self._step_options(self._settings.tool_timeout_s))

    def _step_options(self, timeout_s: int) -> dict[str, Any]:
        """A model or tool call: never retried by Temporal, lost within seconds of its
        worker's death, and on the resume window's clock when no worker takes it."""
        return dict(
            start_to_close_timeout=timedelta(seconds=timeout_s),
            schedule_to_start_timeout=timedelta(seconds=self._settings.resume_window_s),
            heartbeat_timeout=timedelta(seconds=self._settings.heartbeat_timeout_s),
            retry_policy=NO_RETRY,
            # A cancelled call must have stopped before the turn writes its closing row.
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )

    async def _tool_outcome(self, call: ToolCall, view: ToolCallView,
                            handle: workflow.ActivityHandle[io.ToolCallResult],
                            may_run_again: bool) -> Reason | None | Literal["again"]:
        try:
            result = await handle
        except (ActivityError, asyncio.CancelledError) as err:
            refused = isinstance(err, ActivityError) and error_type(err) == io.STORE_UNAVAILABLE_ERROR
            if refused and may_run_again:
                view.status = ToolCallStatus.PENDING
                return "again"  # it never acted: its start could not be recorded
            # The tool may or may not have acted: it is never run again by us. If it
            # did record a result before it died, the store keeps that one.
            view.status = ToolCallStatus.INTERRUPTED
            never_started = refused or (isinstance(err, ActivityError)
                                        and _timeout_type(err) == TimeoutType.SCHEDULE_TO_START)
            await self._store_call(
                io.RECORD_TOOL_RESULT,
                io.RecordToolResultInput(
                    chat_id=self._state.chat_id, turn=self._state.turn, tool_call_id=call.id,
                    name=call.name, status="interrupted",
                    content=UNSTARTED_TOOL_TEXT if never_started else INTERRUPTED_TOOL_TEXT))
            return Reason.RESTART_REQUIRES_CONFIRMATION if never_started else Reason.TOOL_STATE_UNKNOWN
        if not result.recorded:
            await self._store_call(io.RECORD_TOOL_RESULT, io.RecordToolResultInput(
                chat_id=self._state.chat_id, turn=self._state.turn, tool_call_id=call.id, name=call.name,
                status=result.status, content=result.content))
        view.status = ToolCallStatus.DONE if result.status == "done" else ToolCallStatus.ERROR
        return None

    async def _settle(self, handles: list[workflow.ActivityHandle[Any]]) -> bool:
        """Wait for the step; on Stop, Dismiss or a superseding message cancel what
        still runs and wait for it to stop. True when the step was cancelled."""
        while True:
            await workflow.wait_condition(
                lambda: all(h.done() for h in handles) or self._interrupt is not None
                or (self._at_wait_points and bool(self._events)))
            if all(h.done() for h in handles):
                return False
            if self._interrupt is None:
                await self._flush_events()  # refusals, announced while the step runs
                continue
            if await self._interrupt_stands():
                break
        for h in handles:
            h.cancel()
        await asyncio.gather(*handles, return_exceptions=True)
        # A step that finished anyway (its result raced the cancel) stands.
        return not all(not h.cancelled() and h.exception() is None for h in handles)

    async def _interrupt_stands(self) -> bool:
        """A client's late retry of a message the chat already holds is not newer
        input: it must not supersede the gate. Drop such retries, keep waiting."""
        if self._interrupt != Reason.SUPERSEDED or not (self._complete or workflow.patched("supersede-checks-store")):
            return True
        ids, self._superseding = self._superseding, []
        held = set(await self._store_call(
            io.HELD_MESSAGES, io.HeldMessagesInput(chat_id=self._state.chat_id, message_ids=ids), list[str]))
        if self._interrupt != Reason.SUPERSEDED or any(i not in held for i in ids) or self._superseding:
            return True
        self._inbox.drop(held)
        self._interrupt = None
        return False

    async def _end_by_user(self) -> None:
        """Stop, Dismiss or a superseding message ended the turn: keep what is known,
        add one closing row. Dismiss commits the follow-ups that were pending when
        it came as user rows; every other message becomes the next turn, in order."""
        reason = self._interrupt or Reason.STOPPED
        self._inbox.return_in_flight()
        recovery.end_recovered(self._state, reason)
        if reason == Reason.DISMISSED:
            committed = [m for m in self._inbox.waiting if m.message_id in self._dismissed_pending]
            self._inbox.drop(self._dismissed_pending)
            await self._finish_turn(closing_text=DISMISSED_TEXT, commit_messages=committed)
            return
        await self._finish_turn(closing_text=SUPERSEDED_TEXT if reason == Reason.SUPERSEDED else STOPPED_TEXT)

    # -- gates ---------------------------------------------------------------
    async def _gate(self, reason: Reason, can_continue: bool = True, detail: str | None = None) -> str:
        """Wait for the user's decision. Returns "continue" (resuming), "dismiss",
        or "ended" (Stop or a newer message closed the turn)."""
        new_id = str(workflow.uuid4())  # drawn at every gate, so recorded runs replay
        recovery.open_gate(self._state, reason, new_id, can_continue, keep_id=self._complete)
        self._state.detail = detail
        if self._decision_id != self._state.recovery_id:
            # A decision is for its gate only. (A replay can meet an update accepted
            # at this gate before the gate opens: it is kept for it.)
            self._decision = None
        if not await self._persist_state():
            return "ended"  # e.g. the lost call had committed the final answer
        while True:
            await workflow.wait_condition(
                lambda: self._decision is not None or self._interrupt is not None or bool(self._events)
                or self._should_hand_on())
            if self._should_hand_on():
                await self._hand_on_gate()
            await self._flush_events()
            if self._interrupt is not None and not await self._interrupt_stands():
                continue
            if self._decision is not None or self._interrupt is not None:
                break
        decision, self._decision = self._decision, None
        if self._interrupt is not None:
            await self._end_by_user()
            return "ended"
        if decision == "continue":
            recovery.accept_continue(self._state)
            self._state.detail = None
            await self._persist_state()
            return "continue"
        recovery.end_recovered(self._state, Reason.DISMISSED)
        # Follow-ups that waited behind the gate are kept as user rows, not answered.
        self._inbox.return_in_flight()
        await self._finish_turn(closing_text=DISMISSED_TEXT, commit_messages=self._inbox.take())
        return "dismiss"

    def _should_hand_on(self) -> bool:
        """Undecided, quiet, and long: a decision or a message is acted on first."""
        return (self._complete and self._decision is None and self._interrupt is None and not self._events
                and self._gate_history_long())

    def _gate_history_long(self) -> bool:
        info = workflow.info()
        return info.is_continue_as_new_suggested() or info.get_current_history_length() > GATE_HISTORY_EVENTS

    async def _hand_on_gate(self) -> None:
        """Continue the waiting gate in a fresh run: same turn, same recovery id."""
        await workflow.wait_condition(workflow.all_handlers_finished)
        if not self._should_hand_on():
            return  # something came meanwhile: the gate acts on it here
        self._inbox.return_in_flight()
        s = self._state
        assert s.reason is not None  # a gate always has one
        workflow.continue_as_new(ChatTurnInput(chat_id=s.chat_id, pending=self._inbox.waiting, recovery=RecoveryStart(
            turn=s.turn, reason=s.reason, can_continue=s.can_continue, recovery_id=s.recovery_id,
            attempts=s.attempts, detail=s.detail)), task_timeout=TURN_TASK_TIMEOUT)

    def _refusal(self, action: recovery.Action, recovery_id: str | None) -> str | None:
        """As `recovery.refusal`, and a gate already decided in this task waits no more."""
        why = recovery.refusal(self._state, action, recovery_id)
        if why is None and self._decision is not None:
            why = recovery.NOT_WAITING
        return why

    def _validate(self, action: recovery.Action, payload: RawValue | None) -> None:
        try:
            recovery_id = RecoveryAction.model_validate(decode_payload(payload)).recovery_id
        except (ValidationError, Undecodable) as err:
            why = first_error(err) if isinstance(err, ValidationError) else str(err)
            raise ApplicationError(f'malformed {action} payload ({why}); expected {{"recovery_id": "..."}}',
                                   type="MalformedPayload", non_retryable=True) from None
        why = self._refusal(action, recovery_id)
        if why is not None:
            raise ApplicationError(why, type="RecoveryActionRejected", non_retryable=True)

    def _decide(self, action: recovery.Action, recovery_id: str | None) -> bool:
        """Act on an accepted Continue or Dismiss. True when it cancels a running continuation."""
        outcome = recovery.decide(self._state.status, Input(action), can_continue=self._state.can_continue)
        if outcome.effect == Effect.CANCEL_AND_DISMISS and self._complete:
            if self._interrupt is None:  # a Stop or a newer message already ends it
                self._interrupt = Reason.DISMISSED
                self._dismissed_pending = set(self._inbox.ids())
            return True
        self._decision, self._decision_id = action, recovery_id  # the gate takes it
        return False

    async def _act_by_update(self, action: recovery.Action, recovery_id: str) -> TurnState:
        # Answered in the workflow task that takes it, with the state the decision
        # leads to: the decision is in the history, and the turn acts on it when its
        # store writes go through. No handler waits on what the run may never reach,
        # and none starts a timer (a replay that meets the update early must do the
        # same). Earlier runs answered once the gate took the decision.
        cancels = self._decide(action, recovery_id)
        if self._at_wait_points:
            return recovery.after_decision(self.state(), action)
        if not cancels:
            await workflow.wait_condition(lambda: self._decision is None)
        return self.state()

    def _act_by_signal(self, action: recovery.Action, payload: RawValue | None) -> None:
        recovery_id: str | None = None  # none readable: refused below, and recorded
        try:
            recovery_id = RecoveryAction.model_validate(decode_payload(payload)).recovery_id
        except ValidationError:
            pass
        except Undecodable:
            if not (self._complete or workflow.patched(REFUSE_UNDECODABLE)):
                return  # earlier runs never saw such a signal
        why = self._refusal(action, recovery_id)
        if why is not None:
            workflow.logger.warning("%s refused for chat %s: %s", action, self._state.chat_id, why)
            self._events.append(NewEvent(type="recovery_action_rejected", payload={
                "turn": self._state.turn, "action": action, "recovery_id": recovery_id, "reason": why}))
            return
        self._decide(action, recovery_id)

    # -- inbox ---------------------------------------------------------------
    def _message_limit(self) -> int:
        if self._settings_known:
            return self._settings.max_message_bytes
        # The configured limit arrives with the first store call: judged there.
        return MESSAGE_BYTES_CEILING if self._complete else DEFAULT_MAX_MESSAGE_BYTES

    def _reject_message(self, message_id: str | None, why: str) -> None:
        workflow.logger.warning("user_message refused for chat %s: %s", self._state.chat_id, why)
        self._events.append(NewEvent(type="message_rejected",
                                     payload={"message_id": message_id, "reason": why}))
        if (self._before_turn and (self._idle_refusals is None or self._idle_refusals.done())
                and (self._complete or workflow.patched(ANNOUNCE_IDLE_REFUSALS))):
            # A run still waiting for its first valid message would otherwise hold
            # the refusal until IDLE_TIMEOUT.
            self._idle_refusals = asyncio.create_task(self._announce_refusals())


def _show_result(handle: "asyncio.Future[io.ToolCallResult]", view: ToolCallView) -> None:
    """A finished call shows in `state` at once, while its siblings still run."""
    if not handle.cancelled() and handle.exception() is None:
        view.status = ToolCallStatus.DONE if handle.result().status == "done" else ToolCallStatus.ERROR


def _timeout_type(err: ActivityError) -> TimeoutType | None:
    cause = err.cause
    return cause.type if isinstance(cause, TemporalTimeoutError) else None


def _tool_summary(call: ToolCall) -> str:
    args = call.arguments if len(call.arguments) <= 80 else call.arguments[:77] + "..."
    return f"{call.name}({args})"
