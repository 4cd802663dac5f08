"""Reconcile pass time as the number of chats grows while the open turns stay
the same: a pass must cost what the open turns cost, not what all chats cost.

    .venv/bin/python bench/reconcile_scale.py [--open 100] [--totals 1000,10000]

For each total: a fresh SQLite store holding `total - open` closed chats and
`open` chats whose turn is open with a run that is really running on the dev
server (no worker polls its task queue, so it stays running). The real
`turnkeeper.reconcile_pass` activity runs three times over it; the median is
reported with the store calls it made.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment

from bench._common import dev_server, progress, run_and_exit
from turnkeeper import client as tk
from turnkeeper.activities.reconcile.reconciler import Reconciler
from turnkeeper.config import Settings
from turnkeeper.models import ChatTurnInput, ModelReply, UserMessage
from turnkeeper.store import SQLiteStore

PASSES = 3


class CountingStore:
    """Counts the store calls a pass makes, passing everything through."""

    def __init__(self, inner: SQLiteStore) -> None:
        self._inner = inner
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await attr(*args, **kwargs)

        return counted


async def populate(store: SQLiteStore, client: Client, settings: Settings, total: int, open_: int) -> None:
    for i in range(total - open_):
        chat = f"closed-{total}-{i}"
        await store.begin_turn(chat, f"run-{i}", ["m"])
        await store.commit_user_messages(chat, 1, [UserMessage(message_id="m", text="hi")])
        await store.record_assistant(chat, 1, 0, ModelReply(text="done"), final=True)
    for i in range(open_):
        chat = f"open-{total}-{i}"
        handle = await client.start_workflow(  # nobody polls this queue: it stays running
            tk.WORKFLOW_TYPE,
            ChatTurnInput(chat_id=chat),
            id=tk.workflow_id(chat),
            task_queue=settings.task_queue,
        )
        await store.begin_turn(chat, handle.result_run_id or "", ["m"])


async def measure(client: Client, address: str, tmp: Path, total: int, open_: int) -> dict[str, float]:
    settings = Settings.from_env(
        {
            "TEMPORAL_ADDRESS": address,
            "TURNKEEPER_DATA_DIR": str(tmp / f"data-{total}"),
            "TURNKEEPER_TASK_QUEUE": f"idle-{total}",
        }
    )
    store = SQLiteStore(settings.sqlite_path)
    await store.open()
    try:
        progress(f"{total} chats, {open_} open: populating")
        await populate(store, client, settings, total, open_)
        counting = CountingStore(store)
        reconciler = Reconciler(settings, counting)  # type: ignore[arg-type]
        env = ActivityEnvironment(client=client)
        times = []
        for _ in range(PASSES):
            t0 = time.perf_counter()
            summary = await env.run(reconciler.reconcile_pass)
            times.append(time.perf_counter() - t0)
        assert summary.examined == open_ and summary.healthy == open_, summary
        return {
            "total": total,
            "open": open_,
            "median_s": statistics.median(times),
            "store_calls_per_pass": counting.calls / PASSES,
        }
    finally:
        await store.close()


async def main(open_: int, totals: list[int]) -> None:
    with tempfile.TemporaryDirectory(prefix="tk-reconcile-") as tmp_name:
        tmp = Path(tmp_name)
        async with dev_server(tmp) as server:
            client = await Client.connect(server.address, data_converter=pydantic_data_converter)
            rows = [await measure(client, server.address, tmp, total, open_) for total in totals]
    print(f"reconcile pass over chats of which {open_} are open (runs running), median of {PASSES} passes")
    print(f"{'chats':>8} {'open':>6} {'pass ms':>9} {'store calls':>12}")
    for r in rows:
        print(
            f"{r['total']:>8} {r['open']:>6} {r['median_s'] * 1000:>9.1f} {r['store_calls_per_pass']:>12.0f}"
        )
    ratio = rows[-1]["median_s"] / rows[0]["median_s"]
    print(
        f"{rows[-1]['total']}/{rows[0]['total']} chats: pass time {ratio:.2f}x "
        f"({'flat' if ratio <= 1.5 else 'GROWS'})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--open", type=int, default=100)
    parser.add_argument("--totals", default="1000,10000")
    args = parser.parse_args()
    run_and_exit(main(args.open, [int(t) for t in args.totals.split(",")]))
