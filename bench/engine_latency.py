"""A one-tool turn on the engine we ship, side by side with the engine's own floor
and with a stock dev server, measured interleaved in one run.

    .venv/bin/python bench/engine_latency.py [--quick] [--eager-variant] [--loop-variant] [--previous-variant | --reads-variant N] [--json]

Every variant runs the turn of bench/turn_latency.py (scripted model ->
`write_file` -> scripted model), each Temporal variant with its own in-process
worker on its own task queue:

  turnkeeper           turnkeeper as shipped: the real worker (`worker.run_worker`)
                       on a dev server started as the embedded one is
                       (`turnkeeper.worker.dev_server.start_dev_command`); a turn is
                       `turnkeeper.client.send_message`, then the run's result
  bare, stock server   bench/bare_loop.py (its worker unsandboxed, as turnkeeper's)
                       on `temporal server start-dev` with the CLI's defaults
                       (`cli_defaults=True`): what a user gets without our tuning
  bare, tuned server   the same bare loop on turnkeeper's tuned server: the engine's
                       floor for this turn
  (--eager-variant)    the bare loop on the tuned server started with eager
                       workflow start, and turnkeeper as the web process with its
                       own worker sends a turn (TURNKEEPER_WEB_WORKER=1:
                       `send_message(eager=True)`, the message in the run's input
                       instead of signal-with-start, which cannot start eagerly)
  (--loop-variant)     the bare loop on the tuned server with its workflow
                       activations on the worker's event loop, as turnkeeper's
                       worker runs them (`turnkeeper.worker.loop_activations`): what
                       that setting alone gives the floor
  (--previous-variant) the bare loop on the embedded server's settings before
                       the task-dispatch settings (the 50 ms tick back), so the
                       CPU those settings cost under load shows (--reads-variant
                       N: with N queue reads a second instead)

Phases: spaced turns (one turn per variant in turn, so each server idles
between its turns); back-to-back turns (blocks per variant, each after two
seconds of unmeasured turns on the same server, blocks interleaved) for the
medians, p90s and goals; throughput rounds (50 in flight, alternating) for
turns/s and CPU; the time from `send` to the start of the model activity (the
history's event, the activity's own clock, its first store write); where each
millisecond of a turn goes (history event times); and the wall time of the
CLI's common commands against the tuned server. Everything runs on the
worker's own event loop (uvloop where installed). See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

import temporalio.client
import temporalio.worker
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench._common import (
    Server,
    dev_server,
    event_s,
    near_median,
    p90,
    print_timeline,
    progress,
    run_and_exit,
    timeline,
)
from bench.bare_loop import MODEL as BARE_MODEL
from bench.bare_loop import BareTurn
from bench.turn_latency import (
    TURN_TIMEOUT_S,
    Bare,
    BareActivities,
    PairedRatio,
    Steps,
    Turnkeeper,
    cpu_seconds,
    ratio_of_rounds,
)
from turnkeeper import activity_io as io
from turnkeeper import client as tk
from turnkeeper.models import TurnStatus
from turnkeeper.store import SQLiteStore
from turnkeeper.worker.dev_server import TASK_DISPATCH, server_settings
from turnkeeper.worker.loop_activations import LoopActivations
from turnkeeper.worker.main import STICKY_SCHEDULE_TO_START, event_loop_factory

WARMUP_TURNS = 5
IN_FLIGHT = 50
# Back-to-back: before a block's measured turns, each variant runs unmeasured
# turns back to back for this long. A server's queue-read limiter holds two
# seconds' worth of reads (40 at the default 20/s); a server that has been idle
# serves a few turns without the tick, one that has been busy does not.
BUSY_S = 2.0
# The server's own default for the task-dispatch settings (the 50 ms tick).
SERVER_DEFAULT_READS_PER_S = 20

# The goals from the issue.
GOAL_MEDIAN_MS = 60.0
GOAL_P90_MS = 100.0
GOAL_VS_STOCK = 0.30  # turnkeeper's median <= this x the bare loop's on a stock server
GOAL_THROUGHPUT_VS_STOCK = 1.7
GOAL_VS_FLOOR = 1.15  # turnkeeper's median <= this x the bare loop's on the same tuned server
BY_BLOCK = "turnkeeper/tuned bare median, block by block"
GOAL_TO_MODEL_MS = 20.0  # send -> model activity start, median
GOAL_CLI_S = 0.4  # `turnkeeper status CHAT`, median wall time

CLI_COMMANDS = ("status", "history", "events", "list")


@dataclass(frozen=True)
class Plan:
    spaced: int  # turns per variant, one at a time, variants taking turns
    blocks: int  # back-to-back: blocks per variant,
    per_block: int  # and measured turns per block
    rounds: int  # throughput rounds
    per_round: int  # turns per variant per round
    cli_runs: int  # runs of each CLI command


FULL = Plan(spaced=20, blocks=5, per_block=8, rounds=6, per_round=100, cli_runs=15)
QUICK = Plan(spaced=6, blocks=2, per_block=5, rounds=1, per_round=50, cli_runs=5)


class UnsandboxedBare(Bare):
    """The bare loop's worker with its workflow code outside the sandbox, as
    turnkeeper's runs: the least the SDK does for this turn, so that the tuned
    server's bare loop is the engine's floor (and the stock server's the same
    worker on another server)."""

    def __init__(
        self,
        client: Client,
        tmp: Path,  # Bare's fields, not its (sandboxed) worker
        on_loop: bool = False,
    ) -> None:
        self.client = client
        self.task_queue = f"bench-bare-{uuid.uuid4().hex[:8]}"
        self._task: asyncio.Task[None] | None = None
        acts = BareActivities(Steps(tmp / "ws"))
        self._worker = Worker(
            client,
            task_queue=self.task_queue,
            workflows=[BareTurn],
            activities=[acts.model, acts.tool],
            workflow_runner=UnsandboxedWorkflowRunner(),
            workflow_task_executor=LoopActivations() if on_loop else None,
            sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
        )


# -- turns -------------------------------------------------------------------------------


@dataclass
class Turn:
    ms: float
    sent_at: float  # wall clock (s) just before the start request: the server shares this host's clock
    workflow_id: str
    run_id: str | None = None
    chat_id: str | None = None


@dataclass
class Variant:
    key: str
    label: str
    server: str  # which server: tuned, stock or previous
    run_turn: Callable[[], Awaitable[tuple[str, str | None, str | None]]]  # workflow id, run id, chat id
    turns: list[Turn] = field(default_factory=list)  # back to back
    spaced: list[Turn] = field(default_factory=list)  # the server idle before each
    round_turns_per_s: list[float] = field(default_factory=list)
    process_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    throughput_turns: int = 0

    async def turn(self) -> Turn:
        sent_at, start = time.time(), time.perf_counter()
        workflow_id, run_id, chat_id = await asyncio.wait_for(self.run_turn(), TURN_TIMEOUT_S)
        return Turn((time.perf_counter() - start) * 1000, sent_at, workflow_id, run_id, chat_id)

    @property
    def latencies(self) -> list[float]:
        return [t.ms for t in self.turns]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.latencies)

    @property
    def p90_ms(self) -> float:
        return p90(self.latencies)

    def block_medians(self, per_block: int) -> list[float]:
        """Each back-to-back block's median, ms, in the order the blocks ran."""
        return [
            statistics.median(self.latencies[i : i + per_block])
            for i in range(0, len(self.latencies), per_block)
        ]

    @property
    def turns_per_s(self) -> float:
        return statistics.median(self.round_turns_per_s)


