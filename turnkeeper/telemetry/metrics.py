"""turnkeeper's own metrics (docs/operations.md, "Metrics"): names, labels, and
how each is recorded.

They go through the SDK's metric meters (`workflow.metric_meter()`,
`activity.metric_meter()`), so the worker's Prometheus exporter serves them
next to the SDK's `temporal_*` metrics, and a workflow's replay records nothing.
Without TURNKEEPER_METRICS_ADDRESS the meters are no-ops. No I/O: safe to
import from workflow code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the meter comes from the SDK's runtime; the CLI imports this module too
    from temporalio.common import MetricMeter

    from turnkeeper.statuses import Reason, TurnStatus

# The names Prometheus shows: the exporter adds `_total` to a counter's name and the
# unit to a histogram's (turnkeeper/telemetry/exporters.py), as Prometheus's conventions ask.
TURNS = "turnkeeper_turns_total"
GATES = "turnkeeper_gates_total"
TOOL_CALLS = "turnkeeper_tool_calls_total"
MODEL_CALL_SECONDS = "turnkeeper_model_call_seconds"

# Seconds; a model call takes from a fraction of a second to minutes.
MODEL_CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# The `reason` of a turn that completed: it has none.
NO_REASON = "none"
# The `tool` of a call naming no enabled tool: the model chose the name, so it is
# not a label value (parentheses are never part of a tool's name).
UNKNOWN_TOOL = "(unknown)"


def turn_ended(meter: MetricMeter, status: TurnStatus, reason: Reason | None) -> None:
    meter.create_counter(meter_name(TURNS), "Turns ended, by final status and reason").add(
        1, {"status": status.value, "reason": reason.value if reason else NO_REASON}
    )


def gate_opened(meter: MetricMeter, reason: str) -> None:
    meter.create_counter(meter_name(GATES), "Gates opened (a turn waits for its user), by reason").add(
        1, {"reason": reason}
    )


def tool_called(meter: MetricMeter, tool: str, outcome: str) -> None:
    meter.create_counter(meter_name(TOOL_CALLS), "Tool calls, by tool and outcome").add(
        1, {"tool": tool, "outcome": outcome}
    )


def model_call_took(meter: MetricMeter, seconds: float) -> None:
    meter.create_histogram_float(
        meter_name(MODEL_CALL_SECONDS), "Model provider calls, answered or failed", "seconds"
    ).record(seconds)


def meter_name(exported: str) -> str:
    """The name a meter is given: the exporter adds the suffix back."""
    return exported.removesuffix("_total").removesuffix("_seconds")
