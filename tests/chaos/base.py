"""What the chaos harness's parts share: its configuration, its report, the
per-chat bookkeeping, the record of every user action and small helpers.
See tests/chaos/harness.py."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import WorkflowTaskFailedCause

TOOL = "ledger_write"
CONFIRM_TOOL = "ledger_confirm"  # asks first: runs only once its user approved the call
TOOL_MODULE = "tests.chaos.tools"
TASK_QUEUE = "chaos"
WORKER_READY_LINE = "worker serving task queue"
# Workflow task failures that are part of normal operation, not bugs.
BENIGN_WFT_CAUSES = frozenset(
    {
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND,
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_STICKY_TASK_QUEUE,
    }
)
CLOSED_TURN = ("completed", "recovered", "failed")
OPEN_TURN = ("running", "awaiting_user", "resuming")
# The workers' limits on user messages (TURNKEEPER_MAX_MESSAGE_BYTES, TURNKEEPER_MAX_PENDING_BYTES).
MAX_MESSAGE_BYTES = 64 * 1024
MAX_PENDING_BYTES = 1024 * 1024


@dataclass
class ChaosConfig:
    turns: int = 500  # closed turns to reach before settling
    kills: int = 50  # SIGKILLs to make before settling (at least)
    workers: int = 3  # worker processes kept up
    chats: int = 24  # chats driven concurrently
    seed: int | None = None  # None: a fresh seed, printed in the report
    # the model
    tool_max_s: float = 1.5  # tool duration: uniform 0..tool_max_s
    parallel_tools: float = 0.25  # P(two tool calls in one reply)
    second_round: float = 0.1  # P(another tool round after a tool result)
    max_rounds: int = 3  # tool rounds per user message at most
    model_delay_max_s: float = 0.25  # model latency: uniform 0..this
    slow_model: float = 0.05  # P(a slow model call: 1-3 s)
    provider_errors: float = 0.02  # P(a 429, retried by the OpenAI client)
    strict_protocol: bool = True  # answer 400 like OpenAI when a tool call has no tool result
    confirm: float = 0.25  # P(a tool call is of the tool that asks first)
    # subagents (docs/subagents.md): the workers enable `delegate`
    delegate: float = 0.35  # P(a user message's first reply is a delegate call); 0: `delegate` not enabled
    background: float = 0.3  # P(a delegate call is in background mode)
    fanout: float = 0.2  # P(a delegating reply makes two delegate calls at once)
    nested: float = 0.15  # P(a subagent's task delegates once more, in wait mode, where the depth allows)
    bad_delegate: float = 0.03  # P(a delegate call is refused: an unknown profile or mode; starts nothing)
    subagent_max_depth: int = 2  # TURNKEEPER_SUBAGENT_MAX_DEPTH for the workers
    subagent_max_fanout: int = 4  # TURNKEEPER_SUBAGENT_MAX_FANOUT for the workers
    # the users
    followup: float = 0.12  # P(a follow-up) per check while a turn runs (every 0.3-0.8 s)
    max_followups: int = 3  # follow-ups per turn at most
    dup_retry: float = 0.1  # P(a message is sent twice at once with the same id)
    late_dup: float = 0.02  # P(an older acknowledged id is sent again) per check
    stop: float = 0.005  # P(the user presses Stop) per check while a turn runs
    think_max_s: float = 1.0  # pause between turns: uniform 0..this
    action: float = 0.03  # P(Continue, Dismiss or Stop at a random moment) per check
    resuming_action: float = 0.25  # the same while the turn runs a Continue (status resuming)
    signal_form: float = 0.5  # P(Continue/Dismiss/Stop as a bare signal rather than by tk.decide)
    # bursts of large follow-ups, sent while a tool runs
    bursts: int | None = None  # bursts to send, paced over the target turns (None: turns // 25)
    burst_size: tuple[int, int] = (10, 40)  # follow-ups per burst
    burst_bytes: tuple[int, int] = (40_000, 60_000)  # bytes per follow-up
    burst_gap_s: float = 0.05  # pause between a burst's sends: uniform 0..this
    oversize: float = 0.3  # P(a burst also holds one message over the single-message limit)
    # store outages (tests/chaos/store.py: a held write lock; on PostgreSQL also read-only, cut sessions)
    outages: int | None = None  # outages to make, paced over the target turns (None: turns // 60)
    outage_s: tuple[float, float] = (3.0, 12.0)  # how long each lasts
    outage_kinds: tuple[str, ...] | None = None  # these in turn; None: the store's kinds at random
    outage_gap_s: float = 5.0  # store between two outages; an outage waits this long for a Continue
    # the gate driver
    p_continue: float = 0.6  # P(Continue) when can_continue, else Dismiss
    p_approve: float = 0.6  # at an approval gate: P(Approve), else Deny
    stale_probe: float = 0.1  # P(first trying a stale recovery id, which must be refused)
    gate_think_max_s: float = 1.5  # the user looks at the gate this long: uniform 0..this
    sub_gate_grace_s: float = 30.0  # a waiting subagent's gate shows in its user's chat within this
    subagent_gate_user: float = (
        0.4  # P(at a subagent's gate in a parent's chat, its user acts first, at random)
    )
    # the killer
    kill_span: float = 0.85  # kills (and bursts, outages) are spread over this share of the turns
    min_worker_uptime_s: float = 3.0  # only workers up this long are killed
    stall_kills: float = 0.3  # share of kills made while the harness holds the store's write
    # lock for a moment, so the victim is likely inside a store write
    # the system under test
    postgres_url: str | None = None  # None: one SQLite store; else a role and schema of the run's own there
    reconcile_every: int = 20  # TURNKEEPER_RECONCILE_EVERY for the workers
    # the new invariants' bounds
    answer_bound_s: float = 5.0  # every action answered within this
    probe_timeout_s: float = 60.0  # the probe message's turn answers within this
    idle_after_s: float = 20.0  # a run unchanged this long with nothing to do is idle
    # limits
    max_chaos_s: float = 1500.0  # the chaos phase ends after this, target reached or not
    settle_timeout_s: float = 240.0  # everything must be idle this long after chaos ends
    slow_turn_s: float = 90.0  # a turn running this long is recorded (with its state)
    action_wait_s: float = 30.0  # an action's answer is waited for this long at most
    replay: bool = True  # replay every recorded history against ChatTurn
    workdir: Path | None = None  # default: a fresh temporary directory
    keep: bool = False  # keep the work directory even when all passed
    progress: Callable[[str], None] | None = None

    @property
    def burst_target(self) -> int:
        return self.bursts if self.bursts is not None else self.turns // 25

    @property
    def outage_target(self) -> int:
        return self.outages if self.outages is not None else self.turns // 60


@dataclass
class Report:
    seed: int
    config: dict[str, Any]
    workdir: str
    store: str = ""  # the session store the workers used
    elapsed_s: float = 0.0
    chaos_s: float = 0.0
    settle_s: float = 0.0
    probe_s: float = 0.0
    check_s: float = 0.0
    target_reached: bool = False
    turns_closed: int = 0
    turns_by_status: dict[str, int] = field(default_factory=dict)
    recovered_by_reason: dict[str, int] = field(default_factory=dict)
    gates_by_reason: dict[str, int] = field(default_factory=dict)
    chats: int = 0
    kills: int = 0
    workers_started: int = 0
    workers_died_unexpectedly: int = 0
    worker_identities_serving: int = 0
    gates_answered: dict[str, int] = field(default_factory=dict)
    gate_rejections: dict[str, int] = field(default_factory=dict)
    stale_probes: dict[str, int] = field(default_factory=dict)
    rejection_samples: dict[str, str] = field(default_factory=dict)
    stops: int = 0
    user_actions: dict[str, int] = field(default_factory=dict)  # kind -> count
    action_outcomes: dict[str, int] = field(default_factory=dict)  # "kind: outcome" -> count
    while_resuming: dict[str, int] = field(default_factory=dict)  # actions taken in status resuming
    latency: dict[str, dict[str, float]] = field(default_factory=dict)  # group -> n, max_s, p99_s
    # the same, less the time in which no worker was serving (the bound applies to this)
    latency_served: dict[str, float] = field(default_factory=dict)
    latency_live: dict[str, float] = field(default_factory=dict)  # less the killed holders' time too
    no_worker_gaps: dict[str, float] = field(default_factory=dict)  # count, total_s, longest_s
    bursts: list[dict[str, Any]] = field(default_factory=list)
    outages: list[dict[str, Any]] = field(default_factory=list)
    outage_looks: dict[str, int] = field(default_factory=dict)  # state queries in outages; store_unavailable
    probes: dict[str, Any] = field(default_factory=dict)
    messages: dict[str, int] = field(default_factory=dict)
    tools: dict[str, int] = field(default_factory=dict)
    approvals: dict[str, int] = field(default_factory=dict)  # the tool that asks first: scheduled, denied
    model_requests: int = 0
    model_answers: dict[str, int] = field(default_factory=dict)
    # delegations: turns and calls by mode, children, reports, depth; see Checker._delegations
    subagents: dict[str, int] = field(default_factory=dict)
    subagent_gates: dict[str, int] = field(default_factory=dict)  # decisions at a subagent's gate
    runs_by_status: dict[str, int] = field(default_factory=dict)
    workflow_task_timeouts: int = 0
    replayed_histories: int = 0
    # Runs the reconciler ended because their workflow task kept failing (a history
    # the workers' code does not replay, say): activities/reconcile/wedged_runs.py.
    runs_ended_by_reconciler: int = 0
    invariants: dict[str, int] = field(default_factory=dict)
    details: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)
    kill_log: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.target_reached and not any(self.invariants.values())

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        return out

    def summary(self) -> str:
        def kv(d: dict[str, Any]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"

        m, t = self.messages, self.tools
        lat_all = self.latency.get("all", {})
        burst_msgs = sum(b["messages"] for b in self.bursts)
        burst_mb = sum(b["bytes"] for b in self.bursts) / 1e6
        lines = [
            f"chaos: seed {self.seed}, {self.config['workers']} workers, {self.chats} chats, "
            f"target {self.config['turns']} turns / {self.config['kills']} kills; {self.store or 'SQLite'}",
            f"elapsed            {self.elapsed_s:.1f} s (chaos {self.chaos_s:.1f} s, settle "
            f"{self.settle_s:.1f} s, probes {self.probe_s:.1f} s, check {self.check_s:.1f} s)",
            f"turns closed       {self.turns_closed} ({kv(self.turns_by_status)})",
            f"turns recovered    {kv(self.recovered_by_reason)}",
            f"gates opened       {kv(self.gates_by_reason)}",
            f"kills              {self.kills} SIGKILLs ({sum(1 for k in self.kill_log if k.get('store_stall'))} "
            f"during a store stall, {sum(1 for k in self.kill_log if k.get('during_outage'))} during an "
            f"outage); {self.workers_started} worker processes started; "
            f"{self.workers_died_unexpectedly} died by themselves; "
            f"{self.worker_identities_serving} distinct workers served",
            f"store outages      {len(self.outages)} ({sum(o['held_s'] for o in self.outages):.1f} s in all, "
            f"longest {max((o['held_s'] for o in self.outages), default=0):.1f} s; "
            f"{kv(Counter(o.get('kind', 'lock') for o in self.outages))}; "
            f"{sum(1 for o in self.outages if o.get('continues_running'))} while a Continue ran); `state` showed "
            f"store_unavailable in {self.outage_looks.get('store_unavailable', 0)} of "
            f"{self.outage_looks.get('queries', 0)} queries made during one",
            f"user actions       {sum(self.user_actions.values())} ({kv(self.user_actions)})",
            f"  while resuming   {kv(self.while_resuming)}",
            f"  outcomes         {kv(self.action_outcomes)}",
            f"  answered in      max {lat_all.get('max_s', 0):.2f} s, p99 {lat_all.get('p99_s', 0):.2f} s "
            f"over {int(lat_all.get('n', 0))} actions and sends",
            *(
                f"    {g:<16} n {int(v['n'])}, max {v['max_s']:.2f} s, p99 {v['p99_s']:.2f} s"
                for g, v in sorted(self.latency.items())
                if g != "all"
            ),
            f"  with a worker    max {self.latency_served.get('max_s', 0):.2f} s, p99 "
            f"{self.latency_served.get('p99_s', 0):.2f} s (less the time no worker served: "
            f"{int(self.no_worker_gaps.get('count', 0))} spans, {self.no_worker_gaps.get('total_s', 0):.1f} s "
            f"in all, longest {self.no_worker_gaps.get('longest_s', 0):.1f} s)",
            f"  at a live worker max {self.latency_live.get('max_s', 0):.2f} s, p99 "
            f"{self.latency_live.get('p99_s', 0):.2f} s (less also the time the chat's task sat with a killed "
            "worker, until it timed out)",
            f"gates answered     {kv(self.gates_answered)}; refused {kv(self.gate_rejections)}",
            f"stale-id probes    {kv(self.stale_probes)}; Stop pressed {self.stops} times",
            *(f"  refusal '{k}' e.g.: {v}" for k, v in self.rejection_samples.items() if k == "other"),
            f"bursts             {len(self.bursts)} ({burst_msgs} large follow-ups, {burst_mb:.1f} MB; "
            f"{sum(1 for b in self.bursts if b.get('during_outage'))} during an outage, "
            f"{sum(1 for b in self.bursts if b.get('while_resuming'))} while a Continue ran)",
            f"messages           sent {m.get('sends', 0)} signal-with-starts for {m.get('ids', 0)} ids "
            f"({m.get('dup_sends', 0)} retried ids); acknowledged {m.get('acknowledged', 0)}; "
            f"unacknowledged {m.get('unacknowledged', 0)}; committed {m.get('committed', 0)}; refused "
            f"visibly {m.get('refused_visibly', 0)}; acknowledged during an outage "
            f"{m.get('acknowledged_during_outage', 0)}",
            f"probes             {kv({k: v for k, v in self.probes.items() if not isinstance(v, list)})}",
            f"tools              {t.get('starts', 0)} started, {t.get('done', 0)} finished, "
            f"{t.get('cut_off_by_kills', 0)} cut off by a kill, "
            f"{t.get('cut_off', 0) - t.get('cut_off_by_kills', 0)} cancelled (Stop, superseded, dismissed); "
            f"{t.get('recorded_not_acted', 0)} recorded but killed before acting",
            f"asking first       {kv(self.approvals)}",
            *self._subagent_lines(kv),
            f"model requests     {self.model_requests} ({kv(self.model_answers)})",
            f"workflow runs      {kv(self.runs_by_status)}; {self.workflow_task_timeouts} workflow "
            f"task timeouts; {self.replayed_histories} histories replayed; "
            f"{self.runs_ended_by_reconciler} runs ended by the reconciler for a failing workflow task",
            "invariants:",
        ]
        for name, count in self.invariants.items():
            lines.append(f"  {name:<36}{count:>5}   {'ok' if count == 0 else 'FAIL'}")
        detail = {k: v for k, v in self.details.items() if v}
        if detail:
            lines.append(f"  details: {kv(detail)}")
        if not self.target_reached:
            lines.append("  TARGET NOT REACHED in the time allowed")
        for f in self.failures:
            lines.append(f"FAILURE: {f}")
        for a in self.anomalies:
            lines.append(f"anomaly: {a}")
        lines.append(
            f"result: {'PASS' if self.ok else 'FAIL'}"
            + (f" (work dir {self.workdir})" if self.workdir else "")
        )
        return "\n".join(lines)

    def _subagent_lines(self, kv: Callable[[dict[str, Any]], str]) -> list[str]:
        d = self.subagents
        if not d:
            return []
        in_bg = sum(v for k, v in self.subagent_gates.items() if "background subagent's chat" in k)
        return [
            f"subagents          {d.get('delegating_turns', 0)} delegating turns "
            f"({d.get('turns_wait', 0)} wait, {d.get('turns_background', 0)} background, "
            f"{d.get('turns_fanout', 0)} with 2 or more calls, {d.get('turns_nested', 0)} in sub-chats); "
            f"{d.get('calls', 0)} delegate calls ({d.get('calls_wait', 0)} wait, "
            f"{d.get('calls_background', 0)} background, {d.get('calls_nested', 0)} nested, "
            f"{d.get('calls_refused', 0)} refused in words, {d.get('calls_that_started_no_child', 0)} "
            f"cut off before their child started); {d.get('children_started', 0)} children started, "
            f"max depth {d.get('max_depth', 0)}; {d.get('sub_chat_turns_closed', 0)} of the closed turns "
            "are sub-chats'",
            f"  children ended   {kv({k[6:]: v for k, v in d.items() if k.startswith('ended ')})}",
            f"  waiting          {d.get('wait_answers_matched', 0)} answers are their call's row; "
            f"{d.get('wait_children_without_an_answer', 0)} ended without one (the row says how); "
            f"{d.get('wait_answers_cut_by_the_parents_end', 0)} cut off by their parent's Stop, Dismiss or "
            "supersession",
            f"  background       {d.get('reports', 0)} reports committed for {d.get('background_turns_ended', 0)} "
            f"ended turns; {in_bg} gates decided in a background subagent's own chat",
            f"  subagent gates   {kv(self.subagent_gates)}",
        ]


# -- per-chat bookkeeping -------------------------------------------------------------------


@dataclass
class ChatLog:
    chat_id: str
    n: int = 0
    acked: list[str] = field(default_factory=list)  # unique ids, in order of first acknowledgement
    acked_set: set[str] = field(default_factory=set)
    unacked: set[str] = field(default_factory=set)
    texts: dict[str, str] = field(default_factory=dict)
    acked_during_outage: set[str] = field(default_factory=set)
    sends: int = 0
    dup_sends: int = 0
    late_dups: list[tuple[float, str]] = field(default_factory=list)
    sent: Counter[str] = field(default_factory=Counter)  # signal-with-starts per message id
    recovery_ids: list[str] = field(default_factory=list)  # every id the user has seen, oldest first
    resumed_at: float | None = None  # a Continue of this chat was accepted at (monotonic)
    bursts: int = 0
    probe_id: str | None = None
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one send at a time: order is known

    def saw(self, recovery_id: str | None) -> None:
        if recovery_id and (not self.recovery_ids or self.recovery_ids[-1] != recovery_id):
            self.recovery_ids.append(recovery_id)


# -- user actions and their answers --------------------------------------------------------


@dataclass
class Action:
    kind: str  # continue/decide, dismiss/signal, stop/decide, message, followup, burst, probe, ...
    chat_id: str
    source: str  # user, gate, burst, probe
    at_s: float  # since the harness started
    status_seen: str | None = None  # the turn's status the user saw just before, when it looked
    reason_seen: str | None = None  # and its reason (subagent_waiting: a subagent's gate, shown here)
    turn_seen: int | None = None  # and its turn
    id_kind: str | None = None  # current, last-seen, old, made-up (Continue/Dismiss)
    recovery_id: str | None = None  # the one sent (Continue/Dismiss)
    latency_s: float | None = None  # None: no answer within action_wait_s
    unix: float = field(default_factory=time.time)  # when it was sent, to compare with history events
    outcome: str = ""  # accepted, refused: <kind>, error: <type>, no answer


class ActionLog:
    def __init__(self) -> None:
        self.actions: list[Action] = []

    def add(self, action: Action) -> Action:
        self.actions.append(action)
        return action

    @staticmethod
    def group(kind: str) -> str:
        if kind.endswith("/decide"):
            return "decisions"
        if kind.endswith("/signal"):
            return "signals"
        return "messages"

    def latency(self) -> dict[str, dict[str, float]]:
        groups: dict[str, list[float]] = defaultdict(list)
        for a in self.actions:
            if a.latency_s is not None:
                groups[self.group(a.kind)].append(a.latency_s)
                groups["all"].append(a.latency_s)
        return {
            g: {"n": len(v), "max_s": round(max(v), 3), "p99_s": round(percentile(v, 99), 3)}
            for g, v in groups.items()
        }

    def counts(self) -> dict[str, int]:
        """User actions by kind: Continue, Dismiss and Stop in each form (the gate
        driver's answers included), bursts; messages are counted apart."""
        return dict(
            Counter(
                a.kind
                for a in self.actions
                if a.kind.split("/")[0] in ("continue", "dismiss", "stop") or a.kind == "burst"
            )
        )

    def outcomes(self) -> dict[str, int]:
        return dict(
            Counter(
                f"{a.kind}: {a.outcome}"
                for a in self.actions
                if a.kind.split("/")[0] in ("continue", "dismiss", "stop")
            )
        )

    def while_resuming(self) -> dict[str, int]:
        return dict(
            Counter(
                f"{a.kind} {a.id_kind or ''}".strip() + f": {a.outcome}"
                for a in self.actions
                if a.status_seen == "resuming"
            )
        )

    def unanswered(self, bound_s: float) -> list[Action]:
        return [
            a for a in self.actions if a.kind != "burst" and (a.latency_s is None or a.latency_s > bound_s)
        ]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def error_kind(text: str) -> str:
    low = text.lower()
    for needle, kind in (
        ("stale", "stale"),
        ("not waiting", "not waiting"),
        ("unavailable", "context unavailable"),
        ("no turn is running", "not running"),
        ("malformed", "malformed"),
        ("already completed", "run closed"),
        ("not found", "run closed"),
    ):
        if needle in low:
            return kind
    return "other"
