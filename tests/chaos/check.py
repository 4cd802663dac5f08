"""The chaos harness's checker: reads the store (through its API, as any backend
serves it), the ledger, the worker logs, the harness's own records and every
workflow history after a run, and counts each invariant's violations. See
tests/chaos/harness.py for the invariants."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import WorkflowExecutionStatus, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from tests.chaos.base import BENIGN_WFT_CAUSES, CLOSED_TURN, CONFIRM_TOOL, Report, percentile
from tests.chaos.infra import ANSWER_LEAD, unanswered_tool_calls
from tests.chaos.users import is_sub_chat, parent_chat, shown_subagent
from turnkeeper import activity_io as io
from turnkeeper import client as tk
from turnkeeper.models import DENIED_TOOL_TEXT, UNAPPROVED_TOOL_TEXT, Event
from turnkeeper.replay_watch import FailureWatch
from turnkeeper.store import SessionStore, TranscriptRow, open_store
from turnkeeper.subagents import (
    DELEGATE_TOOL,
    SUBAGENT_SENDER,
    DelegateRefused,
    parse_args,
    report_message_id,
    sub_chat_id,
    task_message_id,
)
from turnkeeper.worker.catch_up import LOST_TASK, NO_TASK, QUERY_BEHIND, QUERY_CATCH_UP

if TYPE_CHECKING:
    from tests.chaos.harness import Chaos

LOG_BUG_PATTERNS = re.compile(r"nondetermin|Failed activation|Failed handling activation", re.IGNORECASE)
CATCH_UP_LINE = f"{QUERY_CATCH_UP} run "  # the worker's own line for each refused catch-up
CATCH_UP = re.compile(re.escape(CATCH_UP_LINE) + r"(\S+) at event (\d+) \((.+)\)")
SIGNS = {NO_TASK: "no_task_started", LOST_TASK: "lost_task_start", QUERY_BEHIND: "query_behind"}


ABNORMAL_RUN = (
    WorkflowExecutionStatus.FAILED,
    WorkflowExecutionStatus.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT,
    WorkflowExecutionStatus.CANCELED,
)
# How the reconciler's terminate (activities/reconcile/run_sweep.py) names itself: it ends a run
# whose workflow task keeps failing (activities/reconcile/wedged_runs.py).
RECONCILER_TERMINATES = "turnkeeper reconciler:"
# invariant -> the details it sums
INVARIANTS: dict[str, tuple[str, ...]] = {
    "duplicate_tool_executions": (
        "ledger_keys_started_twice",
        "ledger_start_without_tool_runs_row",
        "tool_calls_scheduled_twice",
        "children_started_twice",
    ),
    "lost_or_doubly_committed_messages": (
        "lost_messages",
        "doubly_committed_messages",
        "message_text_changed",
        "unknown_user_rows",
        "chats_out_of_order",
        "refused_but_committed",
        "delegated_tasks_lost",
        "delegated_tasks_doubled",
    ),
    "stuck_turns": (
        "chats_running_at_end",
        "open_turn_rows_without_run",
        "gates_without_run",
        "closed_turns_without_one_turn_end",
        "runs_ended_abnormally",
        "run_errors",
    ),
    "nondeterminism_errors": (
        "nondeterminism_in_history",
        "workflow_task_failures",
        "worker_log_lines",
        "replay_failures",
    ),
    "unbalanced_transcripts": ("unbalanced_transcripts", "tool_rows_apart_from_their_call"),
    "tools_run_without_approval": (
        "confirm_tool_scheduled_unapproved",
        "confirm_tool_started_unscheduled",
        "denied_call_ran",
    ),
    "actions_not_answered_in_time": ("actions_answered_late", "actions_unanswered"),
    "chats_not_answering_probe": ("probes_unanswered",),
    "idle_running_runs": ("idle_running_runs",),
    # Subagents (docs/subagents.md): each delegate call has one result; a waiting child's
    # answer is that result; each ended turn of a background child is one report message.
    "lost_or_doubled_child_answers": (
        "delegate_calls_without_one_result",
        "wait_answers_lost",
        "wait_answers_without_a_child_answer",
        "background_reports_lost",
        "background_reports_doubled",
        "background_reports_refused",
        "reports_for_turns_not_ended",
        "reports_from_waiting_children",
        "report_texts_without_the_answer",
        "refused_calls_started_children",
        "sub_chats_no_call_names",
    ),
    # After settling every child is closed or at a gate its user can see.
    "children_left_running": (
        "children_running_at_end",
        "parents_showing_a_gate_no_child_holds",
        "child_gates_not_shown_to_the_user",
        "waiting_children_outliving_their_turn",
    ),
    # Dismiss given in a parent's chat at a subagent's gate ends the parent's turn and the child's.
    "subagent_decisions_not_carried_out": (
        "parents_not_dismissed",
        "children_not_dismissed_with_their_parent",
    ),
}
EVENT_PAGE = 1000
ALL_CHATS = 1_000_000  # list_chats' limit: every chat of a run


def no_worker_gaps(
    windows: list[tuple[float, float]], t0: float, from_s: float, until_s: float
) -> list[tuple[float, float]]:
    """The spans (seconds since the harness started, within [from_s, until_s]) in
    which no worker was serving, from the merged serving windows (monotonic)."""
    gaps: list[tuple[float, float]] = []
    at = from_s
    for a, b in windows:
        a, b = a - t0, b - t0
        if a > at:
            gaps.append((at, min(a, until_s)))
        at = max(at, b)
        if at >= until_s:
            break
    if at < until_s:
        gaps.append((at, until_s))
    return [(a, b) for a, b in gaps if b > a]


def unserved_s(at_s: float, took_s: float, gaps: list[tuple[float, float]]) -> float:
    """How much of [at_s, at_s + took_s] fell in one of `gaps` (overlaps counted once)."""
    end = at_s + took_s
    total, reached = 0.0, at_s
    for a, b in sorted(gaps):
        a, b = max(a, reached), min(b, end)
        if b > a:
            total += b - a
            reached = b
    return total


def task_worker_pid(ev: Any) -> int | None:
    """The pid of the worker that started a workflow task (its identity is `<pid>@<host>`)."""
    pid = ev.workflow_task_started_event_attributes.identity.partition("@")[0]
    return int(pid) if pid.isdigit() else None


def held_by_killed_workers(
    histories: list[WorkflowHistory], killed_pids: set[int]
) -> dict[str, list[tuple[float, float]]]:
    """Per chat, the spans (unix time) in which a run's workflow task sat with a
    killed worker: started by it and timed out, or sent to its sticky queue and
    timed out there. No live worker could act on the chat then: Temporal hands the
    task on only when it times out."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for hist in histories:
        chat_id = hist.workflow_id.removeprefix("chat-")
        scheduled: float | None = None
        started: tuple[float, int | None] | None = None
        for ev in hist.events:
            et, at = ev.event_type, ev.event_time.ToMicroseconds() / 1e6
            if et == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                scheduled, started = at, None
            elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                started = (at, task_worker_pid(ev))
            elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                if started is not None and started[1] in killed_pids:
                    spans[chat_id].append((started[0], at))
                elif started is None and scheduled is not None:  # a dead worker's sticky queue
                    spans[chat_id].append((scheduled, at))
                scheduled = started = None
    return spans


def ended_by_reconciler(histories: list[WorkflowHistory]) -> dict[str, str]:
    """Run id -> the reason, for each run the reconciler terminated because its
    workflow task kept failing (activities/reconcile/wedged_runs.py), as a run whose history
    the workers' code does not replay would be."""
    ended: dict[str, str] = {}
    for hist in histories:
        for ev in hist.events:
            if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
                reason = ev.workflow_execution_terminated_event_attributes.reason
                if reason.startswith(RECONCILER_TERMINATES):
                    ended[hist.run_id] = reason
    return ended


# A sub-turn that ended so has a final answer (activities/subagent_activities.py's ANSWERED).
ANSWERED = {("completed", None), ("recovered", "continued"), ("recovered", "answer_restored")}
REPORT_ID_PREFIX = "subagent:"


