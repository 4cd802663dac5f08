"""`python worker.py` as a user runs it: with TEMPORAL_ADDRESS unset it starts
the embedded dev server, a later worker reuses it, SIGTERM exits cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sqlite3
import time

import pytest
from temporalio.client import Client

from tests.support import Stack, free_port
from turnkeeper import client as tk
from turnkeeper.config import Settings
from turnkeeper.worker.dev_server import is_healthy, stop_dev_server

pytestmark = pytest.mark.crash


async def _wait_healthy(address: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await is_healthy(address):
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"no healthy server at {address}")


async def test_embedded_dev_server_outlives_a_killed_worker(stack: Stack) -> None:
    port, ui = free_port(), free_port()
    embedded = {
        "TEMPORAL_ADDRESS": "",
        "TURNKEEPER_DEV_SERVER_PORT": str(port),
        "TURNKEEPER_DEV_UI_PORT": str(ui),
        "TURNKEEPER_TASK_QUEUE": "turnkeeper",
    }
    stack.script([{"text": "one"}, {"text": "two"}])
    settings = Settings.from_env(stack.env(**embedded))
    address = f"127.0.0.1:{port}"
    try:
        first = stack.spawn_worker(**embedded)
        await _wait_healthy(address)
        db = settings.data_dir / "temporal.db"
        assert db.exists()
        # WAL (SQLITE_PRAGMAS): without it every server transaction waits for fsyncs.
        with contextlib.closing(sqlite3.connect(db)) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        client = await Client.connect(address, data_converter=tk.data_converter(settings))
        chat = stack.chat()
        handle = await tk.send_message(client, settings, chat, tk.new_message("a", settings))
        assert (await handle.result()).turn == 1

        stack.kill(first)  # SIGKILL: the server, in its own session, keeps serving
        assert await is_healthy(address)
        second = stack.spawn_worker(**embedded)
        handle = await tk.send_message(client, settings, chat, tk.new_message("b", settings))
        assert (await asyncio.wait_for(handle.result(), 60)).turn == 2
        log = (stack.dir / "worker1.log").read_text()
        assert "reusing the Temporal dev server" in log
        assert "event loop uvloop" in log  # TURNKEEPER_EVENT_LOOP=auto, uvloop installed

        os.killpg(second.pid, signal.SIGTERM)
        assert second.wait(timeout=60) == 0
        assert "shutting down" in (stack.dir / "worker1.log").read_text()
    finally:
        with contextlib.suppress(Exception):
            stop_dev_server(settings)


async def test_bad_configuration_is_a_clear_error(stack: Stack) -> None:
    proc = stack.spawn_worker(TURNKEEPER_TOOLS="read_file,teleport")
    assert proc.wait(timeout=60) == 2
    log = (stack.dir / "worker0.log").read_text()
    assert "teleport" in log and "configuration error" in log
    proc = stack.spawn_worker(TURNKEEPER_MODEL="gpt-nonsense")
    assert proc.wait(timeout=60) == 2
    assert "TURNKEEPER_MODEL" in (stack.dir / "worker1.log").read_text()
    proc = stack.spawn_worker(TURNKEEPER_TOOL_MODULES="tk_no_such_tools")
    assert proc.wait(timeout=60) == 2
    log = (stack.dir / "worker2.log").read_text()
    assert "TURNKEEPER_TOOL_MODULES: cannot load tool module 'tk_no_such_tools'" in log
    assert "Traceback" not in log
    proc = stack.spawn_worker(TURNKEEPER_EVENT_LOOP="trio")
    assert proc.wait(timeout=60) == 2
    assert (
        "TURNKEEPER_EVENT_LOOP must be one of auto, uvloop, asyncio, got 'trio'"
        in (stack.dir / "worker3.log").read_text()
    )


async def test_a_taken_port_is_a_clear_error(stack: Stack) -> None:
    """The embedded server cannot bind its UI port: the worker says which variables
    to set, without a traceback, and exits 1."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = stack.spawn_worker(
            TEMPORAL_ADDRESS="",
            TURNKEEPER_DATA_DIR=str(stack.dir / "own"),
            TURNKEEPER_DEV_SERVER_PORT=str(free_port()),
            TURNKEEPER_DEV_UI_PORT=str(taken.getsockname()[1]),
        )
        assert proc.wait(timeout=60) == 1
    log = (stack.dir / "worker0.log").read_text()
    assert "address already in use" in log and "TURNKEEPER_DEV_UI_PORT" in log
    assert "Traceback" not in log
