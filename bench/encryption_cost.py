"""What payload encryption costs: a turn's latency and throughput with
TURNKEEPER_ENCRYPTION_KEYS set against unset, interleaved in one run, and the
size of a turn's history.

    .venv/bin/python bench/encryption_cost.py [--sequential 40] [--rounds 12] [--turns 150] [--json-out F]

Two `python worker.py` processes on one dev server with the embedded server's
settings, alike but for the key, each with its own task queue; this process
sends both the same turn (bench/turn_latency.py's: model -> write_file ->
model, in a fresh chat), each through a client with its worker's data
converter, so the client's own encryption is counted too. Both workers run with
a 30 s heartbeat timeout, so that a busy machine does not stop a turn at a gate.

- latency: `--sequential` turns per variant, one at a time, the two taking turns
  (off, on, on, off, ...); medians, p90, and the median of the paired ratios.
- throughput: `--rounds` rounds of `--turns` turns per variant at 50 in flight,
  alternating (reversed every other round); the median over the rounds of each
  round's on/off ratio with its interval (bench/README.md); goal >= 0.95.
- history: proto and JSON bytes and events of a few runs of each, and the
  bytes an encrypted payload adds.
- the codec alone: CPU time to open and to seal the encrypted payloads of a
  turn's run, as the worker's codec does it (this process, many passes): a
  figure that a busy machine moves far less than the rounds.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio.api.common.v1 import Payload
from temporalio.client import Client

from bench._common import alternate_rounds, dev_server, p90, progress, run_and_exit
from bench.process_throughput import (
    IN_FLIGHT,
    WARMUP_TURNS,
    TurnkeeperProcess,
    burst,
    print_cpu_table,
    spawn_and_warm,
)
from bench.turn_latency import TURN_TIMEOUT_S, PairedRatio, proto_size, ratio_of_rounds, turnkeeper_turn
from turnkeeper import client as tk
from turnkeeper.config import Settings
from turnkeeper.payloads.encryption import ENCODING, EncryptionCodec

GOAL_THROUGHPUT_ON_VS_OFF = 0.95
HISTORY_SAMPLES = 5
# Both workers alike: a machine busy with other work can hold a heartbeat past
# the default 3 s, and a turn that then waits for its user would hold the round.
WORKER_ENV = {"TURNKEEPER_HEARTBEAT_TIMEOUT": "30"}


async def run(sequential: int, rounds: int, turns: int, json_out: Path | None) -> None:
    key = f"bench:{base64.b64encode(os.urandom(32)).decode()}"
    with tempfile.TemporaryDirectory(prefix="tk-encryption-") as tmp_name:
        tmp = Path(tmp_name)
        async with dev_server(tmp) as server:
            variants: list[TurnkeeperProcess] = []
            for name, label, keys in (("off", "plain payloads", ""), ("on", "encrypted payloads", key)):
                (tmp / name).mkdir()
                extra = {**WORKER_ENV, "TURNKEEPER_ENCRYPTION_KEYS": keys}
                client = await Client.connect(
                    server.address, data_converter=tk.data_converter(Settings.from_env(extra))
                )
                variants.append(TurnkeeperProcess(client, server.address, tmp / name, name, label, env=extra))
            try:
                await spawn_and_warm(variants)
                latency, runs = await sequential_turns(variants, sequential)
                histories = {v.key: await history_sizes(v, runs[v.key][:HISTORY_SAMPLES]) for v in variants}
                codec = await codec_cost(variants[1], runs["on"][:HISTORY_SAMPLES])
                await alternate_rounds(
                    variants,
                    warmup=WARMUP_TURNS,
                    rounds=rounds,
                    burst=lambda v: named(v, burst(v, turns, server.pid)),
                    per_round=f"{turns} turns per variant, {IN_FLIGHT} in flight",
                )
                for v in variants:
                    v.check_running()
            finally:
                for v in variants:
                    v.stop()
    summary = report({v.key: v for v in variants}, latency, histories, codec, sequential, rounds, turns)
    if json_out is not None:
        json_out.write_text(json.dumps(summary, indent=2))


async def named(v: TurnkeeperProcess, work: Awaitable[None]) -> None:
    """A turn that does not end says whose it was, and what its worker logged."""
    try:
        await work
    except TimeoutError:
        raise RuntimeError(
            f"a turn of {v.label} did not end within {TURN_TIMEOUT_S:.0f} s; its worker's "
            f"log ends:\n{v.log.read_text(errors='replace')[-1500:]}"
        ) from None


async def sequential_turns(
    variants: list[TurnkeeperProcess], n: int
) -> tuple[dict[str, list[float]], dict[str, list[tuple[str, str | None]]]]:
    progress(f"latency: {n} turns per variant, one at a time, alternating")
    latency: dict[str, list[float]] = {v.key: [] for v in variants}
    runs: dict[str, list[tuple[str, str | None]]] = {v.key: [] for v in variants}
    for i in range(n):
        for v in variants if i % 2 == 0 else variants[::-1]:
            start = time.perf_counter()
            runs[v.key].append(await turnkeeper_turn(v.client, v.settings))
            latency[v.key].append((time.perf_counter() - start) * 1000)
    return latency, runs


async def history_sizes(v: TurnkeeperProcess, runs: list[tuple[str, str | None]]) -> dict[str, float]:
    """Per run, as the server stores it (fetched without decoding)."""
    sizes: list[tuple[int, int, int, int]] = []
    for workflow_id, run_id in runs:
        history = await v.client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        raw = b"".join(e.SerializeToString() for e in history.events)
        sizes.append((proto_size(history), len(history.to_json()), len(history.events), raw.count(ENCODING)))
    return {
        "proto_bytes": statistics.mean(s[0] for s in sizes),
        "json_bytes": statistics.mean(s[1] for s in sizes),
        "events": statistics.mean(s[2] for s in sizes),
        "encrypted_payloads": statistics.mean(s[3] for s in sizes),
    }


async def codec_cost(
    v: TurnkeeperProcess, runs: list[tuple[str, str | None]], passes: int = 200
) -> dict[str, float]:
    """CPU time of the codec over the encrypted payloads of these runs, per turn."""
    codec = v.client.data_converter.payload_codec
    assert isinstance(codec, EncryptionCodec)
    sealed: list[Payload] = []
    for workflow_id, run_id in runs:
        history = await v.client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        for event in history.events:  # every payload, wherever it sits (inputs, results, failures, summaries)
            sealed += [p for p in _payloads(event) if p.metadata.get("encoding") == ENCODING]
    opened = [codec.decrypt(p) for p in sealed]
    start = time.process_time()
    for _ in range(passes):
        for p in sealed:
            codec.decrypt(p)
    open_s = (time.process_time() - start) / passes
    start = time.process_time()
    for _ in range(passes):
        for p in opened:
            codec.encrypt(p)
    seal_s = (time.process_time() - start) / passes
    n = len(runs)
    return {
        "payloads_per_turn": len(sealed) / n,
        "mean_payload_bytes": statistics.mean(len(p.data) for p in opened),
        "open_ms_per_turn": open_s * 1000 / n,
        "seal_ms_per_turn": seal_s * 1000 / n,
        "open_us_per_payload": open_s * 1e6 / len(sealed),
        "seal_us_per_payload": seal_s * 1e6 / len(sealed),
    }


def _payloads(message: Any) -> list[Payload]:
    """Every Payload inside a protobuf message."""
    found: list[Payload] = []
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            items = list(value.values()) if field.message_type.fields_by_name["value"].message_type else []
        elif field.is_repeated:
            items = list(value)
        else:
            items = [value]
        for item in items:
            found += [item] if isinstance(item, Payload) else _payloads(item)
    return found


def report(
    variants: dict[str, TurnkeeperProcess],
    latency: dict[str, list[float]],
    histories: dict[str, dict[str, float]],
    codec: dict[str, float],
    sequential: int,
    rounds: int,
    turns: int,
) -> dict[str, Any]:
    off, on = variants["off"], variants["on"]
    print(f"\nlatency: {sequential} sequential turns per variant, alternating (model -> write_file -> model)")
    print(f"{'variant':<22}{'median ms':>11}{'p90 ms':>9}")
    for v in variants.values():
        print(f"{v.label:<22}{statistics.median(latency[v.key]):>11.1f}{p90(latency[v.key]):>9.1f}")
    paired_latency = ratio_of_rounds(latency["on"], latency["off"])
    median_ratio = statistics.median(latency["on"]) / statistics.median(latency["off"])
    print(
        f"  on/off: medians {median_ratio:.3f}x; paired turns {paired_latency.median:.3f}x "
        f"({paired_latency.describe()})"
    )

    print(
        f"\nthroughput: {rounds} rounds of {turns} turns per variant, {IN_FLIGHT} in flight; each worker "
        "in its own process; CPU ms per turn (medians of the rounds) of this process, the worker, the server"
    )
    print_cpu_table(list(variants.values()), 22)
    cpu = {v.key: {k: statistics.median(x) for k, x in v.cpu_ms.items()} for v in variants.values()}
    throughput: PairedRatio = ratio_of_rounds(on.turns_per_s, off.turns_per_s)
    print(f"  on/off: {throughput.median:.3f}x   {throughput.describe()}")

    h_off, h_on = histories["off"], histories["on"]
    print(f"\nhistory of a turn's run (mean of {HISTORY_SAMPLES} runs each, as stored)")
    print(f"{'variant':<22}{'events':>8}{'proto B':>10}{'JSON B':>10}{'encrypted':>11}")
    for v in variants.values():
        h = histories[v.key]
        print(
            f"{v.label:<22}{h['events']:>8.1f}{h['proto_bytes']:>10.0f}{h['json_bytes']:>10.0f}"
            f"{h['encrypted_payloads']:>11.1f}"
        )
    per_payload = (
        (h_on["proto_bytes"] - h_off["proto_bytes"]) / h_on["encrypted_payloads"]
        if h_on["encrypted_payloads"]
        else float("nan")
    )
    print(
        f"  on/off: proto bytes {h_on['proto_bytes'] / h_off['proto_bytes']:.2f}x, JSON bytes "
        f"{h_on['json_bytes'] / h_off['json_bytes']:.2f}x; {per_payload:.0f} bytes more per encrypted payload"
    )

    total_cpu = sum(cpu["on"].values())
    print(
        f"\nthe codec alone, over the {codec['payloads_per_turn']:.0f} encrypted payloads of a turn's run "
        f"({codec['mean_payload_bytes']:.0f} bytes on average, opened): CPU ms per turn"
    )
    print(
        f"  open {codec['open_ms_per_turn']:.3f} ({codec['open_us_per_payload']:.1f} us a payload), seal "
        f"{codec['seal_ms_per_turn']:.3f} ({codec['seal_us_per_payload']:.1f} us a payload); once each is "
        f"{(codec['open_ms_per_turn'] + codec['seal_ms_per_turn']) / total_cpu:.2%} of the "
        f"{total_cpu:.1f} ms CPU of an encrypted turn above"
    )

    print("\ngoal")
    print(
        f"  {'throughput on/off >= 0.95':<28}{throughput.median:>8.3f} x   "
        f"{'PASS' if throughput.median >= GOAL_THROUGHPUT_ON_VS_OFF else 'MISS'}   "
        f"{throughput.note(GOAL_THROUGHPUT_ON_VS_OFF)}"
    )
    return {
        "sequential": sequential,
        "rounds": rounds,
        "turns_per_round": turns,
        "in_flight": IN_FLIGHT,
        "latency_ms": {
            k: {"median": statistics.median(x), "p90": p90(x), "all": x} for k, x in latency.items()
        },
        "latency_on_off": {"medians": median_ratio, "paired": asdict(paired_latency)},
        "turns_per_s": {
            v.key: {"median": statistics.median(v.turns_per_s), "rounds": v.turns_per_s}
            for v in variants.values()
        },
        "cpu_ms_per_turn": cpu,
        "throughput_on_off": asdict(throughput),
        "history": histories,
        "bytes_per_encrypted_payload": per_payload,
        "codec": codec,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequential", type=int, default=40, help="latency: turns per variant (default 40)")
    parser.add_argument("--rounds", type=int, default=12, help="throughput: alternating rounds (default 12)")
    parser.add_argument(
        "--turns", type=int, default=150, help="throughput: turns per variant per round (default 150)"
    )
    parser.add_argument("--json-out", type=Path, help="also write the results to this file as JSON")
    args = parser.parse_args()
    run_and_exit(run(args.sequential, args.rounds, args.turns, args.json_out))


if __name__ == "__main__":
    main()
