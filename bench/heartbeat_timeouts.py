"""When the server times out a step whose heartbeats stop: the figure behind
SIGKILL -> awaiting_user, measured without killing anything.

    .venv/bin/python bench/heartbeat_timeouts.py [--timeout S] [--beats N] [--json]

An activity beats on turnkeeper's cadence (every third of the heartbeat timeout,
from one interval into the step) through a worker with turnkeeper's heartbeat
throttle, stops beating after 1, 2, ... N beats, and then hangs, as a SIGKILLed
worker's step would. For each stop point it prints when ACTIVITY_TASK_TIMED_OUT
came after the last beat. A server that timed steps out exactly one timeout
after the last beat would print the timeout every time; this one re-arms its
heartbeat timer no sooner than about 1 s after the timer fired, so some stop
points come later, up to timeout + 1 s - one beat interval (bench/README.md,
"Recovery latency benchmark"). Run it again after upgrading the server: the
2.5 s bound on SIGKILL -> awaiting_user rests on this rule.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench._common import dev_server, event_s, progress, run_and_exit
from turnkeeper.activities.heartbeat import beat_interval
from turnkeeper.config import Settings
from turnkeeper.worker.main import heartbeat_throttle

HANG_S = 30.0  # far past any timeout measured here


@activity.defn(name="bench.beat_then_hang")
async def beat_then_hang(beats_at: list[float]) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    for at in beats_at:
        await asyncio.sleep(max(0.0, started + at - loop.time()))
        activity.heartbeat()
    await asyncio.sleep(HANG_S)  # beats stop: the server must notice


@workflow.defn(name="bench.HeartbeatTimeout")
class HeartbeatTimeout:
    @workflow.run
    async def run(self, beats_at: list[float], timeout_s: float) -> str:
        try:
            await workflow.execute_activity(
                beat_then_hang,
                beats_at,
                start_to_close_timeout=timedelta(seconds=HANG_S * 2),
                heartbeat_timeout=timedelta(seconds=timeout_s),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError:
            return "timed out"
        return "completed"


async def one(client: Client, task_queue: str, beats_at: list[float], timeout_s: float) -> float:
    """Seconds from the activity's start to ACTIVITY_TASK_TIMED_OUT (server clock)."""
    handle = await client.start_workflow(
        HeartbeatTimeout.run,
        args=[beats_at, timeout_s],
        id=f"beats-{uuid.uuid4().hex[:10]}",
        task_queue=task_queue,
    )
    outcome = await handle.result()
    if outcome != "timed out":
        raise RuntimeError(f"the activity {outcome} instead of timing out")
    events = [e async for e in handle.fetch_history_events()]
    started = next(e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)
    timed_out = next(e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT)
    return event_s(timed_out) - event_s(started)


async def run(timeout_s: int, max_beats: int, as_json: bool) -> None:
    every = beat_interval(timedelta(seconds=timeout_s)).total_seconds()
    throttle = heartbeat_throttle(Settings(heartbeat_timeout=timeout_s))
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="turnkeeper-heartbeats-") as tmp:
        progress("starting the Temporal dev server")
        async with dev_server(Path(tmp), attempts=3) as server:
            # The activity hangs past each timeout: the SDK's warnings about its
            # cancellation and late completion are noise here.
            quiet = Runtime(
                telemetry=TelemetryConfig(
                    logging=LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))
                )
            )
            client = await Client.connect(server.address, runtime=quiet)
            task_queue = f"bench-heartbeats-{uuid.uuid4().hex[:8]}"
            logging.getLogger("temporalio").setLevel(logging.CRITICAL)
            async with Worker(
                client,
                task_queue=task_queue,
                workflows=[HeartbeatTimeout],
                activities=[beat_then_hang],
                workflow_runner=UnsandboxedWorkflowRunner(),
                max_heartbeat_throttle_interval=throttle,
                default_heartbeat_throttle_interval=throttle,
                graceful_shutdown_timeout=timedelta(seconds=0),
            ):
                for n in range(0, max_beats + 1):
                    beats_at = [every * k for k in range(1, n + 1)]
                    last = beats_at[-1] if beats_at else 0.0
                    after_start = await one(client, task_queue, beats_at, timeout_s)
                    rows.append(
                        {
                            "beats": n,
                            "last_beat_s": last,
                            "timed_out_s": after_start,
                            "after_last_beat_s": after_start - last,
                        }
                    )
                    progress(
                        f"{n} beat(s), the last at {last:.2f} s: timed out {after_start:.2f} s after the "
                        f"start, {after_start - last:.2f} s after the last beat"
                    )
            progress("stopping the dev server")

    bound = timeout_s + 1 - every
    print()
    print(
        f"heartbeat timeout {timeout_s} s; beats every {every:.3g} s from {every:.3g} s into the step; "
        f"the worker's throttle {throttle.total_seconds():.3g} s (turnkeeper's settings)"
    )
    print(f"{'beats':>5}  {'last beat':>9}  {'timed out':>9}  {'after the last beat':>19}")
    for r in rows:
        print(
            f"{r['beats']:>5}  {r['last_beat_s']:>8.2f}s  {r['timed_out_s']:>8.2f}s  {r['after_last_beat_s']:>18.2f}s"
        )
    after = [r["after_last_beat_s"] for r in rows if r["beats"] > 0]
    print(
        f"after the last beat: median {statistics.median(after):.2f} s, max {max(after):.2f} s; "
        f"the rule's bound timeout + 1 s - one beat interval = {bound:.2f} s"
    )
    if as_json:
        print(
            json.dumps(
                {
                    "heartbeat_timeout_s": timeout_s,
                    "beat_interval_s": every,
                    "throttle_s": throttle.total_seconds(),
                    "bound_s": bound,
                    "rows": rows,
                },
                indent=2,
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--timeout",
        type=int,
        default=Settings().heartbeat_timeout,
        metavar="S",
        help=f"heartbeat timeout in whole seconds (default: the project's, {Settings().heartbeat_timeout})",
    )
    parser.add_argument(
        "--beats", type=int, default=9, metavar="N", help="stop after 0, 1, ... N beats (default 9)"
    )
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    if args.timeout < 1 or args.beats < 1:
        parser.error("--timeout and --beats must be at least 1")
    run_and_exit(run(args.timeout, args.beats, args.json))


if __name__ == "__main__":
    main()
