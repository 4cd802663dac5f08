"""Workflow activations on the worker's event loop thread.

The SDK runs each activation of a workflow on a thread of its own pool and waits
for it from the event loop, so that it can report workflow code that blocks for
2 s (deadlock detection). That costs every activation two thread switches: on a
2-core machine about 1 ms of each of a turn's workflow tasks, a tenth of the
turn (bench/README, "Workflow activations on the event loop").

turnkeeper's workflow code is its own: it does no I/O and never blocks. So a
worker with unsandboxed workflow code (the default) hands the SDK this executor,
which runs each activation on the event loop thread instead, the way the SDK's
own debug mode does. The loop waits while an activation runs: a few tenths of a
millisecond, or tens for the replay of a history after an eviction (the history
bound keeps those short). On the pool's thread an activation held the GIL, and
so the loop, nearly as long. An activation slower than `SLOW_ACTIVATION_S` is
logged. With TURNKEEPER_WORKFLOW_SANDBOX=on the SDK's threads and its deadlock
detection stay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger("turnkeeper.worker")

# The SDK's deadlock timeout is 2 s: an activation half as long is worth a word.
SLOW_ACTIVATION_S = 1.0


class LoopActivations(ThreadPoolExecutor):
    """An executor for `Worker(workflow_task_executor=...)` that starts no thread:
    `submit` runs the call on the running event loop, in a callback of its own
    (outside the task that submitted it, as the SDK's debug mode does). Calls run
    one per turn of the loop, in the order submitted: between two of them the
    loop runs its timers and I/O, so a worker taking over many runs at once (each
    replaying its history) still sends its steps' heartbeats on time."""

    def __init__(self) -> None:
        super().__init__(
            max_workers=1, thread_name_prefix="turnkeeper-unused"
        )  # threads start on submit only
        self._waiting: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = (
            deque()
        )
        self._scheduled = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        done: Future[T] = Future()
        self._waiting.append((done, fn, args, kwargs))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run_next)
        return done

    def _run_next(self) -> None:
        _run(*self._waiting.popleft())
        if self._waiting:
            asyncio.get_running_loop().call_soon(self._run_next)  # the next turn of the loop
        else:
            self._scheduled = False


def _run(done: Future[T], fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if not done.set_running_or_notify_cancel():
        return
    # The workflow's own event loop registers itself as running while it steps and
    # clears the registration when it is done: the worker's loop is put back.
    running = asyncio._get_running_loop()
    started = time.monotonic()
    try:
        result = fn(*args, **kwargs)
    except BaseException as err:
        done.set_exception(err)
    else:
        done.set_result(result)
    finally:
        asyncio._set_running_loop(running)
    took = time.monotonic() - started
    if took > SLOW_ACTIVATION_S:
        log.warning("a workflow activation took %.1f s on the worker's event loop", took)
