"""A chat of 2,000 turns: what a model step sends, reads and holds must not grow
with the chat once its older turns are folded into a summary.

    .venv/bin/python bench/long_chat.py [--turns 2000] [--context-tokens 8000] [--seed 1]
    .venv/bin/python bench/long_chat.py --temporal [--turns 2000]

Default (direct): the real model activity (`turnkeeper.model_call`, run by
temporalio.testing.ActivityEnvironment, so no Temporal server) on a real SQLite
store, one chat, turn after turn. The model is in-process and answers at once:
text of 100-800 bytes, or (one turn in five) a `read_file` call whose result
(200-2,000 bytes) the benchmark records as the tool activity would, then the
answer; it summarises as the scripted model does (through the provider's
`summarise`). A full Temporal turn per step would measure the engine, not the
context; `--temporal` does that instead.
Per model call: the tokens sent (bytes / 4 of the messages the provider receives
and of the tools' schemas, counted here, not by the builder), the time spent in
store transactions, and the summary calls made. At turns 10, 100, 1,000 and
2,000: medians over the ten turns up to it, the rows in the store, the process's
resident memory (it is the worker here), and for contrast the time to read and
decode the whole transcript (`history`), which every model step did before (in
a process of its own, best of three).

--temporal: the same chat through a dev server and one `python worker.py`
process, the model a FakeChatServer through the OpenAI provider (it summarises
by a chat completion, as a real model would): tokens per call from its
requests, the worker's VmRSS from /proc, and the turn's wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from bench._common import ROOT, dev_server, progress, run_and_exit
from turnkeeper import activity_io as io
from turnkeeper.activities.model_call import ModelCallActivity
from turnkeeper.activities.providers import ModelProvider
from turnkeeper.activities.providers.base import SUMMARY_INSTRUCTION, SummaryRequest, listed_summary
from turnkeeper.activities.tools import default_registry
from turnkeeper.config import Settings
from turnkeeper.models import ChatMessage, ModelReply, ToolCall, ToolSpec, UserMessage
from turnkeeper.store import SQLiteStore
from turnkeeper.store.transaction import Transaction

T = TypeVar("T")
CHAT = "long-chat"
CHECKPOINTS = (10, 100, 500, 1000, 1500, 2000)
WINDOW = 100  # turns up to a checkpoint its medians are taken over (all of them at turn 10)
TOOLS = ("read_file",)


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def sent_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """What a call sends, counted apart from the builder: bytes / 4 of its JSON."""
    return (len(json.dumps(messages, separators=(",", ":"))) + (len(json.dumps(tools)) if tools else 0)) // 4


class TimedStore(SQLiteStore):
    """The real SQLite store; every transaction's wall time is added to `spent`."""

    spent = 0.0

    async def _run_write(
        self, chat_id: str, work: Callable[[Transaction, Any], Coroutine[Any, Any, T]], durable: bool
    ) -> T:
        started = time.perf_counter()
        try:
            return await super()._run_write(chat_id, work, durable)
        finally:
            self.spent += time.perf_counter() - started

    async def _run_read(self, work: Callable[[Transaction], Coroutine[Any, Any, T]], snapshot: bool) -> T:
        started = time.perf_counter()
        try:
            return await super()._run_read(work, snapshot)
        finally:
            self.spent += time.perf_counter() - started


class BenchModel(ModelProvider):
    name = "bench"

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.tokens: list[int] = []
        self.summaries = 0

    async def complete(
        self, history: list[ChatMessage], tools: list[ToolSpec], *, call_index: int
    ) -> ModelReply:
        self.tokens.append(
            sent_tokens(
                [m.model_dump(exclude_none=True) for m in history],
                [t.model_dump(exclude={"effect"}) for t in tools],
            )
        )
        if history[-1].role == "user" and self.rng.random() < 0.2:
            return ModelReply(
                tool_calls=[
                    ToolCall(
                        id=f"call_{call_index}_0",
                        name="read_file",
                        arguments=json.dumps({"path": f"notes/{call_index}.txt"}),
                    )
                ]
            )
        return ModelReply(text=f"answer {call_index}: " + "a" * self.rng.randint(100, 800))

    async def summarise(self, request: SummaryRequest) -> str:
        self.summaries += 1
        return listed_summary(request)


