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
from typing import Any

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
        CHAT_ID_ATTR,
        DISMISSED_TEXT,
        INTERRUPTED_TOOL_TEXT,
        OPEN_STATUSES,
        RECOVERY_REASON_ATTR,
        STOPPED_TEXT,
        SUPERSEDED_TEXT,
        TURN_STATUS_ATTR,
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
    from workflows import recovery


NO_RETRY = RetryPolicy(maximum_attempts=1)
# Store writes are idempotent, so retrying them is safe; bounded so a dead
# store fails the run (the reconciler then sees it) instead of wedging it.
STORE_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=20,
                          maximum_interval=timedelta(seconds=5))
STORE_TIMEOUT = timedelta(seconds=30)
# A run started without a message (e.g. `temporal workflow start`) waits this long.
IDLE_TIMEOUT = timedelta(minutes=10)
# A model call cut off by a graceful shutdown is scheduled again this many times.
MAX_SHUTDOWN_RESCHEDULES = 5
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024
# Patch ids: behaviour that running turns recorded without must replay as it was.
REFUSE_UNDECODABLE = "refuse-undecodable-user-message"
ANNOUNCE_IDLE_REFUSALS = "announce-refusals-while-idle"


class _Cancelled(Exception):
    """Stop, or a message that superseded the gate, cancelled the running step."""


class _Interrupted(Exception):
    """A step was lost; carries the reason the gate opens with."""

    def __init__(self, reason: Reason, committed: bool = False, can_continue: bool = True) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.committed = committed  # the call's messages are in the store for sure
        self.can_continue = can_continue


