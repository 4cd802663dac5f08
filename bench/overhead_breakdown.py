"""What each of turnkeeper's contract extras costs in throughput, or in a lone
turn's latency, measured one at a time on the bare loop of bench/turn_latency.py:

    .venv/bin/python bench/overhead_breakdown.py [--rounds 4] [--turns 150]
    .venv/bin/python bench/overhead_breakdown.py --latency [--blocks 30]

  plain              the bare loop (three activities), workflow code outside the sandbox
  search attributes  the same, started with ChatId and TurnStatus set
  signal-with-start  started by signal-with-start of `user_message`
  local activity     a local activity in the first workflow task
  patch marker       a patch asked in the first workflow task (a marker, and the
                     server's TemporalChangeVersion search attribute)
  turnkeeper         the real worker, all of these plus the session store

Every variant's workflows run on one in-process worker outside the sandbox (as
turnkeeper's do), on one dev server started with the embedded server's
settings. Rounds of `--turns` turns at 50 in flight alternate between the
variants; each ratio is the median of the per-round ratios to `plain`, with the
lowest and highest round after it.

`--latency` runs turns one at a time instead: blocks of `BLOCK_TURNS` back to
back per variant (the first of each unmeasured), blocks interleaved and their
order reversed every other time, and prints each variant's median and p90
against `plain`. It also prints how long each activity's own code took (an
interceptor's wall clock around it, local activities included): what of a
turn is the store's work rather than Temporal's. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

import temporalio.client
import temporalio.worker
from temporalio import activity
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench._common import alternate_rounds, dev_server, p90, progress, run_and_exit
from bench.breakdown_loops import NOOP, Plain, Signalled, WithLocalActivity, WithPatch
from bench.turn_latency import BareActivities, Steps, Turnkeeper, cpu_seconds
from turnkeeper.search_attributes import CHAT_ID_ATTR, TURN_STATUS_ATTR
from turnkeeper.worker.main import STICKY_SCHEDULE_TO_START, event_loop_factory

IN_FLIGHT = 50
WARMUP_TURNS = 5
# --latency: turns per block, back to back; the first warms the variant's path up.
BLOCK_TURNS = 4


@activity.defn(name=NOOP)
async def noop(turn_id: str) -> str:
    return turn_id


@dataclass
class Variant:
    label: str
    turn: Callable[[], Awaitable[None]]
    turns_per_s: list[float] = field(default_factory=list)
    process_cpu_ms: list[float] = field(default_factory=list)
    server_cpu_ms: list[float] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)


class ActivityWall(temporalio.client.Interceptor, temporalio.worker.Interceptor):
    """The wall time of each activity's own code, by activity type: a client
    interceptor that is also a worker interceptor reaches every worker built on
    the client, local activities included."""

    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = defaultdict(list)

    def intercept_activity(
        self, next: temporalio.worker.ActivityInboundInterceptor
    ) -> temporalio.worker.ActivityInboundInterceptor:
        return _TimedActivity(next, self)


class _TimedActivity(temporalio.worker.ActivityInboundInterceptor):
    def __init__(self, next: temporalio.worker.ActivityInboundInterceptor, wall: ActivityWall) -> None:
        super().__init__(next)
        self._wall = wall

    async def execute_activity(self, input: temporalio.worker.ExecuteActivityInput) -> Any:
        started = time.perf_counter()
        try:
            return await self.next.execute_activity(input)
        finally:
            info = activity.info()
            name = info.activity_type + (" (local)" if info.is_local else "")
            self._wall.ms[name].append((time.perf_counter() - started) * 1000)


async def run(rounds: int, turns: int, latency_blocks: int | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="tk-breakdown-") as tmp_name:
        tmp = Path(tmp_name)
        async with dev_server(tmp) as server:
            wall = ActivityWall()
            client = await Client.connect(
                server.address, data_converter=pydantic_data_converter, interceptors=[wall]
            )
            task_queue = f"breakdown-{uuid.uuid4().hex[:8]}"
            acts = BareActivities(Steps(tmp / "ws"))
            worker = Worker(
                client,
                task_queue=task_queue,
                workflows=[Plain, Signalled, WithLocalActivity, WithPatch],
                activities=[acts.model, acts.tool, noop],
                workflow_runner=UnsandboxedWorkflowRunner(),
                sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
            )
            turnkeeper = Turnkeeper(client, server.address, tmp)

            async def bare(workflow: str, **options: object) -> None:
                turn_id = uuid.uuid4().hex
                text = await client.execute_workflow(
                    workflow,
                    turn_id,
                    id=f"breakdown-{turn_id}",
                    task_queue=task_queue,
                    result_type=str,
                    **options,
                )
                if text != "done":
                    raise RuntimeError(f"{workflow} answered {text!r}")

            async def plain() -> None:
                await bare("BreakdownPlain")

            async def with_search_attributes() -> None:
                key = uuid.uuid4().hex
                await bare(
                    "BreakdownPlain",
                    search_attributes=TypedSearchAttributes(
                        [
                            SearchAttributePair(CHAT_ID_ATTR, key),
                            SearchAttributePair(TURN_STATUS_ATTR, "running"),
                        ]
                    ),
                )

            async def signal_with_start() -> None:
                turn_id = uuid.uuid4().hex
                handle = await client.start_workflow(
                    "BreakdownSignalled",
                    turn_id,
                    id=f"breakdown-{turn_id}",
                    task_queue=task_queue,
                    start_signal="user_message",
                    start_signal_args=[{"text": "write the file"}],
                    result_type=str,
                )
                if await handle.result() != "done":
                    raise RuntimeError("signalled loop did not answer 'done'")

            async def local_activity() -> None:
                await bare("BreakdownLocalActivity")

            async def patch() -> None:
                await bare("BreakdownPatched")

            async def real_turn() -> None:
                await turnkeeper.turn()

            variants = [
                Variant("plain", plain),
                Variant("search attributes", with_search_attributes),
                Variant("signal-with-start", signal_with_start),
                Variant("local activity", local_activity),
                Variant("patch marker", patch),
                Variant("turnkeeper", real_turn),
            ]

            async with worker:
                await turnkeeper.start()
                try:
                    if latency_blocks is not None:
                        await one_at_a_time(variants, latency_blocks, wall)
                    else:
                        await alternate_rounds(
                            variants,
                            warmup=WARMUP_TURNS,
                            rounds=rounds,
                            burst=lambda v: burst(v, turns, server.pid),
                            per_round=f"{turns} turns per variant, {IN_FLIGHT} in flight",
                        )
                finally:
                    await turnkeeper.close()
            if latency_blocks is not None:
                report_latency(variants, latency_blocks, wall)
            else:
                report(variants, rounds, turns)


async def one_at_a_time(variants: list[Variant], blocks: int, wall: ActivityWall) -> None:
    progress(f"warm-up: {WARMUP_TURNS} turns per variant")
    for v in variants:
        for _ in range(WARMUP_TURNS):
            await v.turn()
    wall.ms.clear()
    progress(f"{blocks} blocks of {BLOCK_TURNS} turns per variant, one turn at a time")
    for i in range(blocks):
        for v in variants if i % 2 == 0 else variants[::-1]:
            for j in range(BLOCK_TURNS):
                started = time.perf_counter()
                await v.turn()
                if j:
                    v.latencies_ms.append((time.perf_counter() - started) * 1000)


def report_latency(variants: list[Variant], blocks: int, wall: ActivityWall) -> None:
    base = statistics.median(variants[0].latencies_ms)
    print(
        f"\none turn at a time: {blocks} blocks of {BLOCK_TURNS - 1} measured turns per variant, interleaved"
    )
    print(f"{'variant':<20} {'median ms':>10} {'p90 ms':>8} {'vs plain':>9} {'+ ms':>7}")
    for v in variants:
        median = statistics.median(v.latencies_ms)
        print(
            f"{v.label:<20} {median:>10.1f} {p90(v.latencies_ms):>8.1f} {median / base:>8.2f}x "
            f"{median - base:>+7.1f}"
        )
    print("\neach activity's own code, ms (median, p90; an interceptor's wall clock around it)")
    for name, ms in sorted(wall.ms.items()):
        if len(ms) < blocks:
            continue  # not a turn's: the reconciler's pass, run by its schedule meanwhile
        print(f"  {name:<34} {statistics.median(ms):>6.2f} {p90(ms):>6.2f}   ({len(ms)} calls)")


async def burst(v: Variant, turns: int, server_pid: int) -> None:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> None:
        async with gate:
            await v.turn()

    server_before, process_before, start = cpu_seconds(server_pid), time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(turns)))
    v.turns_per_s.append(turns / (time.perf_counter() - start))
    v.process_cpu_ms.append((time.process_time() - process_before) * 1000 / turns)
    v.server_cpu_ms.append((cpu_seconds(server_pid) - server_before) * 1000 / turns)


def report(variants: list[Variant], rounds: int, turns: int) -> None:
    base = variants[0]
    print(
        f"\n{rounds} rounds of {turns} turns per variant, {IN_FLIGHT} in flight; CPU = this process "
        "(client and workers) + dev server"
    )
    print(f"{'variant':<20} {'turns/s':>8} {'vs plain (rounds)':>22} {'process ms':>11} {'server ms':>10}")
    for v in variants:
        ratios = [a / b for a, b in zip(v.turns_per_s, base.turns_per_s, strict=False)]
        spread = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        print(
            f"{v.label:<20} {statistics.median(v.turns_per_s):>8.1f} {spread:>22} "
            f"{statistics.median(v.process_cpu_ms):>11.1f} {statistics.median(v.server_cpu_ms):>10.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--turns", type=int, default=150, help="turns per variant per round")
    parser.add_argument("--latency", action="store_true", help="one turn at a time: latency, not throughput")
    parser.add_argument("--blocks", type=int, default=30, help="--latency: blocks per variant")
    args = parser.parse_args()
    # The worker's own event loop (uvloop), as `python worker.py` runs it.
    run_and_exit(
        run(args.rounds, args.turns, args.blocks if args.latency else None),
        loop_factory=event_loop_factory("auto"),
    )


if __name__ == "__main__":
    main()