def behind_what(hist: WorkflowHistory | None, event_id: int, pid: int | None) -> str:
    """What the event a "query behind" refusal stood at was: the start of the refusing
    worker's own task (no catch-up: the sign's price), of another worker's task (the
    catch-up the sign is for), or an event of a task no worker had started."""
    if hist is None or not 0 < event_id <= len(hist.events):
        return "query_behind_at_unknown"
    ev = hist.events[event_id - 1]
    if ev.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
        return "query_behind_at_events_no_task_started"
    own = pid is not None and task_worker_pid(ev) == pid
    return "query_behind_at_own_task" if own else "query_behind_at_another_workers_task"


def answered(status: str, reason: str | None) -> bool:
    return (status, reason if status == "recovered" else None) in ANSWERED


def is_report_id(message_id: str | None) -> bool:
    """A background subagent's report (turnkeeper.subagents.report_message_id)."""
    return bool(message_id) and str(message_id).startswith(REPORT_ID_PREFIX)


def report_of(message_id: str) -> str:
    """The sub-chat a report message id names: `subagent:<sub-chat>:<turn>`."""
    return message_id.removeprefix(REPORT_ID_PREFIX).rsplit(":", 1)[0]


def final_answer(rows: list[TranscriptRow], turn: int) -> str | None:
    """A turn's final answer: its last assistant row, if that row has words and no calls."""
    last = next((r for r in reversed(rows) if r.turn == turn and r.message.role == "assistant"), None)
    if last is None or last.message.tool_calls or not (last.message.content or "").strip():
        return None
    return last.message.content


@dataclass
class DelegateCall:
    chat_id: str
    turn: int
    call_id: str
    mode: str
    task: str
    sub_chat: str
    refusal: str | None  # why the workflow must refuse it (starting nothing), else None


def delegate_calls(
    rows_of: dict[str, list[TranscriptRow]], max_depth: int, max_fanout: int
) -> list[DelegateCall]:
    """Every delegate call in the transcripts, with the sub-chat it names and whether
    the workflow must refuse it (malformed or unknown-profile arguments, past the depth
    or the fan-out bound: the harness configures no profile)."""
    out: list[DelegateCall] = []
    for chat_id, rows in rows_of.items():
        depth = chat_id.count(".sub") + 1  # the depth a subagent of this chat would be at
        for r in rows:
            if r.message.role != "assistant":
                continue
            n = 0
            for call in r.message.tool_calls or []:
                if call.name != DELEGATE_TOOL:
                    continue
                n += 1
                refusal: str | None = None
                mode, task = "wait", ""
                try:
                    args = parse_args(call.arguments)
                    mode, task = args.mode, args.task
                    if args.profile is not None:
                        refusal = f"unknown profile {args.profile!r}"
                except DelegateRefused as err:
                    refusal = str(err)
                if refusal is None and depth > max_depth:
                    refusal = f"depth {depth} > {max_depth}"
                if refusal is None and n > max_fanout:
                    refusal = f"call {n} of a reply > {max_fanout}"
                out.append(
                    DelegateCall(
                        chat_id, r.turn, call.id, mode, task, sub_chat_id(chat_id, r.turn, call.id), refusal
                    )
                )
    return out