async def shipped_turn(client: Client, tk_variant: Turnkeeper) -> tuple[str, str | None, str | None]:
    """A turn as any client sends one: signal-with-start, then the run's result."""
    chat_id = f"bench-{uuid.uuid4().hex[:12]}"
    handle = await tk.send_message(
        client, tk_variant.settings, chat_id, tk.new_message("write the file", tk_variant.settings)
    )
    state = await handle.result()
    if state.status != TurnStatus.COMPLETED:
        raise RuntimeError(f"turnkeeper turn ended {state.status.value}/{state.reason}")
    return handle.id, handle.result_run_id, chat_id


async def eager_turnkeeper_turn(client: Client, tk_variant: Turnkeeper) -> tuple[str, str | None, str | None]:
    """A turn as the web process with its own worker sends one (TURNKEEPER_WEB_WORKER=1):
    `send_message(eager=True)`, the message in the new run's input and its first
    workflow task handed to this process's worker in the start call's reply."""
    settings = tk_variant.settings
    chat_id = f"bench-{uuid.uuid4().hex[:12]}"
    handle = await tk.send_message(
        client, settings, chat_id, tk.new_message("write the file", settings), eager=True
    )
    state = await handle.result()
    if state.status != TurnStatus.COMPLETED:
        raise RuntimeError(f"turnkeeper turn ended {state.status.value}/{state.reason}")
    return handle.id, handle.result_run_id, chat_id


async def bare(client: Client, task_queue: str, eager: bool = False) -> tuple[str, str | None, str | None]:
    turn_id = uuid.uuid4().hex[:12]
    workflow_id = f"bare-{turn_id}"
    handle = await client.start_workflow(
        BareTurn.run, turn_id, id=workflow_id, task_queue=task_queue, request_eager_start=eager
    )
    text = await handle.result()
    if text != "done":
        raise RuntimeError(f"bare turn answered {text!r}")
    return workflow_id, handle.result_run_id, None


