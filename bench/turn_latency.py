"""Turn latency and throughput of turnkeeper against a bare Temporal loop and a
plain in-process loop, measured side by side in one run.

    .venv/bin/python bench/turn_latency.py [--quick] [--no-deployed | --deployed-rounds N] [--json]

Every variant runs the same turn: model call -> `write_file` tool -> model call
(final text), with the scripted model and the real built-in `write_file` tool.

  turnkeeper        the real worker (`worker.run_worker`) with its defaults: ChatTurn,
                    signal-with-start, SQLite session store, local store activities,
                    search attributes, workflow code outside the sandbox
                    (--sandbox-variant adds the same with TURNKEEPER_WORKFLOW_SANDBOX=on,
                    --fixed-pollers-variant with TURNKEEPER_POLLERS=5)
  bare Temporal     bench/bare_loop.py: three plain activities, nothing else
  in-process        the same three steps as plain awaits, without Temporal
  in-process+store  the same, plus the SQLiteStore calls turnkeeper's activities make

Each Temporal variant has its own task queue and its own in-process worker on
one Temporal dev server started here (on-disk SQLite, like the embedded server
the worker starts). Measurements alternate between variants so that the noise
of a small shared machine falls on all of them alike. Then, unless --no-deployed,
bench/process_throughput.py measures throughput once more with each worker in a
process of its own, as deployed. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio import activity
from temporalio.api.history.v1 import History
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from bench._common import (
    Server,
    dev_server,
    median_interval,
    near_median,
    p90,
    print_timeline,
    progress,
    run_and_exit,
    timeline,
)
from bench.bare_loop import MODEL, TOOL, BareModelInput, BareToolInput, BareTurn
from turnkeeper import client as tk
from turnkeeper.activities.providers import ScriptedProvider
from turnkeeper.activities.tools import ToolContext, ToolRegistry, default_registry
from turnkeeper.config import Settings
from turnkeeper.models import ChatMessage, ModelReply, ToolCall, TurnStatus, UserMessage
from turnkeeper.store import SQLiteStore
from turnkeeper.worker.dev_server import server_settings
from turnkeeper.worker.main import STICKY_SCHEDULE_TO_START, run_worker

# One benchmark turn. The scripted model answers item i for the i-th assistant
# message of the chat, so every turn runs in a fresh chat to replay the same script.
SCRIPT = [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "f.txt", "content": "x"}}]},
    {"text": "done"},
]
TOOLS = ("write_file",)
MAX_TOOL_OUTPUT = 16 * 1024

WARMUP_TURNS = 5
# The dev server's history shard moves tasks to matching at most this often per
# second (default 20): a workflow task waits for the next 50 ms tick. --fast-dispatch
# raises it, so the per-step costs of the variants show instead of the tick.
FAST_DISPATCH = {"history.transferProcessorMaxPollRPS": 1000}
TURN_TIMEOUT_S = 120.0

# The goals from the issue.
GOAL_MEDIAN_MS = 250.0
GOAL_MEDIAN_VS_BARE = 1.25
GOAL_THROUGHPUT_VS_BARE = 1.0


@dataclass(frozen=True)
class ServerSetup:
    """How the benchmark's dev server is started."""

    dynamic_config: dict[str, object]  # on top of the embedded server's DYNAMIC_CONFIG
    cli_defaults: bool  # without the embedded server's tuning

    def describe(self) -> str:
        pragmas, config = server_settings(self.dynamic_config, self.cli_defaults)
        return (
            ("the CLI's defaults" if self.cli_defaults else "the embedded server's settings")
            + f" (SQLite: {', '.join(pragmas) or 'defaults'}; dynamic config: "
            + (", ".join(f"{k}={v}" for k, v in config.items()) or "defaults")
            + ")"
            + ("" if FAST_DISPATCH.keys() <= config.keys() else "; workflow tasks dispatched on a 50 ms tick")
        )


@dataclass(frozen=True)
class Plan:
    sequential: int  # latency: turns per variant, one at a time
    throughput: int  # throughput: turns per variant in all
    in_flight: int  # throughput: turns running at once
    rounds: int  # throughput: split into this many alternating rounds
    history_samples: int  # runs whose history is fetched per Temporal variant
    deployed_rounds: int  # throughput as deployed (process_throughput.py): rounds,
    deployed_turns: int  # and turns per variant per round


