"""Throughput with each worker in a process of its own, as they are deployed:
turnkeeper's `python worker.py` with its shipped defaults (uvloop, its poller
settings, workflow code outside the sandbox) against the bare loop of
bench/turn_latency.py run by bench/bare_worker.py as a user of the SDK would run
it (`asyncio.run`, the SDK's defaults). This process only sends the turns and
waits for their results, the same way for both.

    .venv/bin/python bench/process_throughput.py [--rounds 12] [--turns 150] [--asyncio-variant]

Rounds of `--turns` turns at 50 in flight alternate between the variants (in
reversed order every other round), on one dev server with the embedded
server's settings. `--asyncio-variant` adds turnkeeper's worker with
TURNKEEPER_EVENT_LOOP=asyncio, to show what uvloop gains. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench._common import ROOT, alternate_rounds, dev_server, progress, run_and_exit
from bench.turn_latency import (
    GOAL_THROUGHPUT_VS_BARE,
    SCRIPT,
    TURN_TIMEOUT_S,
    PairedRatio,
    bare_turn,
    cpu_seconds,
    ratio_of_rounds,
    turnkeeper_turn,
)
from turnkeeper.config import Settings

IN_FLIGHT = 50
WARMUP_TURNS = 5
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


@dataclass
class WorkerProcess(ABC):
    """One variant: its worker process, and how this process sends it a turn."""

    key: str
    label: str
    command: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    turns_per_s: list[float] = field(default_factory=list)
    cpu_ms: dict[str, list[float]] = field(default_factory=lambda: {"driver": [], "worker": [], "server": []})

    def spawn(self) -> None:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def check_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"the {self.label} worker exited:\n{self.log.read_text()[-1500:]}")

    @abstractmethod
    async def turn(self) -> None: ...


class TurnkeeperProcess(WorkerProcess):
    def __init__(
        self, client: Client, address: str, tmp: Path, key: str, label: str, env: dict[str, str] | None = None
    ) -> None:
        script = tmp / "script.json"
        script.write_text(json.dumps(SCRIPT))
        worker_env = {
            **os.environ,
            "TEMPORAL_ADDRESS": address,
            "TURNKEEPER_TASK_QUEUE": f"bench-{key}-{uuid.uuid4().hex[:8]}",
            "TURNKEEPER_DATA_DIR": str(tmp / "data"),
            "TURNKEEPER_WORKSPACE": str(tmp / "ws"),
            "TURNKEEPER_MODEL": f"scripted:{script}",
            "TURNKEEPER_LOG_LEVEL": "WARNING",
            **(env or {}),
        }
        super().__init__(
            key, label, [sys.executable, str(ROOT / "worker.py")], worker_env, tmp / "worker.log"
        )
        self.client = client
        self.settings = Settings.from_env(worker_env)

    async def turn(self) -> None:
        await turnkeeper_turn(self.client, self.settings)


class BareProcess(WorkerProcess):
    def __init__(self, client: Client, address: str, tmp: Path) -> None:
        self.task_queue = f"bench-bare-{uuid.uuid4().hex[:8]}"
        command = [
            sys.executable,
            str(ROOT / "bench" / "bare_worker.py"),
            address,
            self.task_queue,
            str(tmp / "ws"),
        ]
        super().__init__("bare", "bare Temporal loop", command, dict(os.environ), tmp / "worker.log")
        self.client = client

    async def turn(self) -> None:
        await bare_turn(self.client, self.task_queue)


async def burst(v: WorkerProcess, turns: int, server_pid: int) -> None:
    assert v.proc is not None
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> None:
        async with gate:
            await asyncio.wait_for(v.turn(), TURN_TIMEOUT_S)

    driver, worker, server = time.process_time(), cpu_seconds(v.proc.pid), cpu_seconds(server_pid)
    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(turns)))
    v.turns_per_s.append(turns / (time.perf_counter() - start))
    v.cpu_ms["driver"].append((time.process_time() - driver) * 1000 / turns)
    v.cpu_ms["worker"].append((cpu_seconds(v.proc.pid) - worker) * 1000 / turns)
    v.cpu_ms["server"].append((cpu_seconds(server_pid) - server) * 1000 / turns)
    v.check_running()


async def run(rounds: int, turns: int, with_asyncio: bool, json_out: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="tk-processes-") as tmp_name:
        tmp = Path(tmp_name)
        async with dev_server(tmp) as server:
            client = await Client.connect(server.address, data_converter=pydantic_data_converter)
            for sub in ("turnkeeper", "turnkeeper-asyncio", "bare"):
                (tmp / sub).mkdir()
            variants: list[WorkerProcess] = [
                TurnkeeperProcess(client, server.address, tmp / "turnkeeper", "turnkeeper", "turnkeeper"),
                *(
                    [
                        TurnkeeperProcess(
                            client,
                            server.address,
                            tmp / "turnkeeper-asyncio",
                            "turnkeeper_asyncio",
                            "turnkeeper, asyncio loop",
                            env={"TURNKEEPER_EVENT_LOOP": "asyncio"},
                        )
                    ]
                    if with_asyncio
                    else []
                ),
                BareProcess(client, server.address, tmp / "bare"),
            ]
            try:
                await spawn_and_warm(variants)
                await alternate_rounds(
                    variants,
                    warmup=WARMUP_TURNS,
                    rounds=rounds,
                    burst=lambda v: burst(v, turns, server.pid),
                    per_round=f"{turns} turns per variant, {IN_FLIGHT} in flight",
                )
            finally:
                for v in variants:
                    v.stop()
            summary = report({v.key: v for v in variants}, rounds, turns)
    if json_out is not None:
        json_out.write_text(json.dumps(summary, indent=2))


async def spawn_and_warm(variants: Sequence[WorkerProcess]) -> None:
    """Start every variant's worker process and wait until each has taken a turn."""
    for v in variants:
        v.spawn()
    progress("waiting for each worker to take a first turn")
    for v in variants:
        await asyncio.wait_for(v.turn(), READY_TIMEOUT_S)