class ActivityClock(temporalio.client.Interceptor, temporalio.worker.Interceptor):
    """Records, on this host's wall clock, when each run's first model activity
    (turnkeeper's or the bare loop's) began to run in the worker (the activity's
    own clock). A client interceptor that is also a worker interceptor reaches the
    workers built on that client."""

    def __init__(self) -> None:
        self.model_started: dict[str, float] = {}  # run id -> wall clock (s)

    def intercept_activity(
        self, next: temporalio.worker.ActivityInboundInterceptor
    ) -> temporalio.worker.ActivityInboundInterceptor:
        return _ClockInbound(next, self)


class _ClockInbound(temporalio.worker.ActivityInboundInterceptor):
    def __init__(self, next: temporalio.worker.ActivityInboundInterceptor, clock: ActivityClock) -> None:
        super().__init__(next)
        self._clock = clock

    async def execute_activity(self, input: temporalio.worker.ExecuteActivityInput) -> Any:
        info = activity.info()
        if info.activity_type in (io.MODEL_CALL, BARE_MODEL):
            self._clock.model_started.setdefault(info.workflow_run_id, time.time())
        return await super().execute_activity(input)


# -- phases ------------------------------------------------------------------------------


def alternating(variants: list[Variant], i: int) -> list[Variant]:
    return variants if i % 2 == 0 else variants[::-1]


async def sequential(variants: list[Variant], plan: Plan) -> None:
    """Spaced: one turn per variant in turn, so each server has been idle for the
    other variants' turns. Back to back: blocks of turns per variant, each after
    BUSY_S of unmeasured turns on the same server, as when a server is busy."""
    progress(f"warm-up: {WARMUP_TURNS} turns per variant")
    for i in range(WARMUP_TURNS):
        for v in alternating(variants, i):
            await v.turn()
    progress(f"spaced: {plan.spaced} turns per variant, variants taking turns")
    for i in range(plan.spaced):
        for v in alternating(variants, i):
            v.spaced.append(await v.turn())
    progress(
        f"back to back: {plan.blocks} blocks of {plan.per_block} turns per variant, "
        f"each after {BUSY_S:.0f} s of turns on the same server"
    )
    for i in range(plan.blocks):
        for v in alternating(variants, i):
            busy_until = time.monotonic() + BUSY_S
            while time.monotonic() < busy_until:
                await v.turn()
            for _ in range(plan.per_block):
                v.turns.append(await v.turn())


async def throughput(variants: list[Variant], plan: Plan, servers: dict[str, Server]) -> None:
    for i in range(plan.rounds):
        progress(
            f"throughput round {i + 1} of {plan.rounds}: {plan.per_round} turns per variant, "
            f"{IN_FLIGHT} in flight"
        )
        for v in alternating(variants, i):
            gate = asyncio.Semaphore(IN_FLIGHT)

            async def one(v: Variant = v) -> None:
                async with gate:
                    await v.turn()

            pid = servers[v.server].pid
            cpu, server_cpu, start = time.process_time(), cpu_seconds(pid), time.perf_counter()
            await asyncio.gather(*(one() for _ in range(plan.per_round)))
            seconds = time.perf_counter() - start
            v.round_turns_per_s.append(plan.per_round / seconds)
            v.process_cpu_s += time.process_time() - cpu
            v.server_cpu_s += cpu_seconds(pid) - server_cpu
            v.throughput_turns += plan.per_round


# -- where the time goes -------------------------------------------------------------------


def _type(e: Any) -> int:
    return e.event_type


def breakdown(history: WorkflowHistory, turn: Turn) -> dict[str, float]:
    """One turn's milliseconds by where they went, from its history's event times
    (server clock) and the client's marks (same host clock). The parts add up to
    the turn's time at the client."""
    events = list(history.events)
    first, last = event_s(events[0]), event_s(events[-1])
    parts = {
        "client -> server (start request)": (first - turn.sent_at) * 1000,
        "workflow task dispatch (scheduled -> started)": 0.0,
        "worker: workflow tasks (started -> completed)": 0.0,
        "activities (started -> completed)": 0.0,
        "server between events": 0.0,
        "result -> client": turn.ms - (last - turn.sent_at) * 1000,
    }
    for prev, e in zip(events, events[1:], strict=False):
        gap = (event_s(e) - event_s(prev)) * 1000
        if _type(e) == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            parts["workflow task dispatch (scheduled -> started)"] += gap
        elif _type(e) == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            parts["worker: workflow tasks (started -> completed)"] += gap
        elif _type(e) in (
            EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
            EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
        ):
            parts["activities (started -> completed)"] += gap
        else:
            parts["server between events"] += gap
    return parts