# Throughput comes in rounds so that each is compared with its neighbours in time:
# this machine's speed drifts by a quarter within minutes. Twelve rounds narrow
# the interval around the median ratio to the third lowest-third highest round.
FULL = Plan(
    sequential=30,
    throughput=1800,
    in_flight=50,
    rounds=12,
    history_samples=5,
    deployed_rounds=12,
    deployed_turns=150,
)
QUICK = Plan(
    sequential=10,
    throughput=50,
    in_flight=50,
    rounds=1,
    history_samples=3,
    deployed_rounds=1,
    deployed_turns=50,
)


# -- the dev server's CPU time -------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # fields 3.. of proc(5); utime is 14, stime 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the turn's three steps, shared by the bare and in-process variants -----------


class Steps:
    """The scripted model and the real `write_file` tool, outside turnkeeper's activities."""

    def __init__(self, workspace: Path) -> None:
        workspace.mkdir(parents=True, exist_ok=True)
        self.workspace = workspace
        self.provider = ScriptedProvider(SCRIPT)
        self.registry: ToolRegistry = default_registry()

    async def model(self, history: list[ChatMessage], call_index: int) -> ModelReply:
        return await self.provider.complete(history, self.registry.specs(TOOLS), call_index=call_index)

    async def tool(self, chat_id: str, call: ToolCall) -> str:
        ctx = ToolContext.for_call(
            workspace=self.workspace, chat_id=chat_id, turn=1, tool_call_id=call.id, exec_timeout=60.0
        )
        outcome = await self.registry.run(
            call.name, call.arguments, ctx, enabled=TOOLS, max_output_bytes=MAX_TOOL_OUTPUT
        )
        if outcome.is_error:
            raise RuntimeError(f"tool failed: {outcome.content}")
        return outcome.content


class BareActivities:
    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    @activity.defn(name=MODEL)
    async def model(self, inp: BareModelInput) -> ModelReply:
        return await self.steps.model([], inp.step)

    @activity.defn(name=TOOL)
    async def tool(self, inp: BareToolInput) -> str:
        return await self.steps.tool(inp.turn_id, inp.call)


# -- variants ------------------------------------------------------------------------


@dataclass
class TurnRecord:
    ms: float
    workflow_id: str | None = None
    run_id: str | None = None


class Variant(ABC):
    key: str
    label: str
    temporal: bool = False

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    @abstractmethod
    async def _turn(self) -> tuple[str | None, str | None]:
        """Run one turn to its end; the workflow id and run id, if any."""

    async def turn(self) -> TurnRecord:
        start = time.perf_counter()
        workflow_id, run_id = await asyncio.wait_for(self._turn(), TURN_TIMEOUT_S)
        return TurnRecord((time.perf_counter() - start) * 1000, workflow_id, run_id)


# What the optional turnkeeper variants change: workflow code in Temporal's sandbox
# (its CPU cost), and the SDK's fixed five pollers (what the worker's own poller
# settings gain, worker.poller_behaviors).
SANDBOX_ON = {"TURNKEEPER_WORKFLOW_SANDBOX": "on"}
FIXED_POLLERS = {"TURNKEEPER_POLLERS": "5"}


class Turnkeeper(Variant):
    temporal = True

    def __init__(
        self,
        client: Client,
        address: str,
        tmp: Path,
        key: str = "turnkeeper",
        label: str = "turnkeeper",
        env: dict[str, str] | None = None,
    ) -> None:
        # `env` departs from the worker's defaults (see SANDBOX_ON, FIXED_POLLERS).
        self.key, self.label = key, label
        script = tmp / "script.json"
        script.write_text(json.dumps(SCRIPT))
        self.settings = Settings.from_env(
            {
                **(env or {}),
                "TEMPORAL_ADDRESS": address,
                "TURNKEEPER_TASK_QUEUE": f"bench-turnkeeper-{uuid.uuid4().hex[:8]}",
                "TURNKEEPER_DATA_DIR": str(tmp / "data"),
                "TURNKEEPER_WORKSPACE": str(tmp / "ws"),
                "TURNKEEPER_MODEL": f"scripted:{script}",
            }
        )
        # As shipped: turnkeeper's data converter, on `client`'s connection and interceptors.
        self.client = Client(**{**client.config(), "data_converter": tk.data_converter(self.settings)})
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(run_worker(self.settings, client=self.client, stop=self._stop))
        await asyncio.sleep(0.5)
        if self._task.done():
            self._task.result()  # raise what stopped it

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _turn(self) -> tuple[str | None, str | None]:
        return await turnkeeper_turn(self.client, self.settings)


