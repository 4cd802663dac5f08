"""Heartbeats from a background task, so a dead worker is noticed within seconds
even while the activity awaits a slow model or tool."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity

DEFAULT_INTERVAL_S = 2.0


@contextlib.asynccontextmanager
async def heartbeating() -> AsyncIterator[None]:
    timeout = activity.info().heartbeat_timeout
    # A third of the timeout (the worker's throttle lets them through): two beats
    # may be late before a live worker's step is taken for lost.
    interval = timeout.total_seconds() / 3 if timeout else DEFAULT_INTERVAL_S

    async def beat() -> None:
        # Sleep first: most calls end before the first beat is due, and every
        # beat is a server write.
        while True:
            await asyncio.sleep(interval)
            activity.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