async def fetch(client: Client, turn: Turn) -> WorkflowHistory:
    return await client.get_workflow_handle(turn.workflow_id, run_id=turn.run_id).fetch_history()


async def to_model_start(
    client: Client, store: SQLiteStore, clock: ActivityClock, turn: Turn
) -> dict[str, float]:
    """From a message to the model activity's start, ms: from the client's send, and
    from the server's signal event, to the history's ACTIVITY_TASK_STARTED of the
    model call (server clock; recorded when the workflow task that schedules it
    completes, before the worker has it); to the activity's own start (the
    ActivityClock interceptor); and to its first store write (the `user_message`
    event it records as it commits the message)."""
    history = await fetch(client, turn)
    events = list(history.events)
    received = next(
        event_s(e)
        for e in events
        if _type(e)
        in (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED)
        and (
            _type(e) == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            or not any(_type(x) == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED for x in events)
        )
    )
    started = next(
        event_s(e)
        for prev, e in zip(events, events[1:], strict=False)
        if _type(e) == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and prev.activity_task_scheduled_event_attributes.activity_type.name == io.MODEL_CALL
    )
    assert turn.chat_id is not None and turn.run_id is not None
    written = next(ev.created_at for ev in await store.events(turn.chat_id) if ev.type == "user_message")
    ran = clock.model_started[turn.run_id]
    return {
        "send -> ACTIVITY_TASK_STARTED": (started - turn.sent_at) * 1000,
        "message event -> ACTIVITY_TASK_STARTED": (started - received) * 1000,
        "send -> activity runs (its own clock)": (ran - turn.sent_at) * 1000,
        "ACTIVITY_TASK_STARTED -> activity runs": (ran - started) * 1000,
        "send -> activity's first store write": (_epoch(written) - turn.sent_at) * 1000,
    }


async def floor_to_model_start(client: Client, clock: ActivityClock, turn: Turn) -> dict[str, float]:
    """The bare loop's side of `to_model_start`: from the start request to its model
    activity's ACTIVITY_TASK_STARTED and to the activity's own start. What lies
    between those two is the engine's, for turnkeeper's turn too."""
    events = list((await fetch(client, turn)).events)
    started = next(event_s(e) for e in events if _type(e) == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)
    assert turn.run_id is not None
    ran = clock.model_started[turn.run_id]
    return {
        "start -> ACTIVITY_TASK_STARTED": (started - turn.sent_at) * 1000,
        "start -> activity runs (its own clock)": (ran - turn.sent_at) * 1000,
        "ACTIVITY_TASK_STARTED -> activity runs": (ran - started) * 1000,
    }


def _epoch(at: datetime) -> float:
    return at.timestamp()


# -- the CLI ------------------------------------------------------------------------------


async def cli_wall(command: list[str], env: dict[str, str], runs: int) -> list[float]:
    """Wall seconds of `turnkeeper <command>`, run `runs` times (after one unmeasured run)."""
    exe = str(Path(sys.executable).parent / "turnkeeper")
    times = []
    for i in range(runs + 1):
        start = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            exe,
            *command,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(
                f"turnkeeper {' '.join(command)} exited {proc.returncode}: {err.decode()[-500:]}"
            )
        if i:
            times.append(elapsed)
    return times


