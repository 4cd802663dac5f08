"""A per-test stack on the shared dev server: own task queue, data dir,
workspace, scripted model, and workers in-process or as real processes.

Also what the tests share with the benchmarks (bench/ imports them from here): free
ports, a dev server of its own on an on-disk SQLite file as the worker starts it
(the chaos harness's and the benchmarks'), and the median's interval."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from turnkeeper import client as tk
from turnkeeper.config import Settings
from turnkeeper.models import TurnState
from turnkeeper.store import SessionStore, open_store
from turnkeeper.worker.dev_server import is_healthy, start_dev_command
from turnkeeper.worker.main import run_worker

ROOT = Path(__file__).resolve().parent.parent
HISTORIES = ROOT / "tests" / "histories"
# What the worker logs once it polls.
WORKER_READY = "worker serving task queue"

# Ports for the servers tests start: below Linux's ephemeral range (32768-60999), where
# neither an outgoing connection nor a port the dev server picks for its own services
# can take one between its choice and its bind; each xdist process has a block of its own.
_PORTS = range(20000, 32000)


def _port_block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    size = len(_PORTS) // max(count, 1)
    return range(_PORTS.start + index * size, _PORTS.start + (index + 1) * size)


_PORT_BLOCK = _port_block()
# A random start: a second run on the machine (another checkout's) rarely meets this one.
_next_port = random.randrange(len(_PORT_BLOCK))


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, for a server a test starts; each call
    gives another one (in turn through this process's block)."""
    global _next_port
    for _ in range(len(_PORT_BLOCK)):
        port = _PORT_BLOCK[_next_port % len(_PORT_BLOCK)]
        _next_port += 1
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            return port
    raise RuntimeError(f"no free port in {_PORT_BLOCK}")


# -- a dev server of its own ----------------------------------------------------------

DEV_SERVER_START_TIMEOUT_S = 60.0


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
            deadline = time.monotonic() + DEV_SERVER_START_TIMEOUT_S
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


# -- statistics ---------------------------------------------------------------------------


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


