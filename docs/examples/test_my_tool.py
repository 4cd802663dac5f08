"""A test of a tool of your own, in a real turn on a local Temporal dev server."""

import pytest

from turnkeeper.activities.tools import ToolContext, tool
from turnkeeper.testing import ScriptedProvider, TurnkeeperTestEnv

shipped: list[str] = []


@tool(effect="write")
async def ship_order(order_id: str, ctx: ToolContext) -> str:
    """Ship an order."""
    shipped.append(ctx.idempotency_key)
    return f"order {order_id} shipped"


@pytest.mark.asyncio
async def test_the_model_ships_the_order_once() -> None:
    model = ScriptedProvider(
        [
            {"tool_calls": [{"name": "ship_order", "arguments": {"order_id": "A-17"}}]},
            {"text": "Order A-17 is on its way."},
        ]
    )
    async with TurnkeeperTestEnv(tools=[ship_order], model=model) as env:
        turn = await env.send("orders-1", "Please ship order A-17.")

    assert turn.state.status == "completed"
    assert turn.reply == "Order A-17 is on its way."
    assert [row["role"] for row in turn.transcript] == ["user", "assistant", "tool", "assistant"]
    assert turn.transcript[2]["content"] == "order A-17 shipped"
    assert len(shipped) == 1 and shipped[0].startswith("orders-1/1/")