async def turnkeeper_turn(client: Client, settings: Settings) -> tuple[str, str | None]:
    """One benchmark turn in a fresh chat, sent as any client sends it; its workflow and run id."""
    chat_id = f"bench-{uuid.uuid4().hex[:12]}"
    handle = await tk.send_message(client, settings, chat_id, tk.new_message("write the file", settings))
    state = await handle.result()
    if state.status != TurnStatus.COMPLETED:
        raise RuntimeError(f"turnkeeper turn ended {state.status.value}/{state.reason}")
    return handle.id, handle.result_run_id


class Bare(Variant):
    key = "bare"
    label = "bare Temporal loop"
    temporal = True

    def __init__(self, client: Client, tmp: Path) -> None:
        self.client = client
        self.task_queue = f"bench-bare-{uuid.uuid4().hex[:8]}"
        acts = BareActivities(Steps(tmp / "ws"))
        self._worker = Worker(
            client,
            task_queue=self.task_queue,
            workflows=[BareTurn],
            activities=[acts.model, acts.tool],
            sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._worker.run())

    async def close(self) -> None:
        await self._worker.shutdown()
        if self._task is not None:
            await self._task

    async def _turn(self) -> tuple[str | None, str | None]:
        return await bare_turn(self.client, self.task_queue), None


async def bare_turn(client: Client, task_queue: str) -> str:
    """One bare-loop turn on `task_queue`; its workflow id."""
    turn_id = uuid.uuid4().hex[:12]
    workflow_id = f"bare-{turn_id}"
    text = await client.execute_workflow(BareTurn.run, turn_id, id=workflow_id, task_queue=task_queue)
    if text != "done":
        raise RuntimeError(f"bare turn answered {text!r}")
    return workflow_id


class Agents(Variant):
    """Temporal's OpenAI Agents integration (`temporalio.openai_agents`) on the same
    server: a scripted model and one activity tool with maximum_attempts=1."""

    key = "agents"
    label = "OpenAI Agents integration"
    temporal = True

    def __init__(self, address: str, tmp: Path) -> None:
        self.address = address
        self.path = tmp / "f.txt"
        self.task_queue = f"bench-agents-{uuid.uuid4().hex[:8]}"
        self._worker: Worker | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        from agents import Model, ModelProvider
        from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
        from temporalio.openai_agents.testing import ResponseBuilders

        from bench.agents_loop import AgentsTurn, write_file

        # The SDK's default tracing stays on, as a user gets it; with no OpenAI key
        # its exporter warns once per batch, which would bury the report.
        logging.getLogger("openai.agents").setLevel(logging.ERROR)
        arguments = json.dumps({"path": str(self.path), "content": "x"})

        class ScriptedModel(Model):
            """Tool call first; once the tool's output is in the input, the answer."""

            async def get_response(
                self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
            ) -> Any:
                answered = isinstance(input, list) and any(
                    isinstance(i, dict) and i.get("type") == "function_call_output" for i in input
                )
                if answered:
                    return ResponseBuilders.output_message("done")
                return ResponseBuilders.tool_call(arguments, "write_file", call_id=uuid.uuid4().hex)

            def stream_response(self, *args: Any, **kwargs: Any) -> Any:
                raise NotImplementedError

        class Provider(ModelProvider):
            def get_model(self, model_name: str | None) -> Model:
                return ScriptedModel()

        plugin = OpenAIAgentsPlugin(
            model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=300)),
            model_provider=Provider(),
        )
        self.client = await Client.connect(self.address, plugins=[plugin])
        self._worker = Worker(
            self.client,
            task_queue=self.task_queue,
            workflows=[AgentsTurn],
            activities=[write_file],
            sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
        )
        self._task = asyncio.create_task(self._worker.run())

    async def close(self) -> None:
        if self._worker is not None:
            await self._worker.shutdown()
        if self._task is not None:
            await self._task

    async def _turn(self) -> tuple[str | None, str | None]:
        workflow_id = f"agents-{uuid.uuid4().hex[:12]}"
        text = await self.client.execute_workflow(
            "AgentsTurn", "write the file", id=workflow_id, task_queue=self.task_queue, result_type=str
        )
        if text != "done":
            raise RuntimeError(f"agents turn answered {text!r}")
        return workflow_id, None