def _p10(values: list[float]) -> float:
    """A tenth of the steps took less: the cost without the other processes' noise."""
    return sorted(values)[len(values) // 10]


async def whole_history_read(db: Path) -> tuple[int, float]:
    """(rows, ms) of reading and decoding the whole transcript, as every model step
    did before: in a process of its own, so that its objects do not count here."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--time-history", str(db), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    rows, ms = out.split()
    return int(rows), float(ms)


async def time_history(db: Path) -> None:
    store = SQLiteStore(db)
    await store.open()
    try:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            history = await store.history(CHAT)
            best = min(best, (time.perf_counter() - started) * 1000)
        print(len(history), best)
    finally:
        await store.close()


@dataclass(frozen=True)
class Step:
    """One turn of the direct run: its calls' median tokens and its store ms per call."""

    tokens: float
    store_ms: float


@dataclass(frozen=True)
class DirectRow:
    turn: int
    rows: int
    loaded: int
    tokens: float
    store_ms: float
    store_p10: float
    history_ms: float
    rss: float
    summaries: int


@dataclass(frozen=True)
class TemporalRow:
    turn: int
    tokens: float
    wall_ms: float
    rss: float
    summaries: int


def _table(rows: Sequence[object], columns: list[tuple[str, str, str]]) -> None:
    """`columns`: (title, the row's field, its format)."""
    print("  ".join(title for title, _, _ in columns))
    for r in rows:
        print("  ".join(format(getattr(r, field), fmt).rjust(len(title)) for title, field, fmt in columns))


async def direct(turns: int, budget: int, seed: int) -> None:
    from temporalio.testing import ActivityEnvironment

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="tk-long-chat-") as tmp:
        settings = Settings(tools=TOOLS, workspace=Path(tmp) / "ws", context_tokens=budget)
        store = TimedStore(Path(tmp) / "sessions.db")
        await store.open()
        model = BenchModel(rng)
        activity = ModelCallActivity(settings, store, model, default_registry())
        env = ActivityEnvironment()
        per_turn: list[Step] = []
        rows: list[DirectRow] = []
        first_fold = None
        try:
            for n in range(1, turns + 1):
                began = await store.begin_turn(CHAT, f"run-{n}", [f"m{n}"])
                assert began.turn == n
                message = UserMessage(
                    message_id=f"m{n}", text=f"message {n}: " + "u" * rng.randint(100, 1200)
                )
                calls, spent, summaries = 0, 0.0, model.summaries
                step, new = 0, [message]
                while True:
                    store.spent = 0.0
                    result = await env.run(
                        activity.model_call,
                        io.ModelCallInput(chat_id=CHAT, turn=n, step=step, new_messages=new),
                    )
                    spent += store.spent
                    calls += 1
                    if result.reply.is_final:
                        break
                    for call in result.reply.tool_calls:  # as the tool activity records it
                        await store.record_tool_result(
                            CHAT, n, call.id, call.name, "r" * rng.randint(200, 2000), "done"
                        )
                    step, new = step + 1, []
                if first_fold is None and model.summaries > summaries:
                    first_fold = n
                per_turn.append(
                    Step(tokens=statistics.median(model.tokens[-calls:]), store_ms=spent * 1000 / calls)
                )
                if n in CHECKPOINTS or n == turns:
                    window = per_turn[-min(WINDOW, n) :]
                    rss = rss_mib()
                    rows_now, full_ms = await whole_history_read(store.path)
                    loaded = await store.context_rows(CHAT)
                    rows.append(
                        DirectRow(
                            turn=n,
                            rows=rows_now,
                            loaded=len(loaded.rows),
                            tokens=statistics.median(w.tokens for w in window),
                            store_ms=statistics.median(w.store_ms for w in window),
                            store_p10=_p10([w.store_ms for w in window]),
                            history_ms=full_ms,
                            rss=rss,
                            summaries=model.summaries,
                        )
                    )
                    progress(f"turn {n}: {rows[-1]}")
        finally:
            await store.close()
    print(
        f"direct: the model activity on a SQLite store, one chat of {turns} turns, "
        f"TURNKEEPER_CONTEXT_TOKENS={budget}; first fold at turn {first_fold}"
    )
    _table(
        rows,
        [
            ("turn", "turn", "d"),
            ("transcript rows", "rows", "d"),
            ("rows loaded", "loaded", "d"),
            ("ctx tokens/call", "tokens", ".0f"),
            ("store ms/step", "store_ms", ".2f"),
            ("(p10)", "store_p10", ".2f"),
            ("whole-history read ms", "history_ms", ".1f"),
            ("RSS MiB", "rss", ".1f"),
            ("summaries so far", "summaries", "d"),
        ],
    )
    print(
        f"medians over the {WINDOW} turns up to each row; a step is one model call (commit, context, "
        f"record); the whole-history read is the best of 3 in a separate process. "
        f"Load average at the end: {os.getloadavg()[0]:.1f}"
    )


