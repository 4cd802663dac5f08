"""A deploy with Worker Deployment Versioning: two worker processes of one
deployment, builds "a" and "b". A turn waiting at a gate when "b" is made current
stays pinned to "a" and finishes there; the next turn starts on "b"; once "a" is
stopped, turns go on on "b"."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest
from temporalio.api.enums.v1 import (
    EventType,
    RoutingConfigUpdateState,
    VersioningBehavior,
)
from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest

from tests.support import Stack
from turnkeeper import client as tk
from turnkeeper.config import ConfigError, Settings
from turnkeeper.models import Reason, TurnStatus
from turnkeeper.worker.dev_server import temporal_binary
from turnkeeper.worker.main import deployment_config

pytestmark = pytest.mark.crash


def test_a_versioned_worker_needs_a_deployment_name_and_a_build_id() -> None:
    assert deployment_config(Settings.from_env({})) is None
    config = deployment_config(
        Settings.from_env({"TURNKEEPER_DEPLOYMENT_NAME": "turnkeeper", "TURNKEEPER_BUILD_ID": "0.2.0"})
    )
    assert config is not None and config.use_worker_versioning
    assert config.version.to_canonical_string() == "turnkeeper.0.2.0"
    assert config.default_versioning_behavior == VersioningBehavior.VERSIONING_BEHAVIOR_PINNED
    for env, message in (
        ({"TURNKEEPER_BUILD_ID": "0.2.0"}, "TURNKEEPER_BUILD_ID is set but TURNKEEPER_DEPLOYMENT"),
        ({"TURNKEEPER_DEPLOYMENT_NAME": "tk"}, "TURNKEEPER_DEPLOYMENT_NAME is set but"),
        ({"TURNKEEPER_DEPLOYMENT_NAME": "tk.1"}, "without `.`"),
        ({"TURNKEEPER_BUILD_ID": "0.2 rc"}, "without spaces"),
    ):
        with pytest.raises(ConfigError, match=message):
            deployment_config(Settings.from_env(env))


async def _set_current(stack: Stack, deployment: str, build_id: str, timeout: float = 30.0) -> None:
    """The operator's step, as docs/operations.md gives it: `temporal worker deployment
    set-current-version`. A version exists once its worker polls: until then the
    server answers that it knows no such deployment or version, and we ask again.
    Then until the task queue routes by the new version."""
    cmd = [
        temporal_binary(),
        "worker",
        "deployment",
        "set-current-version",
        "--address",
        stack.address,
        "--deployment-name",
        deployment,
        "--build-id",
        build_id,
        "--yes",
    ]
    deadline = time.monotonic() + timeout
    while True:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        if proc.returncode == 0:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"set-current-version {build_id}: {out.decode(errors='replace')}")
        await asyncio.sleep(0.3)
    request = DescribeWorkerDeploymentRequest(namespace=stack.client.namespace, deployment_name=deployment)
    while True:
        info = (
            await stack.client.workflow_service.describe_worker_deployment(request)
        ).worker_deployment_info
        current = info.routing_config.current_deployment_version.build_id
        if current == build_id and info.routing_config_update_state in (
            RoutingConfigUpdateState.ROUTING_CONFIG_UPDATE_STATE_COMPLETED,
            RoutingConfigUpdateState.ROUTING_CONFIG_UPDATE_STATE_UNSPECIFIED,
        ):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"version {build_id} not current in {timeout} s: {info}")
        await asyncio.sleep(0.2)


async def _builds(stack: Stack, chat: str, run_id: str) -> tuple[set[str], set[Any]]:
    """The build ids, and the versioning behaviours, of the workflow tasks a run completed."""
    history = await stack.client.get_workflow_handle(tk.workflow_id(chat), run_id=run_id).fetch_history()
    done = [
        e.workflow_task_completed_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]
    assert done
    return {a.deployment_version.build_id for a in done}, {a.versioning_behavior for a in done}


async def test_a_waiting_turn_finishes_on_its_build_and_the_next_turn_starts_on_the_new_one(
    stack: Stack,
) -> None:
    deployment = f"deploy-{stack.task_queue}"
    stack.env_extra.update(
        {"TURNKEEPER_CONFIRM_TOOLS": "write_file", "TURNKEEPER_DEPLOYMENT_NAME": deployment}
    )
    stack.script(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "approved.txt", "content": "on a"}}
                ]
            },
            {"text": "written"},
            {"text": "second turn"},
            {"text": "third turn"},
        ]
    )
    a = stack.spawn_worker(TURNKEEPER_BUILD_ID="a")
    await stack.wait_serving(a)
    await _set_current(stack, deployment, "a")

    chat = stack.chat("deploy")
    handle = await stack.send(chat, "write approved.txt")
    gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER, timeout=30)
    assert gate.reason == Reason.APPROVAL_REQUIRED and gate.recovery_id
    first_run = (await handle.describe()).run_id

    # The deploy: build "b" serves and is made current while turn 1 waits. "a" keeps
    # serving: its pinned run needs a worker of its own build (it drains).
    b = stack.spawn_worker(TURNKEEPER_BUILD_ID="b")
    await stack.wait_serving(b)
    await _set_current(stack, deployment, "b")

    gated = stack.client.get_workflow_handle(tk.workflow_id(chat), run_id=first_run)
    await gated.signal("continue", {"recovery_id": gate.recovery_id})
    done = await stack.wait_turn_done(chat, 1, timeout=30)
    assert done.status == TurnStatus.COMPLETED
    assert (stack.ws / "approved.txt").read_text() == "on a"
    info = (await gated.describe()).raw_description.workflow_execution_info.versioning_info
    assert (info.behavior, info.deployment_version.build_id) == (
        VersioningBehavior.VERSIONING_BEHAVIOR_PINNED,
        "a",
    )
    assert await _builds(stack, chat, first_run) == ({"a"}, {VersioningBehavior.VERSIONING_BEHAVIOR_PINNED})

    # A new message after it is a new run: it starts on the current version.
    second = await stack.send(chat, "and again")
    await stack.wait_turn_done(chat, 2, timeout=30)
    second_run = (await second.describe()).run_id
    assert second_run != first_run
    assert await _builds(stack, chat, second_run) == ({"b"}, {VersioningBehavior.VERSIONING_BEHAVIOR_PINNED})

    # Drained: "a" stops (SIGTERM, gracefully) and turns go on on "b".
    stack.kill(a, signal.SIGTERM)
    assert a.returncode == 0
    third = await stack.send(chat, "once more")
    await stack.wait_turn_done(chat, 3, timeout=30)
    assert await _builds(stack, chat, (await third.describe()).run_id) == (
        {"b"},
        {VersioningBehavior.VERSIONING_BEHAVIOR_PINNED},
    )
    assert [
        m["content"] for m in await stack.history(chat) if m["role"] == "assistant" and m.get("content")
    ] == ["written", "second turn", "third turn"]