class Checker:
    def __init__(self, h: Chaos, report: Report) -> None:
        self.h = h
        self.report = report
        self.det: Counter[str] = Counter()
        self.evidence: dict[str, list[str]] = defaultdict(list)
        self.late: list[Any] = []  # actions answered late
        self.calls_by_sub: dict[str, DelegateCall] = {}  # every delegate call, by the sub-chat it names

    def fail(self, detail: str, text: str, chat_id: str | None = None, why: str | None = None) -> None:
        self.det[detail] += 1
        self.report.failures.append(text)
        if chat_id is not None:
            self.evidence[chat_id].append(why or text)

    async def run(self) -> None:
        h, report = self.h, self.report
        start = time.monotonic()
        self.det.update({k: 0 for ks in INVARIANTS.values() for k in ks})
        report.chats = len(h.chats)
        report.gates_answered = dict(h.gates_answered)
        report.gate_rejections = dict(h.gate_rejections)
        report.stale_probes = dict(h.stale_probes)
        report.rejection_samples = dict(h.rejection_samples)
        report.stops = h.stops
        refused = h.model.counts.get("protocol_violation", 0)
        if refused:
            report.anomalies.append(
                f"{refused} model requests carried a tool call without its tool result: a real OpenAI "
                "server refuses those with 400 (here: answered the same way, so the turn waits as model_failed)"
            )
        await self._load_store()
        self._turns_and_events()
        self._tools()
        self._messages()
        self._transcripts()
        self._stuck()
        self._probes_and_idle_runs()
        histories = await self._runs_and_histories()
        self._delegations()
        self._children_left_running()
        self._actions(histories)
        self._approvals()
        self._why_late(histories)
        await self._nondeterminism(histories)
        report.invariants = {name: sum(self.det[k] for k in keys) for name, keys in INVARIANTS.items()}
        report.details = dict(self.det)
        if self.evidence:
            self._write_evidence(histories)
        report.check_s = time.monotonic() - start

    async def _load_store(self) -> None:
        """Every chat's turns, transcript and event log, read through the store's API
        once the workers are stopped: the chats the harness drove and any other the
        store lists."""
        store = open_store(self.h.settings)
        await store.open()
        try:
            latest = await store.list_chats(limit=ALL_CHATS)
            chat_ids = sorted(set(self.h.chats) | {r.chat_id for r in latest})
            self.events: list[Event] = []
            rows_of: dict[str, list[TranscriptRow]] = {}
            for chat_id in chat_ids:
                self.events += await _all_events(store, chat_id)
                if rows := await store.transcript_rows(chat_id):
                    rows_of[chat_id] = rows
            # A turn row's `ended` is set with its `turn_end` event, in one transaction.
            ended = {(e.chat_id, e.payload.get("turn")) for e in self.events if e.type == "turn_end"}
            self.turns: list[dict[str, Any]] = []
            for last in sorted(latest, key=lambda r: r.chat_id):
                for n in range(1, last.turn + 1):  # a chat's turns are numbered 1, 2, 3, ...
                    r = await store.get_turn(last.chat_id, n) if n < last.turn else last
                    if r is not None:
                        self.turns.append(
                            {
                                "chat_id": r.chat_id,
                                "turn": r.turn,
                                "run_id": r.run_id,
                                "status": r.status.value,
                                "reason": r.reason.value if r.reason else None,
                                "recovery_id": r.recovery_id,
                                "attempts": r.attempts,
                                "ended": int((r.chat_id, r.turn) in ended),
                            }
                        )
        finally:
            await store.close()
        # Chats in the order of their first row, rows of all chats in transcript order (the order findings come in).
        self.rows_of = dict(sorted(rows_of.items(), key=lambda item: item[1][0].id))
        self.messages = sorted(
            ((chat_id, r) for chat_id, rows in rows_of.items() for r in rows), key=lambda m: m[1].id
        )
        # The store records each tool start (its idempotency key) with a `tool_started` event.
        self.tool_runs = {e.payload.get("idempotency_key") for e in self.events if e.type == "tool_started"}
        self.delegate_runs = {
            e.payload.get("idempotency_key")
            for e in self.events
            if e.type == "tool_started" and e.payload.get("name") == DELEGATE_TOOL
        }
        self.senders = {
            (e.chat_id, e.payload.get("message_id")): e.payload.get("sender")
            for e in self.events
            if e.type == "user_message"
        }
        self.turns_of: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
        for t in self.turns:
            self.turns_of[t["chat_id"]][t["turn"]] = t

    # -- turns and the event log: gates, turns written to after their end -----------------
    def _turns_and_events(self) -> None:
        report = self.report
        by_status = Counter(r["status"] for r in self.turns)
        report.turns_by_status = dict(by_status)
        report.turns_closed = sum(by_status[s] for s in CLOSED_TURN)
        report.recovered_by_reason = dict(
            Counter(r["reason"] for r in self.turns if r["status"] == "recovered")
        )
        for r in self.turns:
            if r["reason"] == "superseded" and r["turn"] + 1 not in self.turns_of[r["chat_id"]]:
                report.anomalies.append(
                    f"chat {r['chat_id']}: turn {r['turn']} was superseded but no turn "
                    "follows it (superseded by a retried message id?)"
                )
                self.evidence[r["chat_id"]].append(f"turn {r['turn']} superseded without a successor")
        gates: Counter[str] = Counter()
        ended: dict[tuple[str, int], int] = {}
        self.turn_ends: Counter[tuple[str, int]] = Counter()
        self.refused_ids: dict[str, dict[str, str]] = defaultdict(dict)  # chat -> message id -> reason
        self.refusals: Counter[tuple[str, str]] = Counter()  # message_rejected events per (chat, id)
        assistant_writes: Counter[tuple[str, int, int]] = Counter()
        for e in self.events:
            payload = e.payload
            key = (e.chat_id, payload.get("turn"))
            if e.type == "recovery_state":
                if payload.get("status") == "awaiting_user":
                    gates[payload.get("reason")] += 1
                if key in ended:
                    self.det["turn_reopened_after_end"] += 1
                    report.anomalies.append(
                        f"chat {e.chat_id}: turn {payload.get('turn')} got recovery_state "
                        f"{payload.get('status')}/{payload.get('reason')} (seq {e.seq}) after its turn_end "
                        f"(seq {ended[key]}): a closed turn was reopened"
                    )
                    self.evidence[e.chat_id].append(f"turn {payload.get('turn')} reopened after turn_end")
            elif e.type == "turn_end":
                ended.setdefault(key, e.seq)
                self.turn_ends[key] += 1
            elif e.type == "assistant_message":
                assistant_writes[(e.chat_id, payload.get("turn"), payload.get("step"))] += 1
            elif e.type == "recovery_action_rejected":
                self.det["signals_refused_in_event_log"] += 1
            elif e.type == "message_rejected" and payload.get("message_id"):
                self.refused_ids[e.chat_id][payload["message_id"]] = str(payload.get("reason"))
                self.refusals[(e.chat_id, payload["message_id"])] += 1
        report.gates_by_reason = dict(gates)
        for (chat_id, turn, step), n in assistant_writes.items():
            if n > 1:
                self.det["assistant_row_rewritten"] += 1
                report.anomalies.append(
                    f"chat {chat_id}: turn {turn} step {step}: the assistant row was "
                    f"written {n} times (an answer rewritten in place)"
                )
                self.evidence[chat_id].append(f"turn {turn} step {step} assistant row written {n} times")

    # -- 1. tools ------------------------------------------------------------------------------
    def _tools(self) -> None:
        h, report = self.h, self.report
        starts: dict[str, list[str]] = defaultdict(list)
        dones: Counter[str] = Counter()
        self.confirm_starts: dict[
            str, str
        ] = {}  # tool call id -> its ledger start, of the tool that asks first
        for line in h.ledger.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "start":
                starts[parts[1]].append(line)
                if f"tool={CONFIRM_TOOL}" in parts:
                    self.confirm_starts[parts[1].rsplit("/", 1)[-1]] = line
            elif len(parts) >= 2 and parts[0] == "done":
                dones[parts[1]] += 1
        for key, lines in starts.items():
            if len(lines) > 1:
                self.fail(
                    "ledger_keys_started_twice",
                    f"tool executed {len(lines)} times: {key}: {lines}",
                    key.split("/")[0],
                    f"tool {key} started {len(lines)} times",
                )
            if key not in self.tool_runs:
                self.fail(
                    "ledger_start_without_tool_runs_row",
                    f"tool acted without a tool_runs row in the store: {key}",
                )
        killed_at = {k["pid"]: k["unix"] for k in h.kill_log}

        def cut_by_kill(line: str) -> bool:
            # The tool's worker was killed while it could still be running.
            fields = dict(f.split("=", 1) for f in line.split()[2:] if "=" in f)
            at = killed_at.get(int(fields.get("pid", -1)))
            return at is not None and 0 <= at - float(fields.get("t", 0)) <= h.cfg.tool_max_s + 1

        cut_off = [k for k in starts if dones[k] == 0]
        report.tools = {
            "starts": sum(len(v) for v in starts.values()),
            "done": sum(dones.values()),
            "cut_off": len(cut_off),
            "cut_off_by_kills": sum(1 for k in cut_off if cut_by_kill(starts[k][0])),
            "recorded_not_acted": sum(
                1 for k in self.tool_runs if k not in starts and k not in self.delegate_runs
            ),
        }
        if self.delegate_runs:
            report.tools["delegate_calls_recorded"] = len(self.delegate_runs)

    # -- 4 (issue). messages: every acknowledged one committed exactly once, or refused visibly --
    def _messages(self) -> None:
        h, report = self.h, self.report
        msg: Counter[str] = Counter()
        for chat in h.chats.values():
            rows = [r for r in self.rows_of.get(chat.chat_id, []) if r.message.role == "user"]
            ids = [r.message_id for r in rows]
            count = Counter(ids)
            contents = Counter(r.message.content for r in rows)
            refused = self.refused_ids.get(chat.chat_id, {})
            msg["ids"] += len(chat.texts)
            msg["sends"] += chat.sends
            msg["dup_sends"] += chat.dup_sends
            msg["late_dup_sends"] += len(chat.late_dups)
            msg["acknowledged"] += len(chat.acked)
            msg["unacknowledged"] += len(chat.unacked)
            msg["acknowledged_during_outage"] += len(chat.acked_during_outage)
            resent = {mid for _, mid in chat.late_dups}
            for mid in chat.acked:
                text = chat.texts[mid]
                if mid in refused:
                    msg["refused_visibly"] += 1
                    msg[f"refused: {refused[mid].split(';')[0][:40]}"] += 1
                    if self.refusals[(chat.chat_id, mid)] > chat.sent[mid]:
                        self.det["refusals_announced_more_than_sent"] += 1
                        report.anomalies.append(
                            f"chat {chat.chat_id} message {mid}: {self.refusals[(chat.chat_id, mid)]} "
                            f"message_rejected events for {chat.sent[mid]} sends"
                        )
                    if count[mid] == 1 and mid in resent:
                        msg["refused_then_sent_again_and_committed"] += 1  # as the refusal asks
                    elif count[mid]:
                        self.fail(
                            "refused_but_committed",
                            f"chat {chat.chat_id} message {mid} was refused ({refused[mid]}) "
                            f"but committed {count[mid]} times",
                            chat.chat_id,
                            f"message {mid} refused and committed",
                        )
                    continue
                if count[mid] == 0:
                    self.fail(
                        "lost_messages",
                        f"acknowledged message lost: chat {chat.chat_id} message {mid}"
                        + (
                            " (acknowledged during a store outage)" if mid in chat.acked_during_outage else ""
                        ),
                        chat.chat_id,
                        f"message {mid} acknowledged, never committed",
                    )
                elif count[mid] > 1 or contents[text] > 1:
                    self.fail(
                        "doubly_committed_messages",
                        f"message committed {max(count[mid], contents[text])} "
                        f"times: chat {chat.chat_id} message {mid}",
                        chat.chat_id,
                        f"message {mid} committed more than once",
                    )
                else:
                    msg["committed"] += 1
                    if mid in chat.acked_during_outage:
                        msg["committed_acknowledged_during_outage"] += 1
                    row = next(r for r in rows if r.message_id == mid)
                    if row.message.content != text:
                        self.fail(
                            "message_text_changed",
                            f"chat {chat.chat_id} message {mid}: committed text differs",
                            chat.chat_id,
                        )
            for mid in chat.unacked:
                if count[mid] > 1:
                    self.fail(
                        "doubly_committed_messages",
                        f"unacknowledged message committed {count[mid]} times: {mid}",
                        chat.chat_id,
                    )
                elif count[mid] == 1:
                    msg["unacknowledged_but_committed"] += 1
            unknown = [i for i in ids if i not in chat.texts and not is_report_id(i)]
            if unknown:
                self.det["unknown_user_rows"] += len(unknown) - 1
                self.fail(
                    "unknown_user_rows",
                    f"chat {chat.chat_id}: user rows nobody sent: {unknown}",
                    chat.chat_id,
                )
            # A refused message sent again later has its place where it was sent again.
            committed_order = [i for i in ids if i in chat.acked_set and i not in refused]
            expected_order = [i for i in chat.acked if count[i] >= 1 and i not in refused]
            if committed_order != expected_order:
                self.fail(
                    "chats_out_of_order",
                    f"chat {chat.chat_id}: messages committed out of order: "
                    f"sent {expected_order}, committed {committed_order}",
                    chat.chat_id,
                    "user rows out of order",
                )
        report.messages = dict(msg)

    # -- 5. transcripts stay balanced: one tool row per tool call, no orphan tool row ------------
    def _transcripts(self) -> None:
        for chat_id, rows in self.rows_of.items():
            calls: list[str] = []
            answered: Counter[str] = Counter()
            for r in rows:
                if r.message.role == "assistant":
                    calls += [c.id for c in r.message.tool_calls or []]
                elif r.message.role == "tool":
                    answered[r.message.tool_call_id] += 1
            bad = [c for c in calls if answered[c] != 1] + [c for c in answered if c not in calls]
            if bad:
                self.fail(
                    "unbalanced_transcripts",
                    f"chat {chat_id}: unbalanced tool rows for calls {bad}",
                    chat_id,
                    f"unbalanced tool rows {bad}",
                )
            # A provider also wants each call's tool row right after the call's assistant row.
            apart = [c for c in unanswered_tool_calls([_body(r) for r in rows]) if c not in bad]
            if apart:
                self.fail(
                    "tool_rows_apart_from_their_call",
                    f"chat {chat_id}: the tool rows of calls {apart} do not "
                    "follow their assistant row at once (a provider refuses the transcript)",
                    chat_id,
                    f"tool rows apart from their call {apart}",
                )

    # -- 3. stuck turns ----------------------------------------------------------------------------
    def _stuck(self) -> None:
        h, report = self.h, self.report
        still_running = set(h.still_running)
        for chat_id in h.still_running:
            if is_sub_chat(chat_id):
                continue  # a subagent's chat: _children_left_running
            state = h.final_states.get(chat_id)
            if isinstance(state, dict) and state.get("status") == "awaiting_user":
                report.anomalies.append(f"chat {chat_id} ended waiting visibly: {state.get('reason')}")
                continue
            self.fail(
                "chats_running_at_end",
                f"chat {chat_id} still running after settling: {state}",
                chat_id,
                "running at the end",
            )
        for r in self.turns:
            chat_id, turn = r["chat_id"], r["turn"]
            if r["status"] in ("running", "resuming"):
                if chat_id not in still_running:
                    self.fail(
                        "open_turn_rows_without_run",
                        f"chat {chat_id} turn {turn}: store says {r['status']} but no run is running",
                        chat_id,
                        f"turn {turn} open in the store",
                    )
            elif r["status"] == "awaiting_user" and chat_id not in still_running:
                self.fail(
                    "gates_without_run",
                    f"chat {chat_id} turn {turn}: store says awaiting_user but no run is waiting",
                    chat_id,
                    f"turn {turn} awaiting in the store without a run",
                )
            elif r["status"] in CLOSED_TURN and self.turn_ends[(chat_id, turn)] != 1:
                # What reads the event log (`send`, a UI) would show it working forever, or end it twice.
                self.fail(
                    "closed_turns_without_one_turn_end",
                    f"chat {chat_id} turn {turn}: "
                    f"{r['status']}/{r['reason']} with {self.turn_ends[(chat_id, turn)]} turn_end events",
                    chat_id,
                    f"turn {turn} closed without one turn_end",
                )
        for text in h.slow_turns:
            report.anomalies.append(text)
        for text in h.run_errors:
            self.fail("run_errors", text)

    # -- subagents: no child answer lost or doubled; no child left running -------------------------
    def _delegations(self) -> None:
        """Every delegate call in any chat's transcript (a subagent's chat's included):
        one result row; a refused call started nothing; a waiting child's answer is its
        row; each ended turn of a background child is one report message in its parent's
        chat, with its answer; the task is its sub-chat's one first row. Also counts."""
        h, report = self.h, self.report
        calls = delegate_calls(self.rows_of, h.cfg.subagent_max_depth, h.cfg.subagent_max_fanout)
        self.calls_by_sub = {c.sub_chat: c for c in calls}
        started = {w.removeprefix("chat-") for w in self.children}
        sub_chats = {c for c in self.rows_of if is_sub_chat(c)} | {c for c in self.turns_of if is_sub_chat(c)}
        counts: Counter[str] = Counter()
        turns: dict[tuple[str, int], list[DelegateCall]] = defaultdict(list)
        for c in calls:
            turns[(c.chat_id, c.turn)].append(c)
        counts["delegating_turns"] = len(turns)
        for group in turns.values():
            modes = {c.mode for c in group if c.refusal is None}
            counts["turns_wait"] += "wait" in modes
            counts["turns_background"] += "background" in modes
            counts["turns_fanout"] += len(group) > 1
            counts["turns_nested"] += is_sub_chat(group[0].chat_id)
        counts["calls"] = len(calls)
        counts["children_started"] = len(started)
        counts["sub_chats_in_store"] = len(sub_chats)
        counts["max_depth"] = max((c.count(".sub") for c in sub_chats | started), default=0)
        counts["sub_chat_turns_closed"] = sum(
            1 for t in self.turns if is_sub_chat(t["chat_id"]) and t["status"] in CLOSED_TURN
        )
        reports_seen: set[tuple[str, str]] = set()
        self._reports = self.report_rows()
        for c in calls:
            counts["calls_refused" if c.refusal else f"calls_{c.mode}"] += 1
            counts["calls_nested"] += is_sub_chat(c.chat_id)
            self._one_delegation(c, c.sub_chat in started or c.sub_chat in sub_chats, counts, reports_seen)
        # The sub-chats' own user rows: the task once, reports of their own subagents, nothing else.
        for sub in sorted(sub_chats):
            call = self.calls_by_sub.get(sub)
            rows = [r for r in self.rows_of.get(sub, []) if r.message.role == "user"]
            task_id = task_message_id(call.call_id) if call else None
            ids = Counter(r.message_id for r in rows)
            if call is None:
                self.fail(
                    "unknown_user_rows", f"sub-chat {sub}: no delegate call in any transcript names it", sub
                )
                continue
            if ids[task_id] == 0 and (sub in started or rows):
                self.fail(
                    "delegated_tasks_lost",
                    f"sub-chat {sub}: its task (message {task_id}) is no row of it",
                    sub,
                    f"task {task_id} lost",
                )
            elif ids[task_id] > 1:
                self.fail("delegated_tasks_doubled", f"sub-chat {sub}: its task is {ids[task_id]} rows", sub)
            elif ids[task_id] == 1:
                row = next(r for r in rows if r.message_id == task_id)
                if row.message.content != call.task:
                    self.fail("message_text_changed", f"sub-chat {sub}: its task's text differs", sub)
                if rows[0].message_id != task_id:
                    self.fail("chats_out_of_order", f"sub-chat {sub}: its task is not its first row", sub)
            unknown = [i for i in ids if i != task_id and not is_report_id(i)]
            if unknown:
                self.fail("unknown_user_rows", f"sub-chat {sub}: user rows nobody sent: {unknown}", sub)
        for (chat_id, message_id), row_count in self._reports.items():
            if (chat_id, message_id) not in reports_seen:
                self.fail(
                    "reports_for_turns_not_ended",
                    f"chat {chat_id}: report {message_id} ({row_count} rows) of no ended turn of a "
                    "background subagent of this chat",
                    chat_id,
                )
        ended = Counter(
            f"{t['status']}/{t['reason']}" if t["reason"] else t["status"]
            for c in calls
            if c.refusal is None
            for t in self.turns_of.get(c.sub_chat, {}).values()
        )
        counts.update({f"ended {k}": v for k, v in ended.items()})
        report.subagents = dict(counts)
        self._dismissed_from_the_parent()
        gates: Counter[str] = Counter(h.subagent_gates_decided)
        for a in h.actions.actions:
            if a.reason_seen == "subagent_waiting" and a.source == "user":
                gates[f"{a.kind.split('/')[0]} by the user ({a.id_kind}): {a.outcome}"] += 1
            elif a.reason_seen == "subagent_waiting" and a.id_kind == "made-up":
                gates[f"stale probe: {a.outcome}"] += 1
        report.subagent_gates = dict(gates)

    def _dismissed_from_the_parent(self) -> None:
        """A Dismiss accepted at a subagent's gate shown in a parent's chat (with the id on
        screen, judged by tk.decide) ends the parent's turn and the subagent's as dismissed."""
        gates: dict[str, set[tuple[str, int]]] = defaultdict(set)  # recovery id -> the turns that opened it
        for e in self.events:
            p = e.payload
            own_gate = p.get("status") == "awaiting_user" and p.get("reason") != "subagent_waiting"
            if e.type == "recovery_state" and own_gate and p.get("recovery_id"):
                gates[p["recovery_id"]].add((e.chat_id, p.get("turn")))
        for a in self.h.actions.actions:
            if not (
                a.reason_seen == "subagent_waiting"
                and a.kind == "dismiss/decide"
                and a.id_kind == "current"
                and a.outcome == "accepted"
            ):
                continue
            parent = self.turns_of.get(a.chat_id, {}).get(a.turn_seen or 0)
            if parent is not None and (parent["status"], parent["reason"]) == ("completed", None):
                self.fail(
                    "parents_not_dismissed",
                    f"chat {a.chat_id}: Dismiss at a subagent's gate ({a.recovery_id}) at {a.at_s:.1f} s was "
                    f"accepted, but turn {a.turn_seen} completed",
                    a.chat_id,
                )
            for sub, turn in sorted(gates.get(a.recovery_id or "", ())):
                rec = self.turns_of.get(sub, {}).get(turn)
                if (
                    is_sub_chat(sub)
                    and rec is not None
                    and (rec["status"], rec["reason"]) != ("recovered", "dismissed")
                ):
                    self.fail(
                        "children_not_dismissed_with_their_parent",
                        f"chat {a.chat_id}: Dismiss at subagent {sub}'s gate ({a.recovery_id}) at {a.at_s:.1f} s "
                        f"was accepted, but its turn {turn} ended {rec['status']}/{rec['reason']}",
                        sub,
                    )

    def report_rows(self) -> Counter[tuple[str, str]]:
        """(chat, message id) -> rows, of every report message in any chat."""
        return Counter(
            (chat_id, r.message_id)
            for chat_id, rows in self.rows_of.items()
            for r in rows
            if r.message.role == "user" and r.message_id and is_report_id(r.message_id)
        )

    def _one_delegation(
        self, c: DelegateCall, started: bool, counts: Counter[str], reports_seen: set[tuple[str, str]]
    ) -> None:
        rows = self.rows_of.get(c.chat_id, [])
        results = [r for r in rows if r.message.role == "tool" and r.message.tool_call_id == c.call_id]
        parent_turn = self.turns_of.get(c.chat_id, {}).get(c.turn, {})
        where = f"chat {c.chat_id} turn {c.turn} delegate call {c.call_id} ({c.mode}, sub-chat {c.sub_chat})"
        if len(results) != 1 and parent_turn.get("status") in CLOSED_TURN:
            self.fail(
                "delegate_calls_without_one_result",
                f"{where}: {len(results)} result rows",
                c.chat_id,
                f"delegate call {c.call_id}: {len(results)} result rows",
            )
        content = (results[0].message.content or "") if results else ""
        if c.refusal is not None:
            if started:
                self.fail(
                    "refused_calls_started_children",
                    f"{where}: should be refused ({c.refusal}) but its child started",
                    c.chat_id,
                )
            elif results and not content.startswith("Error"):
                self.report.anomalies.append(
                    f"{where}: refused ({c.refusal}) but its row reads {content[:200]!r}"
                )
            return
        if not started:
            counts["calls_that_started_no_child"] += 1
            return
        sub_turns = self.turns_of.get(c.sub_chat, {})
        sub_rows = self.rows_of.get(c.sub_chat, [])
        task_id = task_message_id(c.call_id)
        task_turn = next((r.turn for r in sub_rows if r.message_id == task_id), 1)
        own = sub_turns.get(task_turn)
        answer = final_answer(sub_rows, task_turn) if own and answered(own["status"], own["reason"]) else None
        reports = self._reports
        if c.mode == "wait":
            mine = [k for k in reports if k[0] == c.chat_id and report_of(k[1]) == c.sub_chat]
            if mine:
                self.fail(
                    "reports_from_waiting_children", f"{where}: reports {mine} of a waiting child", c.chat_id
                )
            if not results:
                return
            if answer is not None and content != answer:
                ended_by_user = parent_turn.get("reason") in ("stopped", "dismissed", "superseded")
                if ended_by_user:
                    counts["wait_answers_cut_by_the_parents_end"] += 1
                else:
                    self.fail(
                        "wait_answers_lost",
                        f"{where}: the child answered {answer!r} but the call's row reads {content[:300]!r}",
                        c.chat_id,
                        f"delegate call {c.call_id}: the child's answer is not its row",
                    )
                    self.evidence[c.sub_chat].append(
                        f"its answer is not the row of call {c.call_id} in {c.chat_id}"
                    )
            elif answer is not None:
                counts["wait_answers_matched"] += 1
            elif content.startswith(ANSWER_LEAD):
                self.fail(
                    "wait_answers_without_a_child_answer",
                    f"{where}: the row reads {content[:200]!r} but the child's turn "
                    f"{task_turn} ended {own['status'] if own else 'never'} without an answer",
                    c.chat_id,
                )
            else:
                counts["wait_children_without_an_answer"] += 1
            return
        # background: each ended turn of the child is one report in the parent's chat
        for t, rec in sorted(sub_turns.items()):
            mid = report_message_id(c.sub_chat, t)
            n = reports.get((c.chat_id, mid), 0)
            ended = rec["status"] in CLOSED_TURN
            if n:
                reports_seen.add((c.chat_id, mid))
            if not ended:
                continue
            counts["background_turns_ended"] += 1
            if n == 1:
                counts["reports"] += 1
                if self.senders.get((c.chat_id, mid)) != SUBAGENT_SENDER:
                    self.report.anomalies.append(
                        f"{where}: report {mid} was sent by {self.senders.get((c.chat_id, mid))!r}"
                    )
                row = next(r for r in rows if r.message_id == mid)
                words = final_answer(sub_rows, t) if answered(rec["status"], rec["reason"]) else None
                if words is not None and words not in (row.message.content or ""):
                    self.fail(
                        "report_texts_without_the_answer",
                        f"{where}: report {mid} lacks the answer {words!r}: {(row.message.content or '')[:300]!r}",
                        c.chat_id,
                    )
            elif n > 1:
                self.fail("background_reports_doubled", f"{where}: report {mid} is {n} rows", c.chat_id)
            elif mid in self.refused_ids.get(c.chat_id, {}):
                self.fail(
                    "background_reports_refused",
                    f"{where}: report {mid} refused: {self.refused_ids[c.chat_id][mid]}",
                    c.chat_id,
                )
            else:
                self.fail(
                    "background_reports_lost",
                    f"{where}: turn {t} ended {rec['status']}/{rec['reason']} but report {mid} is no row",
                    c.chat_id,
                    f"report {mid} lost",
                )
                self.evidence[c.sub_chat].append(f"its turn {t}'s report {mid} is no row of {c.chat_id}")

    def _children_left_running(self) -> None:
        """After settling: every subagent's run is closed or waits at a gate; a chat that
        shows a subagent's gate shows one its subagent holds; a waiting child's gate
        reached its user's chat; no waiting child outlives its parent's turn."""
        h = self.h
        for chat_id in h.still_running:
            state = h.final_states.get(chat_id)
            if is_sub_chat(chat_id) and not (
                isinstance(state, dict) and state.get("status") == "awaiting_user"
            ):
                self.fail(
                    "children_running_at_end",
                    f"sub-chat {chat_id} still running after settling, not at a gate: {state}",
                    chat_id,
                    "subagent running at the end",
                )
            elif is_sub_chat(chat_id):
                self.report.anomalies.append(
                    f"sub-chat {chat_id} ended waiting visibly: {state.get('reason')}"
                )  # type: ignore[union-attr]
            if isinstance(state, dict) and state.get("reason") == "subagent_waiting":
                holder = shown_subagent(state)
                held = h.final_states.get(holder["chat_id"]) if holder else None
                if (
                    not isinstance(held, dict)
                    or held.get("status") != "awaiting_user"
                    or held.get("recovery_id") != state.get("recovery_id")
                ):
                    self.fail(
                        "parents_showing_a_gate_no_child_holds",
                        f"chat {chat_id} shows subagent_waiting ({state.get('recovery_id')}) but its subagent "
                        f"{holder['chat_id'] if holder else '(none listed)'} shows {held}",
                        chat_id,
                    )
        for text in h.unshown_child_gates:
            self.fail("child_gates_not_shown_to_the_user", text, text.split(":")[0])
        for text in h.outliving_children:
            self.fail("waiting_children_outliving_their_turn", text, text.split(":")[0])
        for sub, c in self.calls_by_sub.items():
            if c.mode != "wait" or c.refusal is not None:
                continue
            parent = self.turns_of.get(c.chat_id, {}).get(c.turn, {})
            open_child = [t for t, r in self.turns_of.get(sub, {}).items() if r["status"] not in CLOSED_TURN]
            if parent.get("status") in CLOSED_TURN and open_child:
                self.fail(
                    "waiting_children_outliving_their_turn",
                    f"chat {c.chat_id} turn {c.turn} ended {parent['status']}/{parent['reason']} but its "
                    f"waiting subagent {sub} has turn(s) {open_child} open",
                    sub,
                )

    # -- 1 (issue). every action answered in time --------------------------------------------------
    def _actions(self, histories: list[WorkflowHistory]) -> None:
        h, report = self.h, self.report
        log = h.actions
        report.user_actions = log.counts()
        report.action_outcomes = log.outcomes()
        report.while_resuming = log.while_resuming()
        report.latency = log.latency()
        bound = h.cfg.answer_bound_s
        # A decision is judged by a worker: the time in which none was serving
        # (every one killed, the replacements not yet polling) is the killer's,
        # not the turn's. The bound applies to the rest; both clocks are reported.
        h.pool.look_for_serving()
        until = h.pool.stopped_at or time.monotonic()
        gaps = no_worker_gaps(h.pool.serving_windows(until), h.t0, h.chaos_from_s, until - h.t0)
        report.no_worker_gaps = {
            "count": len(gaps),
            "total_s": round(sum(b - a for a, b in gaps), 2),
            "longest_s": round(max((b - a for a, b in gaps), default=0.0), 2),
        }
        served = [
            a.latency_s - unserved_s(a.at_s, a.latency_s, gaps)
            for a in log.actions
            if a.latency_s is not None and a.kind != "burst"
        ]
        report.latency_served = {
            "n": len(served),
            "max_s": round(max(served, default=0.0), 3),
            "p99_s": round(percentile(served, 99), 3),
        }
        # Likewise the time the chat's task sat with a worker the killer had killed
        # (the contract's clock starts when an action reaches a live worker).
        held = held_by_killed_workers(histories, {k["pid"] for k in h.kill_log})

        def held_gaps(a: Any) -> list[tuple[float, float]]:
            offset = a.unix - a.at_s
            return [(u0 - offset, u1 - offset) for u0, u1 in held[a.chat_id]]

        live = [
            a.latency_s - unserved_s(a.at_s, a.latency_s, gaps + held_gaps(a))
            for a in log.actions
            if a.latency_s is not None and a.kind != "burst"
        ]
        report.latency_live = {
            "n": len(live),
            "max_s": round(max(live, default=0.0), 3),
            "p99_s": round(percentile(live, 99), 3),
        }
        for a in log.unanswered(bound):
            if a.latency_s is not None and self._late_only_on_the_raw_clock(
                a,
                bound,
                (
                    ("late_only_while_no_worker_served", gaps, "with no worker serving"),
                    (
                        "late_only_while_a_killed_worker_held_its_task",
                        gaps + held_gaps(a),
                        "with no worker serving or the chat's task held by a killed worker",
                    ),
                ),
            ):
                continue
            detail = "actions_unanswered" if a.latency_s is None else "actions_answered_late"
            took = (
                f"no answer in {h.cfg.action_wait_s:.0f} s" if a.latency_s is None else f"{a.latency_s:.2f} s"
            )
            around = self._circumstances(a.at_s, a.latency_s or h.cfg.action_wait_s)
            self.late.append(a)
            self.fail(
                detail,
                f"chat {a.chat_id}: {a.kind} ({a.source}, id {a.id_kind}, status seen "
                f"{a.status_seen}) at {a.at_s:.1f} s answered after {took}: {a.outcome}{around}",
                a.chat_id,
                f"{a.kind} at {a.at_s:.1f} s took {took}",
            )
        made_up = [
            a
            for a in log.actions
            if a.id_kind == "made-up" and a.outcome == "accepted" and a.kind.endswith("/decide")
        ]
        for a in made_up:
            self.fail(
                "run_errors", f"chat {a.chat_id}: {a.kind} with a made-up recovery id was accepted", a.chat_id
            )
        # Expected under the contract, not an invariant of its own: Dismiss with the
        # current id is accepted in every open status, resuming included.
        refused = [
            a
            for a in log.actions
            if a.kind == "dismiss/decide"
            and a.id_kind == "current"
            and a.status_seen == "resuming"
            and a.outcome.startswith("refused")
        ]
        if refused:
            report.anomalies.append(
                f"{len(refused)} Dismiss decisions with the current id were refused while the turn was resuming "
                f"(e.g. chat {refused[0].chat_id} at {refused[0].at_s:.1f} s: {refused[0].outcome}); the "
                "contract accepts them (a race with the turn's end refuses some)"
            )

    def _late_only_on_the_raw_clock(
        self, a: Any, bound: float, clocks: tuple[tuple[str, list[tuple[float, float]], str], ...]
    ) -> bool:
        """In time on one of `clocks` (the spans no live worker could answer in): an
        anomaly named after the first such clock, not a failure."""
        for detail, spans, words in clocks:
            unserved = unserved_s(a.at_s, a.latency_s, spans)
            if a.latency_s - unserved <= bound:
                self.det[detail] += 1
                self.report.anomalies.append(
                    f"chat {a.chat_id}: {a.kind} at {a.at_s:.1f} s took "
                    f"{a.latency_s:.2f} s, of which {unserved:.2f} s {words}"
                )
                return True
        return False

    def _why_late(self, histories: list[WorkflowHistory]) -> None:
        """Sorts the late answers: the run's workflow task timed out meanwhile (its
        worker was killed holding it), a store outage, or neither."""
        timeouts: dict[str, list[float]] = defaultdict(list)
        for hist in histories:
            for ev in hist.events:
                if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                    timeouts[hist.workflow_id.removeprefix("chat-")].append(
                        ev.event_time.ToMicroseconds() / 1e6
                    )
        for a in self.late:
            took = a.latency_s if a.latency_s is not None else self.h.cfg.action_wait_s
            if any(a.unix <= t <= a.unix + took + 0.5 for t in timeouts[a.chat_id]):
                self.det["late_behind_a_workflow_task_timeout"] += 1
            elif any(
                o["at_s"] <= a.at_s + took and a.at_s <= o["at_s"] + o["held_s"] for o in self.h.outage_log
            ):
                self.det["late_in_a_store_outage"] += 1
            else:
                self.det["late_otherwise"] += 1

    def _circumstances(self, at_s: float, took_s: float) -> str:
        """The kills (up to 10 s before, the workflow task timeout) and outages around an action."""
        h = self.h
        parts = [
            f"kill {k['kill']} of worker {k['worker']} {at_s - k['at_s']:+.1f} s before it"
            for k in h.kill_log
            if at_s - 10.5 <= k["at_s"] <= at_s + took_s
        ]
        parts += [
            f"store outage {o['outage']} ({o['at_s']:.1f}-{o['at_s'] + o['held_s']:.1f} s)"
            for o in h.outage_log
            if o["at_s"] <= at_s + took_s and at_s <= o["at_s"] + o["held_s"]
        ]
        return f" [{'; '.join(parts)}]" if parts else ""

    # -- 2 and 3 (issue). probes answered; no run running with nothing to do ----------------------------
    def _probes_and_idle_runs(self) -> None:
        h, report = self.h, self.report
        report.probes = dict(h.probe_summary)
        for chat_id, why in h.probe_failures.items():
            self.fail(
                "probes_unanswered",
                f"chat {chat_id}: the probe message was not answered within "
                f"{h.cfg.probe_timeout_s:.0f} s: {why}",
                chat_id,
                f"probe unanswered: {why}",
            )
        for chat_id, why in h.idle_runs.items():
            self.fail(
                "idle_running_runs",
                f"chat {chat_id}: run running with nothing to do: {why}",
                chat_id,
                f"idle run: {why}",
            )

    # -- workflow runs and their histories ----------------------------------------------------------
    async def _runs_and_histories(self) -> list[WorkflowHistory]:
        h, report = self.h, self.report
        self.approved_calls: set[str] = set()
        runs = [wf async for wf in h.client.list_workflows("WorkflowType='ChatTurn'")]
        report.runs_by_status = dict(Counter(wf.status.name.lower() if wf.status else "?" for wf in runs))
        for wf in runs:
            if wf.status in ABNORMAL_RUN:
                self.fail(
                    "runs_ended_abnormally",
                    f"run {wf.id}/{wf.run_id} ended {wf.status.name}",
                    wf.id.removeprefix("chat-"),
                    f"run {wf.run_id} {wf.status.name}",
                )
        sem = asyncio.Semaphore(8)

        async def fetch(wf: Any) -> WorkflowHistory | None:
            async with sem:
                try:
                    return await h.client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
                except Exception as err:
                    report.anomalies.append(f"history of {wf.id}/{wf.run_id} not fetched: {err}")
                    return None

        histories = [x for x in await asyncio.gather(*(fetch(wf) for wf in runs)) if x is not None]
        running = {wf.run_id for wf in runs if wf.status == WorkflowExecutionStatus.RUNNING}
        identities: set[str] = set()
        scheduled: dict[str, list[str]] = defaultdict(list)
        self.children: dict[str, set[str]] = defaultdict(set)  # child workflow id -> its first runs' ids
        never_acted: set[str] = set()
        for hist in histories:
            for ev in hist.events:
                et = ev.event_type
                if et == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                    identities.add(ev.workflow_task_started_event_attributes.identity)
                elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                    identities.add(ev.activity_task_started_event_attributes.identity)
                elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                    report.workflow_task_timeouts += 1
                elif et == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
                    child = ev.child_workflow_execution_started_event_attributes.workflow_execution
                    self.children[child.workflow_id].add(child.run_id)
                elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                    a = ev.workflow_task_failed_event_attributes
                    if a.cause in BENIGN_WFT_CAUSES:
                        self.det["benign_workflow_task_failures"] += 1
                        continue
                    cause = WorkflowTaskFailedCause.Name(a.cause)
                    text = f"{cause}: {a.failure.message}"
                    detail = (
                        "nondeterminism_in_history"
                        if "NON_DETERMINISTIC" in cause or "nondetermin" in text.lower()
                        else "workflow_task_failures"
                    )
                    self._save_history(hist)
                    self.fail(
                        detail,
                        f"workflow task failed in {hist.workflow_id}/{hist.run_id} "
                        f"(event {ev.event_id}, {a.identity}): {text[:500]}",
                        hist.workflow_id.removeprefix("chat-"),
                        f"workflow task failed: {cause}",
                    )
                elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
                    failed = ev.activity_task_failed_event_attributes
                    if failed.failure.application_failure_info.type == io.STORE_UNAVAILABLE_ERROR:
                        # Refused before it acted (its start could not be recorded): the
                        # workflow schedules the call again once the store is back.
                        never_acted.add(f"{hist.workflow_id}/{hist.run_id}#{failed.scheduled_event_id}")
                elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    a = ev.activity_task_scheduled_event_attributes
                    if a.activity_type.name == io.TOOL_CALL and a.input.payloads:
                        try:
                            scheduled_input = json.loads(a.input.payloads[0].data)
                            call_id = scheduled_input["call"]["id"]
                        except (ValueError, KeyError, TypeError):
                            continue
                        where = f"{hist.workflow_id}/{hist.run_id}#{ev.event_id}"
                        scheduled[call_id].append(where)
                        if scheduled_input["call"].get("name") == CONFIRM_TOOL:
                            if scheduled_input.get("approved") is True:
                                self.approved_calls.add(call_id)
                            else:
                                self.fail(
                                    "confirm_tool_scheduled_unapproved",
                                    f"{CONFIRM_TOOL} call {call_id} scheduled without approval: {where}",
                                    hist.workflow_id.removeprefix("chat-"),
                                )
        ended = ended_by_reconciler(histories)
        report.runs_ended_by_reconciler = len(ended)
        for hist in histories:
            if hist.run_id in running:
                self._save_history(hist)  # still running after the probes: why, is for its history to tell
            if hist.run_id in ended:
                self._save_history(hist)  # its workflow task kept failing: the history says where
                self.evidence[hist.workflow_id.removeprefix("chat-")].append(
                    f"run {hist.run_id} ended by the reconciler: {ended[hist.run_id][:300]}"
                )
        identities.discard("")
        report.worker_identities_serving = len(identities)
        for child_id, run_ids in self.children.items():
            if len(run_ids) > 1:
                self.fail(
                    "children_started_twice",
                    f"child workflow {child_id} started {len(run_ids)} times (runs {sorted(run_ids)})",
                    child_id.removeprefix("chat-"),
                )
        for call_id, where in scheduled.items():
            where = [w for w in where if w not in never_acted]
            if len(where) > 1:
                self.fail(
                    "tool_calls_scheduled_twice", f"tool call {call_id} scheduled {len(where)} times: {where}"
                )
        return histories

    # -- 5a. tools that ask first ------------------------------------------------------------------------
    def _approvals(self) -> None:
        """A start of the tool that asks first belongs to an approved activity; a call
        answered as denied (or as not run for want of approval) never started."""
        for call_id, line in self.confirm_starts.items():
            if call_id not in self.approved_calls:
                self.fail(
                    "confirm_tool_started_unscheduled",
                    f"{CONFIRM_TOOL} started without an approved activity in any history: {line}",
                    line.split()[1].split("/")[0],
                )
        denied = unapproved = 0
        for chat_id, m in self.messages:
            if m.message.role != "tool":
                continue
            content = m.message.content
            if content not in (DENIED_TOOL_TEXT, UNAPPROVED_TOOL_TEXT):
                continue
            denied += content == DENIED_TOOL_TEXT
            unapproved += content == UNAPPROVED_TOOL_TEXT
            call_id = m.message.tool_call_id
            if call_id in self.confirm_starts:
                self.fail(
                    "denied_call_ran",
                    f"call {call_id} of chat {chat_id} answered "
                    f"{content!r} but the ledger shows it ran: {self.confirm_starts[call_id]}",
                    chat_id,
                )
        self.report.approvals = {
            "approved_calls_scheduled": len(self.approved_calls),
            "approved_calls_started": len(self.confirm_starts),
            "denied_rows": denied,
            "not_run_rows": unapproved,
        }

    # -- 4. non-determinism -----------------------------------------------------------------------------
    async def _nondeterminism(self, histories: list[WorkflowHistory]) -> None:
        h, report = self.h, self.report
        pool = getattr(h, "pool", None)  # the workers the run started, each with its log
        pids = {w.log.name: w.pid for w in pool.lives} if pool else {}
        runs = {x.run_id: x for x in histories}
        for log in sorted((h.work / "logs").glob("worker-*.log")):
            lines = log.read_text(errors="replace").splitlines()
            for n, line in enumerate(lines, 1):
                if CATCH_UP_LINE in line:
                    # Refused on purpose: a query's catch-up, the run dropped (turnkeeper/worker/catch_up.py).
                    self.det["query_catch_ups_evicted"] += 1
                    if m := CATCH_UP.search(line):
                        self.det[f"catch_ups_{SIGNS.get(m[3], 'other')}"] += 1
                        if m[3] == QUERY_BEHIND:
                            self.det[behind_what(runs.get(m[1]), int(m[2]), pids.get(log.name))] += 1
                    continue
                if LOG_BUG_PATTERNS.search(line):
                    self.fail("worker_log_lines", f"{log.name}:{n}: {line.strip()[:400]}")
                    for chat_id in h.chats:
                        if chat_id in line:
                            self.evidence[chat_id].append(f"{log.name}:{n}")
        if not (h.cfg.replay and histories):
            return
        replay_start = time.monotonic()

        async def each() -> AsyncIterator[WorkflowHistory]:
            for hist in histories:
                yield hist

        from turnkeeper.workflows.chat_turn import ChatTurn  # the harness itself needs no workflow code

        # Watched: a run whose workflow code fails past its history's last completed
        # task (a message no worker took yet) counts too; the replayer only logs it.
        watch = FailureWatch(SandboxedWorkflowRunner())
        results = await Replayer(
            workflows=[ChatTurn], data_converter=pydantic_data_converter, workflow_runner=watch
        ).replay_workflows(each(), raise_on_replay_failure=False)
        report.replayed_histories = len(histories)
        failures: dict[str, object] = {run_id: watch.next_task_failure(run_id) for run_id in watch.failures}
        failures.update(results.replay_failures)
        for run_id, failure in failures.items():
            hist = next(x for x in histories if x.run_id == run_id)
            chat_id = hist.workflow_id.removeprefix("chat-")
            self.fail(
                "replay_failures",
                f"replay of {hist.workflow_id}/{run_id} failed: {failure!r}"[:600],
                chat_id,
                f"replay of run {run_id} failed",
            )
            self._save_history(hist)
        h.log(f"replayed {len(histories)} histories in {time.monotonic() - replay_start:.1f} s")

    # -- evidence ---------------------------------------------------------------------------------------
    def _save_history(self, hist: WorkflowHistory) -> None:
        """The whole history, for `Replayer.replay_workflow(WorkflowHistory.from_json(...))`."""
        out = self.h.work / "evidence"
        out.mkdir(exist_ok=True)
        path = out / f"{hist.workflow_id.removeprefix('chat-')}-{hist.run_id}.history.json"
        if not path.exists():
            path.write_text(hist.to_json())

    def _write_evidence(self, histories: list[WorkflowHistory]) -> None:
        """Per chat with a finding: its turns, transcript, event log, runs, history
        excerpts, the harness's actions and the worker log lines that name it, in
        <work>/evidence/<chat>.json."""
        h = self.h
        out = h.work / "evidence"
        out.mkdir(exist_ok=True)
        logs = {
            p.name: p.read_text(errors="replace").splitlines()
            for p in sorted((h.work / "logs").glob("worker-*.log"))
        }
        # A subagent's finding is its parents' too: their turns, transcripts and runs say what waited for it.
        for chat_id in [c for c in self.evidence if is_sub_chat(c)]:
            while is_sub_chat(chat_id):
                sub, chat_id = chat_id, parent_chat(chat_id)
                self.evidence[chat_id].append(f"parent of {sub}, which has a finding")
        for chat_id in [c for c in self.evidence if not is_sub_chat(c)]:
            for sub in sorted({c.sub_chat for c in self.calls_by_sub.values() if c.chat_id == chat_id}):
                self.evidence.setdefault(sub, []).append(f"subagent of {chat_id}, which has a finding")
        for chat_id, why in self.evidence.items():
            wid = tk.workflow_id(chat_id)
            chat = h.chats.get(chat_id)
            data = {
                "chat_id": chat_id,
                "findings": why,
                "acknowledged_in_order": chat.acked if chat else None,
                "late_duplicate_sends": chat.late_dups if chat else None,
                "actions": [vars(a) for a in h.actions.actions if a.chat_id == chat_id],
                "outages": h.outage_log,
                "turns": [dict(r) for r in self.turns_of.get(chat_id, {}).values()],
                "transcript": [
                    {
                        "id": r.id,
                        "turn": r.turn,
                        "role": r.message.role,
                        "message_id": r.message_id,
                        "step": r.step,
                        "body": _short_body(_body(r)),
                    }
                    for r in self.rows_of.get(chat_id, [])
                ],
                "events": [
                    {"seq": e.seq, "type": e.type, "payload": _short_body(e.payload)}
                    for e in self.events
                    if e.chat_id == chat_id
                ],
                "runs": [
                    {"run_id": x.run_id, "events": [event_line(ev) for ev in x.events]}
                    for x in histories
                    if x.workflow_id == wid
                ],
                "worker_log_lines": [
                    f"{name}:{n}: {line[:2000]}"
                    for name, lines in logs.items()
                    for n, line in enumerate(lines, 1)
                    if chat_id in line
                ],
            }
            (out / f"{chat_id}.json").write_text(json.dumps(data, indent=1, default=str))


