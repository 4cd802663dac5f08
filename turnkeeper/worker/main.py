"""The turnkeeper worker: connect to Temporal (or start the embedded dev server),
register the search attributes, create the reconcile schedule, and run `ChatTurn`
and `Reconcile` with their activities.

    turnkeeper worker         # or: python -m turnkeeper.worker, or python worker.py in a checkout
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from temporalio.client import Client
from temporalio.worker import (
    PollerBehavior,
    PollerBehaviorAutoscaling,
    PollerBehaviorSimpleMaximum,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkerDeploymentConfig,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from turnkeeper import mcp_config
from turnkeeper.activities.assemble import build_activities
from turnkeeper.activities.heartbeat import beat_interval
from turnkeeper.activities.providers import ModelProvider, load_provider
from turnkeeper.activities.tools import (
    ToolLoadError,
    ToolRegistry,
    default_registry,
    load_tool_modules,
)
from turnkeeper.client import connect, ensure_search_attributes
from turnkeeper.config import (
    ConfigError,
    Settings,
    import_from_working_directory,
)
from turnkeeper.reconcile_io import schedule_id
from turnkeeper.replay import registered_workflows
from turnkeeper.step_timeouts import StepTimeouts
from turnkeeper.store import (
    SessionStore,
    StoreError,
    StoreUnavailable,
    open_store,
)
from turnkeeper.telemetry import exporters as telemetry
from turnkeeper.telemetry import logs as worker_logs
from turnkeeper.worker.catch_up import CatchUpGuard
from turnkeeper.worker.dev_server import SEARCH_ATTRIBUTES, DevServerError
from turnkeeper.worker.loop_activations import LoopActivations
from turnkeeper.worker.reconcile_schedule import ensure_reconcile_schedule

if TYPE_CHECKING:
    from turnkeeper.activities.tools.mcp import McpTools

log = logging.getLogger("turnkeeper.worker")

# Short, so a dead worker's turns move to another worker within seconds.
STICKY_SCHEDULE_TO_START = timedelta(seconds=1)


def heartbeat_throttle(settings: Settings) -> timedelta:
    """The SDK holds heartbeats back for up to 0.8 x the timeout by default; ours
    must reach the server as they are made, or a dead worker is noticed later. Half
    a beat interval: a throttle as long as the interval holds some beats back by
    nearly a whole one."""
    return beat_interval(timedelta(seconds=settings.heartbeat_timeout)) / 2


# Workflow-task polls kept waiting by default, and the share of them on the shared
# queue (the SDK's default share): 40 wait on the worker's sticky queue, 10 on the
# shared one (see `poller_behaviors`).
WORKFLOW_TASK_POLLS = 50
SHARED_QUEUE_POLL_SHARE = 0.2


@dataclass(frozen=True)
class PollerBehaviors:
    workflow_tasks: PollerBehavior
    activity_tasks: PollerBehavior


def poller_behaviors(settings: Settings) -> PollerBehaviors:
    """A turn's later workflow tasks go to this worker's sticky queue; one that
    finds no poll waiting goes through the queue's backlog, a write and a read on
    the server. Autoscaling left about one such write per turn at 50 turns in
    flight; 50 fixed polls (40 sticky, 10 shared) halve that, and 10 shared polls
    still spread a burst over several workers. Activities mostly start eagerly, so
    their polls scale on the server's hints. A fixed `max_pollers` caps both, as
    a server before 1.28 needs."""
    if settings.max_pollers is not None:
        fixed = PollerBehaviorSimpleMaximum(settings.max_pollers)
        return PollerBehaviors(workflow_tasks=fixed, activity_tasks=fixed)
    return PollerBehaviors(
        workflow_tasks=PollerBehaviorSimpleMaximum(WORKFLOW_TASK_POLLS),
        activity_tasks=PollerBehaviorAutoscaling(),
    )


def event_loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The worker's event loop: uvloop unless `asyncio` is asked for (None: asyncio's own).
    Every task, activation and store call passes through the loop; uvloop cut the
    worker's CPU per turn by about a seventh (docs/performance.md)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "TURNKEEPER_EVENT_LOOP=uvloop, but uvloop is not installed "
                "(pip install uvloop; it runs on Linux and macOS)"
            ) from None
        return None  # auto: e.g. on Windows
    return uvloop.new_event_loop


def check_tools(settings: Settings, registry: ToolRegistry | None = None) -> None:
    registry = default_registry() if registry is None else registry
    try:
        load_tool_modules(settings.tool_modules)
    except ToolLoadError as err:
        if not isinstance(err.__cause__, (ModuleNotFoundError, ValueError)):
            # The module itself raised: where, in its own code, is worth showing.
            log.error("tool module %r raised while loading", err.name, exc_info=err.__cause__)
        raise ConfigError(f"TURNKEEPER_TOOL_MODULES: {err}") from None
    # A server's tools are enabled by its configuration; naming them here is allowed too.
    mcp_prefixes = tuple(f"{s.name}__" for s in mcp_servers(settings))
    unknown = [n for n in settings.tools if registry.get(n) is None and not n.startswith(mcp_prefixes)]
    if unknown:
        raise ConfigError(
            f"TURNKEEPER_TOOLS names unknown tools {unknown}; known: {sorted(registry.names())}"
        )
    for profile in settings.subagent_profiles:
        # A misspelt tool would quietly leave the subagent without it.
        unknown = [n for n in profile.tools if registry.get(n) is None and not n.startswith(mcp_prefixes)]
        if unknown:
            raise ConfigError(
                f"TURNKEEPER_SUBAGENT_PROFILES: profile {profile.name!r} names unknown tools {unknown}; "
                f"known: {sorted(registry.names())}"
            )
    from turnkeeper.activities.tools import sandbox

    sandbox.configure(settings.exec_sandbox)
    if "exec" in settings.tools and sandbox.enabled():
        try:
            sandbox.check()
        except sandbox.SandboxUnavailable as err:
            raise ConfigError(
                f"TURNKEEPER_TOOLS enables exec, whose commands run in a sandbox "
                f"(TURNKEEPER_EXEC_SANDBOX=auto), and none works here: {err}"
            ) from None


def mcp_servers(settings: Settings) -> list[mcp_config.McpServerConfig]:
    """TURNKEEPER_MCP_SERVERS's servers (docs/mcp.md); none when it is unset."""
    if settings.mcp_servers is None:
        return []
    try:
        return mcp_config.load(settings.mcp_servers)
    except mcp_config.McpConfigError as err:
        raise ConfigError(f"TURNKEEPER_MCP_SERVERS: {err}") from None


