"""The reconciler's verdict on a turn whose run ended abnormally: what it left
behind, judged by the reason table (docs/recovery.md, "Gates").
Pure functions, no I/O: the reconciler (activities/reconcile/reconciler.py) reads the
run's history and the store's rows of the turn and acts on the verdict. Here: the
verdict itself and the judgement of the store's rows; a run's history is read and
judged in activities/reconcile/history_read.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from turnkeeper.models import (
    DISMISSED_TEXT,
    INTERRUPTED_TURN_TEXT,
    STOPPED_TEXT,
    SUPERSEDED_TEXT,
    ChatMessage,
    Reason,
    ToolCall,
    UserMessage,
)

# Assistant rows the system writes when it closes a turn: never a model's answer.
_CLOSING_TEXTS = frozenset({SUPERSEDED_TEXT, DISMISSED_TEXT, STOPPED_TEXT, INTERRUPTED_TURN_TEXT})


@dataclass(frozen=True)
class UnansweredCall:
    """A tool call of the transcript that has no tool row yet."""

    id: str
    name: str
    started: bool = True
    """False when it provably never reached a worker (its row says it did not run)."""


@dataclass(frozen=True)
class Verdict:
    reason: Reason
    can_continue: bool
    unanswered: tuple[UnansweredCall, ...] = ()
    """Calls to answer with interrupted tool rows before the gate opens."""
    final_text: str | None = None
    """With `answer_restored`: the answer to commit without a model call."""
    messages: tuple[UserMessage, ...] = ()
    """Every user message the run had acknowledged (its input and `user_message`
    signals), in order; the store may hold some of them already."""
    detail: str = ""
    """Why, in words, for the log."""

    @property
    def closes_turn(self) -> bool:
        """Whether the reconciler closes the turn itself (no recovery run)."""
        return self.reason in (Reason.COMMITTED, Reason.ANSWER_RESTORED)


def committed() -> Verdict:
    return Verdict(Reason.COMMITTED, True, detail="the store holds the turn's completion")


def invalid(detail: str) -> Verdict:
    return Verdict(Reason.CHECKPOINT_INVALID, False, detail=detail)


def unknown(detail: str) -> Verdict:
    return Verdict(Reason.CHECKPOINT_UNKNOWN, False, detail=detail)


# -- the store's rows ------------------------------------------------------------------


def is_completion(row: ChatMessage) -> bool:
    """An assistant row that answers the turn: no tool calls, real text."""
    return (
        row.role == "assistant"
        and not row.tool_calls
        and bool((row.content or "").strip())
        and row.content not in _CLOSING_TEXTS
    )


def holds_completion(rows: Sequence[ChatMessage]) -> bool:
    return any(is_completion(r) for r in rows)


def rows_problem(rows: Sequence[ChatMessage]) -> str | None:
    """What makes the turn's rows unusable as model context, or None."""
    calls: set[str] = set()
    for row in rows:
        if row.role != "assistant":
            continue
        if not row.tool_calls and not (row.content or "").strip():
            return "an assistant row has neither tool calls nor text (an empty answer)"
        for call in row.tool_calls or []:
            if not call.id or not call.name:
                return "a tool call row has no id or no name"
            if call.id in calls:
                return f"tool call id {call.id!r} appears twice"
            calls.add(call.id)
    answered: set[str] = set()
    for row in rows:
        if row.role != "tool":
            continue
        if not row.tool_call_id or row.tool_call_id not in calls:
            return f"a tool row answers call {row.tool_call_id!r}, which was never made"
        if row.tool_call_id in answered:
            return f"tool call {row.tool_call_id!r} has two results"
        answered.add(row.tool_call_id)
    return None


def store_calls(rows: Sequence[ChatMessage]) -> dict[str, ToolCall]:
    return {c.id: c for r in rows if r.role == "assistant" for c in r.tool_calls or []}


def answered_calls(rows: Sequence[ChatMessage]) -> set[str]:
    return {r.tool_call_id for r in rows if r.role == "tool" and r.tool_call_id}


def judge_store(rows: Sequence[ChatMessage]) -> Verdict:
    """The run and its history are gone: judge from the store's rows of the turn alone."""
    if holds_completion(rows):
        return committed()
    problem = rows_problem(rows)
    if problem is not None:
        return invalid(problem)
    calls = store_calls(rows)
    if not calls:
        return Verdict(
            Reason.INTERRUPTED_WITHOUT_CHECKPOINT,
            False,
            detail="history gone; the store holds no model step of the turn",
        )
    answered = answered_calls(rows)
    return Verdict(
        Reason.INTERRUPTED_WITH_SAVED_CONTEXT,
        True,
        unanswered=tuple(UnansweredCall(c.id, c.name) for c in calls.values() if c.id not in answered),
        detail="history gone; the store holds the turn's tool calls",
    )
