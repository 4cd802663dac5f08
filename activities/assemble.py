"""Everything a worker registers, built from one set of settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from turnkeeper.activities.model_call import ModelCallActivity
from turnkeeper.activities.providers import ModelProvider
from turnkeeper.activities.reconcile.quiet_passes import QuietPasses
from turnkeeper.activities.reconcile.reconciler import Reconciler
from turnkeeper.activities.store_activities import StoreActivities
from turnkeeper.activities.subagent_activities import SubagentActivities
from turnkeeper.activities.tool_call import ToolCallActivity
from turnkeeper.activities.tools import ToolRegistry
from turnkeeper.config import Settings
from turnkeeper.store import SessionStore


def build_activities(
    settings: Settings, store: SessionStore, provider: ModelProvider, registry: ToolRegistry
) -> list[Callable[..., Any]]:
    # Which tools ask first reaches each turn with its settings (recorded in its history).
    writes = StoreActivities(settings, store, registry.confirm_names(settings.tools, settings.confirm_tools))
    model = ModelCallActivity(settings, store, provider, registry, begin=writes.begin)
    tools = ToolCallActivity(settings, store, registry)
    reconciler = Reconciler(settings, store)
    quiet = QuietPasses(settings)
    subagents = SubagentActivities(settings, store)
    return [
        model.model_call,
        tools.tool_call,
        writes.begin_turn,
        writes.adopt_turn,
        writes.held_messages,
        writes.record_tool_result,
        writes.commit_messages,
        writes.record_assistant,
        writes.update_turn,
        writes.finish_turn,
        writes.append_events,
        subagents.subagent_start,
        subagents.subagent_result,
        subagents.report_to_parent,
        reconciler.reconcile_pass,
        quiet.delete_quiet_passes,
    ]