class InProcess(Variant):
    """model -> write_file -> model as plain awaits; with `store`, also the store
    calls turnkeeper's activities make per turn, in the same order."""

    def __init__(self, tmp: Path, with_store: bool) -> None:
        self.steps = Steps(tmp / "ws")
        self.store = SQLiteStore(tmp / "sessions.db") if with_store else None
        self.key = "in_process_store" if with_store else "in_process"
        self.label = "in-process + SQLiteStore" if with_store else "in-process (no store)"

    async def start(self) -> None:
        if self.store is not None:
            await self.store.open()

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()

    async def _turn(self) -> tuple[str | None, str | None]:
        chat_id = f"bench-{uuid.uuid4().hex[:12]}"
        if self.store is None:
            reply = await self.steps.model([], 0)
            for call in reply.tool_calls:
                await self.steps.tool(chat_id, call)
            reply = await self.steps.model([], 1)
        else:
            reply = await self._turn_with_store(chat_id, self.store)
        if reply.text != "done":
            raise RuntimeError(f"in-process turn answered {reply.text!r}")
        return None, None

    async def _turn_with_store(self, chat_id: str, store: SQLiteStore) -> ModelReply:
        message = UserMessage(message_id=uuid.uuid4().hex, text="write the file")
        turn = (await store.begin_turn(chat_id, uuid.uuid4().hex, [message.message_id])).turn
        assert turn is not None
        new_messages = [message]
        step = 0
        while True:  # as activities/model_call.py and activities/tool_call.py
            if new_messages:
                await store.commit_user_messages(chat_id, turn, new_messages)
                new_messages = []
            history = await store.history(chat_id)
            reply = await self.steps.model(history, sum(1 for m in history if m.role == "assistant"))
            await store.record_assistant(chat_id, turn, step, reply, final=reply.is_final)
            if reply.is_final:
                return reply
            for call in reply.tool_calls:
                await store.tool_started(chat_id, turn, call, f"{chat_id}/{turn}/{call.id}")
                content = await self.steps.tool(chat_id, call)
                await store.record_tool_result(chat_id, turn, call.id, call.name, content, "done")
            step += 1


# -- measurements ----------------------------------------------------------------------


@dataclass
class Result:
    label: str
    latencies_ms: list[float] = field(default_factory=list)
    throughput_turns: int = 0
    throughput_seconds: float = 0.0
    round_turns_per_s: list[float] = field(default_factory=list)  # one per throughput round
    process_cpu_s: float = 0.0  # this process during the throughput phase
    server_cpu_s: float = 0.0  # the dev server during the throughput phase
    history_events: float | None = None
    history_proto_bytes: float | None = None
    history_json_bytes: float | None = None

    @property
    def median_ms(self) -> float:
        return statistics.median(self.latencies_ms)

    @property
    def p90_ms(self) -> float:
        return p90(self.latencies_ms)

    @property
    def turns_per_s(self) -> float:
        return self.throughput_turns / self.throughput_seconds

    @property
    def process_cpu_ms(self) -> float:
        return self.process_cpu_s * 1000 / self.throughput_turns

    @property
    def server_cpu_ms(self) -> float:
        return self.server_cpu_s * 1000 / self.throughput_turns

    def summary(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "median_ms": self.median_ms,
            "p90_ms": self.p90_ms,
            "turns_per_s": self.turns_per_s,
            "throughput_turns": self.throughput_turns,
            "throughput_seconds": self.throughput_seconds,
            "round_turns_per_s": self.round_turns_per_s,
            "process_cpu_ms_per_turn": self.process_cpu_ms,
            "server_cpu_ms_per_turn": self.server_cpu_ms,
            "history_events_per_turn": self.history_events,
            "history_proto_bytes_per_turn": self.history_proto_bytes,
            "history_json_bytes_per_turn": self.history_json_bytes,
            "latencies_ms": self.latencies_ms,
        }


@dataclass(frozen=True)
class PairedRatio:
    """a/b over pairs measured side by side (rounds' throughput, or blocks' medians)."""

    median: float
    lowest: float
    highest: float
    interval: tuple[float, float, float]  # median_interval: low, high, its coverage

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PairedRatio:
        low, high, coverage = data["interval"]
        return cls(data["median"], data["lowest"], data["highest"], (low, high, coverage))

    def describe(self) -> str:
        low, high, coverage = self.interval
        spread = f"{self.lowest:.2f}-{self.highest:.2f}"
        return spread if coverage == 0 else f"{spread}   median within {low:.2f}-{high:.2f} ({coverage:.0%})"

    def note(self, goal: float) -> str:
        """Whether the rounds can tell the median from `goal`."""
        low, high, coverage = self.interval
        if coverage == 0:
            return "one round: no interval"
        where = f"{coverage:.0%} interval {low:.2f}-{high:.2f}"
        if low >= goal:
            return f"the {where} is at or above {goal:.2f}"
        if high < goal:
            return f"the {where} is below {goal:.2f}"
        return f"too close to tell: the {where} holds {goal:.2f}"


