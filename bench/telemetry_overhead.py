"""What metrics and traces cost the worker: CPU per turn of turnkeeper's
`python worker.py` with TURNKEEPER_METRICS_ADDRESS and OTEL_EXPORTER_OTLP_ENDPOINT
set against the same worker with neither, each worker in a process of its own.

    .venv/bin/python bench/telemetry_overhead.py [--rounds 8] [--turns 100] [--split]

Rounds of `--turns` one-tool turns at 50 in flight alternate between the two
(in reversed order every other round) on one dev server. With telemetry on,
this process sends its turns through a traced client, as `turnkeeper send`
does, so every turn is a whole trace; the spans go to a small OTLP/HTTP sink
in this process, and /metrics is scraped once a round, as Prometheus would.
Both workers get a 30 s heartbeat timeout and a 600 s resume window: on a
busy shared machine a step can wait seconds for a CPU, and a turn stopped at a
gate would end the run. Reported: the medians over the rounds of the worker's CPU ms per turn, and of
each round's on/off ratio with the interval its median lies in. `--split` adds
a worker with metrics only and one with traces only. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench._common import alternate_rounds, dev_server, free_port, median_interval, run_and_exit
from bench.process_throughput import IN_FLIGHT, WARMUP_TURNS, TurnkeeperProcess, burst, spawn_and_warm
from turnkeeper.telemetry import exporters as telemetry


class OtlpSink:
    """Accepts OTLP/HTTP trace exports (an empty protobuf answer is a full success) and counts them."""

    def __init__(self) -> None:
        sink = self
        self.requests = 0
        self.bytes = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.requests += 1
                sink.bytes += len(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()


def scrape(address: str) -> int:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        return len(response.read())


async def run(rounds: int, turns: int, split: bool, json_out: Path | None) -> None:
    sink = OtlpSink()
    patient = {"TURNKEEPER_HEARTBEAT_TIMEOUT": "30", "TURNKEEPER_RESUME_WINDOW": "600"}
    traces = {**patient, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint}
    plans = [("off", "telemetry off", patient), ("on", "metrics and traces on", traces)]
    if split:
        plans += [("metrics", "metrics only", patient), ("traces", "traces only", traces)]
    metrics_at = {key: f"127.0.0.1:{free_port()}" for key in ("on", "metrics")}
    with tempfile.TemporaryDirectory(prefix="tk-telemetry-") as tmp_name:
        tmp = Path(tmp_name)
        async with dev_server(tmp) as server:
            client = await Client.connect(server.address, data_converter=pydantic_data_converter)
            variants: list[TurnkeeperProcess] = []
            for key, label, env in plans:
                (tmp / key).mkdir()
                if key in metrics_at:
                    env = {**env, "TURNKEEPER_METRICS_ADDRESS": metrics_at[key]}
                v = TurnkeeperProcess(client, server.address, tmp / key, key, label, env=env)
                # Traced turns start in this process, as they do in `turnkeeper send`.
                v.client = telemetry.traced(client, v.settings, "bench-driver")
                variants.append(v)
            scraped: list[int] = []

            async def measured(v: TurnkeeperProcess) -> None:
                await burst(v, turns, server.pid)
                if v.key in metrics_at:
                    scraped.append(await asyncio.to_thread(scrape, metrics_at[v.key]))

            try:
                await spawn_and_warm(variants)
                await alternate_rounds(
                    variants,
                    warmup=WARMUP_TURNS,
                    rounds=rounds,
                    burst=measured,
                    per_round=f"{turns} turns per variant, {IN_FLIGHT} in flight",
                )
            finally:
                for v in variants:
                    v.stop()
                telemetry.flush_traces()
                sink.close()
    summary = report({v.key: v for v in variants}, rounds, turns, sink, scraped)
    if json_out is not None:
        json_out.write_text(json.dumps(summary, indent=2))


def report(
    variants: dict[str, TurnkeeperProcess], rounds: int, turns: int, sink: OtlpSink, scraped: list[int]
) -> dict[str, Any]:
    print(
        f"\n{rounds} rounds of {turns} one-tool turns per variant, {IN_FLIGHT} in flight, each worker in "
        "its own process; medians over the rounds"
    )
    print(f"{'variant':<24}{'turns/s':>9}{'worker CPU ms/turn':>20}{'server':>8}")
    for v in variants.values():
        print(
            f"{v.label:<24}{statistics.median(v.turns_per_s):>9.1f}"
            f"{statistics.median(v.cpu_ms['worker']):>20.2f}{statistics.median(v.cpu_ms['server']):>8.2f}"
        )
    off = variants["off"]
    ratios: dict[str, Any] = {}
    print("\nagainst telemetry off, round by round (median; lowest-highest round; where the median lies)")
    for key, v in variants.items():
        if v is off:
            continue
        cpu = [b / a for a, b in zip(off.cpu_ms["worker"], v.cpu_ms["worker"], strict=False)]
        rate = [b / a for a, b in zip(off.turns_per_s, v.turns_per_s, strict=False)]
        low, high, coverage = median_interval(cpu)
        print(
            f"  {v.label:<22} worker CPU per turn {statistics.median(cpu):.3f}x ({min(cpu):.3f}-{max(cpu):.3f}; "
            f"{low:.3f}-{high:.3f} at {coverage:.0%}), turns/s {statistics.median(rate):.3f}x"
        )
        ratios[key] = {
            "worker_cpu": {
                "median": statistics.median(cpu),
                "rounds": cpu,
                "interval": [low, high, coverage],
            },
            "turns_per_s": {"median": statistics.median(rate), "rounds": rate},
        }
    if scraped:
        print(
            f"traces: {sink.requests} OTLP exports, {sink.bytes / 1024:.0f} KiB in all; "
            f"/metrics: {statistics.median(scraped) / 1024:.0f} KiB a scrape"
        )
    return {
        "rounds": rounds,
        "turns_per_round": turns,
        "in_flight": IN_FLIGHT,
        "variants": {
            v.key: {"label": v.label, "turns_per_s": v.turns_per_s, "cpu_ms_per_turn": v.cpu_ms}
            for v in variants.values()
        },
        "against_off": ratios,
        "otlp": {"requests": sink.requests, "bytes": sink.bytes},
        "metrics_bytes": scraped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="alternating rounds (default 8)")
    parser.add_argument("--turns", type=int, default=100, help="turns per variant per round (default 100)")
    parser.add_argument("--split", action="store_true", help="also run metrics only and traces only")
    parser.add_argument("--json-out", type=Path, help="also write the results to this file as JSON")
    args = parser.parse_args()
    run_and_exit(run(args.rounds, args.turns, args.split, args.json_out))


if __name__ == "__main__":
    main()