async def serve_mcp_tools(
    settings: Settings, registry: ToolRegistry | None = None
) -> tuple[Settings, ToolRegistry, McpTools | None]:
    """The worker's tools: the built-ins (or `registry`'s) and, with TURNKEEPER_MCP_SERVERS,
    its servers' (enabled by being configured), in a registry of its own. The SDK is imported
    only then."""
    registry = default_registry() if registry is None else registry
    servers = mcp_servers(settings)
    if not servers:
        return settings, registry, None
    from turnkeeper.activities.tools.mcp import McpTools

    mcp = await McpTools.start(servers, registry)
    tools = tuple(dict.fromkeys((*settings.tools, *mcp.names)))
    return dataclasses.replace(settings, tools=tools), mcp.registry, mcp


async def _open_store(store: SessionStore) -> None:
    """Open the store, waiting out an outage (locked, unreachable): a worker started
    while the store is down serves once it is back instead of exiting."""
    # By hand, not a RetryPolicy: no worker runs yet to retry an activity on.
    delay = 1.0
    while True:
        try:
            await store.open()
            return
        except StoreUnavailable as err:
            log.warning("the session store is unavailable, trying again in %.0f s: %s", delay, err)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 30.0)


def deployment_config(settings: Settings) -> WorkerDeploymentConfig | None:
    """TURNKEEPER_DEPLOYMENT_NAME and TURNKEEPER_BUILD_ID: this worker is that Worker
    Deployment Version, and every run that begins on it (`ChatTurn`, `Reconcile`) is
    pinned to it: a run ends on the build that began it; each turn is a new run, so
    new turns start on whichever version is current. None: unversioned
    (docs/operations.md, "Shipping a change to workflow code")."""
    deployment = settings.worker_deployment()
    if deployment is None:
        return None
    from temporalio.common import VersioningBehavior, WorkerDeploymentVersion

    version = WorkerDeploymentVersion(*deployment)
    log.info(
        "worker deployment version %s: runs that begin here are pinned to it", version.to_canonical_string()
    )
    return WorkerDeploymentConfig(
        version=version, use_worker_versioning=True, default_versioning_behavior=VersioningBehavior.PINNED
    )


async def _register_search_attributes(client: Client) -> None:
    try:
        added = await ensure_search_attributes(client, client.namespace)
        if added:
            log.info("registered search attributes %s", added)
    except Exception as err:
        log.warning(
            "could not check search attributes (%s); register %s as Keyword yourself",
            err,
            ", ".join(SEARCH_ATTRIBUTES),
        )


async def _create_reconcile_schedule(client: Client, settings: Settings, schedule_id: str) -> None:
    try:
        await ensure_reconcile_schedule(client, settings, schedule_id)
    except Exception as err:
        log.warning(
            "could not create the reconcile schedule %r (%s); interrupted turns whose run "
            "ended abnormally are not recovered until it exists",
            schedule_id,
            err,
        )


