"""Metrics and traces (docs/operations.md): a real worker process serves /metrics
with the SDK's and turnkeeper's metrics after real turns, a gate and a Continue;
an in-memory span exporter sees one turn's span tree."""

from __future__ import annotations

import re
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import Stack, free_port, until_async
from turnkeeper import client as tk
from turnkeeper.config import ConfigError, Settings
from turnkeeper.models import TurnStatus
from turnkeeper.telemetry import exporters as telemetry
from turnkeeper.telemetry import metrics
from turnkeeper.testing import FakeChatServer

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
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
    return f"127.0.0.1:{free_port()}"


async def test_the_worker_serves_sdk_and_turnkeeper_metrics(stack: Stack) -> None:
    """One chat: a turn with two tool calls (one the model made up) whose next model
    call fails (a gate), Continue, and a second turn that completes."""
    address = free_address()
    with FakeChatServer() as server:
        server.script(
            [
                {
                    "tool_calls": [
                        {"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}},
                        {"name": "no_such_tool", "arguments": {}},
                    ]
                },
                {"status": 401, "message": "bad key"},  # permanent: the turn asks its user
                {"text": "done after Continue"},
                {"text": "second turn"},
            ]
        )
        worker = stack.spawn_worker(
            TURNKEEPER_METRICS_ADDRESS=address,
            TURNKEEPER_MODEL="openai:fake-model",
            OPENAI_BASE_URL=server.base_url,
            OPENAI_API_KEY="k",
        )
        await stack.wait_serving(worker)
        chat = stack.chat("metrics")
        await stack.send(chat, "write a.txt")
        gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
        assert gate.reason is not None and gate.reason.value == "model_failed"
        await stack.decide(chat, "continue", gate.recovery_id)
        await stack.wait_turn_done(chat, 1)
        # The run closes first: a message that reaches the task completing it fails
        # that task (UnhandledCommand), and its retry counts the turn's end again.
        await stack.client.get_workflow_handle(tk.workflow_id(chat)).result()
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
            raise AssertionError(
                "\n".join(line for line in text.splitlines() if "turnkeeper_" in line)
            ) from None
    # Only these turnkeeper series: the turn has no other end, the model no other tool.
    assert value(text, metrics.TURNS) == 2 and value(text, metrics.GATES) == 1
    assert value(text, metrics.TOOL_CALLS) == 2
    assert 0 < value(text, f"{metrics.MODEL_CALL_SECONDS}_sum") < 60
    assert value(text, f"{metrics.MODEL_CALL_SECONDS}_bucket", le="+Inf") == 4
    assert value(text, f"{metrics.MODEL_CALL_SECONDS}_bucket", le="300") == 4  # our buckets, not the SDK's
    # Prometheus's conventions for the SDK's own too: `_total` counters, durations in seconds.
    assert value(text, "temporal_workflow_completed_total", workflow_type="ChatTurn") >= 1
    # The SDK's own, from the same endpoint, for our queue.
    assert (
        value(
            text,
            "temporal_workflow_task_execution_latency_seconds_count",
            task_queue=stack.task_queue,
            workflow_type="ChatTurn",
        )
        > 0
    )
    assert (
        value(
            text,
            "temporal_activity_execution_latency_seconds_count",
            task_queue=stack.task_queue,
            activity_type="turnkeeper.tool_call",
        )
        == 2
    )


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


def test_traces_without_the_otel_extra_are_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as when it is not installed
    settings = Settings(otlp_endpoint="http://127.0.0.1:4318")
    with pytest.raises(
        ConfigError, match=r"OTEL_EXPORTER_OTLP_ENDPOINT is set, .*pip install 'turnkeeper\[otel\]'"
    ):
        telemetry.check_tracing(settings)
    telemetry.check_tracing(Settings())  # unset: nothing to check


def test_without_the_variables_nothing_changes() -> None:
    settings = Settings()
    assert telemetry.metrics_runtime(settings) is None
    sentinel = object()
    assert telemetry.traced(sentinel, settings, "x") is sentinel  # type: ignore[arg-type]
    assert telemetry.traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"


@pytest.fixture(scope="module")
def spans() -> Iterator[Any]:
    """The process's tracer provider, exporting to memory (a process sets it once;
    the worker then keeps it rather than setting up its own OTLP exporter)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    assert trace.get_tracer_provider() is provider, "another test set the process's tracer provider"
    yield exporter
    exporter.clear()


async def test_a_turn_is_one_trace_of_its_workflow_model_and_tool_calls(stack: Stack, spans: Any) -> None:
    stack.script(
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}]},
            {"text": "wrote a.txt"},
        ]
    )
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}  # unused: the provider above exports
    await stack.start_worker(**otel)
    settings = stack.settings(**otel)
    client = telemetry.traced(stack.client, settings, "turnkeeper-test")  # as the CLI's `send`
    chat = stack.chat("traced")
    handle = await tk.send_message(client, settings, chat, tk.new_message("write a.txt", settings))
    assert (await handle.result()).status == TurnStatus.COMPLETED

    def tree() -> list[Any]:
        roots = [
            s
            for s in spans.get_finished_spans()
            if s.name == "SignalWithStartWorkflow:ChatTurn"
            and s.attributes.get("temporalWorkflowID") == tk.workflow_id(chat)
        ]
        assert len(roots) == 1, roots
        return [s for s in spans.get_finished_spans() if s.context.trace_id == roots[0].context.trace_id]

    async def complete() -> bool:
        return any(s.name == "CompleteWorkflow:ChatTurn" for s in tree())

    await until_async(complete, timeout=10, what="the turn's spans")
    trace_spans = tree()
    by_id = {s.context.span_id: s for s in trace_spans}

    def parent(span: Any) -> str | None:
        return by_id[span.parent.span_id].name if span.parent is not None else None

    def named(name: str) -> list[Any]:
        return [s for s in trace_spans if s.name == name]

    [root] = named("SignalWithStartWorkflow:ChatTurn")
    assert root.parent is None
    [run] = named("RunWorkflow:ChatTurn")
    assert parent(run) == root.name and run.attributes["temporalRunID"] == handle.result_run_id
    # The workflow schedules each step; the worker's activity span is the step's child.
    for step, count in (("turnkeeper.model_call", 2), ("turnkeeper.tool_call", 1)):
        started, ran = named(f"StartActivity:{step}"), named(f"RunActivity:{step}")
        assert len(started) == len(ran) == count, (step, [s.name for s in trace_spans])
        assert {parent(s) for s in started} == {root.name}
        assert sorted(r.parent.span_id for r in ran) == sorted(s.context.span_id for s in started)
        assert all(r.attributes["temporalWorkflowID"] == tk.workflow_id(chat) for r in ran)
        assert all(r.end_time >= r.start_time for r in ran)
    # A plain turn's store writes ride in its steps: no other activity runs.
    assert sorted({s.name for s in trace_spans if s.name.startswith("RunActivity:")}) == [
        "RunActivity:turnkeeper.model_call",
        "RunActivity:turnkeeper.tool_call",
    ]
