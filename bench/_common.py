"""What the benchmark scripts share: their own Temporal dev server, progress
output, statistics, a workflow history as a timeline, and the way they exit.

Imported as `bench._common` (bench/__init__.py: how a script finds `bench`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import WorkflowHistory

from turnkeeper.worker.dev_server import is_healthy, start_dev_command

ROOT = Path(__file__).resolve().parent.parent

SERVER_START_TIMEOUT_S = 60.0

T = TypeVar("T")


def progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


# -- the Temporal dev server ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Server:
    address: str
    pid: int
    http_address: str  # Temporal's HTTP API, as `turnkeeper status` asks it


@contextlib.asynccontextmanager
async def dev_server(
    tmp: Path,
    dynamic_config: dict[str, object] | None = None,
    cli_defaults: bool = False,
    metrics_port: int | None = None,
    attempts: int = 1,
) -> AsyncIterator[Server]:
    """The embedded server's `temporal server start-dev` on a free port, with its
    SQLite file in `tmp` (`cli_defaults`: without its tuning; `metrics_port`: its
    Prometheus metrics served there); stopped on the way out.

    The dev server picks the ports of its internal services itself and can pick
    the one just chosen for the frontend: it then panics a moment after turning
    healthy. With `attempts` > 1, a start is looked at again 1.5 s after it
    turned healthy, and one that died is made again on other ports."""
    for attempt in range(1, attempts + 1):
        port, http_port = free_port(), free_port()
        address = f"127.0.0.1:{port}"
        suffix = "" if attempt == 1 else f"-{attempt}"
        cmd = start_dev_command(
            port,
            tmp / f"temporal{suffix}.db",
            log_level="error",
            http_port=http_port,
            dynamic_config=dynamic_config,
            cli_defaults=cli_defaults,
        )
        if metrics_port is not None:
            cmd += ["--metrics-port", str(metrics_port)]
        log_path = tmp / f"temporal-server{suffix}.log"
        # Own session: a Ctrl-C at the terminal reaches only us, and we stop the server last.
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        try:
            deadline = time.monotonic() + SERVER_START_TIMEOUT_S
            while not await is_healthy(address) and proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            if attempts > 1 and proc.poll() is None:
                await asyncio.sleep(1.5)  # past the internal services' start-up
            if proc.poll() is not None or not await is_healthy(address):
                if attempt < attempts:
                    continue
                raise RuntimeError(f"the Temporal dev server did not start:\n{log_path.read_text()[-800:]}")
            yield Server(address, proc.pid, f"127.0.0.1:{http_port}")
            return
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# -- statistics --------------------------------------------------------------------------


def p90(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def median_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free interval for the median of the distribution `values`
    were drawn from: the k-th lowest and k-th highest value, with k as large as
    keeps the chance of covering it at least `level` (binomial order statistics).
    Returns (low, high, that chance). Six rounds give their whole range (97%);
    twelve, the third lowest to the third highest (96%); sixty, the 22nd (97%)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("no values")
    k, coverage = 1, 1 - 2 * 0.5**n
    while k + 1 <= n // 2:
        wider_k = k + 1
        # Coverage of [x(k), x(n-k+1)]: 1 - 2 P(Binomial(n, 1/2) <= k - 1).
        chance = 1 - 2 * sum(math.comb(n, i) for i in range(wider_k)) / 2**n
        if chance < level:
            break
        k, coverage = wider_k, chance
    return ordered[k - 1], ordered[n - k], coverage


def near_median(items: Sequence[T], value: Callable[[T], float]) -> T:
    """The item whose value is closest to the median: a typical run to show in full."""
    median = statistics.median(value(i) for i in items)
    return min(items, key=lambda i: abs(value(i) - median))


# -- a workflow history as a timeline ---------------------------------------------------------


def event_s(e: Any) -> float:
    """An event's server wall-clock time in seconds (the server runs on this host)."""
    return e.event_time.ToNanoseconds() / 1e9


def event_name(e: Any) -> str:
    """The event type, with what tells events of a type apart: activity type, marker,
    timeout type, error type."""
    name = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
    if e.HasField("activity_task_scheduled_event_attributes"):
        name += f" ({e.activity_task_scheduled_event_attributes.activity_type.name})"
    elif e.HasField("marker_recorded_event_attributes"):
        name += f" ({e.marker_recorded_event_attributes.marker_name})"
    elif e.HasField("activity_task_timed_out_event_attributes"):
        failure = e.activity_task_timed_out_event_attributes.failure
        kind = failure.cause.timeout_failure_info.timeout_type if failure.HasField("cause") else 0
        name += f" ({_timeout_name(kind)})" if kind else ""
    elif e.HasField("workflow_task_timed_out_event_attributes"):
        name += f" ({_timeout_name(e.workflow_task_timed_out_event_attributes.timeout_type)})"
    elif e.HasField("activity_task_failed_event_attributes"):
        info = e.activity_task_failed_event_attributes.failure
        err = info.cause.application_failure_info.type if info.HasField("cause") else ""
        err = err or info.application_failure_info.type
        name += f" ({err})" if err else ""
    return name


def _timeout_name(value: int) -> str:
    return TimeoutType.Name(value).removeprefix("TIMEOUT_TYPE_")


def timeline(history: WorkflowHistory, marks: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Each history event, and each client-side mark (label: wall-clock seconds), in time
    order, with its offset from the first event and the gap since the previous row."""
    rows = [(event_s(e), event_name(e)) for e in history.events]
    rows += [(t, f"<< {label}") for label, t in (marks or {}).items()]
    rows.sort(key=lambda r: r[0])
    first = event_s(history.events[0])
    out: list[dict[str, Any]] = []
    prev = None
    for t, name in rows:
        out.append(
            {"event": name, "at_ms": (t - first) * 1000, "gap_ms": 0.0 if prev is None else (t - prev) * 1000}
        )
        prev = t
    return out


def print_timeline(title: str, rows: list[dict[str, Any]]) -> None:
    print()
    print(title)
    for row in rows:
        print(f"  {row['at_ms']:>9.1f} ms  +{row['gap_ms']:>7.1f}  {row['event']}")


# -- main ----------------------------------------------------------------------------------------


class Measured(Protocol):
    """A benchmark variant: one turn to its end per call."""

    def turn(self) -> Awaitable[object]: ...


V = TypeVar("V", bound=Measured)


async def alternate_rounds(
    variants: Sequence[V], *, warmup: int, rounds: int, per_round: str, burst: Callable[[V], Awaitable[None]]
) -> None:
    """Warm every variant up (`warmup` turns each, through its `turn()`), then run
    `burst` on each in `rounds` rounds, in reversed order every other round, so
    that a slow spell of the machine falls on all variants alike."""
    progress(f"warm-up: {warmup} turns per variant")
    for v in variants:
        for _ in range(warmup):
            await v.turn()
    for i in range(rounds):
        progress(f"round {i + 1} of {rounds}: {per_round}")
        for v in variants if i % 2 == 0 else variants[::-1]:
            await burst(v)


def run_and_exit(
    main: Coroutine[Any, Any, None], loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
) -> NoReturn:
    """Run a script's main coroutine (on `loop_factory`'s loop; None: asyncio's own),
    report a failure, and exit with os._exit."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    code = 0
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(main)
    except KeyboardInterrupt:  # workers and the server are already stopped (finally blocks)
        code = 130
    except Exception:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # A Temporal runtime can abort at interpreter exit (sdk-python #300).
    os._exit(code)
