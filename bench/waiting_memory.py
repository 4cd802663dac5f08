"""Worker memory while many chats wait for their user: a waiting turn must cost
the worker nothing once it is evicted from the workflow cache.

    .venv/bin/python bench/waiting_memory.py [--steps 100,500,1000]

One `python worker.py` process; each chat's first model call fails permanently
(scripted `{"error": ...}`), so every turn ends at a `model_failed` gate and
waits. After each step's chats are all waiting, the worker's resident memory
(VmRSS) is read from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench._common import ROOT, dev_server, progress, run_and_exit
from turnkeeper import client as tk
from turnkeeper.config import Settings

IN_FLIGHT = 50


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def waiting(client: Client, prefix: str) -> int:
    count = await client.count_workflows(f"TurnStatus='awaiting_user' AND ChatId STARTS_WITH '{prefix}'")
    return count.count


async def main(steps: list[int], extra_env: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory(prefix="tk-memory-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "script.json").write_text(json.dumps([{"error": "the provider refused (benchmark)"}]))
        async with dev_server(tmp) as server:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNKEEPER_", "TEMPORAL_"))}
            env.update(
                {
                    "TEMPORAL_ADDRESS": server.address,
                    "TURNKEEPER_TASK_QUEUE": "memory",
                    "TURNKEEPER_DATA_DIR": str(tmp / "data"),
                    "TURNKEEPER_WORKSPACE": str(tmp / "ws"),
                    "TURNKEEPER_MODEL": f"scripted:{tmp / 'script.json'}",
                    "TURNKEEPER_LOG_LEVEL": "WARNING",
                    "TURNKEEPER_RECONCILE_EVERY": "3600",
                    **extra_env,
                }
            )
            worker = subprocess.Popen(
                [sys.executable, "worker.py"],
                cwd=ROOT,
                env=env,
                stdout=open(tmp / "worker.log", "wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                client = await Client.connect(server.address, data_converter=pydantic_data_converter)
                settings = Settings.from_env(env)
                await asyncio.sleep(3)
                rows = [(0, rss_mib(worker.pid))]
                gate = asyncio.Semaphore(IN_FLIGHT)
                sent = 0

                async def one(i: int) -> None:
                    async with gate:
                        await tk.send_message(client, settings, f"mem-{i}", tk.new_message("hi", settings))

                for target in steps:
                    await asyncio.gather(*(one(i) for i in range(sent, target)))
                    sent = target
                    deadline = time.monotonic() + 600
                    while await waiting(client, "mem-") < target:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"only {await waiting(client, 'mem-')} of {target} waiting")
                        await asyncio.sleep(0.5)
                    await asyncio.sleep(2)
                    rows.append((target, rss_mib(worker.pid)))
                    progress(f"{target} chats waiting: worker RSS {rows[-1][1]:.1f} MiB")
            finally:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=60)
    print("one worker process; chats waiting for their user at a model_failed gate")
    print(f"{'waiting':>8} {'RSS MiB':>9}")
    for n, mib in rows:
        print(f"{n:>8} {mib:>9.1f}")
    # Past the workflow cache (TURNKEEPER_MAX_CACHED_WORKFLOWS) memory must stay flat.
    (n0, m0), (n1, m1) = rows[-2], rows[-1]
    print(
        f"from {n0} to {n1} waiting: {m1 - m0:+.1f} MiB ({(m1 - m0) * 1024 / max(1, n1 - n0):.1f} KiB "
        "per further waiting chat)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="100,500,1000")
    parser.add_argument("--env", action="append", default=[], help="extra worker env, NAME=VALUE")
    args = parser.parse_args()
    run_and_exit(main([int(s) for s in args.steps.split(",")], dict(kv.split("=", 1) for kv in args.env)))
