"""Metrics and traces (docs/operations.md, "Metrics" and "Traces").

Metrics: with TURNKEEPER_METRICS_ADDRESS set, the worker's Temporal runtime
serves Prometheus text at http://ADDRESS/metrics: the SDK's `temporal_*`
metrics and turnkeeper's (turnkeeper/telemetry/metrics.py), on one exporter.

Traces: with OTEL_EXPORTER_OTLP_ENDPOINT set, Temporal's `TracingInterceptor`
on the clients of the worker, the CLI and the web process sends spans of
turns, model calls and tool calls to that OTLP/HTTP collector. OpenTelemetry
is imported only then, so the CLI starts as fast without it.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from turnkeeper.config import ConfigError, Settings
from turnkeeper.telemetry.metrics import MODEL_CALL_BUCKETS, MODEL_CALL_SECONDS, meter_name

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.runtime import Runtime

log = logging.getLogger("turnkeeper.telemetry")

# Set when this process set up the tracer provider: flushed on the way out.
_provider: Any = None
# How long a process waits, on its way out, for its last spans to reach the collector.
FLUSH_TIMEOUT_MS = 3000


def metrics_runtime(settings: Settings) -> Runtime | None:
    """A Temporal runtime that serves Prometheus text at TURNKEEPER_METRICS_ADDRESS
    (None when it is unset). Clients connected on it, and their workers, report there."""
    if not settings.metrics_address:
        return None
    from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

    # Prometheus's conventions: counters end in `_total`, durations are in seconds
    # and named with their unit.
    prometheus = PrometheusConfig(
        bind_address=settings.metrics_address,
        counters_total_suffix=True,
        unit_suffix=True,
        durations_as_seconds=True,
        histogram_bucket_overrides={meter_name(MODEL_CALL_SECONDS): list(MODEL_CALL_BUCKETS)},
    )
    try:
        return Runtime(telemetry=TelemetryConfig(metrics=prometheus))
    except ValueError as err:  # e.g. the address is in use
        raise ConfigError(f"TURNKEEPER_METRICS_ADDRESS={settings.metrics_address}: {err}") from None


def use_metrics_runtime(settings: Settings) -> bool:
    """Make the metrics runtime the process's default, so the clients it connects
    next report there. True when metrics are on."""
    runtime = metrics_runtime(settings)
    if runtime is None:
        return False
    from temporalio.runtime import Runtime

    Runtime.set_default(runtime, error_if_already_set=False)
    log.info("metrics at http://%s/metrics", settings.metrics_address)
    return True


def traced(client: Client, settings: Settings, service: str) -> Client:
    """`client` with Temporal's tracing interceptor when OTEL_EXPORTER_OTLP_ENDPOINT
    is set (the same connection); `client` itself otherwise. A worker made from
    the result traces its workflows and activities too."""
    if not settings.otlp_endpoint:
        return client
    check_tracing(settings)
    from temporalio.client import Client
    from temporalio.contrib.opentelemetry import TracingInterceptor

    _set_up_provider(settings.otlp_endpoint, service)
    config = client.config()
    config["interceptors"] = [*config["interceptors"], TracingInterceptor()]
    return Client(**config)


def check_tracing(settings: Settings) -> None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT set, a configuration error unless the
    `otel` extra is installed (at start-up, not at the first traced call)."""
    if not settings.otlp_endpoint:
        return
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
        import temporalio.contrib.opentelemetry  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_ENDPOINT is set, but OpenTelemetry is not installed ({err}); "
            "pip install 'turnkeeper[otel]'"
        ) from None


def traces_url(endpoint: str) -> str:
    """Where spans go: OTEL_EXPORTER_OTLP_ENDPOINT with the traces path after it,
    as the OTLP/HTTP exporter reads that variable."""
    return endpoint.rstrip("/") + "/v1/traces"


def _set_up_provider(endpoint: str, service: str) -> None:
    global _provider
    from opentelemetry import trace

    if _provider is not None or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return  # set up already, here or by the application embedding us: its exporters get the spans
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # OTEL_SERVICE_NAME and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT win, as elsewhere in OpenTelemetry.
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
    own_url = None if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") else traces_url(endpoint)
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=own_url)))
    trace.set_tracer_provider(provider)
    _provider = provider
    # The host only: a URL may carry credentials, which are never logged.
    log.info(
        "traces go to the OTLP collector at %s",
        urlsplit(own_url or os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]).hostname,
    )


def flush_traces() -> None:
    """Send the spans still buffered, waiting a bounded time (a process that
    ends with os._exit would lose them)."""
    if _provider is not None:
        _provider.force_flush(FLUSH_TIMEOUT_MS)