async def python_wall(code: str, runs: int) -> list[float]:
    """Wall seconds of `python -c code`: the floor under any CLI command."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code)
        await proc.wait()
        times.append(time.perf_counter() - start)
    return times


# -- main ----------------------------------------------------------------------------------


def describe(name: str, dynamic_config: dict[str, object], cli_defaults: bool) -> str:
    pragmas, config = server_settings(dynamic_config, cli_defaults)
    return f"{name}: SQLite {', '.join(pragmas) or 'defaults'}; dynamic config " + (
        ", ".join(f"{k}={v}" for k, v in config.items()) or "defaults"
    )


async def run(
    plan: Plan,
    with_eager: bool,
    reads_variant: int | None,
    as_json: bool,
    stream: str = "on",
    config_variant: dict[str, object] | None = None,
    with_loop: bool = False,
) -> None:
    setups = {"tuned": ({}, False), "stock": ({}, True)}
    if reads_variant is not None:
        setups["previous"] = ({k: reads_variant for k in TASK_DISPATCH}, False)
    elif config_variant:
        setups["previous"] = (config_variant, False)
    with tempfile.TemporaryDirectory(prefix="turnkeeper-engine-") as tmp_name:
        tmp = Path(tmp_name)
        async with contextlib.AsyncExitStack() as stack:
            servers: dict[str, Server] = {}
            clients: dict[str, Client] = {}
            clock = ActivityClock()
            for name, (config, cli_defaults) in setups.items():
                progress(f"starting the {name} dev server")
                (tmp / name).mkdir()
                servers[name] = await stack.enter_async_context(
                    dev_server(tmp / name, config, cli_defaults=cli_defaults)
                )
                clients[name] = await Client.connect(
                    servers[name].address,
                    data_converter=pydantic_data_converter,
                    interceptors=[clock] if name == "tuned" else [],
                )

            (tmp / "turnkeeper").mkdir()
            tk_variant = Turnkeeper(
                clients["tuned"],
                servers["tuned"].address,
                tmp / "turnkeeper",
                env={"TURNKEEPER_STREAM": stream},
            )
            await tk_variant.start()
            stack.push_async_callback(tk_variant.close)
            bares: dict[str, UnsandboxedBare] = {}
            for name in setups:
                (tmp / f"bare-{name}").mkdir()
                bares[name] = UnsandboxedBare(clients[name], tmp / f"bare-{name}")
                await bares[name].start()
                stack.push_async_callback(bares[name].close)

            if with_loop:
                (tmp / "bare-loop").mkdir()
                bares["loop"] = UnsandboxedBare(clients["tuned"], tmp / "bare-loop", on_loop=True)
                await bares["loop"].start()
                stack.push_async_callback(bares["loop"].close)

            tuned = clients["tuned"]
            variants = [
                Variant(
                    "turnkeeper",
                    "turnkeeper as shipped",
                    "tuned",
                    lambda: shipped_turn(tk_variant.client, tk_variant),
                ),
                Variant(
                    "stock",
                    "bare, stock server",
                    "stock",
                    lambda: bare(clients["stock"], bares["stock"].task_queue),
                ),
                Variant(
                    "floor", "bare, tuned server", "tuned", lambda: bare(tuned, bares["tuned"].task_queue)
                ),
            ]
            if with_eager:
                variants += [
                    Variant(
                        "floor_eager",
                        "bare, tuned, eager start",
                        "tuned",
                        lambda: bare(tuned, bares["tuned"].task_queue, eager=True),
                    ),
                    Variant(
                        "turnkeeper_eager",
                        "turnkeeper, web worker",
                        "tuned",
                        lambda: eager_turnkeeper_turn(tk_variant.client, tk_variant),
                    ),
                ]
            if with_loop:
                variants.append(
                    Variant(
                        "floor_loop",
                        "bare, tuned, on the loop",
                        "tuned",
                        lambda: bare(tuned, bares["loop"].task_queue),
                    )
                )
            if "previous" in setups:
                label = (
                    "bare, previous embedded"
                    if reads_variant == SERVER_DEFAULT_READS_PER_S
                    else f"bare, {reads_variant} reads/s"
                    if reads_variant is not None
                    else "bare, tuned + " + ", ".join(f"{k}={v}" for k, v in (config_variant or {}).items())
                )
                variants.append(
                    Variant(
                        "previous",
                        label,
                        "previous",
                        lambda: bare(clients["previous"], bares["previous"].task_queue),
                    )
                )
            by_key = {v.key: v for v in variants}

            await sequential(variants, plan)
            await throughput(variants, plan, servers)

            progress("histories: where the time goes, send -> model start")
            parts: dict[str, list[dict[str, float]]] = {}
            timelines: dict[str, tuple[Turn, list[dict[str, Any]]]] = {}
            for v in variants:
                if v.key in ("turnkeeper", "floor", "turnkeeper_eager", "floor_eager"):
                    client = clients[v.server]
                    parts[v.key] = [breakdown(await fetch(client, t), t) for t in v.turns]
                    typical = near_median(v.turns, lambda t: t.ms)
                    timelines[v.key] = (typical, timeline(await fetch(client, typical)))
            store = SQLiteStore(tk_variant.settings.sqlite_path)
            await store.open()
            try:
                to_model = {
                    key: [await to_model_start(tuned, store, clock, t) for t in by_key[key].turns]
                    for key in ("turnkeeper", "turnkeeper_eager")
                    if key in by_key
                }
                to_model.update(
                    {
                        key: [await floor_to_model_start(tuned, clock, t) for t in by_key[key].turns]
                        for key in ("floor", "floor_eager")
                        if key in by_key
                    }
                )
            finally:
                await store.close()

            progress("CLI wall times")
            env = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("TURNKEEPER_", "TEMPORAL_", "OPENAI_"))
            }
            env.update(
                {
                    "TEMPORAL_ADDRESS": servers["tuned"].address,
                    "TURNKEEPER_TEMPORAL_HTTP_ADDRESS": servers["tuned"].http_address,
                    "TURNKEEPER_DATA_DIR": str(tk_variant.settings.data_dir),
                    "TURNKEEPER_TASK_QUEUE": tk_variant.settings.task_queue,
                }
            )
            chat = by_key["turnkeeper"].turns[-1].chat_id
            assert chat is not None
            cli: dict[str, list[float]] = {}
            for command in CLI_COMMANDS:
                args = [command] if command == "list" else [command, chat]
                cli[command] = await cli_wall(args, env, plan.cli_runs)
            cli["(python -c pass)"] = await python_wall("pass", plan.cli_runs)
            cli["(python -c 'import temporalio.client')"] = await python_wall(
                "import temporalio.client", plan.cli_runs
            )
            progress("stopping workers and dev servers")
        summary = report(variants, parts, timelines, to_model, cli, plan, setups)
    if as_json:
        print()
        print(json.dumps(summary, indent=2))


def _med(values: list[float]) -> float:
    return statistics.median(values)


def variant_goals(
    tk_: Variant,
    stock: Variant,
    floor: Variant,
    to_model: list[dict[str, float]],
    cli: dict[str, list[float]],
    throughput_vs_stock: float,
) -> list[tuple[str, str, bool]]:
    """The issue's goals for one turnkeeper variant: (goal, value, met)."""
    to_model_median = _med([r["send -> activity runs (its own clock)"] for r in to_model])
    vs_stock, vs_floor = tk_.median_ms / stock.median_ms, tk_.median_ms / floor.median_ms
    return [
        ("median <= 60 ms", f"{tk_.median_ms:.1f} ms", tk_.median_ms <= GOAL_MEDIAN_MS),
        ("p90 <= 100 ms", f"{tk_.p90_ms:.1f} ms", tk_.p90_ms <= GOAL_P90_MS),
        ("median <= 0.30 x stock bare", f"{vs_stock:.2f} x", vs_stock <= GOAL_VS_STOCK),
        (
            "throughput >= 1.7 x stock bare",
            f"{throughput_vs_stock:.2f} x",
            throughput_vs_stock >= GOAL_THROUGHPUT_VS_STOCK,
        ),
        ("median <= 1.15 x tuned bare", f"{vs_floor:.2f} x", vs_floor <= GOAL_VS_FLOOR),
        ("send -> model start <= 20 ms", f"{to_model_median:.1f} ms", to_model_median <= GOAL_TO_MODEL_MS),
        ("CLI status <= 0.4 s", f"{_med(cli['status']):.3f} s", _med(cli["status"]) <= GOAL_CLI_S),
    ]


