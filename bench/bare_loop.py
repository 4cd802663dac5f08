"""The baseline for bench/turn_latency.py: the smallest Temporal loop that does
what one benchmark turn of turnkeeper does — model call, tool call, model call —
as three ordinary activities, with no session store, no signals, no search
attributes and no local activities.

It lives in its own module so the workflow sandbox can import it; the activity
implementations are in turn_latency.py and are referred to here by name only.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from turnkeeper.config import Settings
    from turnkeeper.models import ModelReply, ToolCall

MODEL = "bare.model"
TOOL = "bare.tool"

# The options turnkeeper gives its model and tool activities (with default settings).
ACTIVITY_OPTIONS = dict(
    start_to_close_timeout=timedelta(seconds=300),
    heartbeat_timeout=timedelta(seconds=Settings().heartbeat_timeout),
    retry_policy=RetryPolicy(maximum_attempts=1),
)


class BareModelInput(BaseModel):
    turn_id: str
    step: int


class BareToolInput(BaseModel):
    turn_id: str
    call: ToolCall


async def bare_loop(turn_id: str) -> str:
    """The loop itself, also run by the variants of bench/breakdown_loops.py."""
    step = 0
    while True:
        reply: ModelReply = await workflow.execute_activity(
            MODEL, BareModelInput(turn_id=turn_id, step=step), result_type=ModelReply, **ACTIVITY_OPTIONS
        )
        if reply.is_final:
            return reply.text or ""
        for call in reply.tool_calls:
            await workflow.execute_activity(
                TOOL, BareToolInput(turn_id=turn_id, call=call), result_type=str, **ACTIVITY_OPTIONS
            )
        step += 1


@workflow.defn(name="BareTurn")
class BareTurn:
    @workflow.run
    async def run(self, turn_id: str) -> str:
        return await bare_loop(turn_id)
