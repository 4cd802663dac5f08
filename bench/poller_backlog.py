"""How many tasks go through the task queue's backlog per turn, by poller setting:

    .venv/bin/python bench/poller_backlog.py [--pollers auto,5] [--rounds 2] [--turns 300]

A workflow or activity task that finds no poll waiting is written to the task
queue's backlog and read back later: server work a waiting poll saves. The dev
server here runs with `--metrics-port`; its `persistence_requests` counter for
`CreateTasks`, and its count of workflow tasks written to a sticky queue's
backlog and to the shared queue's, are read before and after each burst of
`--turns` turns at 50 in flight. Every setting of `TURNKEEPER_POLLERS` gets its
own real worker and task queue on the one server; bursts alternate between
them. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import tempfile
import time
import urllib.request
from dataclasses import astuple, dataclass
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from bench._common import alternate_rounds, dev_server, free_port, run_and_exit
from bench.turn_latency import Turnkeeper, cpu_seconds
from turnkeeper import client as tk
from turnkeeper.config import Settings

IN_FLIGHT = 50
WARMUP_TURNS = 5


@dataclass(frozen=True)
class Backlog:
    """Counters of the server's, so far: `CreateTasks` persistence requests (one
    may write several tasks), and workflow tasks written to the backlog of a
    sticky queue and of the shared queue's partitions."""

    create_tasks: float = 0.0
    sticky: float = 0.0
    shared: float = 0.0

    def per_turn(self, before: Backlog, turns: int) -> Backlog:
        return Backlog(*((a - b) / turns for a, b in zip(astuple(self), astuple(before), strict=False)))


async def backlog(metrics_port: int) -> Backlog:
    return await asyncio.to_thread(_backlog, metrics_port)


def _backlog(metrics_port: int) -> Backlog:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    create = sticky = shared = 0.0
    for line in text.splitlines():
        m = re.match(r"(\w+)\{(.*)\} (\S+)$", line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2), float(m.group(3))
        if name == "persistence_requests" and 'operation="CreateTasks"' in labels:
            create += value
        elif name == "task_write_latency_count" and 'task_type="Workflow"' in labels:
            if 'partition="__sticky__"' in labels:
                sticky += value
            else:
                shared += value
    return Backlog(create, sticky, shared)


async def run(pollers: list[str], rounds: int, turns: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tk-pollers-") as tmp_name:
        tmp = Path(tmp_name)
        metrics_port = free_port()
        async with dev_server(tmp, metrics_port=metrics_port) as server:
            client = await tk.connect(Settings.from_env({"TEMPORAL_ADDRESS": server.address}))
            variants = []
            for setting in pollers:
                (tmp / setting).mkdir()
                variants.append(
                    Turnkeeper(
                        client,
                        server.address,
                        tmp / setting,
                        key=setting,
                        label=f"TURNKEEPER_POLLERS={setting}",
                        env={"TURNKEEPER_POLLERS": setting},
                    )
                )
            results: dict[str, list[tuple[float, Backlog, float]]] = {v.key: [] for v in variants}
            async with contextlib.AsyncExitStack() as stack:
                for v in variants:
                    await v.start()
                    stack.push_async_callback(v.close)

                async def measure(v: Turnkeeper) -> None:
                    results[v.key].append(await burst(v, turns, metrics_port, server.pid))

                await alternate_rounds(
                    variants,
                    warmup=WARMUP_TURNS,
                    rounds=rounds,
                    burst=measure,
                    per_round=f"{turns} turns per setting, {IN_FLIGHT} in flight",
                )
    print(f"\nper turn, {turns} turns per burst at {IN_FLIGHT} in flight; one line per burst")
    print(
        "(CreateTasks: the server's backlog write requests; sticky and shared: workflow tasks written "
        "to the backlog of a sticky queue and of the shared queue)"
    )
    print(
        f"{'TURNKEEPER_POLLERS':<20}{'turns/s':>9}{'CreateTasks':>13}{'sticky':>8}{'shared':>8}{'server CPU ms':>15}"
    )
    for key, rows in results.items():
        for tps, b, server_ms in rows:
            print(
                f"{key:<20}{tps:>9.1f}{b.create_tasks:>13.2f}{b.sticky:>8.2f}{b.shared:>8.2f}{server_ms:>15.1f}"
            )


async def burst(
    v: Turnkeeper, turns: int, metrics_port: int, server_pid: int
) -> tuple[float, Backlog, float]:
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> None:
        async with gate:
            await v.turn()

    before, cpu_before, start = await backlog(metrics_port), cpu_seconds(server_pid), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(turns)))
    elapsed = time.perf_counter() - start
    return (
        turns / elapsed,
        (await backlog(metrics_port)).per_turn(before, turns),
        (cpu_seconds(server_pid) - cpu_before) * 1000 / turns,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pollers", default="auto,5", help="comma-separated TURNKEEPER_POLLERS settings (default auto,5)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--turns", type=int, default=300, help="turns per setting per round")
    args = parser.parse_args()
    run_and_exit(run([p.strip() for p in args.pollers.split(",") if p.strip()], args.rounds, args.turns))


if __name__ == "__main__":
    main()
