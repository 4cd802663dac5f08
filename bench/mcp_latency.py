"""The latency an MCP tool adds to a turn, over a built-in tool on the same turn shape.

    .venv/bin/python bench/mcp_latency.py [--turns N] [--json]

Two real workers (`run_worker`, in this process) on one dev server, each with the
scripted model and the turn model call -> one tool call -> model call (final text):

  built-in   `read_file` of a small file in the workspace
  mcp        `time__get_current_time` from `mcp-server-time` over stdio (its
             process started once, at the worker's start)

Both tools are `read` and do almost nothing, so the difference is what the MCP
path costs: the JSON schema check, the request over the server's pipe, its answer
and rendering. Turns alternate between the two. Reported: each variant's median
and p90 turn latency, and its tool step alone (the tool activity's start to its
completion, server clock), and the medians' differences.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench._common import dev_server, event_s, p90, progress, run_and_exit
from turnkeeper import activity_io
from turnkeeper import client as tk
from turnkeeper.config import Settings
from turnkeeper.models import TurnStatus
from turnkeeper.worker.main import run_worker

TIME_SERVER = str(Path(sys.executable).parent / "mcp-server-time")
VARIANTS = {
    "built-in": {"name": "read_file", "arguments": {"path": "f.txt"}},
    "mcp": {"name": "time__get_current_time", "arguments": {"timezone": "Etc/UTC"}},
}
WARMUP_TURNS = 5
SCHEDULED = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
STARTED = EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
COMPLETED = EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
TOOL_CALL = activity_io.TOOL_CALL


class Variant:
    def __init__(self, key: str, client: Client, address: str, tmp: Path) -> None:
        self.key = key
        root = tmp / key
        (root / "ws").mkdir(parents=True)
        (root / "ws" / "f.txt").write_text("x")
        script = root / "script.json"
        script.write_text(json.dumps([{"tool_calls": [VARIANTS[key]]}, {"text": "done"}]))
        servers = root / "mcp.json"
        servers.write_text(json.dumps({"mcpServers": {"time": {"command": TIME_SERVER}}}))
        env = {
            "TEMPORAL_ADDRESS": address,
            "TURNKEEPER_TASK_QUEUE": f"bench-mcp-{key}-{uuid.uuid4().hex[:6]}",
            "TURNKEEPER_DATA_DIR": str(root / "data"),
            "TURNKEEPER_WORKSPACE": str(root / "ws"),
            "TURNKEEPER_MODEL": f"scripted:{script}",
        }
        if key == "mcp":
            env["TURNKEEPER_MCP_SERVERS"] = str(servers)
        self.settings = Settings.from_env(env)
        self.client = Client(**{**client.config(), "data_converter": tk.data_converter(self.settings)})
        self.turns: list[float] = []
        self.tool_steps: list[float] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(run_worker(self.settings, client=self.client, stop=self._stop))
        await asyncio.sleep(3)  # the worker polls, its MCP server listed
        if self._task.done():
            self._task.result()

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def turn(self, record: bool = True) -> None:
        chat = f"bench-{uuid.uuid4().hex[:12]}"
        loop = asyncio.get_running_loop()
        started = loop.time()
        handle = await tk.send_message(self.client, self.settings, chat, tk.new_message("go", self.settings))
        state = await handle.result()
        took = loop.time() - started
        if state.status != TurnStatus.COMPLETED or state.tool_calls[0].status.value != "done":
            raise RuntimeError(f"{self.key}: turn ended {state.status.value}, tool {state.tool_calls}")
        if record:
            self.turns.append(took)
            self.tool_steps.append(await _tool_step(handle))


async def _tool_step(handle: Any) -> float:
    """The tool activity's start to its completion, on the server's clock."""
    tools: set[int] = set()
    started = completed = None
    async for e in handle.fetch_history_events():
        kind = e.event_type
        if kind == SCHEDULED and e.activity_task_scheduled_event_attributes.activity_type.name == TOOL_CALL:
            tools.add(e.event_id)
        elif kind == STARTED and e.activity_task_started_event_attributes.scheduled_event_id in tools:
            started = event_s(e)
        elif kind == COMPLETED and e.activity_task_completed_event_attributes.scheduled_event_id in tools:
            completed = event_s(e)
    if started is None or completed is None:
        raise RuntimeError("no tool step in the turn's history")
    return completed - started


def _ms(values: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(values) * 1000, "p90_ms": p90(values) * 1000}


async def main(turns: int, as_json: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="tk-bench-mcp-") as tmp_name:
        tmp = Path(tmp_name)
        async with dev_server(tmp, attempts=3) as server:
            client = await Client.connect(server.address)
            variants = [Variant(key, client, server.address, tmp) for key in VARIANTS]
            for v in variants:
                await v.start()
            try:
                progress(f"warm-up: {WARMUP_TURNS} turns per variant")
                for v in variants:
                    for _ in range(WARMUP_TURNS):
                        await v.turn(record=False)
                for i in range(turns):
                    if i % 10 == 0:
                        progress(f"turns {i + 1}-{min(i + 10, turns)} of {turns} per variant")
                    for v in variants if i % 2 == 0 else variants[::-1]:
                        await v.turn()
            finally:
                for v in variants:
                    await v.close()
    report: dict[str, Any] = {
        v.key: {"turn": _ms(v.turns), "tool_step": _ms(v.tool_steps), "turns": len(v.turns)} for v in variants
    }
    builtin, mcp = report["built-in"], report["mcp"]
    report["added_ms"] = {
        "turn_median": mcp["turn"]["median_ms"] - builtin["turn"]["median_ms"],
        "tool_step_median": mcp["tool_step"]["median_ms"] - builtin["tool_step"]["median_ms"],
    }
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{'variant':<10} {'turn median':>12} {'turn p90':>10} {'tool step median':>17} {'tool step p90':>14}"
    )
    for key in VARIANTS:
        r = report[key]
        print(
            f"{key:<10} {r['turn']['median_ms']:>10.1f}ms {r['turn']['p90_ms']:>8.1f}ms "
            f"{r['tool_step']['median_ms']:>15.1f}ms {r['tool_step']['p90_ms']:>12.1f}ms"
        )
    added = report["added_ms"]
    print(
        f"an MCP call adds {added['turn_median']:.1f} ms to the median turn "
        f"({added['tool_step_median']:.1f} ms to the median tool step)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=60, help="measured turns per variant (default 60)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    run_and_exit(main(args.turns, args.json))
