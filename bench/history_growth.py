"""Workflow-history size per turn as a chat grows: the transcript lives in the
store, so a turn's history must not grow with the chat's length.

    .venv/bin/python bench/history_growth.py [--turns 200]

One chat, N sequential one-tool turns (model -> write_file -> model) on the real
worker with the scripted model; prints events and bytes of the run of turn 1,
10, 100, ... and the last, and the ratio last/first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench._common import dev_server, progress, run_and_exit
from turnkeeper import client as tk
from turnkeeper.config import Settings
from turnkeeper.worker.main import run_worker


async def main(turns: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tk-growth-") as tmp_name:
        tmp = Path(tmp_name)
        script = []
        for _ in range(turns):
            script += [
                {
                    "tool_calls": [
                        {"name": "write_file", "arguments": {"path": "f.txt", "content": "x" * 200}}
                    ]
                },
                {"text": "done " + "y" * 200},
            ]
        (tmp / "script.json").write_text(json.dumps(script))
        async with dev_server(tmp) as server:
            client = await Client.connect(server.address, data_converter=pydantic_data_converter)
            settings = Settings.from_env(
                {
                    "TEMPORAL_ADDRESS": server.address,
                    "TURNKEEPER_TASK_QUEUE": "growth",
                    "TURNKEEPER_DATA_DIR": str(tmp / "data"),
                    "TURNKEEPER_WORKSPACE": str(tmp / "ws"),
                    "TURNKEEPER_MODEL": f"scripted:{tmp / 'script.json'}",
                }
            )
            stop = asyncio.Event()
            worker = asyncio.create_task(run_worker(settings, client=client, stop=stop))
            await asyncio.sleep(0.5)
            sizes: dict[int, tuple[int, int]] = {}
            marks = sorted({1, 10, 100, 1000, turns} & set(range(1, turns + 1)))
            try:
                for n in range(1, turns + 1):
                    handle = await tk.send_message(
                        client, settings, "growth", tk.new_message(f"turn {n} " + "z" * 200, settings)
                    )
                    await handle.result()
                    if n in marks:
                        history = await client.get_workflow_handle(
                            handle.id, run_id=handle.result_run_id
                        ).fetch_history()
                        sizes[n] = (len(history.events), len(history.to_json()))
                        progress(f"turn {n}: {sizes[n][0]} events, {sizes[n][1]:,} JSON bytes")
            finally:
                stop.set()
                await worker
    print(f"one chat, {turns} sequential one-tool turns; history of the run of turn n")
    print(f"{'turn':>6} {'events':>8} {'JSON bytes':>12}")
    for n, (events, size) in sizes.items():
        print(f"{n:>6} {events:>8} {size:>12,}")
    first, last = sizes[marks[0]], sizes[marks[-1]]
    print(
        f"last/first: events {last[0] / first[0]:.2f}x, bytes {last[1] / first[1]:.2f}x "
        f"({'flat' if last[1] <= first[1] * 1.05 else 'GROWS'})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    run_and_exit(main(parser.parse_args().turns))
