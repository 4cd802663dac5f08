"""What a cold replay costs: the time a worker without the turn cached needs to
replay a history, by history length, for the two ways a turn's history grows.

    .venv/bin/python bench/cold_replay.py [--steps 300] [--signals 950] [--repeat 5]

A worker that has not cached a turn replays its whole history inside one
workflow task, which has TURN_TASK_TIMEOUT (2 s): a history it cannot replay in
time times out on every retry. This script records, on the embedded server's
settings and the real worker (scripted model):

  steps     one turn of N tool steps (model -> list_dir), with the history bound
            lifted so that it stays one run (what a run was before the bound)
  signals   a gate that N stale Dismiss signals reach (each refused, each kept
            in the history), with the bound lifted the same way
  bound     the same N-step turn at the shipped bound: its longest run

then replays each history with the SDK's `Replayer` (no sandbox, as the worker
runs; logging off) and prints the median of `--repeat` replays, in ms and in ms
per event. Replay runs in this process, one history at a time, on an idle
server: a loaded worker takes longer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from bench._common import dev_server, progress, run_and_exit
from turnkeeper import client as tk
from turnkeeper import long_history
from turnkeeper.config import Settings
from turnkeeper.models import TURN_TASK_TIMEOUT, TurnState, TurnStatus
from turnkeeper.worker.main import run_worker
from turnkeeper.workflows.chat_turn import ChatTurn


async def _histories(client: Client, chat: str) -> list[WorkflowHistory]:
    return [
        await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        async for wf in client.list_workflows(f"WorkflowId='{tk.workflow_id(chat)}'")
    ]


async def _wait_state(client: Client, chat: str, status: TurnStatus, timeout: float = 600) -> TurnState:
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = await tk.query_state(client, chat)
            if state.status == status:
                return state
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"chat {chat} never reached {status.value}")
        await asyncio.sleep(0.2)


def _settings(tmp: Path, address: str, name: str, script: list[dict[str, object]]) -> Settings:
    (tmp / f"{name}.json").write_text(json.dumps(script))
    return Settings.from_env(
        {
            "TEMPORAL_ADDRESS": address,
            "TURNKEEPER_TASK_QUEUE": f"cold-replay-{name}",
            "TURNKEEPER_DATA_DIR": str(tmp / "data"),
            "TURNKEEPER_WORKSPACE": str(tmp / "ws"),
            "TURNKEEPER_MODEL": f"scripted:{tmp / f'{name}.json'}",
            "TURNKEEPER_WORKFLOW_SANDBOX": "off",
        }
    )


async def record(tmp: Path, steps: int, signals: int) -> dict[str, WorkflowHistory]:
    (tmp / "ws").mkdir()
    async with dev_server(tmp) as server:
        client = await Client.connect(server.address, data_converter=pydantic_data_converter)
        stepping = _settings(
            tmp,
            server.address,
            "steps",
            [{"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}] * steps + [{"text": "done"}],
        )
        failing = _settings(tmp, server.address, "gate", [{"error": "the provider refuses, for good"}])
        stop = asyncio.Event()
        workers = [asyncio.create_task(run_worker(s, client=client, stop=stop)) for s in (stepping, failing)]
        await asyncio.sleep(0.5)
        out: dict[str, WorkflowHistory] = {}
        shipped = long_history.RUN_HISTORY_EVENTS
        try:
            long_history.RUN_HISTORY_EVENTS = 10**9  # one run, as before the bound
            progress(f"steps: one turn of {steps} tool steps")
            await (await tk.send_message(client, stepping, "steps", tk.new_message("go", stepping))).result()
            out["steps"] = max(await _histories(client, "steps"), key=lambda h: len(h.events))

            progress(f"signals: {signals} stale Dismiss signals at a gate")
            handle = await tk.send_message(client, failing, "signals", tk.new_message("go", failing))
            await _wait_state(client, "signals", TurnStatus.AWAITING_USER)
            in_flight = asyncio.Semaphore(16)

            async def stale(i: int) -> None:
                async with in_flight:
                    await handle.signal("dismiss", {"recovery_id": f"stale-{i}"})

            await asyncio.gather(*(stale(i) for i in range(signals)))
            await asyncio.sleep(2)  # every signal taken by a workflow task
            out["signals"] = max(await _histories(client, "signals"), key=lambda h: len(h.events))

            long_history.RUN_HISTORY_EVENTS = shipped
            progress(f"bound: the same {steps}-step turn at the shipped bound ({shipped} events)")
            await (await tk.send_message(client, stepping, "bound", tk.new_message("go", stepping))).result()
            out["bound"] = max(await _histories(client, "bound"), key=lambda h: len(h.events))
        finally:
            long_history.RUN_HISTORY_EVENTS = shipped
            stop.set()
            await asyncio.gather(*workers)
    return out


async def main(steps: int, signals: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tk-cold-replay-") as tmp_name:
        histories = await record(Path(tmp_name), steps, signals)
    logging.disable(logging.CRITICAL)  # the refusals' warnings would be timed too
    replayer = Replayer(
        workflows=[ChatTurn],
        data_converter=pydantic_data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    print(
        f"cold replay, median of {repeat} (Replayer, no sandbox); task timeout "
        f"{TURN_TASK_TIMEOUT.total_seconds():g} s, bound {long_history.RUN_HISTORY_EVENTS} events"
    )
    print(f"{'history':<10} {'events':>7} {'ms':>8} {'ms/event':>9}")
    shipped = long_history.RUN_HISTORY_EVENTS
    for name, history in histories.items():
        # Replayed with the bound it was recorded with, or the replay would hand on.
        long_history.RUN_HISTORY_EVENTS = shipped if name == "bound" else 10**9
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
            times.append(time.perf_counter() - start)
            assert result.replay_failure is None, (name, result.replay_failure)
        long_history.RUN_HISTORY_EVENTS = shipped
        ms = statistics.median(times) * 1000
        print(f"{name:<10} {len(history.events):>7} {ms:>8.0f} {ms / len(history.events):>9.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--signals", type=int, default=950, help="at most the server's cap (1,000) less one")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    run_and_exit(main(args.steps, args.signals, args.repeat))
