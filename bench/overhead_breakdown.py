"""What each of turnkeeper's contract extras costs in throughput, measured one at
a time on the bare loop of bench/turn_latency.py:

    .venv/bin/python bench/overhead_breakdown.py [--rounds 4] [--turns 150]

  plain              the bare loop (three activities), workflow code outside the sandbox
  search attributes  the same, started with ChatId and TurnStatus set
  signal-with-start  started by signal-with-start of `user_message`
  local activity     a local activity in the first workflow task
  turnkeeper         the real worker, all of these plus the session store

Every variant's workflows run on one in-process worker outside the sandbox (as
turnkeeper's do), on one dev server started with the embedded server's
settings. Rounds of `--turns` turns at 50 in flight alternate between the
variants; each ratio is the median of the per-round ratios to `plain`, with the
lowest and highest round after it. See bench/README.md.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio import activity
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench._common import alternate_rounds, dev_server, run_and_exit
from bench.breakdown_loops import NOOP, Plain, Signalled, WithLocalActivity
from bench.turn_latency import BareActivities, Steps, Turnkeeper, cpu_seconds
from turnkeeper.search_attributes import CHAT_ID_ATTR, TURN_STATUS_ATTR
from turnkeeper.worker import STICKY_SCHEDULE_TO_START

IN_FLIGHT = 50
WARMUP_TURNS = 5


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


async def run(rounds: int, turns: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tk-breakdown-") as tmp_name:
        tmp = Path(tmp_name)
        async with dev_server(tmp) as server:
            client = await Client.connect(server.address, data_converter=pydantic_data_converter)
            task_queue = f"breakdown-{uuid.uuid4().hex[:8]}"
            acts = BareActivities(Steps(tmp / "ws"))
            worker = Worker(client, task_queue=task_queue, workflows=[Plain, Signalled, WithLocalActivity],
                            activities=[acts.model, acts.tool, noop], workflow_runner=UnsandboxedWorkflowRunner(),
                            sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START)
            turnkeeper = Turnkeeper(client, server.address, tmp)

            async def bare(workflow: str, **options: object) -> None:
                turn_id = uuid.uuid4().hex
                text = await client.execute_workflow(workflow, turn_id, id=f"breakdown-{turn_id}",
                                                     task_queue=task_queue, result_type=str, **options)
                if text != "done":
                    raise RuntimeError(f"{workflow} answered {text!r}")

            async def plain() -> None:
                await bare("BreakdownPlain")

            async def with_search_attributes() -> None:
                key = uuid.uuid4().hex
                await bare("BreakdownPlain", search_attributes=TypedSearchAttributes([
                    SearchAttributePair(CHAT_ID_ATTR, key), SearchAttributePair(TURN_STATUS_ATTR, "running")]))

            async def signal_with_start() -> None:
                turn_id = uuid.uuid4().hex
                handle = await client.start_workflow(
                    "BreakdownSignalled", turn_id, id=f"breakdown-{turn_id}", task_queue=task_queue,
                    start_signal="user_message", start_signal_args=[{"text": "write the file"}], result_type=str)
                if await handle.result() != "done":
                    raise RuntimeError("signalled loop did not answer 'done'")

            async def local_activity() -> None:
                await bare("BreakdownLocalActivity")

            async def real_turn() -> None:
                await turnkeeper.turn()

            variants = [Variant("plain", plain), Variant("search attributes", with_search_attributes),
                        Variant("signal-with-start", signal_with_start), Variant("local activity", local_activity),
                        Variant("turnkeeper", real_turn)]
            async with worker:
                await turnkeeper.start()
                try:
                    await alternate_rounds(variants, warmup=WARMUP_TURNS, rounds=rounds,
                                           burst=lambda v: burst(v, turns, server.pid),
                                           per_round=f"{turns} turns per variant, {IN_FLIGHT} in flight")
                finally:
                    await turnkeeper.close()
            report(variants, rounds, turns)


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
    print(f"\n{rounds} rounds of {turns} turns per variant, {IN_FLIGHT} in flight; CPU = this process "
          "(client and workers) + dev server")
    print(f"{'variant':<20} {'turns/s':>8} {'vs plain (rounds)':>22} {'process ms':>11} {'server ms':>10}")
    for v in variants:
        ratios = [a / b for a, b in zip(v.turns_per_s, base.turns_per_s)]
        spread = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        print(f"{v.label:<20} {statistics.median(v.turns_per_s):>8.1f} {spread:>22} "
              f"{statistics.median(v.process_cpu_ms):>11.1f} {statistics.median(v.server_cpu_ms):>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--turns", type=int, default=150, help="turns per variant per round")
    args = parser.parse_args()
    run_and_exit(run(args.rounds, args.turns))


if __name__ == "__main__":
    main()