async def until(pred: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll a cheap local condition (a file, a fake server's request count)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} not reached in {timeout} s")


async def until_async(
    pred: Callable[[], Awaitable[bool]], timeout: float = 20.0, what: str = "condition"
) -> None:
    """As `until`, for a condition that asks the server or the store."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await pred():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what} not reached in {timeout} s")


class Stack:
    def __init__(
        self, client: Client, address: str, tmp: Path, name: str = "test", http_address: str | None = None
    ) -> None:
        self.name = name
        self.chats: list[str] = []
        self.client = client
        self.address = address
        self.http_address = http_address
        self.dir = tmp
        self.ws = tmp / "ws"
        self.ws.mkdir(exist_ok=True)
        self.data = tmp / "data"
        self.script_path = tmp / "script.json"
        self.task_queue = f"tq-{uuid.uuid4().hex[:10]}"
        self.env_extra: dict[str, str] = {}
        self._workers: list[tuple[asyncio.Event, asyncio.Task[None]]] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}  # pid -> log file of a spawned worker
        self._store: SessionStore | None = None

    # -- configuration ---------------------------------------------------------
    def chat(self, name: str = "c") -> str:
        chat_id = f"{name}-{uuid.uuid4().hex[:8]}"
        self.chats.append(chat_id)
        return chat_id

    def script(self, items: list[dict[str, Any]]) -> None:
        self.script_path.write_text(json.dumps(items))
        self.env_extra.setdefault("TURNKEEPER_MODEL", f"scripted:{self.script_path}")

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNKEEPER_", "TEMPORAL_"))}
        env.update(
            {
                "TEMPORAL_ADDRESS": self.address,
                # The embedded server's HTTP API, as `turnkeeper status` uses it there.
                "TURNKEEPER_TEMPORAL_HTTP_ADDRESS": self.http_address or "",
                "TURNKEEPER_TASK_QUEUE": self.task_queue,
                "TURNKEEPER_DATA_DIR": str(self.data),
                "TURNKEEPER_WORKSPACE": str(self.ws),
                "PYTHONUNBUFFERED": "1",
                # Each worker creates its queue's reconcile schedule: it never fires during a test.
                "TURNKEEPER_RECONCILE_EVERY": "3600",
            }
        )
        env.update(self.env_extra)
        env.update(extra)
        return env

    def settings(self, **extra: str) -> Settings:
        return Settings.from_env(self.env(**extra))

    # -- workers ---------------------------------------------------------------
    async def start_worker(self, **extra: str) -> None:
        """A worker in this process (the real `run_worker`), stopped at close. Its
        workflows run in Temporal's sandbox, so a non-deterministic call in workflow
        code fails the tests; `spawn_worker` runs the production default (no sandbox)."""
        extra.setdefault("TURNKEEPER_WORKFLOW_SANDBOX", "on")
        stop = asyncio.Event()
        task = asyncio.create_task(run_worker(self.settings(**extra), client=self.client, stop=stop))
        self._workers.append((stop, task))
        await asyncio.sleep(0.3)
        if task.done():
            task.result()  # raise what stopped it

    async def stop_workers(self) -> None:
        """Stop the in-process workers: a run's next task then waits for a worker."""
        for stop, _ in self._workers:
            stop.set()
        for _, task in self._workers:
            await asyncio.wait_for(task, 30)
        self._workers.clear()

    def spawn_worker(
        self, command: Sequence[str] = (sys.executable, "worker.py"), cwd: Path = ROOT, **extra: str
    ) -> subprocess.Popen[bytes]:
        """`python worker.py` (or `command`) as a real process, in its own process group."""
        path = self.dir / f"worker{len(self.procs)}.log"
        with open(path, "wb") as log:
            proc = subprocess.Popen(
                list(command),
                cwd=cwd,
                env=self.env(**extra),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        self.logs[proc.pid] = path
        return proc

    async def wait_serving(self, *procs: subprocess.Popen[bytes], timeout: float = 90.0) -> None:
        """Until every spawned worker in `procs` polls its task queue: starting one
        takes a second or more, which a test with short timeouts cannot spare."""
        logs = [self.logs[p.pid] for p in procs]
        await until(
            lambda: all(WORKER_READY in p.read_text(errors="replace") for p in logs),
            timeout,
            f"{len(logs)} spawned worker(s) serving",
        )

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)

    async def record_histories(self) -> None:
        """Keep every run of this test's chats under tests/histories for the replay test."""
        HISTORIES.mkdir(exist_ok=True)
        n = 0
        for chat_id in self.chats:
            async for wf in self.client.list_workflows(f"WorkflowId='{tk.workflow_id(chat_id)}'"):
                history = await self.client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
                (HISTORIES / f"{self.name}-{n}.json").write_text(history.to_json())
                n += 1

    def print_worker_logs(self, lines: int = 80) -> None:
        """The end of each spawned worker's log, for a failed test's report."""
        for pid, path in self.logs.items():
            tail = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            print(f"--- worker {pid} ({path.name}), last {len(tail)} lines ---", *tail, sep="\n")

    async def close(self) -> None:
        if os.environ.get("TK_RECORD_HISTORIES"):
            await self.record_histories()
        for stop, _ in self._workers:
            stop.set()
        for _, task in self._workers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)
        if self._store is not None:
            await self._store.close()

    # -- clients ---------------------------------------------------------------
    async def store(self) -> SessionStore:
        if self._store is None:
            self._store = open_store(self.settings())
            await self._store.open()
        return self._store

    async def send(self, chat_id: str, text: str, message_id: str | None = None) -> WorkflowHandle[Any, Any]:
        settings = self.settings()
        return await tk.send_message(
            self.client, settings, chat_id, tk.new_message(text, settings, message_id=message_id)
        )

    async def signal_undecodable(self, chat_id: str, signal: str) -> None:
        """A signal whose payload no data converter reads (an unknown encoding), as
        any Temporal client could send it."""
        from temporalio.api.common.v1 import Payload, Payloads, WorkflowExecution
        from temporalio.api.workflowservice.v1 import SignalWorkflowExecutionRequest

        await self.client.workflow_service.signal_workflow_execution(
            SignalWorkflowExecutionRequest(
                namespace=self.client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=tk.workflow_id(chat_id)),
                signal_name=signal,
                input=Payloads(payloads=[Payload(metadata={"encoding": b"foo/bar"}, data=b"x")]),
            )
        )

    async def state(self, chat_id: str) -> TurnState:
        return await tk.query_state(self.client, chat_id)

    async def decide(
        self, chat_id: str, action: str, recovery_id: str | None = None, timeout: float = 20.0
    ) -> TurnState:
        """`continue`, `dismiss` or `stop` as a signal, and the state its decision led
        to; `tk.DecisionRefused` in the table's words."""
        return await tk.decide(self.client, chat_id, action, recovery_id, timeout=timeout)

    async def wait_state(
        self, chat_id: str, pred: Callable[[TurnState], bool], timeout: float = 30.0
    ) -> TurnState:
        deadline = time.monotonic() + timeout
        last: TurnState | None = None
        error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                last = await self.state(chat_id)
                if pred(last):
                    return last
            except Exception as err:
                error = err
            await asyncio.sleep(0.1)
        raise AssertionError(
            f"chat {chat_id}: state not reached in {timeout} s; last: {last}; last query error: {error!r}"
        )

    async def wait_turn_done(self, chat_id: str, turn: int, timeout: float = 30.0) -> TurnState:
        return await self.wait_state(
            chat_id, lambda s: s.turn == turn and s.status.value in ("completed", "recovered"), timeout
        )

    async def history(self, chat_id: str) -> list[dict[str, Any]]:
        return [m.public() for m in await (await self.store()).history(chat_id)]

    async def event_types(self, chat_id: str) -> list[str]:
        return [e.type for e in await (await self.store()).events(chat_id)]