async def through_temporal(turns: int, budget: int, seed: int) -> None:
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    from turnkeeper import client as tk
    from turnkeeper.testing import FakeChatServer

    rng = random.Random(seed)
    lead = SUMMARY_INSTRUCTION.split("{", 1)[0][:40]
    tokens: list[int] = []
    summaries = [0]

    def respond(request: dict[str, Any]) -> dict[str, Any]:
        messages = request["messages"]
        if messages[0]["role"] == "system" and messages[0]["content"].startswith(lead):
            summaries[0] += 1
            return {
                "text": "The user sent numbered messages and got numbered answers; "
                f"the last one folded here was: {messages[-1]['content'][-120:]}"
            }
        tokens.append(sent_tokens(messages, request.get("tools") or []))
        return {"text": f"answer {len(tokens)}: " + "a" * rng.randint(100, 800)}

    with (
        tempfile.TemporaryDirectory(prefix="tk-long-chat-") as tmp_name,
        FakeChatServer(responder=respond) as fake,
    ):
        tmp = Path(tmp_name)
        async with dev_server(tmp) as server:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNKEEPER_", "TEMPORAL_"))}
            env.update(
                {
                    "TEMPORAL_ADDRESS": server.address,
                    "TURNKEEPER_TASK_QUEUE": "long-chat",
                    "TURNKEEPER_DATA_DIR": str(tmp / "data"),
                    "TURNKEEPER_WORKSPACE": str(tmp / "ws"),
                    "TURNKEEPER_MODEL": "openai:bench",
                    "OPENAI_BASE_URL": fake.base_url,
                    "OPENAI_API_KEY": "bench",
                    "TURNKEEPER_TOOLS": ",".join(TOOLS),
                    "TURNKEEPER_CONTEXT_TOKENS": str(budget),
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
            rows: list[TemporalRow] = []
            try:
                client = await Client.connect(server.address, data_converter=pydantic_data_converter)
                settings = Settings.from_env(env)
                walls: list[float] = []
                for n in range(1, turns + 1):
                    text = f"message {n}: " + "u" * rng.randint(100, 1200)
                    started = time.perf_counter()
                    handle = await tk.send_message(client, settings, CHAT, tk.new_message(text, settings))
                    await handle.result()
                    walls.append((time.perf_counter() - started) * 1000)
                    if n in CHECKPOINTS or n == turns:
                        rows.append(
                            TemporalRow(
                                turn=n,
                                tokens=statistics.median(tokens[-WINDOW:]),
                                wall_ms=statistics.median(walls[-WINDOW:]),
                                rss=rss_mib(worker.pid),
                                summaries=summaries[0],
                            )
                        )
                        progress(f"turn {n}: {rows[-1]}")
            finally:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=60)
    print(
        f"temporal: one worker process, a FakeChatServer model, one chat of {turns} turns, "
        f"TURNKEEPER_CONTEXT_TOKENS={budget}"
    )
    _table(
        rows,
        [
            ("turn", "turn", "d"),
            ("ctx tokens/call", "tokens", ".0f"),
            ("turn ms", "wall_ms", ".1f"),
            ("worker RSS MiB", "rss", ".1f"),
            ("summary calls so far", "summaries", "d"),
        ],
    )
    print(
        f"medians over the {WINDOW} turns up to each row. Load average at the end: {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument(
        "--context-tokens",
        type=int,
        default=8000,
        help="TURNKEEPER_CONTEXT_TOKENS (default 8000: the first fold comes early)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--temporal", action="store_true", help="through a dev server and a worker process")
    parser.add_argument("--time-history", type=Path, help=argparse.SUPPRESS)  # the contrast's own process
    args = parser.parse_args()
    if args.time_history:
        asyncio.run(time_history(args.time_history))
        sys.exit(0)
    run = through_temporal if args.temporal else direct
    run_and_exit(run(args.turns, args.context_tokens, args.seed))
