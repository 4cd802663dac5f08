"""The bare loop's worker in a process of its own, as a user of the SDK would run
it: `asyncio.run`, the SDK's default worker settings, the sandbox on. Started by
bench/process_throughput.py; stops on SIGTERM.

    .venv/bin/python bench/bare_worker.py ADDRESS TASK_QUEUE WORKSPACE
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from bench._common import run_and_exit
from bench.bare_loop import BareTurn
from bench.turn_latency import BareActivities, Steps
from turnkeeper.worker.main import STICKY_SCHEDULE_TO_START


async def serve(address: str, task_queue: str, workspace: Path) -> None:
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    acts = BareActivities(Steps(workspace))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[BareTurn],
        activities=[acts.model, acts.tool],
        sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
    ):
        await stop.wait()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    run_and_exit(serve(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