def paired_ratio(a: Result, b: Result) -> PairedRatio:
    return ratio_of_rounds(a.round_turns_per_s, b.round_turns_per_s)


def ratio_of_rounds(a: list[float], b: list[float]) -> PairedRatio:
    """a/b of two variants' figures pair by pair: turns per second round by round, or
    (engine_latency.py) back-to-back blocks' medians block by block."""
    ratios = [x / y for x, y in zip(a, b, strict=False)]
    return PairedRatio(statistics.median(ratios), min(ratios), max(ratios), median_interval(ratios))


def alternating(variants: list[Variant], i: int) -> list[Variant]:
    """Round i's order: reversed every other round, so no variant always goes first."""
    return variants if i % 2 == 0 else variants[::-1]


async def burst(variant: Variant, turns: int, in_flight: int) -> float:
    """`turns` turns with at most `in_flight` at once; the seconds it took."""
    gate = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with gate:
            await variant.turn()

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(turns)))
    return time.perf_counter() - start


async def measure(
    variants: list[Variant], plan: Plan, client: Client, server: Server
) -> tuple[dict[str, Result], dict[str, list[TurnRecord]]]:
    results = {v.key: Result(v.label) for v in variants}
    turns: dict[str, list[TurnRecord]] = {v.key: [] for v in variants}

    progress(f"warm-up: {WARMUP_TURNS} turns per variant")
    for i in range(WARMUP_TURNS):
        for v in alternating(variants, i):
            await v.turn()

    progress(f"latency: {plan.sequential} sequential turns per variant, interleaved")
    for i in range(plan.sequential):
        for v in alternating(variants, i):
            record = await v.turn()
            turns[v.key].append(record)
            results[v.key].latencies_ms.append(record.ms)

    per_round = plan.throughput // plan.rounds
    progress(
        f"throughput: {per_round * plan.rounds} turns per variant, {plan.in_flight} in flight, "
        f"in {plan.rounds} alternating round(s)"
    )
    for i in range(plan.rounds):
        for v in alternating(variants, i):
            res = results[v.key]
            cpu, server_cpu = time.process_time(), cpu_seconds(server.pid)
            seconds = await burst(v, per_round, plan.in_flight)
            res.throughput_seconds += seconds
            res.round_turns_per_s.append(per_round / seconds)
            res.process_cpu_s += time.process_time() - cpu
            res.server_cpu_s += cpu_seconds(server.pid) - server_cpu
            res.throughput_turns += per_round

    progress("workflow histories")
    for v in variants:
        if v.temporal:
            histories = [await fetch(client, r) for r in turns[v.key][: plan.history_samples]]
            res = results[v.key]
            res.history_events = statistics.mean(len(h.events) for h in histories)
            res.history_proto_bytes = statistics.mean(proto_size(h) for h in histories)
            res.history_json_bytes = statistics.mean(len(h.to_json()) for h in histories)
    return results, turns


async def fetch(client: Client, record: TurnRecord) -> WorkflowHistory:
    assert record.workflow_id is not None
    return await client.get_workflow_handle(record.workflow_id, run_id=record.run_id).fetch_history()


def proto_size(history: WorkflowHistory) -> int:
    return History(events=history.events).ByteSize()


# -- one turn's timeline -------------------------------------------------------------------


async def median_timeline(
    client: Client, records: list[TurnRecord]
) -> tuple[TurnRecord, list[dict[str, Any]]]:
    """The timeline of the sequential turn closest to the median latency."""
    record = near_median(records, lambda r: r.ms)
    return record, timeline(await fetch(client, record))


