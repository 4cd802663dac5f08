"""Tools that ask first: what a waiting approval costs the worker, and how soon
an approved tool starts.

    .venv/bin/python bench/approval_wait.py [--steps 250,500,1000] [--approve 200]

One `python worker.py` process (TURNKEEPER_MAX_CACHED_WORKFLOWS left at its
default, 200) and the scripted model: each chat's first model call asks for
`ledger_confirm` (tests/chaos/tools.py, registered `confirm=True`), so each turn
waits at an approval gate (`approval_required`). After each step's chats all
wait: the worker's resident memory (VmRSS, /proc), and how long a fresh chat's
turn takes beside them to reach its own gate (a waiting approval holds no worker
slot: the worker runs at most 100 activities and 100 workflow tasks at a time,
far fewer than the chats waiting).
Then `--approve` of the waiting chats, oldest first (so mostly evicted from
the workflow cache: the worker replays each), one at a time: the time from the
Approve (`turnkeeper.client.decide`: the `continue` signal) to the tool's own first line in its
ledger (`start ... t=<unix time>`), median and p90.
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
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench._common import ROOT, dev_server, p90, progress, run_and_exit
from turnkeeper import client as tk
from turnkeeper.config import Settings
from turnkeeper.models import TurnState

IN_FLIGHT = 50
PREFIX = "ask-"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def waiting(client: Client) -> int:
    query = (
        f"TurnStatus='awaiting_user' AND RecoveryReason='approval_required' AND ChatId STARTS_WITH '{PREFIX}'"
    )
    return (await client.count_workflows(query)).count


def ledger_starts(path: Path) -> dict[str, float]:
    """Tool call key -> when the tool started (its own clock, this host's)."""
    out: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "start":
                fields = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
                out[parts[1]] = float(fields["t"])
    return out


async def main(steps: list[int], approve: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tk-approval-") as tmp_name:
        tmp = Path(tmp_name)
        ledger = tmp / "ledger.txt"
        (tmp / "script.json").write_text(
            json.dumps(
                [
                    {
                        "tool_calls": [
                            {"name": "ledger_confirm", "arguments": {"note": "approved", "seconds": 0}}
                        ]
                    },
                    {"text": "done"},
                ]
            )
        )
        async with dev_server(tmp) as server:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNKEEPER_", "TEMPORAL_"))}
            env.update(
                {
                    "TEMPORAL_ADDRESS": server.address,
                    "TURNKEEPER_TASK_QUEUE": "approval",
                    "TURNKEEPER_DATA_DIR": str(tmp / "data"),
                    "TURNKEEPER_WORKSPACE": str(tmp / "ws"),
                    "TURNKEEPER_MODEL": f"scripted:{tmp / 'script.json'}",
                    "TURNKEEPER_TOOL_MODULES": "tests.chaos.tools",
                    "TURNKEEPER_TOOLS": "ledger_write,ledger_confirm",
                    "CHAOS_LEDGER": str(ledger),
                    "TURNKEEPER_LOG_LEVEL": "WARNING",
                    "TURNKEEPER_RECONCILE_EVERY": "3600",
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
            rows: list[tuple[int, float, float]] = []
            latencies: list[float] = []
            try:
                client = await Client.connect(server.address, data_converter=pydantic_data_converter)
                settings = Settings.from_env(env)
                await asyncio.sleep(3)
                gate = asyncio.Semaphore(IN_FLIGHT)

                async def ask(i: int) -> None:
                    async with gate:
                        await tk.send_message(
                            client, settings, f"{PREFIX}{i}", tk.new_message("write", settings)
                        )

                async def beside() -> float:
                    """A fresh chat's turn to its own gate: a model call while the others wait."""
                    chat = f"beside-{time.monotonic_ns()}"
                    started = time.perf_counter()
                    handle = await tk.send_message(client, settings, chat, tk.new_message("hi", settings))
                    state = await handle.query("state", result_type=TurnState)
                    while state.status.value not in ("awaiting_user", "completed"):
                        await asyncio.sleep(0.02)
                        state = await handle.query("state", result_type=TurnState)
                    return (time.perf_counter() - started) * 1000

                rows.append((0, rss_mib(worker.pid), await beside()))
                sent = 0
                for target in steps:
                    await asyncio.gather(*(ask(i) for i in range(sent, target)))
                    sent = target
                    deadline = time.monotonic() + 900
                    while await waiting(client) < target:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"only {await waiting(client)} of {target} waiting")
                        await asyncio.sleep(0.5)
                    await asyncio.sleep(2)
                    rows.append((target, rss_mib(worker.pid), await beside()))
                    progress(
                        f"{target} approvals waiting: worker RSS {rows[-1][1]:.1f} MiB, "
                        f"a turn beside them reached its gate in {rows[-1][2]:.0f} ms"
                    )
                for i in range(min(approve, sent)):
                    chat = f"{PREFIX}{i}"
                    state = await client.get_workflow_handle(tk.workflow_id(chat)).query(
                        "state", result_type=TurnState
                    )
                    assert state.reason is not None and state.reason.value == "approval_required", state
                    key = state.approvals[0].idempotency_key
                    approved_at = time.time()
                    await tk.decide(client, chat, "continue", state.recovery_id)
                    deadline = time.monotonic() + 30
                    while key not in (starts := ledger_starts(ledger)):
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"{chat}: the approved tool did not start")
                        await asyncio.sleep(0.005)
                    latencies.append((starts[key] - approved_at) * 1000)
                progress(f"approved {len(latencies)}")
                rows.append((sent - len(latencies), rss_mib(worker.pid), await beside()))
            finally:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=60)
    print("one worker process (workflow cache 200); chats waiting at an approval gate")
    print(f"{'waiting':>8} {'worker RSS MiB':>15} {'a turn beside them, ms':>23}")
    for n, mib, ms in rows:
        print(f"{n:>8} {mib:>15.1f} {ms:>23.0f}")
    if len(rows) >= 3:
        (n0, m0, _), (n1, m1, _) = rows[-3], rows[-2]
        print(
            f"from {n0} to {n1} waiting: {m1 - m0:+.1f} MiB ({(m1 - m0) * 1024 / max(1, n1 - n0):.1f} KiB per "
            "further waiting chat)"
        )
    if latencies:
        print(
            f"Approve -> the tool starts: median {statistics.median(latencies):.1f} ms, "
            f"p90 {p90(latencies):.1f} ms, max {max(latencies):.1f} ms over {len(latencies)} approvals "
            "(one at a time, oldest first)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="250,500,1000")
    parser.add_argument("--approve", type=int, default=200)
    args = parser.parse_args()
    run_and_exit(main([int(s) for s in args.steps.split(",")], args.approve))