async def _all_events(store: SessionStore, chat_id: str) -> list[Event]:
    """A chat's whole event log, in order."""
    events: list[Event] = []
    while page := await store.events(chat_id, after_seq=events[-1].seq if events else 0, limit=EVENT_PAGE):
        events += page
        if len(page) < EVENT_PAGE:
            break
    return events


def _body(row: TranscriptRow) -> dict[str, Any]:
    """A transcript row's message as the store keeps it (and `history --json` shows it)."""
    return row.message.model_dump(mode="json", exclude_none=True)


def _short_body(body: Any, limit: int = 300) -> Any:
    """A row or payload with long texts (the bursts' follow-ups) cut to their start."""
    if isinstance(body, dict):
        return {k: _short_body(v, limit) for k, v in body.items()}
    if isinstance(body, list):
        return [_short_body(v, limit) for v in body]
    if isinstance(body, str) and len(body) > limit:
        return f"{body[:limit]}... ({len(body)} chars)"
    return body


def _payload(payloads: Any, limit: int = 160) -> str:
    return payloads.payloads[0].data[:limit].decode(errors="replace") if payloads.payloads else ""


def event_line(ev: Any) -> str:
    """One history event as a short readable line."""
    name = EventType.Name(ev.event_type).removeprefix("EVENT_TYPE_")
    t = ev.event_time.ToDatetime().strftime("%H:%M:%S.%f")[:-3]
    extra = ""
    if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        a = ev.activity_task_scheduled_event_attributes
        extra = f" {a.activity_type.name} {_payload(a.input)}"
    elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
        extra = (
            f" sched={ev.activity_task_started_event_attributes.scheduled_event_id} "
            f"{ev.activity_task_started_event_attributes.identity}"
        )
    elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
        a = ev.activity_task_timed_out_event_attributes
        extra = f" sched={a.scheduled_event_id} {a.failure.message}"
    elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
        extra = f" {ev.workflow_task_started_event_attributes.identity}"
    elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
        a = ev.workflow_task_failed_event_attributes
        extra = f" {WorkflowTaskFailedCause.Name(a.cause)} {a.failure.message[:300]}"
    elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
        a = ev.workflow_execution_signaled_event_attributes
        extra = f" {a.signal_name} {_payload(a.input)}"
    elif ev.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
        fields = ev.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
        extra = " " + ",".join(f"{k}={v.data.decode(errors='replace')}" for k, v in fields.items())
    elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
        extra = f" {ev.workflow_execution_terminated_event_attributes.reason[:300]}"
    return f"{ev.event_id:>4} {t} {name}{extra}"