# -- report ----------------------------------------------------------------------------------


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def report(
    results: dict[str, Result],
    timelines: dict[str, tuple[TurnRecord, list[dict[str, Any]]]],
    plan: Plan,
    server: ServerSetup,
    deployed: dict[str, Any] | None,
) -> dict[str, Any]:
    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    header = (
        f"{'variant':<26}{'median ms':>10}{'p90 ms':>9}{'turns/s':>9}{'CPU ms/turn':>13}"
        f"{'events/turn':>13}{'proto B/turn':>14}{'JSON B/turn':>13}"
    )
    print()
    print(
        f"{plan.sequential} sequential turns per variant (after {WARMUP_TURNS} warm-up); "
        f"throughput: {plan.throughput // plan.rounds * plan.rounds} turns, {plan.in_flight} in flight; "
        "CPU = this process + dev server, during the throughput runs"
    )
    print("dev server: " + server.describe())
    print(header)
    print("-" * len(header))
    for r in results.values():
        cpu = f"{r.process_cpu_ms:.1f} + {r.server_cpu_ms:.1f}"
        print(
            f"{r.label:<26}{r.median_ms:>10.1f}{r.p90_ms:>9.1f}{r.turns_per_s:>9.1f}{cpu:>13}"
            f"{num(r.history_events, '.1f'):>13}{num(r.history_proto_bytes, ',.0f'):>14}"
            f"{num(r.history_json_bytes, ',.0f'):>13}"
        )

    tk_, bare = results["turnkeeper"], results["bare"]
    sandboxed, agents = results.get("turnkeeper_sandbox"), results.get("agents")
    fixed = results.get("turnkeeper_fixed_pollers")
    # Throughput: the per-round ratios' median, range and the interval around the median.
    spreads: dict[str, PairedRatio] = {"turnkeeper/bare throughput": paired_ratio(tk_, bare)}
    if sandboxed is not None:
        spreads["turnkeeper sandbox on/off throughput"] = paired_ratio(sandboxed, tk_)
    if fixed is not None:
        spreads["turnkeeper default/5 fixed pollers"] = paired_ratio(tk_, fixed)
    if agents is not None:
        spreads["turnkeeper/agents throughput"] = paired_ratio(tk_, agents)
    ratios = {
        "turnkeeper/bare median": ratio(tk_.median_ms, bare.median_ms),
        "turnkeeper/bare p90": ratio(tk_.p90_ms, bare.p90_ms),
        "turnkeeper/bare throughput": spreads["turnkeeper/bare throughput"].median,
        "turnkeeper/bare events": ratio(tk_.history_events or 0, bare.history_events or 0),
        "turnkeeper/in-process+store median": ratio(tk_.median_ms, results["in_process_store"].median_ms),
        "turnkeeper/in-process+store throughput": ratio(
            tk_.turns_per_s, results["in_process_store"].turns_per_s
        ),
        "turnkeeper/in-process median": ratio(tk_.median_ms, results["in_process"].median_ms),
    }
    if sandboxed is not None:
        ratios["turnkeeper sandbox on/off throughput"] = spreads[
            "turnkeeper sandbox on/off throughput"
        ].median
        ratios["turnkeeper sandbox on/off worker CPU"] = ratio(sandboxed.process_cpu_ms, tk_.process_cpu_ms)
    if fixed is not None:
        ratios["turnkeeper default/5 fixed pollers"] = spreads["turnkeeper default/5 fixed pollers"].median
        ratios["fixed pollers/bare throughput"] = paired_ratio(fixed, bare).median
    if agents is not None:
        ratios["turnkeeper/agents median"] = ratio(tk_.median_ms, agents.median_ms)
        ratios["turnkeeper/agents throughput"] = spreads["turnkeeper/agents throughput"].median
    if deployed is not None:
        print_deployed(deployed)
        spreads["turnkeeper/bare throughput, as deployed"] = PairedRatio.from_json(
            deployed["ratios"]["turnkeeper/bare throughput"]
        )
        ratios["turnkeeper/bare throughput, as deployed"] = spreads[
            "turnkeeper/bare throughput, as deployed"
        ].median
    print()
    print(
        "ratios (throughput: the median over the rounds of each round's ratio; after it the lowest-highest "
        "round, and where the median of such rounds lies with the chance given)"
    )
    for name, value in ratios.items():
        spread = f"   {spreads[name].describe()}" if name in spreads else ""
        print(f"  {name:<40}{value:>8.2f}x{spread}")

    bare_tp = spreads["turnkeeper/bare throughput"]
    # (goal, value, met, note): throughput goals are judged on the median round
    # ratio, and say whether the rounds could tell it from the goal at all.
    goals: list[tuple[str, str, bool, str]] = [
        ("median <= 250 ms", f"{tk_.median_ms:.1f} ms", tk_.median_ms <= GOAL_MEDIAN_MS, ""),
        (
            "median <= 1.25 x bare",
            f"{ratios['turnkeeper/bare median']:.2f} x",
            ratios["turnkeeper/bare median"] <= GOAL_MEDIAN_VS_BARE,
            "",
        ),
        (
            "throughput >= bare",
            f"{bare_tp.median:.2f} x",
            bare_tp.median >= GOAL_THROUGHPUT_VS_BARE,
            bare_tp.note(GOAL_THROUGHPUT_VS_BARE),
        ),
    ]
    if deployed is not None:
        deployed_tp = spreads["turnkeeper/bare throughput, as deployed"]
        goals.append(
            (
                "throughput >= bare, deployed",
                f"{deployed_tp.median:.2f} x",
                deployed_tp.median >= GOAL_THROUGHPUT_VS_BARE,
                deployed_tp.note(GOAL_THROUGHPUT_VS_BARE),
            )
        )
    if agents is not None:  # issue 4: at least as good as Temporal's own integration
        agents_tp = spreads["turnkeeper/agents throughput"]
        goals += [
            (
                "median <= agents",
                f"{ratios['turnkeeper/agents median']:.2f} x",
                ratios["turnkeeper/agents median"] <= 1.0,
                "",
            ),
            (
                "throughput >= agents",
                f"{agents_tp.median:.2f} x",
                agents_tp.median >= 1.0,
                agents_tp.note(1.0),
            ),
        ]
    print()
    print("goals (turnkeeper)")
    for goal, value, ok, note in goals:
        print(f"  {goal:<30}{value:>12}   {'PASS' if ok else 'MISS'}" + (f"   {note}" if note else ""))

    for key, (record, rows) in timelines.items():
        span = rows[-1]["at_ms"] if rows else 0.0
        print_timeline(
            f"timeline of one {results[key].label} turn near the median: {record.ms:.1f} ms at the "
            f"client, {span:.1f} ms from first to last history event (server clock)",
            rows,
        )

    return {
        "plan": asdict(plan),
        "dev_server": server.describe(),
        "warmup_turns": WARMUP_TURNS,
        "variants": {k: r.summary() for k, r in results.items()},
        "ratios": ratios,
        "goals": [{"goal": g, "value": v, "pass": ok, "note": note} for g, v, ok, note in goals],
        "throughput_round_ratios": {k: asdict(r) for k, r in spreads.items()},
        "timelines": {k: {"client_ms": rec.ms, "events": rows} for k, (rec, rows) in timelines.items()},
        "deployed": deployed,
        "history_bytes": "proto: serialized temporal.api.history.v1.History size; json: len(to_json())",
    }


