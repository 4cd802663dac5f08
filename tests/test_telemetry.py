"""Metrics and traces (docs/operations.md): a real worker process serves /metrics
with the SDK's and turnkeeper's metrics after real turns, a gate and a Continue;
an in-memory span exporter sees one turn's span tree."""
from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support import Stack, until_async
from turnkeeper import client as tk
from turnkeeper import metrics, telemetry
from turnkeeper.config import ConfigError, Settings
from turnkeeper.models import TurnStatus
from turnkeeper.testing import FakeChatServer

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample in Prometheus text."""
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            name, labels, value = match.groups()
            yield name, dict(_LABEL.findall(labels or "")), float(value)


def value(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for n, ls, v in samples(text) if n == name and labels.items() <= ls.items())


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        return response.read().decode()


def free_address() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_the_worker_serves_sdk_and_turnkeeper_metrics(stack: Stack) -> None:
    """One chat: a turn with two tool calls (one the model made up) whose next model
    call fails (a gate), Continue, and a second turn that completes."""
    address = free_address()
    with FakeChatServer() as server:
        server.script([
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}},
                            {"name": "no_such_tool", "arguments": {}}]},
            {"status": 401, "message": "bad key"},  # permanent: the turn asks its user
            {"text": "done after Continue"},
            {"text": "second turn"},
        ])
        worker = stack.spawn_worker(TURNKEEPER_METRICS_ADDRESS=address, TURNKEEPER_MODEL="openai:fake-model",
                                    OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="k")
        await stack.wait_serving(worker)
        chat = stack.chat("metrics")
        await stack.send(chat, "write a.txt")
        gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
        assert gate.reason is not None and gate.reason.value == "model_failed"
        await tk.decide(stack.client, chat, "continue_turn", gate.recovery_id or "")
        await stack.wait_turn_done(chat, 1)
        await stack.send(chat, "once more")
        await stack.wait_turn_done(chat, 2)

        expected = {
            (metrics.TURNS, (("status", "recovered"), ("reason", "continued"))): 1,
            (metrics.TURNS, (("status", "completed"), ("reason", "none"))): 1,
            (metrics.GATES, (("reason", "model_failed"),)): 1,
            (metrics.TOOL_CALLS, (("tool", "write_file"), ("outcome", "done"))): 1,
            (metrics.TOOL_CALLS, (("tool", metrics.UNKNOWN_TOOL), ("outcome", "error"))): 1,
            (f"{metrics.MODEL_CALL_SECONDS}_count", ()): 4,  # answered or failed
        }
        text = ""

        async def counted() -> bool:
            nonlocal text
            text = scrape(address)
            return all(value(text, name, **dict(labels)) == n for (name, labels), n in expected.items())

        try:
            await until_async(counted, timeout=15, what="the expected metrics")
        except AssertionError:
            raise AssertionError("\n".join(line for line in text.splitlines() if "turnkeeper_" in line)) from None
    # Only these turnkeeper series: the turn has no other end, the model no other tool.
    assert value(text, metrics.TURNS) == 2 and value(text, metrics.GATES) == 1
    assert value(text, metrics.TOOL_CALLS) == 2
    assert 0 < value(text, f"{metrics.MODEL_CALL_SECONDS}_sum") < 60
    assert value(text, f"{metrics.MODEL_CALL_SECONDS}_bucket", le="+Inf") == 4
    # The SDK's own, from the same endpoint, for our queue.
    assert value(text, "temporal_workflow_task_execution_latency_count", task_queue=stack.task_queue,
                 workflow_type="ChatTurn") > 0
    assert value(text, "temporal_activity_execution_latency_count", task_queue=stack.task_queue,
                 activity_type="turnkeeper.tool_call") == 2


def test_a_bad_metrics_address_is_refused_with_its_name() -> None:
    for raw in ("9464", "host:", ":9464", "host:http", "host:70000"):
        with pytest.raises(ConfigError, match="TURNKEEPER_METRICS_ADDRESS must be host:port"):
            Settings.from_env({"TURNKEEPER_METRICS_ADDRESS": raw})
    assert Settings.from_env({"TURNKEEPER_METRICS_ADDRESS": "0.0.0.0:9464"}).metrics_address == "0.0.0.0:9464"


def test_an_address_in_use_is_a_configuration_error() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ConfigError, match=f"TURNKEEPER_METRICS_ADDRESS={address}: .*in use"):
            telemetry.metrics_runtime(Settings(metrics_address=address))


def test_without_the_variables_nothing_changes() -> None:
    settings = Settings()
    assert telemetry.metrics_runtime(settings) is None
    sentinel = object()
    assert telemetry.traced(sentinel, settings, "x") is sentinel  # type: ignore[arg-type]
    assert telemetry.traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