async def run_worker(
    settings: Settings,
    *,
    client: Client | None = None,
    stop: asyncio.Event | None = None,
    reconcile_schedule_id: str | None = None,
    provider: ModelProvider | None = None,
    registry: ToolRegistry | None = None,
) -> None:
    """Serve until `stop` is set (or SIGTERM/SIGINT when `stop` is None).
    `reconcile_schedule_id`: the task queue's own (`reconcile_io.schedule_id`) unless given.
    `provider` and `registry` stand in for TURNKEEPER_MODEL's provider and the default tool
    registry (turnkeeper.testing passes a test's own)."""
    check_tools(settings, registry)
    versioning = deployment_config(settings)
    telemetry.check_tracing(settings)
    worker_logs.install(encrypted=bool(settings.encryption_keys))
    if provider is None:
        try:
            provider = load_provider(settings.model, env=settings.provider_env())
        except ValueError as err:
            raise ConfigError(f"TURNKEEPER_MODEL: {err}") from None
    if client is None:
        # Before any client connects: the runtime they share serves /metrics.
        telemetry.use_metrics_runtime(settings)
    elif settings.metrics_address:
        log.warning(
            "TURNKEEPER_METRICS_ADDRESS is not used: this worker was given a client, "
            "whose runtime decides where its metrics go"
        )
    store = open_store(settings)
    await _open_store(store)
    if client is None:
        client = await connect(settings, start_dev_server=True)
    # Traced (OTEL_EXPORTER_OTLP_ENDPOINT): the worker's workflows and activities, and the
    # runs the reconciler starts; the schedule below is created without it.
    plain, client = client, telemetry.traced(client, settings, "turnkeeper-worker")
    # Neither needs the other, and neither raises: both round trips at once, so the
    # worker polls one round trip sooner (no pass can run before it polls).
    await asyncio.gather(
        _register_search_attributes(client),
        _create_reconcile_schedule(
            plain, settings, reconcile_schedule_id or schedule_id(settings.task_queue)
        ),
    )
    settings.workspace.mkdir(parents=True, exist_ok=True)
    settings, registry, mcp = await serve_mcp_tools(settings, registry)
    pollers = poller_behaviors(settings)
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=registered_workflows(),  # what `turnkeeper replay` replays against
        interceptors=[StepTimeouts(settings)],
        activities=build_activities(settings, store, provider, registry),
        max_cached_workflows=settings.max_cached_workflows,
        # A query's catch-up is refused before the workflow sees it (catch_up.py).
        workflow_runner=CatchUpGuard(
            SandboxedWorkflowRunner() if settings.workflow_sandbox else UnsandboxedWorkflowRunner()
        ),
        # Our own workflow code, unsandboxed: activations run on this loop (loop_activations.py).
        workflow_task_executor=None if settings.workflow_sandbox else LoopActivations(),
        sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
        max_heartbeat_throttle_interval=heartbeat_throttle(settings),
        default_heartbeat_throttle_interval=heartbeat_throttle(settings),
        workflow_task_poller_behavior=pollers.workflow_tasks,
        nonsticky_to_sticky_poll_ratio=SHARED_QUEUE_POLL_SHARE,
        activity_task_poller_behavior=pollers.activity_tasks,
        # Running tools get this long to finish on SIGTERM; a model call is
        # handed to the next worker at once.
        graceful_shutdown_timeout=timedelta(seconds=settings.shutdown_grace),
        deployment_config=versioning,
        # A turn whose history does not replay (a bad deploy) is not failed here: its
        # workflow task fails and is retried, so the turn waits for a rollback. A run
        # whose task keeps failing is ended by the reconciler and recovered, its
        # messages in order (activities/reconcile/wedged_runs.py).
    )
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    # Names, paths and key ids only: keys and URLs with credentials are never logged.
    key_ids = [k.key_id for k in settings.encryption_keys]
    payloads = (
        f"encrypted under key {key_ids[0]!r}, decrypted with {','.join(key_ids)}" if key_ids else "plain"
    )
    log.info(
        "worker serving task queue %r (model %s, tools %s, workspace %s, store %s, event loop %s, "
        "payloads %s)",
        settings.task_queue,
        settings.model,
        ",".join(settings.tools),
        settings.workspace,
        type(store).__name__,
        type(asyncio.get_running_loop()).__module__.split(".")[0],
        payloads,
    )
    try:
        async with worker:
            await stop.wait()
            log.info("shutting down: running tools get %d s to finish", settings.shutdown_grace)
    finally:
        if mcp is not None:
            await mcp.aclose()
        await provider.aclose()
        await store.close()
        telemetry.flush_traces()


def main() -> None:
    import_from_working_directory()
    code = 0
    try:
        settings = Settings.from_env()
        logging.basicConfig(
            level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        with asyncio.Runner(loop_factory=event_loop_factory(settings.event_loop)) as runner:
            runner.run(run_worker(settings))
    except ConfigError as err:
        print(f"turnkeeper: configuration error: {err}", file=sys.stderr)
        code = 2
    except (DevServerError, StoreError) as err:
        # What the user must fix outside the code (a port, a database): no traceback.
        print(f"turnkeeper: cannot start: {err}", file=sys.stderr)
        code = 1
    except Exception as err:
        log.exception("worker failed: %s", err)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # A Temporal runtime can abort at interpreter exit (sdk-python #300).
    os._exit(code)


if __name__ == "__main__":
    main()