@workflow.defn(name="ChatTurn")
class ChatTurn:
    @workflow.init
    def __init__(self, input: ChatTurnInput) -> None:
        self._state = TurnState(chat_id=input.chat_id)
        self._inbox: list[UserMessage] = []
        self._in_flight: list[UserMessage] = []  # handed to a model call not yet finished
        self._seen: set[str] = set()
        self._events: list[NewEvent] = []  # announced at the next boundary
        self._max_message_bytes = DEFAULT_MAX_MESSAGE_BYTES
        self._settings = io.TurnSettings()
        self._decision: recovery.Action | None = None
        self._interrupt: Reason | None = None  # Stop, or a message that supersedes a gate
        self._superseding: list[str] = []  # ids received at a gate, to check against the store
        # Until a turn begins no step announces events: refusals are announced by a task of their own.
        self._before_turn = input.recovery is None
        self._idle_refusals: asyncio.Task[None] | None = None
        for message in input.pending:
            self._accept(message)

    def _apply_settings(self, settings: io.TurnSettings) -> None:
        self._settings = settings
        self._max_message_bytes = settings.max_message_bytes

    # -- handlers: they only change state; `run` acts on it -------------------
    @workflow.signal(name="user_message")
    def user_message(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        # Raw, so that a payload the converter cannot decode is refused here
        # instead of being dropped by the SDK with nothing but a worker log line.
        try:
            message = UserMessage.model_validate(_decode(payload))
        except ValidationError as err:
            self._reject_message(None, f"malformed user_message payload: {_first_error(err)}")
            return
        except _Undecodable as err:
            if workflow.patched(REFUSE_UNDECODABLE):  # earlier runs dropped these unseen
                self._reject_message(None, f"malformed user_message payload: {err}")
            return
        size = len(message.text.encode())
        if size > self._max_message_bytes:
            self._reject_message(message.message_id,
                                 f"message is {size} bytes; the limit is {self._max_message_bytes}")
            return
        if self._accept(message) and self._state.status in (TurnStatus.AWAITING_USER, TurnStatus.RESUMING):
            # Newer input beats a waiting or running recovery.
            self._superseding.append(message.message_id)
            self._interrupt = self._interrupt or Reason.SUPERSEDED

    @workflow.signal(name="stop")
    def stop(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        # Whatever it carries: Stop needs no argument.
        if not _readable(payload) and not workflow.patched(REFUSE_UNDECODABLE):
            return  # earlier runs never saw such a signal
        if self._state.turn and self._state.status in OPEN_STATUSES:
            self._interrupt = Reason.STOPPED  # the user's explicit word wins

    @workflow.signal(name="continue")
    def continue_signal(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        self._act_by_signal("continue", payload)

    @workflow.signal(name="dismiss")
    def dismiss_signal(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        self._act_by_signal("dismiss", payload)

    @workflow.update(name="continue_turn")
    async def continue_turn(self, action: RecoveryAction) -> TurnState:
        return await self._act_by_update("continue")

    @continue_turn.validator
    def _validate_continue(self, action: RecoveryAction) -> None:
        self._validate("continue", action)

    @workflow.update(name="dismiss_turn")
    async def dismiss_turn(self, action: RecoveryAction) -> TurnState:
        return await self._act_by_update("dismiss")

    @dismiss_turn.validator
    def _validate_dismiss(self, action: RecoveryAction) -> None:
        self._validate("dismiss", action)

    @workflow.query(name="state")
    def state(self) -> TurnState:
        pending = [m.message_id for m in self._in_flight + self._inbox]
        return self._state.model_copy(update={"pending_followups": pending})

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
            waited = await self._wait_for_first_message()
            self._before_turn = False
            if self._idle_refusals is not None:
                await self._idle_refusals  # announced before the turn's own events
            if waited and await self._begin():
                await self._turn_loop(step=0, batch=self._take_inbox())
        await self._flush_events()
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._inbox:
            # What this turn did not consume is the next turn, in order.
            workflow.continue_as_new(ChatTurnInput(chat_id=input.chat_id, pending=self._inbox))
        return self.state()

    async def _wait_for_first_message(self) -> bool:
        try:
            await workflow.wait_condition(lambda: bool(self._inbox), timeout=IDLE_TIMEOUT)
        except asyncio.TimeoutError:
            self._state.status = TurnStatus.COMPLETED
            return False
        return True

    async def _begin(self) -> bool:
        """Number the turn from the store and close any earlier turn left open."""
        while self._inbox:
            begun: io.BeginTurnResult = await workflow.execute_local_activity(
                io.BEGIN_TURN,
                io.BeginTurnInput(chat_id=self._state.chat_id, run_id=workflow.info().run_id,
                                  message_ids=[m.message_id for m in self._inbox]),
                result_type=io.BeginTurnResult,
                start_to_close_timeout=STORE_TIMEOUT, retry_policy=STORE_RETRY,
            )
            self._apply_settings(begun.settings)
            duplicates = set(begun.duplicate_ids)
            self._inbox = [m for m in self._inbox if m.message_id not in duplicates]
            if begun.turn is not None:
                self._state.turn = begun.turn
                return True
            self._state.turn = begun.latest_turn
        # Every message was a retry of one already committed: no turn to run.
        self._state.status = TurnStatus.COMPLETED
        return False

    async def _recover(self, start: RecoveryStart) -> None:
        """A run started by the reconciler: take the turn over and ask its user."""
        adopted: io.AdoptTurnResult = await workflow.execute_local_activity(
            io.ADOPT_TURN,
            io.AdoptTurnInput(chat_id=self._state.chat_id, turn=start.turn, run_id=workflow.info().run_id),
            result_type=io.AdoptTurnResult, start_to_close_timeout=STORE_TIMEOUT, retry_policy=STORE_RETRY)
        self._apply_settings(adopted.settings)
        self._state.turn = start.turn
        if await self._gate(start.reason, can_continue=start.can_continue) == "continue":
            await self._turn_loop(step=adopted.next_step, batch=self._take_inbox())

    async def _turn_loop(self, step: int, batch: list[UserMessage]) -> None:
        # Messages handed to a model call stay ours until it succeeds: a lost call
        # may not have committed them (the store's commit is idempotent).
        self._in_flight = batch
        after_loss = False
        while True:
            try:
                reply = await self._call_model(step, self._in_flight, after_loss)
            except _Interrupted as lost:
                if lost.committed:
                    self._in_flight = []
                if await self._gate(lost.reason, can_continue=lost.can_continue) != "continue":
                    return
                # A new step: the lost one may have written tool calls that never
                # ran; they are answered as interrupted, never replaced.
                step += 1
                after_loss = True
                continue
            except _Cancelled:
                await self._end_by_user()
                return
            self._in_flight = []
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
            self._in_flight = self._take_inbox()

    async def _call_model(self, step: int, batch: list[UserMessage], after_loss: bool) -> ModelReply:
        await self._flush_events()
        resuming = self._state.status == TurnStatus.RESUMING
        for _ in range(MAX_SHUTDOWN_RESCHEDULES):
            if self._interrupt is not None:
                raise _Cancelled()
            handle = workflow.start_activity(
                io.MODEL_CALL,
                io.ModelCallInput(chat_id=self._state.chat_id, turn=self._state.turn, step=step,
                                  new_messages=batch, closes_turn=not resuming,
                                  answer_lost_calls=after_loss),
                result_type=io.ModelCallResult,
                start_to_close_timeout=timedelta(seconds=self._settings.model_timeout_s),
                schedule_to_start_timeout=timedelta(seconds=self._settings.resume_window_s),
                heartbeat_timeout=timedelta(seconds=self._settings.heartbeat_timeout_s),
                retry_policy=NO_RETRY,
                # A cancelled call must have stopped before the turn writes its closing row.
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=f"model call {step + 1} of turn {self._state.turn}",
            )
            if await self._settle([handle]):
                raise _Cancelled()
            try:
                return (await handle).reply
            except ActivityError as err:
                if _error_type(err) == io.WORKER_SHUTDOWN_ERROR:
                    continue  # nothing happened outside: the next worker takes it
                if _error_type(err) == io.MODEL_FAILED_ERROR:
                    # Raised after the activity committed the messages.
                    raise _Interrupted(Reason.MODEL_FAILED, committed=True) from None
                if _error_type(err) == io.CHECKPOINT_INVALID_ERROR:
                    raise _Interrupted(Reason.CHECKPOINT_INVALID, can_continue=False) from None
                raise _Interrupted(Reason.RESTART_REQUIRES_CONFIRMATION) from None
        raise _Interrupted(Reason.RESTART_REQUIRES_CONFIRMATION)

    async def _run_tools(self, calls: list[ToolCall]) -> Reason | None:
        """Run the model's tool calls in parallel; the reason to stop, if any was lost.
        Raises `_Cancelled` after Stop or a superseding message, once every call has
        either finished or been marked interrupted."""
        views = [ToolCallView(id=c.id, name=c.name, status=ToolCallStatus.RUNNING) for c in calls]
        self._state.tool_calls.extend(views)
        handles = [
            workflow.start_activity(
                io.TOOL_CALL,
                io.ToolCallInput(chat_id=self._state.chat_id, turn=self._state.turn, call=call),
                result_type=io.ToolCallResult,
                start_to_close_timeout=timedelta(seconds=self._settings.tool_timeout_s),
                schedule_to_start_timeout=timedelta(seconds=self._settings.resume_window_s),
                heartbeat_timeout=timedelta(seconds=self._settings.heartbeat_timeout_s),
                retry_policy=NO_RETRY,
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=_tool_summary(call),
            )
            for call in calls
        ]
        for handle, view in zip(handles, views):
            handle.add_done_callback(lambda h, v=view: _show_result(h, v))
        cancelled = await self._settle(handles)
        lost = [await self._tool_outcome(call, view, handle)
                for call, view, handle in zip(calls, views, handles)]
        if cancelled:
            raise _Cancelled()
        if Reason.TOOL_STATE_UNKNOWN in lost:
            return Reason.TOOL_STATE_UNKNOWN
        if Reason.RESTART_REQUIRES_CONFIRMATION in lost:
            return Reason.RESTART_REQUIRES_CONFIRMATION
        return None

    async def _tool_outcome(self, call: ToolCall, view: ToolCallView,
                            handle: workflow.ActivityHandle[io.ToolCallResult]) -> Reason | None:
        try:
            result = await handle
        except (ActivityError, asyncio.CancelledError) as err:
            # The tool may or may not have acted: it is never run again by us. If it
            # did record a result before it died, the store keeps that one.
            view.status = ToolCallStatus.INTERRUPTED
            never_started = (isinstance(err, ActivityError)
                             and _timeout_type(err) == TimeoutType.SCHEDULE_TO_START)
            await workflow.execute_local_activity(
                io.RECORD_TOOL_RESULT,
                io.RecordToolResultInput(
                    chat_id=self._state.chat_id, turn=self._state.turn, tool_call_id=call.id,
                    name=call.name, status="interrupted",
                    content=UNSTARTED_TOOL_TEXT if never_started else INTERRUPTED_TOOL_TEXT),
                start_to_close_timeout=STORE_TIMEOUT, retry_policy=STORE_RETRY,
            )
            return Reason.RESTART_REQUIRES_CONFIRMATION if never_started else Reason.TOOL_STATE_UNKNOWN
        view.status = ToolCallStatus.DONE if result.status == "done" else ToolCallStatus.ERROR
        return None

    async def _settle(self, handles: list[workflow.ActivityHandle[Any]]) -> bool:
        """Wait for the step; on Stop or a superseding message cancel what still runs
        and wait for it to stop. True when the step was cancelled."""
        while True:
            await workflow.wait_condition(
                lambda: all(h.done() for h in handles) or self._interrupt is not None)
            if all(h.done() for h in handles):
                return False
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
        if self._interrupt != Reason.SUPERSEDED or not workflow.patched("supersede-checks-store"):
            return True
        ids, self._superseding = self._superseding, []
        held = set(await workflow.execute_local_activity(
            io.HELD_MESSAGES, io.HeldMessagesInput(chat_id=self._state.chat_id, message_ids=ids),
            result_type=list[str], start_to_close_timeout=STORE_TIMEOUT, retry_policy=STORE_RETRY))
        if self._interrupt != Reason.SUPERSEDED or any(i not in held for i in ids) or self._superseding:
            return True
        self._inbox = [m for m in self._inbox if m.message_id not in held]
        self._interrupt = None
        return False

    async def _end_by_user(self) -> None:
        """Stop or a superseding message ended the turn: keep what is known, add one
        closing row. Messages still pending become the next turn."""
        reason = self._interrupt or Reason.STOPPED
        self._return_in_flight()  # they start the next turn with the rest, in order
        recovery.end_recovered(self._state, reason)
        await self._finish_turn(closing_text=SUPERSEDED_TEXT if reason == Reason.SUPERSEDED else STOPPED_TEXT)

    # -- gates ---------------------------------------------------------------
    async def _gate(self, reason: Reason, can_continue: bool = True) -> str:
        """Wait for the user's decision. Returns "continue" (resuming), "dismiss",
        or "ended" (Stop or a newer message closed the turn)."""
        recovery.open_gate(self._state, reason, str(workflow.uuid4()), can_continue)
        self._decision = None
        if not await self._persist_state():
            return "ended"  # e.g. the lost call had committed the final answer
        while True:
            await workflow.wait_condition(
                lambda: self._decision is not None or self._interrupt is not None or bool(self._events))
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
            await self._persist_state()
            return "continue"
        recovery.end_recovered(self._state, Reason.DISMISSED)
        # Follow-ups that waited behind the gate are kept as user rows, not answered.
        self._return_in_flight()
        committed, self._inbox = self._inbox, []
        await self._finish_turn(closing_text=DISMISSED_TEXT, commit_messages=committed)
        return "dismiss"

    def _refusal(self, action: recovery.Action, recovery_id: str | None) -> str | None:
        """As `recovery.refusal`, and a gate already decided in this task waits no more."""
        why = recovery.refusal(self._state, action, recovery_id)
        if why is None and self._decision is not None:
            why = recovery.NOT_WAITING
        return why

    def _validate(self, action: recovery.Action, payload: RecoveryAction) -> None:
        why = self._refusal(action, payload.recovery_id)
        if why is not None:
            raise ApplicationError(why, type="RecoveryActionRejected", non_retryable=True)

    async def _act_by_update(self, action: recovery.Action) -> TurnState:
        self._decision = action
        await workflow.wait_condition(lambda: self._decision is None)
        return self.state()

    def _act_by_signal(self, action: recovery.Action, payload: RawValue | None) -> None:
        recovery_id: str | None = None  # none readable: refused below, and recorded
        try:
            recovery_id = RecoveryAction.model_validate(_decode(payload)).recovery_id
        except ValidationError:
            pass
        except _Undecodable:
            if not workflow.patched(REFUSE_UNDECODABLE):
                return  # earlier runs never saw such a signal
        why = self._refusal(action, recovery_id)
        if why is not None:
            workflow.logger.warning("%s refused for chat %s: %s", action, self._state.chat_id, why)
            self._events.append(NewEvent(type="recovery_action_rejected", payload={
                "turn": self._state.turn, "action": action, "recovery_id": recovery_id, "reason": why}))
            return
        self._decision = action

    # -- persistence ---------------------------------------------------------
    async def _persist_state(self) -> bool:
        """Persist, then announce: the store row and its events, then the search
        attributes. False when the store had already ended the turn (its
        completion wins): the state then follows the store."""
        written: io.TurnWriteResult | None = await workflow.execute_local_activity(
            io.UPDATE_TURN, self._turn_update(), result_type=io.TurnWriteResult | None,
            start_to_close_timeout=STORE_TIMEOUT, retry_policy=STORE_RETRY)
        self._follow_store(written)
        self._upsert_search_attributes()
        return written is None or written.written

    async def _finish_turn(self, closing_text: str | None = None,
                           commit_messages: list[UserMessage] | None = None) -> None:
        update = self._turn_update()
        update.closing_text = closing_text
        update.commit_messages = commit_messages or []
        written: io.TurnWriteResult | None = await workflow.execute_local_activity(
            io.FINISH_TURN, update, result_type=io.TurnWriteResult | None,
            start_to_close_timeout=STORE_TIMEOUT, retry_policy=STORE_RETRY)
        self._follow_store(written)
        self._upsert_search_attributes()

    def _follow_store(self, written: io.TurnWriteResult | None) -> None:
        # None: recorded by a release whose store writes returned nothing.
        if written is not None and not written.written:
            self._state.status = written.status
            self._state.reason = written.reason

    def _turn_update(self) -> io.UpdateTurnInput:
        s = self._state
        return io.UpdateTurnInput(chat_id=s.chat_id, turn=s.turn, status=s.status, reason=s.reason,
                                  recovery_id=s.recovery_id, can_continue=s.can_continue,
                                  attempts=s.attempts)

    async def _announce_refusals(self) -> None:
        # Refusals that arrive while one batch is being written go in the next.
        while self._events and self._before_turn:
            await self._flush_events()

    async def _flush_events(self) -> None:
        if not self._events:
            return
        events, self._events = self._events, []
        await workflow.execute_local_activity(
            io.APPEND_EVENTS, io.AppendEventsInput(chat_id=self._state.chat_id, events=events),
            start_to_close_timeout=STORE_TIMEOUT, retry_policy=STORE_RETRY)

    def _search_attributes_current(self) -> bool:
        """Our client sets them at start; an operator's signal-with-start does not."""
        current = workflow.info().typed_search_attributes
        return (current.get(CHAT_ID_ATTR) == self._state.chat_id
                and current.get(TURN_STATUS_ATTR) == self._state.status.value)

    def _upsert_search_attributes(self) -> None:
        reason = self._state.reason
        workflow.upsert_search_attributes([
            CHAT_ID_ATTR.value_set(self._state.chat_id),
            TURN_STATUS_ATTR.value_set(self._state.status.value),
            RECOVERY_REASON_ATTR.value_set(reason.value) if reason else RECOVERY_REASON_ATTR.value_unset(),
        ])

    # -- inbox ---------------------------------------------------------------
    def _accept(self, message: UserMessage) -> bool:
        if message.message_id in self._seen:
            return False  # the client's retry: one message
        self._seen.add(message.message_id)
        self._inbox.append(message)
        return True

    def _return_in_flight(self) -> None:
        self._inbox = self._in_flight + self._inbox
        self._in_flight = []

    def _take_inbox(self) -> list[UserMessage]:
        batch, self._inbox = self._inbox, []
        return batch

    def _reject_message(self, message_id: str | None, why: str) -> None:
        workflow.logger.warning("user_message refused for chat %s: %s", self._state.chat_id, why)
        self._events.append(NewEvent(type="message_rejected",
                                     payload={"message_id": message_id, "reason": why}))
        if (self._before_turn and (self._idle_refusals is None or self._idle_refusals.done())
                and workflow.patched(ANNOUNCE_IDLE_REFUSALS)):
            # A run still waiting for its first valid message would otherwise hold
            # the refusal until IDLE_TIMEOUT.
            self._idle_refusals = asyncio.create_task(self._announce_refusals())


def _show_result(handle: "asyncio.Future[io.ToolCallResult]", view: ToolCallView) -> None:
    """A finished call shows in `state` at once, while its siblings still run."""
    if not handle.cancelled() and handle.exception() is None:
        view.status = ToolCallStatus.DONE if handle.result().status == "done" else ToolCallStatus.ERROR


def _error_type(err: ActivityError) -> str | None:
    cause = err.cause
    return cause.type if isinstance(cause, ApplicationError) else None


def _timeout_type(err: ActivityError) -> TimeoutType | None:
    cause = err.cause
    return cause.type if isinstance(cause, TemporalTimeoutError) else None


class _Undecodable(Exception):
    """A signal payload the data converter cannot read (unknown encoding, not JSON)."""


def _decode(payload: RawValue | None) -> Any:
    if payload is None:
        return None
    try:
        return workflow.payload_converter().from_payload(payload.payload, None)
    except ValidationError as err:  # the JSON itself is broken
        raise _Undecodable(f"not JSON ({err.errors()[0].get('msg')})") from None
    except Exception as err:  # noqa: BLE001 — e.g. KeyError for an unknown encoding
        raise _Undecodable(err.args[0] if isinstance(err, KeyError) and err.args else str(err)) from None


def _readable(payload: RawValue | None) -> bool:
    try:
        _decode(payload)
    except _Undecodable:
        return False
    return True


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "payload"
    return f"{where}: {first.get('msg')}"


def _tool_summary(call: ToolCall) -> str:
    args = call.arguments if len(call.arguments) <= 80 else call.arguments[:77] + "..."
    return f"{call.name}({args})"
