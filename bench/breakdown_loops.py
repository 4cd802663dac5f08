"""Workflows for bench/overhead_breakdown.py: the bare loop of bench/bare_loop.py
with one of turnkeeper's contract extras added at a time. In a module of their
own so the workflow sandbox can import them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from bench.bare_loop import bare_loop

NOOP = "breakdown.noop"


@workflow.defn(name="BreakdownPlain")
class Plain:
    """The bare loop; started with or without search attributes."""

    @workflow.run
    async def run(self, turn_id: str) -> str:
        return await bare_loop(turn_id)


@workflow.defn(name="BreakdownSignalled")
class Signalled:
    """Started by signal-with-start, as a turn is: it runs once the signal is in."""

    def __init__(self) -> None:
        self._received = False

    @workflow.signal(name="user_message")
    def user_message(self, payload: Any = None) -> None:
        self._received = True

    @workflow.run
    async def run(self, turn_id: str) -> str:
        await workflow.wait_condition(lambda: self._received)
        return await bare_loop(turn_id)


@workflow.defn(name="BreakdownLocalActivity")
class WithLocalActivity:
    """A local activity in the first workflow task, as turnkeeper numbers its turn."""

    @workflow.run
    async def run(self, turn_id: str) -> str:
        await workflow.execute_local_activity(NOOP, turn_id, start_to_close_timeout=timedelta(seconds=30))
        return await bare_loop(turn_id)


@workflow.defn(name="BreakdownPatched")
class WithPatch:
    """A patch asked in the first activation, as turnkeeper asks which recovery
    machine a run has: a marker, and the server's TemporalChangeVersion upsert."""

    @workflow.run
    async def run(self, turn_id: str) -> str:
        workflow.patched("breakdown-patch")
        return await bare_loop(turn_id)
