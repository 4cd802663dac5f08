"""A run's Temporal event history, read back as the reconciler's checkpoint, and
the verdict on the turn it leaves (the verdict itself: activities/reconcile/verdict.py).

Every model call and tool call is its own activity, so its scheduled input and
completed result are in the history, decoded here with the same pydantic models
the workflow used. Temporal writes `ActivityTaskStarted` only when an attempt
closes, so a tool call scheduled without a close event may have acted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.history.v1 import HistoryEvent

from turnkeeper import activity_io
from turnkeeper.activities.reconcile.verdict import (
    UnansweredCall,
    Verdict,
    answered_calls,
    committed,
    holds_completion,
    invalid,
    rows_problem,
    store_calls,
    unknown,
)
from turnkeeper.models import ChatMessage, ChatTurnInput, Reason, UserMessage

M = TypeVar("M", bound=BaseModel)

JSON_ENCODING = b"json/plain"
ENCRYPTED_ENCODING = b"binary/encrypted"  # turnkeeper.payloads.encryption.ENCODING
USER_MESSAGE_SIGNAL = "user_message"


class _Undecodable(Exception):
    """A payload we cannot read: written by another version or another converter."""


def _decode(payloads: Payloads, model: type[M], what: str) -> M:
    if len(payloads.payloads) != 1:
        raise _Undecodable(f"{what}: {len(payloads.payloads)} payloads, expected 1")
    payload = payloads.payloads[0]
    encoding = payload.metadata.get("encoding", b"")
    if encoding == ENCRYPTED_ENCODING:  # the reconciler decrypts what its keys can
        key_id = payload.metadata.get("encryption-key-id", b"").decode(errors="replace")
        raise _Undecodable(
            f"{what}: encrypted under key id {key_id!r}, which TURNKEEPER_ENCRYPTION_KEYS does not list"
        )
    if encoding != JSON_ENCODING:
        raise _Undecodable(f"{what}: payload encoding {encoding.decode(errors='replace')!r}")
    try:
        return model.model_validate_json(payload.data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "payload"
        raise _Undecodable(f"{what}: unknown schema ({where}: {first.get('msg')})") from None


@dataclass
class _Step:
    """One model_call or tool_call activity of the run."""

    kind: str
    input: activity_io.ModelCallInput | activity_io.ToolCallInput
    result: activity_io.ModelCallResult | activity_io.ToolCallResult | None = None
    never_started: bool = False


@dataclass
class _Run:
    start: ChatTurnInput | None = None
    steps: list[_Step] = field(default_factory=list)
    messages: dict[str, UserMessage] = field(default_factory=dict)  # by id, in arrival order

    def acknowledged(self) -> tuple[UserMessage, ...]:
        return tuple(self.messages.values())


def payloads_read(event: HistoryEvent) -> Payloads | None:
    """The payloads of `event` that `_read` decodes: what the reconciler decrypts first."""
    kind = event.event_type
    if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
        return event.workflow_execution_started_event_attributes.input
    if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
        return event.workflow_execution_signaled_event_attributes.input
    if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        return event.activity_task_scheduled_event_attributes.input
    if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
        return event.activity_task_completed_event_attributes.result
    return None


def _read(events: Iterable[HistoryEvent]) -> _Run:
    run = _Run()
    by_id: dict[int, _Step] = {}
    for event in events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            attrs = event.workflow_execution_started_event_attributes
            if attrs.input.payloads:
                run.start = _decode(attrs.input, ChatTurnInput, "workflow input")
                for message in run.start.pending:
                    run.messages.setdefault(message.message_id, message)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            signal = event.workflow_execution_signaled_event_attributes
            if signal.signal_name == USER_MESSAGE_SIGNAL:
                try:
                    message = _decode(signal.input, UserMessage, "user_message")
                except _Undecodable:
                    continue  # the run refused it too (message_rejected): never acknowledged
                run.messages.setdefault(message.message_id, message)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            sched = event.activity_task_scheduled_event_attributes
            name = sched.activity_type.name
            if name == activity_io.MODEL_CALL:
                step = _Step(
                    name, _decode(sched.input, activity_io.ModelCallInput, f"event {event.event_id} input")
                )
            elif name == activity_io.TOOL_CALL:
                step = _Step(
                    name, _decode(sched.input, activity_io.ToolCallInput, f"event {event.event_id} input")
                )
            else:
                continue
            by_id[event.event_id] = step
            run.steps.append(step)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            found = by_id.get(done.scheduled_event_id)
            if found is not None:
                model: type[activity_io.ModelCallResult] | type[activity_io.ToolCallResult] = (
                    activity_io.ModelCallResult
                    if found.kind == activity_io.MODEL_CALL
                    else activity_io.ToolCallResult
                )
                found.result = _decode(done.result, model, f"event {event.event_id} result")
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            # A failed, cancelled or timed-out attempt may have acted, like one without
            # a close event; only a schedule-to-start timeout proves it never started.
            timed_out = event.activity_task_timed_out_event_attributes
            found = by_id.get(timed_out.scheduled_event_id)
            if found is not None:
                found.never_started = (
                    timed_out.failure.timeout_failure_info.timeout_type
                    == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START
                )
    return run


def _history_problem(run: _Run) -> str | None:
    made: set[str] = set()
    for step in run.steps:
        if isinstance(step.result, activity_io.ModelCallResult) and step.result.reply is not None:
            reply = step.result.reply
            if reply.is_final and not (reply.text or "").strip():
                return "the final answer is empty"
            for call in reply.tool_calls:
                if call.id in made:
                    return f"tool call id {call.id!r} appears twice"
                made.add(call.id)
    results: set[str] = set()
    for step in run.steps:
        if not isinstance(step.input, activity_io.ToolCallInput):
            continue
        call_id = step.input.call.id
        if call_id not in made:
            return f"tool call {call_id!r} ran, but no model reply asked for it"
        if isinstance(step.result, activity_io.ToolCallResult):
            if step.result.tool_call_id != call_id:
                return f"tool call {call_id!r} got the result of {step.result.tool_call_id!r}"
            if call_id in results:
                return f"tool call {call_id!r} has two results"
            results.add(call_id)
    return None


def acknowledged(events: Iterable[HistoryEvent]) -> tuple[UserMessage, ...]:
    """The user messages a run acknowledged, in order; () when its history does not decode."""
    try:
        return _read(events).acknowledged()
    except _Undecodable:
        return ()


def judge_history(
    events: Iterable[HistoryEvent], rows: Sequence[ChatMessage], *, resuming: bool = False
) -> Verdict:
    """Judge a run that ended abnormally (or ended while the store still shows its
    turn open) by its history and the store's rows of the turn.

    `resuming`: the store shows the turn resuming, i.e. Continue was accepted and
    the resumed step was lost too: a continuable gate opens as `loop_guard`, as it
    would have in the live run.
    """
    try:
        run: _Run | None = _read(events)
        undecodable = ""
    except _Undecodable as err:
        run, undecodable = None, str(err)
    if holds_completion(rows):  # a persisted completion wins
        return replace(committed(), messages=run.acknowledged() if run else ())
    if run is None:
        return unknown(undecodable)
    messages = run.acknowledged()
    problem = _history_problem(run) or rows_problem(rows)
    if problem is not None:
        return replace(invalid(problem), messages=messages)

    finals = [
        s.result.reply
        for s in run.steps
        if isinstance(s.result, activity_io.ModelCallResult)
        and s.result.reply is not None
        and s.result.reply.is_final
    ]
    if finals:
        return Verdict(
            Reason.ANSWER_RESTORED,
            True,
            final_text=finals[-1].text,
            messages=messages,
            detail="a final answer is in the history",
        )

    # Tool activities of this run, by call id; and the calls its model replies made.
    tool_steps = {
        s.input.call.id: (s.input, s) for s in run.steps if isinstance(s.input, activity_io.ToolCallInput)
    }
    made_here = {
        c.id
        for s in run.steps
        if isinstance(s.result, activity_io.ModelCallResult) and s.result.reply is not None
        for c in s.result.reply.tool_calls
    }
    uncertain = [
        inp.call.id for inp, step in tool_steps.values() if step.result is None and not step.never_started
    ]
    # Calls a handed-on approval gate held were never scheduled before it either.
    held = {c.id for c in run.start.recovery.approvals} if run.start and run.start.recovery else set()
    # Calls of the transcript without a tool row get one, saying what is known.
    answered = answered_calls(rows)
    unanswered: list[UnansweredCall] = []
    for call_id, call in store_calls(rows).items():
        if call_id in answered:
            continue
        found = tool_steps.get(call_id)
        if found is not None:
            started = not found[1].never_started
        else:
            # Asked for here (or held for approval) but never scheduled: it did not run.
            started = call_id not in made_here and call_id not in held
        unanswered.append(UnansweredCall(call_id, call.name, started=started))

    if uncertain:
        reason, can_continue = Reason.TOOL_STATE_UNKNOWN, True
        detail = f"tool call(s) {uncertain} may have acted"
    elif run.start is not None and run.start.recovery is not None:
        # A recovery run that ended at (or before) its gate: the same gate again,
        # never a more permissive one.
        reason, can_continue = run.start.recovery.reason, run.start.recovery.can_continue
        detail = "a recovery run ended before its gate was decided"
        if reason == Reason.APPROVAL_REQUIRED:
            # Its waiting calls were never scheduled and are answered as not run: the
            # model, continued, sees that and may ask again.
            reason, detail = (
                Reason.RESTART_REQUIRES_CONFIRMATION,
                "a run ended while calls waited for approval",
            )
    else:
        reason, can_continue = Reason.RESTART_REQUIRES_CONFIRMATION, True
        detail = "only the user message and completed steps remain"
    if resuming and can_continue:
        reason = Reason.LOOP_GUARD
    return Verdict(reason, can_continue, unanswered=tuple(unanswered), messages=messages, detail=detail)