# -- throughput as deployed ------------------------------------------------------------------


async def deployed_throughput(plan: Plan) -> dict[str, Any]:
    """process_throughput.py in a process of its own: each worker as it is deployed,
    on a fresh dev server with the embedded server's settings."""
    progress("throughput as deployed: bench/process_throughput.py")
    with tempfile.TemporaryDirectory(prefix="turnkeeper-deployed-") as tmp_name:
        out = Path(tmp_name) / "deployed.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(__file__).with_name("process_throughput.py")),
            "--rounds",
            str(plan.deployed_rounds),
            "--turns",
            str(plan.deployed_turns),
            "--json-out",
            str(out),
            stdout=asyncio.subprocess.PIPE,
        )  # its report is ours to print; its progress goes to stderr
        printed, _ = await proc.communicate()
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"process_throughput.py exited {proc.returncode}:\n{printed.decode()[-1500:]}")
        return json.loads(out.read_text())


def print_deployed(deployed: dict[str, Any]) -> None:
    print()
    rounds = deployed["rounds"]
    print(
        "throughput as deployed (bench/process_throughput.py): each worker a process of its own, "
        "turnkeeper's `python worker.py` against the bare loop's worker as a user runs it; "
        f"{rounds} round{'s' if rounds != 1 else ''} of {deployed['turns_per_round']} turns per variant, "
        f"{deployed['in_flight']} in flight; CPU ms per turn of the sending process, the worker and the "
        "dev server"
    )
    print(f"{'variant':<26}{'turns/s':>9}{'CPU ms/turn':>22}")
    for v in deployed["variants"].values():
        cpu = v["cpu_ms_per_turn"]
        parts = f"{cpu['driver']:.1f} + {cpu['worker']:.1f} + {cpu['server']:.1f}"
        print(f"{v['label']:<26}{v['turns_per_s']:>9.1f}{parts:>22}")


# -- main ------------------------------------------------------------------------------------