def report(
    variants: list[Variant],
    parts: dict[str, list[dict[str, float]]],
    timelines: dict[str, tuple[Turn, list[dict[str, Any]]]],
    to_model: dict[str, list[dict[str, float]]],
    cli: dict[str, list[float]],
    plan: Plan,
    setups: dict[str, tuple[dict[str, object], bool]],
) -> dict[str, Any]:
    by_key = {v.key: v for v in variants}
    tk_, stock, floor = by_key["turnkeeper"], by_key["stock"], by_key["floor"]
    print()
    print(
        f"latency: {plan.blocks} x {plan.per_block} back-to-back turns per variant (each block after "
        f"{BUSY_S:.0f} s of turns on its server), blocks interleaved; spaced: {plan.spaced} turns per variant, "
        "variants taking turns; "
        f"throughput: {plan.rounds} round(s) of {plan.per_round} turns per variant, {IN_FLIGHT} in flight; "
        "CPU ms per turn = this process (client and workers) + the variant's dev server"
    )
    for name, (config, cli_defaults) in setups.items():
        print("  " + describe(name, config, cli_defaults))
    header = (
        f"{'variant':<28}{'median ms':>10}{'p90 ms':>9}{'min ms':>8}{'spaced median':>15}"
        f"{'turns/s':>9}{'CPU ms/turn':>15}"
    )
    print(header)
    print("-" * len(header))
    for v in variants:
        cpu = (
            f"{v.process_cpu_s * 1000 / v.throughput_turns:.1f} + "
            f"{v.server_cpu_s * 1000 / v.throughput_turns:.1f}"
        )
        print(
            f"{v.label:<28}{v.median_ms:>10.1f}{v.p90_ms:>9.1f}{min(v.latencies):>8.1f}"
            f"{_med([t.ms for t in v.spaced]):>15.1f}{v.turns_per_s:>9.1f}{cpu:>15}"
        )

    tp_stock = ratio_of_rounds(tk_.round_turns_per_s, stock.round_turns_per_s)
    tp_floor = ratio_of_rounds(tk_.round_turns_per_s, floor.round_turns_per_s)
    spreads: dict[str, PairedRatio] = {
        "turnkeeper/stock bare throughput": tp_stock,
        "turnkeeper/tuned bare throughput": tp_floor,
    }
    ratios = {
        "turnkeeper/stock bare median": tk_.median_ms / stock.median_ms,
        "turnkeeper/stock bare p90": tk_.p90_ms / stock.p90_ms,
        "turnkeeper/tuned bare median (over the floor)": tk_.median_ms / floor.median_ms,
        "turnkeeper/tuned bare p90": tk_.p90_ms / floor.p90_ms,
        "tuned bare/stock bare median": floor.median_ms / stock.median_ms,
        "turnkeeper/stock bare throughput": tp_stock.median,
        "turnkeeper/tuned bare throughput": tp_floor.median,
    }
    # Block by block: each variant's block i ran next to the others' block i, so a
    # slow spell of the machine weighs on both sides of a ratio, not on one.
    floor_blocks = floor.block_medians(plan.per_block)
    by_block = {
        key: ratio_of_rounds(by_key[key].block_medians(plan.per_block), floor_blocks)
        for key in ("turnkeeper", "turnkeeper_eager")
        if key in by_key
    }
    ratios[BY_BLOCK] = by_block["turnkeeper"].median
    if "floor_eager" in by_key:
        ratios["eager/plain start, bare median"] = by_key["floor_eager"].median_ms / floor.median_ms
        ratios["eager/signal-with-start, turnkeeper median"] = (
            by_key["turnkeeper_eager"].median_ms / tk_.median_ms
        )
    if "floor_loop" in by_key:
        ratios["turnkeeper/tuned bare on the loop median"] = tk_.median_ms / by_key["floor_loop"].median_ms
        ratios["on the loop/plain, bare median"] = by_key["floor_loop"].median_ms / floor.median_ms
    if "previous" in by_key:
        prev = by_key["previous"]
        spreads["tuned/previous bare throughput"] = ratio_of_rounds(
            floor.round_turns_per_s, prev.round_turns_per_s
        )
        ratios["tuned/previous bare throughput"] = spreads["tuned/previous bare throughput"].median
        ratios["tuned/previous bare median"] = floor.median_ms / prev.median_ms
        ratios["tuned/previous bare server CPU"] = (
            floor.server_cpu_s / floor.throughput_turns / (prev.server_cpu_s / prev.throughput_turns)
        )
    print()
    print(
        "ratios (throughput: median over the rounds of each round's ratio, then the lowest-highest round; "
        "block by block: the same over the back-to-back blocks' medians)"
    )
    shown = dict(spreads) if plan.rounds > 1 else {}
    if plan.blocks > 1:
        shown[BY_BLOCK] = by_block["turnkeeper"]
    for name, value in ratios.items():
        spread = f"   {shown[name].describe()}" if name in shown else ""
        print(f"  {name:<48}{value:>7.2f}x{spread}")

    print()
    print(
        "a message to the model activity's start, ms (median, p90), back-to-back turns "
        "(the bare loop: from its start request)"
    )
    for key, rows in to_model.items():
        for name in rows[0]:
            values = [r[name] for r in rows]
            print(f"  {by_key[key].label:<26}{name:<42}{_med(values):>7.1f}{p90(values):>7.1f}")

    print()
    print(
        "where a back-to-back turn's milliseconds go (median over the turns of each part; history event times)"
    )
    names = list(next(iter(parts.values()))[0])
    print(f"  {'part':<48}" + "".join(f"{by_key[k].label[:22]:>24}" for k in parts))
    for name in names:
        print(f"  {name:<48}" + "".join(f"{_med([p[name] for p in rows]):>24.1f}" for rows in parts.values()))

    print()
    print("CLI wall time against the tuned server, s (median, min, max over the runs)")
    for name, times in cli.items():
        print(f"  {name:<40}{_med(times):>7.3f}{min(times):>7.3f}{max(times):>7.3f}")

    goals = variant_goals(tk_, stock, floor, to_model["turnkeeper"], cli, tp_stock.median)
    print()
    print("goals (turnkeeper as shipped)")
    for goal, value, ok in goals:
        print(f"  {goal:<34}{value:>10}   {'PASS' if ok else 'MISS'}")
    print(
        f"  over the floor, block by block: {by_block['turnkeeper'].median:.2f} x; "
        f"{by_block['turnkeeper'].note(GOAL_VS_FLOOR)}"
    )
    if "turnkeeper_eager" in by_key:
        eager = by_key["turnkeeper_eager"]
        eager_goals = variant_goals(
            eager,
            stock,
            floor,
            to_model["turnkeeper_eager"],
            cli,
            ratio_of_rounds(eager.round_turns_per_s, stock.round_turns_per_s).median,
        )
        print()
        print("goals (turnkeeper with its worker in the web process: eager start, TURNKEEPER_WEB_WORKER=1)")
        for goal, value, ok in eager_goals:
            print(f"  {goal:<34}{value:>10}   {'PASS' if ok else 'MISS'}")
        print(
            f"  over the floor, block by block: {by_block['turnkeeper_eager'].median:.2f} x; "
            f"{by_block['turnkeeper_eager'].note(GOAL_VS_FLOOR)}"
        )

    for key, (turn, rows) in timelines.items():
        print_timeline(
            f"timeline of one {by_key[key].label} turn near the median: {turn.ms:.1f} ms at the client", rows
        )

    return {
        "plan": asdict(plan),
        "servers": {name: describe(name, c, d) for name, (c, d) in setups.items()},
        "variants": {
            v.key: {
                "label": v.label,
                "median_ms": v.median_ms,
                "p90_ms": v.p90_ms,
                "turns_per_s": v.turns_per_s,
                "round_turns_per_s": v.round_turns_per_s,
                "process_cpu_ms_per_turn": v.process_cpu_s * 1000 / v.throughput_turns,
                "server_cpu_ms_per_turn": v.server_cpu_s * 1000 / v.throughput_turns,
                "latencies_ms": v.latencies,
                "block_medians_ms": v.block_medians(plan.per_block),
                "spaced_ms": [t.ms for t in v.spaced],
            }
            for v in variants
        },
        "ratios": ratios,
        "throughput_round_ratios": {k: asdict(r) for k, r in spreads.items()},
        "over_floor_block_by_block": {k: asdict(r) for k, r in by_block.items()},
        "to_model_start_ms": to_model,
        "breakdown_ms": {k: {n: _med([p[n] for p in rows]) for n in names} for k, rows in parts.items()},
        "cli_wall_s": cli,
        "goals": [{"goal": g, "value": v, "pass": ok} for g, v, ok in goals],
        "timelines": {k: {"client_ms": t.ms, "events": rows} for k, (t, rows) in timelines.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK.blocks} x {QUICK.per_block} back-to-back turns per variant, one throughput "
        f"round of {QUICK.per_round}",
    )
    parser.add_argument("--rounds", type=int, help=f"throughput rounds (default {FULL.rounds})")
    parser.add_argument("--blocks", type=int, help=f"back-to-back blocks per variant (default {FULL.blocks})")
    parser.add_argument(
        "--eager-variant",
        action="store_true",
        help="also the bare loop and turnkeeper started with eager workflow start",
    )
    parser.add_argument(
        "--loop-variant",
        action="store_true",
        help="also the bare loop with its workflow activations on the worker's event loop, "
        "as turnkeeper's worker runs them",
    )
    parser.add_argument(
        "--previous-variant",
        action="store_true",
        help="also the bare loop on the embedded server's settings without the task-dispatch "
        "settings (the 50 ms tick)",
    )
    parser.add_argument(
        "--reads-variant",
        type=int,
        metavar="N",
        help="also the bare loop on the embedded server's settings with the task-dispatch "
        "settings at N reads a second (--previous-variant: N=20, the server's default)",
    )
    parser.add_argument(
        "--config-variant",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="also the bare loop on the embedded server's settings plus this dynamic config "
        "value (repeatable; not with --previous-variant or --reads-variant): a setting's "
        "effect, measured beside the floor",
    )
    parser.add_argument(
        "--stream",
        choices=("on", "off"),
        default="on",
        help="turnkeeper's TURNKEEPER_STREAM (default on, as shipped): what streaming costs a turn",
    )
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if args.rounds is not None:
        plan = replace(plan, rounds=args.rounds)
    if args.blocks is not None:
        plan = replace(plan, blocks=args.blocks)
    # The worker's own event loop (uvloop where installed), as `python worker.py` runs it;
    # every variant's worker and client share it.
    reads = SERVER_DEFAULT_READS_PER_S if args.previous_variant else args.reads_variant
    extra: dict[str, object] = {}
    for item in args.config_variant:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--config-variant {item!r}: expected KEY=JSON")
        extra[key] = json.loads(value)
    if extra and reads is not None:
        parser.error("--config-variant goes without --previous-variant and --reads-variant")
    run_and_exit(
        run(
            plan,
            args.eager_variant,
            reads,
            args.json,
            stream=args.stream,
            config_variant=extra,
            with_loop=args.loop_variant,
        ),
        loop_factory=event_loop_factory("auto"),
    )


if __name__ == "__main__":
    main()
