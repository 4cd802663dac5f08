"""Streaming answers, measured end to end: a dev server, `python worker.py`
processes, `turnkeeper web`, and the model as a `FakeChatServer` that streams at
a fixed rate.

    .venv/bin/python bench/streaming.py [--quick] [--json]

1. Time to first token: each turn on a fresh chat whose event stream is open
   before the message is sent (through the web API). The provider's own time to
   first token is its first text piece's write less the request's arrival; the
   delay turnkeeper adds is the stream's first `assistant_delta` less that write.
2. Throughput with streaming on against off: two workers, one each way, on
   queues of their own; rounds of turns at 20 in flight, alternated.
3. History bytes per turn for a 10-word and a 1,000-word answer, streaming on
   and off: the pieces never enter the history (the answer does, once, in the
   model call's result, where the reconciler finds an answer to restore).
4. Under load: N chats (200) streaming at once through one web process; for
   every piece the provider wrote, the delay until a stream first holds it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench._common import ROOT, dev_server, free_port, p90, progress, run_and_exit
from turnkeeper import client as tk
from turnkeeper.config import Settings
from turnkeeper.testing import FakeChatServer, StreamRecord

GOAL_ADDED_MS = 50.0
GOAL_THROUGHPUT = 0.9
WORD_DELAY_S = 0.05  # the provider's rate: 20 words a second


def words(n: int, tag: str = "") -> str:
    return " ".join(f"{tag}w{i}" for i in range(n))


@dataclass
class Answers:
    """What the fake model says: the user's message names the answer's length
    and pace, `len=<words> delay=<seconds>`."""

    server: FakeChatServer = field(default_factory=FakeChatServer)

    def __post_init__(self) -> None:
        self.server.responder = self._respond

    @staticmethod
    def _respond(request: dict[str, Any]) -> dict[str, Any]:
        text = request["messages"][-1]["content"]
        spec = dict(part.split("=", 1) for part in text.split() if "=" in part)
        return {
            "text": words(int(spec.get("len", "40")), spec.get("tag", "")),
            "chunk_delay": float(spec.get("delay", "0")),
        }

    def record_for(self, tag: str) -> StreamRecord:
        return next(r for r in self.server.streams if f"tag={tag}" in r.request["messages"][-1]["content"])


class Processes:
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env, self.procs = tmp, env, []

    def start(self, args: list[str], name: str, **extra: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env={**self.env, **extra},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


# -- a small SSE client on asyncio streams (hundreds at once) -------------------------------


class EventStream:
    def __init__(self, port: int, chat_id: str) -> None:
        self.port, self.chat_id = port, chat_id
        self.deltas: list[tuple[float, dict[str, Any]]] = []
        self.ended = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.opened = asyncio.Event()

    async def __aenter__(self) -> EventStream:
        self._task = asyncio.create_task(self._read())
        await asyncio.wait_for(self.opened.wait(), 30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _read(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            # HTTP/1.0: the answer comes unchunked, a line is a line.
            writer.write(
                f"GET /api/chats/{self.chat_id}/events HTTP/1.0\r\nHost: 127.0.0.1:{self.port}\r\n"
                "Accept: text/event-stream\r\n\r\n".encode()
            )
            await writer.drain()
            while (await reader.readline()).strip():
                pass  # the response's headers
            self.opened.set()
            event: dict[str, str] = {}
            while line := await reader.readline():
                text = line.decode().strip()
                if text:
                    name, _, value = text.partition(": ")
                    event[name] = value
                    continue
                if event.get("event") == "assistant_delta":
                    self.deltas.append((time.monotonic(), json.loads(event["data"])))
                elif event.get("event") == "turn_end":
                    self.ended.set()
                event = {}
        finally:
            writer.close()

    def first_holding(self, offset_end: int) -> float | None:
        """When the stream first held the answer's first `offset_end` characters."""
        for at, d in self.deltas:
            if d["offset"] + len(d["text"]) >= offset_end:
                return at
        return None