async def run(
    plan: Plan,
    setup: ServerSetup,
    as_json: bool,
    with_sandbox: bool,
    with_fixed_pollers: bool,
    with_deployed: bool,
) -> None:
    with tempfile.TemporaryDirectory(prefix="turnkeeper-bench-") as tmp_name:
        tmp = Path(tmp_name)
        progress("starting the Temporal dev server")
        async with dev_server(tmp, setup.dynamic_config, cli_defaults=setup.cli_defaults) as server:
            client = await Client.connect(server.address, data_converter=pydantic_data_converter)
            for sub in (
                "turnkeeper",
                "turnkeeper-sandbox",
                "turnkeeper-fixed",
                "bare",
                "agents",
                "inproc",
                "inproc-store",
            ):
                (tmp / sub).mkdir()
            variants: list[Variant] = [
                Turnkeeper(client, server.address, tmp / "turnkeeper"),
                *(
                    [
                        Turnkeeper(
                            client,
                            server.address,
                            tmp / "turnkeeper-sandbox",
                            key="turnkeeper_sandbox",
                            label="turnkeeper, sandbox on",
                            env=SANDBOX_ON,
                        )
                    ]
                    if with_sandbox
                    else []
                ),
                *(
                    [
                        Turnkeeper(
                            client,
                            server.address,
                            tmp / "turnkeeper-fixed",
                            key="turnkeeper_fixed_pollers",
                            label="turnkeeper, 5 fixed pollers",
                            env=FIXED_POLLERS,
                        )
                    ]
                    if with_fixed_pollers
                    else []
                ),
                Bare(client, tmp / "bare"),
                *([Agents(server.address, tmp / "agents")] if _agents_installed() else []),
                InProcess(tmp / "inproc", with_store=False),
                InProcess(tmp / "inproc-store", with_store=True),
            ]
            async with contextlib.AsyncExitStack() as stack:
                for v in variants:
                    await v.start()
                    stack.push_async_callback(v.close)
                results, turns = await measure(variants, plan, client, server)
                timelines = {
                    v.key: await median_timeline(client, turns[v.key]) for v in variants if v.temporal
                }
                progress("stopping workers and the dev server")
        deployed = await deployed_throughput(plan) if with_deployed else None
        summary = report(results, timelines, plan, setup, deployed)
    if as_json:
        print()
        print(json.dumps(summary, indent=2))


def _agents_installed() -> bool:
    try:
        import temporalio.openai_agents  # noqa: F401
    except ImportError:
        progress(
            "temporalio[openai-agents] is not installed: no OpenAI Agents comparison "
            "(pip install -e '.[bench]')"
        )
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"short run: {QUICK.sequential} sequential turns, {QUICK.throughput} for throughput",
    )
    parser.add_argument(
        "--fast-dispatch",
        action="store_true",
        help="start the dev server with "
        + ", ".join(f"{k}={v}" for k, v in FAST_DISPATCH.items())
        + " (no 50 ms workflow-task tick)",
    )
    parser.add_argument(
        "--sandbox-variant",
        action="store_true",
        help="also run turnkeeper with TURNKEEPER_WORKFLOW_SANDBOX=on, to show what the sandbox costs",
    )
    parser.add_argument(
        "--fixed-pollers-variant",
        action="store_true",
        help="also run turnkeeper with TURNKEEPER_POLLERS=5 (the SDK's fixed default), to show "
        "what the worker's own poller settings gain",
    )
    parser.add_argument(
        "--cli-server-defaults",
        action="store_true",
        help="start the dev server as `temporal server start-dev` would be by default, without "
        "the embedded server's SQLite pragmas and dynamic config (fsync then bounds throughput)",
    )
    parser.add_argument(
        "--no-deployed",
        action="store_true",
        help="skip the throughput of the workers as deployed (bench/process_throughput.py)",
    )
    parser.add_argument(
        "--deployed-rounds",
        type=int,
        metavar="N",
        help=f"rounds of the throughput as deployed (default {FULL.deployed_rounds}, "
        f"--quick {QUICK.deployed_rounds}); more rounds narrow its interval",
    )
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    if args.deployed_rounds is not None and args.deployed_rounds < 1:
        parser.error("--deployed-rounds must be at least 1")
    setup = ServerSetup(dict(FAST_DISPATCH) if args.fast_dispatch else {}, args.cli_server_defaults)
    # process_throughput.py runs its own server with the embedded settings only.
    with_deployed = not args.no_deployed and setup == ServerSetup({}, False)
    plan = QUICK if args.quick else FULL
    if args.deployed_rounds is not None:
        plan = replace(plan, deployed_rounds=args.deployed_rounds)
    run_and_exit(run(plan, setup, args.json, args.sandbox_variant, args.fixed_pollers_variant, with_deployed))


if __name__ == "__main__":
    main()
