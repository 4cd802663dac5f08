"""Heartbeats from a background task, so a dead worker is noticed within seconds
even while the activity awaits a slow model or tool."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

from temporalio import activity

# Beats per heartbeat timeout: a live worker's step is taken for lost only after
# two beats in a row are late. The server notices a dead worker's step up to
# timeout + 1 s - one beat interval after its last beat (measured: it re-arms its
# heartbeat timer no sooner than 1 s after that timer fired), so beating more
# often would make the worst case slower, not quicker.
BEATS_PER_TIMEOUT = 3
DEFAULT_INTERVAL = timedelta(seconds=2)


def beat_interval(timeout: timedelta | None) -> timedelta:
    """How often a step heartbeats under `timeout`."""
    return timeout / BEATS_PER_TIMEOUT if timeout else DEFAULT_INTERVAL


@contextlib.asynccontextmanager
async def heartbeating() -> AsyncIterator[None]:
    interval = beat_interval(activity.info().heartbeat_timeout).total_seconds()

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