def print_cpu_table(variants: Iterable[WorkerProcess], label_width: int) -> None:
    """Turns/s and CPU ms per turn (medians of the rounds) of this process, the worker, the server."""
    cpu = {v.key: {k: statistics.median(x) for k, x in v.cpu_ms.items()} for v in variants}
    print(f"{'variant':<{label_width}}{'turns/s':>9}{'this':>8}{'worker':>8}{'server':>8}{'total':>8}")
    for v in variants:
        c = cpu[v.key]
        print(
            f"{v.label:<{label_width}}{statistics.median(v.turns_per_s):>9.1f}{c['driver']:>8.1f}"
            f"{c['worker']:>8.1f}{c['server']:>8.1f}{sum(c.values()):>8.1f}"
        )


def report(variants: dict[str, WorkerProcess], rounds: int, turns: int) -> dict[str, Any]:
    print(
        f"\n{rounds} rounds of {turns} turns per variant, {IN_FLIGHT} in flight; each worker in its own "
        "process; CPU ms per turn (medians of the rounds) of this process (sending turns, awaiting "
        "results), the worker process and the dev server"
    )
    print_cpu_table(list(variants.values()), 26)
    cpu = {v.key: {k: statistics.median(x) for k, x in v.cpu_ms.items()} for v in variants.values()}

    tk_, bare = variants["turnkeeper"], variants["bare"]
    spreads: dict[str, PairedRatio] = {
        "turnkeeper/bare throughput": ratio_of_rounds(tk_.turns_per_s, bare.turns_per_s)
    }
    if "turnkeeper_asyncio" in variants:
        spreads["turnkeeper uvloop/asyncio throughput"] = ratio_of_rounds(
            tk_.turns_per_s, variants["turnkeeper_asyncio"].turns_per_s
        )
    print(
        "\nratios (the median over the rounds of each round's ratio; the lowest-highest round; where the "
        "median of such rounds lies with the chance given)"
    )
    for name, r in spreads.items():
        print(f"  {name:<40}{r.median:>8.2f}x   {r.describe()}")
    ours = spreads["turnkeeper/bare throughput"]
    print("\ngoal (turnkeeper)")
    print(
        f"  {'throughput >= bare':<26}{ours.median:>10.2f} x   "
        f"{'PASS' if ours.median >= GOAL_THROUGHPUT_VS_BARE else 'MISS'}   {ours.note(GOAL_THROUGHPUT_VS_BARE)}"
    )
    return {
        "rounds": rounds,
        "turns_per_round": turns,
        "in_flight": IN_FLIGHT,
        "variants": {
            v.key: {
                "label": v.label,
                "turns_per_s": statistics.median(v.turns_per_s),
                "round_turns_per_s": v.turns_per_s,
                "cpu_ms_per_turn": cpu[v.key],
            }
            for v in variants.values()
        },
        "ratios": {name: asdict(r) for name, r in spreads.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12, help="alternating rounds (default 12)")
    parser.add_argument("--turns", type=int, default=150, help="turns per variant per round (default 150)")
    parser.add_argument(
        "--asyncio-variant",
        action="store_true",
        help="also run turnkeeper's worker with TURNKEEPER_EVENT_LOOP=asyncio",
    )
    parser.add_argument("--json-out", type=Path, help="also write the results to this file as JSON")
    args = parser.parse_args()
    run_and_exit(run(args.rounds, args.turns, args.asyncio_variant, args.json_out))


if __name__ == "__main__":
    main()
