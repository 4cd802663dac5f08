"""Where the SQLite store's transactions run, measured on turnkeeper's own turns:

    .venv/bin/python bench/store_placement.py [--pairs 300]

  loop    as shipped: a transaction that can wait for nothing runs on the event
          loop; synced writes, busy locks and calls queued behind the store
          thread go to the thread (activities/store/sqlite.py)
  thread  every transaction on the store thread, as before

One real worker in this process on a dev server with the embedded server's
settings; one-tool turns back to back, the two placements taking turns (the
order reversed every other pair), so a slow spell of the machine meets both.
Prints each placement's median and p90 turn, the store calls per turn and the
milliseconds a turn spends waiting for them (the call's wall time, hops
included), and the difference in the median.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench._common import dev_server, median_interval, p90, progress, run_and_exit
from bench.turn_latency import Turnkeeper
from turnkeeper.activities.store.sqlite import SQLiteStore
from turnkeeper.worker import event_loop_factory

PLACEMENTS = ("loop", "thread")
WARMUP_TURNS = 20


class Placement:
    """Switches every SQLiteStore of this process between the two placements and
    times each transaction's call."""

    def __init__(self) -> None:
        self.current = "loop"
        self.calls: dict[str, list[float]] = {p: [] for p in PLACEMENTS}
        shipped = SQLiteStore._transaction
        placement = self

        async def transaction(store: SQLiteStore, write: bool, fn: Callable[..., Any]) -> Any:
            started = time.perf_counter()
            try:
                if placement.current == "loop":
                    return await shipped(store, write, fn)
                return await store._call(store._tx, write, fn)
            finally:
                placement.calls[placement.current].append((time.perf_counter() - started) * 1000)

        SQLiteStore._transaction = transaction  # type: ignore[method-assign]


async def main(pairs: int) -> None:
    placement = Placement()
    with tempfile.TemporaryDirectory(prefix="tk-store-placement-") as tmp_dir:
        tmp = Path(tmp_dir)
        progress("starting the dev server")
        async with dev_server(tmp, attempts=3) as server:
            client = await Client.connect(server.address, data_converter=pydantic_data_converter)
            (tmp / "tk").mkdir()
            variant = Turnkeeper(client, server.address, tmp / "tk")
            await variant.start()
            try:
                for _ in range(WARMUP_TURNS):
                    await variant.turn()
                for calls in placement.calls.values():
                    calls.clear()
                turns: dict[str, list[float]] = {p: [] for p in PLACEMENTS}
                progress(f"{pairs} pairs of back-to-back turns")
                for i in range(pairs):
                    for name in PLACEMENTS if i % 2 == 0 else PLACEMENTS[::-1]:
                        placement.current = name
                        started = time.perf_counter()
                        await variant.turn()
                        turns[name].append((time.perf_counter() - started) * 1000)
            finally:
                placement.current = "loop"
                await variant.close()

    print(f"{pairs} one-tool turns per placement, back to back, placements taking turns")
    print(f"{'placement':10} {'median ms':>10} {'p90 ms':>8} {'store calls/turn':>17} "
          f"{'store call median ms':>21} {'store ms/turn':>14}")
    for name in PLACEMENTS:
        calls = placement.calls[name]
        print(f"{name:10} {statistics.median(turns[name]):10.1f} {p90(turns[name]):8.1f} "
              f"{len(calls) / pairs:17.1f} {statistics.median(calls):21.3f} {sum(calls) / pairs:14.2f}")
    diffs = [t - l for l, t in zip(turns["loop"], turns["thread"])]
    low, high, chance = median_interval(diffs)
    print(f"thread - loop, pair by pair: median {statistics.median(diffs):+.2f} ms "
          f"(median within {low:+.2f} to {high:+.2f}, {chance:.0%})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=300)
    args = parser.parse_args()
    run_and_exit(main(args.pairs), loop_factory=event_loop_factory("auto"))
