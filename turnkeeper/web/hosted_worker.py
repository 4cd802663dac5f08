"""A worker inside the web process (TURNKEEPER_WEB_WORKER=1): one process serves
the page and runs the turns, on one Temporal client and one event loop.

Sharing the client is what lets a new turn start eagerly: the server hands the
run's first workflow task back in the reply to the start call, to this process's
worker, instead of through the task queue (`turnkeeper.client.send_message`,
`eager=True`). Turns started elsewhere, and follow-ups to a running turn, go the
ordinary way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from turnkeeper.config import Settings
from turnkeeper.web.backends import Backends

log = logging.getLogger("turnkeeper.web")


class HostedWorker:
    def __init__(self, settings: Settings, backends: Backends) -> None:
        self._settings = settings
        self._backends = backends
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        from turnkeeper import client as tk
        from turnkeeper.worker.main import run_worker

        # Started as the worker starts it: the embedded dev server unless TEMPORAL_ADDRESS is set.
        client = await tk.connect(self._settings, start_dev_server=True)
        self._backends.adopt_client(client, eager=True)
        self._task = asyncio.create_task(run_worker(self._settings, client=client, stop=self._stop))
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        # The page keeps serving (reads, and sends for other workers to run); new
        # turns are no longer started eagerly, since no worker here would take them.
        self._backends.eager = False
        log.error("the worker in this process stopped: %s", task.exception(), exc_info=task.exception())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
