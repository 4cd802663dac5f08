"""What the benchmark scripts share: their own Temporal dev server, progress
output, statistics, a workflow history as a timeline, and the way they exit.
The dev server, free ports and the median's interval are the tests' too
(tests/support.py), imported here under their names.

Imported as `bench._common` (bench/__init__.py: how a script finds `bench`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import sys
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar

from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import WorkflowHistory

# Shared with the tests (the chaos harness among them): they live in tests/support.py.
from tests.support import Server as Server
from tests.support import dev_server as dev_server
from tests.support import free_port as free_port
from tests.support import median_interval as median_interval

ROOT = Path(__file__).resolve().parent.parent

T = TypeVar("T")


def progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


# -- statistics --------------------------------------------------------------------------


def p90(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


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