async def post_message(port: int, chat_id: str, text: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"text": text}).encode()
    writer.write(
        f"POST /api/chats/{chat_id}/messages HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    status = (await reader.readline()).decode()
    writer.close()
    if " 202 " not in status:
        raise RuntimeError(f"POST {chat_id}: {status.strip()}")


# -- the measurements ---------------------------------------------------------------------


async def time_to_first_token(port: int, answers: Answers, turns: int) -> dict[str, list[float]]:
    provider, added = [], []
    for i in range(turns):
        chat, tag = f"ttft-{uuid.uuid4().hex[:8]}", f"t{i}x"
        async with EventStream(port, chat) as stream:
            await post_message(port, chat, f"len=20 delay={WORD_DELAY_S} tag={tag}")
            await asyncio.wait_for(stream.ended.wait(), 60)
        record = answers.record_for(tag)
        first_write = record.pieces[0][0]
        seen = stream.first_holding(len(record.pieces[0][1]))
        if seen is None:
            raise RuntimeError(
                f"chat {chat}: no delta held the first piece ({len(stream.deltas)} deltas, "
                f"{len(record.pieces)} pieces written)"
            )
        provider.append((first_write - record.arrived) * 1000)
        added.append((seen - first_write) * 1000)
    return {"provider_ttft_ms": provider, "added_ms": added}


async def throughput(
    clients: dict[str, tuple[Client, Settings]], rounds: int, per_round: int, in_flight: int
) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {k: [] for k in clients}

    async def one(client: Client, settings: Settings) -> None:
        chat = f"tp-{uuid.uuid4().hex[:10]}"
        handle = await tk.send_message(client, settings, chat, tk.new_message("len=60 delay=0", settings))
        await handle.result()

    for r in range(rounds):
        for key in list(clients) if r % 2 == 0 else list(clients)[::-1]:
            client, settings = clients[key]
            gate = asyncio.Semaphore(in_flight)

            async def bounded() -> None:
                async with gate:
                    await one(client, settings)

            start = time.perf_counter()
            await asyncio.gather(*(bounded() for _ in range(per_round)))
            rates[key].append(per_round / (time.perf_counter() - start))
        progress(
            f"throughput round {r + 1} of {rounds}: "
            + ", ".join(f"{k} {v[-1]:.1f}/s" for k, v in rates.items())
        )
    return rates


async def history_bytes(client: Client, settings: Settings, n_words: int) -> int:
    chat = f"hist-{uuid.uuid4().hex[:10]}"
    handle = await tk.send_message(client, settings, chat, tk.new_message(f"len={n_words} delay=0", settings))
    await handle.result()
    history = await handle.fetch_history()
    return sum(e.ByteSize() for e in history.events)


async def many_at_once(port: int, answers: Answers, chats: int) -> dict[str, Any]:
    ids = [(f"load-{uuid.uuid4().hex[:8]}", f"l{i}x") for i in range(chats)]
    streams = [EventStream(port, chat) for chat, _ in ids]
    async with contextlib.AsyncExitStack() as stack:
        for s in streams:
            await stack.enter_async_context(s)
        await asyncio.gather(
            *(post_message(port, chat, f"len=40 delay={WORD_DELAY_S} tag={tag}") for chat, tag in ids)
        )
        await asyncio.wait_for(asyncio.gather(*(s.ended.wait() for s in streams)), 300)
    delays, missing = [], 0
    for stream, (_, tag) in zip(streams, ids, strict=True):
        record = answers.record_for(tag)
        offset = 0
        for at, piece in record.pieces:
            offset += len(piece)
            seen = stream.first_holding(offset)
            if seen is None:
                missing += 1  # its last pieces can arrive only with the recorded answer
            else:
                delays.append((seen - at) * 1000)
    return {"delays_ms": delays, "pieces_only_in_the_answer": missing}


# -- main ---------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def stack(tmp: Path, answers: Answers) -> AsyncIterator[tuple[Processes, str, int]]:
    async with dev_server(tmp) as server:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("TURNKEEPER_", "TEMPORAL_", "OPENAI_"))
        }
        env.update(
            {
                "TEMPORAL_ADDRESS": server.address,
                "TURNKEEPER_DATA_DIR": str(tmp / "data"),
                "TURNKEEPER_MODEL": "openai:fake",
                "OPENAI_BASE_URL": answers.server.base_url,
                "OPENAI_API_KEY": "bench",
                "TURNKEEPER_LOG_LEVEL": "WARNING",
                "PYTHONUNBUFFERED": "1",
            }
        )
        procs = Processes(tmp, env)
        try:
            yield procs, server.address, free_port()
        finally:
            procs.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer turns and 50 chats under load")
    parser.add_argument("--chats", type=int, default=None, help="chats streaming at once (default 200)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ttft_turns, rounds, per_round = (10, 3, 40) if args.quick else (30, 6, 80)
    chats = args.chats or (50 if args.quick else 200)

    answers = Answers()
    with answers.server, tempfile.TemporaryDirectory(prefix="turnkeeper-streaming-") as tmp_name:
        tmp = Path(tmp_name)
        async with stack(tmp, answers) as (procs, address, web_port):
            settings = {
                k: Settings.from_env({**procs.env, "TURNKEEPER_TASK_QUEUE": f"stream-{k}"})
                for k in ("on", "off")
            }
            for key, s in settings.items():
                for n in range(2):
                    procs.start(
                        [sys.executable, "worker.py"],
                        f"worker-{key}-{n}",
                        TURNKEEPER_TASK_QUEUE=s.task_queue,
                        TURNKEEPER_STREAM=key,
                    )
            procs.start(
                [str(Path(sys.executable).parent / "turnkeeper"), "web"],
                "web",
                TURNKEEPER_TASK_QUEUE=settings["on"].task_queue,
                TURNKEEPER_WEB_ADDRESS=f"127.0.0.1:{web_port}",
            )
            client = await Client.connect(address, data_converter=pydantic_data_converter)
            progress("warming up the workers and the web process")
            for s in settings.values():
                await history_bytes(client, s, 5)
            for _ in range(100):
                with contextlib.suppress(OSError):
                    await post_message(web_port, f"warm-{uuid.uuid4().hex[:6]}", "len=3 delay=0")
                    break
                await asyncio.sleep(0.2)

            progress(f"time to first token: {ttft_turns} turns through the web process")
            try:
                ttft = await time_to_first_token(web_port, answers, ttft_turns)
            except Exception:
                for log in sorted(tmp.glob("*.log")):  # what the processes said, before they go
                    print(f"--- {log.name}\n{log.read_text()[-3000:]}", file=sys.stderr)
                raise
            progress("history bytes per turn")
            sizes = {n: await history_bytes(client, settings["on"], n) for n in (10, 1000)}
            sizes_off = {n: await history_bytes(client, settings["off"], n) for n in (10, 1000)}
            rates = await throughput({k: (client, s) for k, s in settings.items()}, rounds, per_round, 20)
            progress(f"{chats} chats streaming at once through one web process")
            load = await many_at_once(web_port, answers, chats)

    ratio = statistics.median(on / off for on, off in zip(rates["on"], rates["off"], strict=True))
    added = ttft["added_ms"]
    summary = {
        "provider_ttft_ms": {"median": statistics.median(ttft["provider_ttft_ms"])},
        "added_ms": {"median": statistics.median(added), "p90": p90(added), "max": max(added)},
        "throughput": {
            "on": statistics.median(rates["on"]),
            "off": statistics.median(rates["off"]),
            "ratio": ratio,
            "rounds": [on / off for on, off in zip(rates["on"], rates["off"], strict=True)],
        },
        "history_bytes": {"streaming on": sizes, "streaming off": sizes_off},
        "under_load": {
            "chats": chats,
            "median_ms": statistics.median(load["delays_ms"]),
            "p90_ms": p90(load["delays_ms"]),
            "pieces": len(load["delays_ms"]),
            "pieces_only_in_the_answer": load["pieces_only_in_the_answer"],
        },
    }
    print()
    print(
        f"time to first token, {ttft_turns} turns (provider streams a word every {WORD_DELAY_S * 1000:.0f} ms)"
    )
    print(
        f"  provider's own (request -> first piece written)    {summary['provider_ttft_ms']['median']:7.1f} ms"
    )
    print(
        f"  added by turnkeeper (first piece -> first delta)   {summary['added_ms']['median']:7.1f} ms median, "
        f"{summary['added_ms']['p90']:.1f} p90, {summary['added_ms']['max']:.1f} max"
    )
    print(f"throughput, 60-word answers, 20 in flight, {rounds} rounds of {per_round}")
    print(
        f"  streaming on {summary['throughput']['on']:.1f} turns/s, off {summary['throughput']['off']:.1f}; "
        f"on/off {ratio:.2f}x (rounds {min(summary['throughput']['rounds']):.2f}-"
        f"{max(summary['throughput']['rounds']):.2f})"
    )
    print("history bytes per turn (10-word against 1,000-word answer)")
    for way, by_len in summary["history_bytes"].items():
        print(f"  {way:14s} {by_len[10]:7d} {by_len[1000]:7d}")
    ul = summary["under_load"]
    print(f"{chats} chats streaming at once through one web process: provider's piece -> a stream holds it")
    print(
        f"  {ul['median_ms']:.1f} ms median, {ul['p90_ms']:.1f} ms p90 over {ul['pieces']} pieces "
        f"({ul['pieces_only_in_the_answer']} came only with the recorded answer)"
    )
    print("goals")
    print(
        f"  added delay median < {GOAL_ADDED_MS:.0f} ms   {'PASS' if summary['added_ms']['median'] < GOAL_ADDED_MS else 'MISS'}"
    )
    print(f"  throughput on/off >= {GOAL_THROUGHPUT}    {'PASS' if ratio >= GOAL_THROUGHPUT else 'MISS'}")
    # The answer itself is in the model call's result (the reconciler restores answers
    # from there), so a longer answer makes a longer history; streaming adds nothing.
    same = all(
        abs(summary["history_bytes"]["streaming on"][n] - summary["history_bytes"]["streaming off"][n]) < 64
        for n in (10, 1000)
    )
    print(f"  history bytes the same with streaming on and off   {'PASS' if same else 'MISS'}")
    if args.json:
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    run_and_exit(main())
