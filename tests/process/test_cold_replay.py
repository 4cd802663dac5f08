"""A turn's history, however long its users made it, replays on a fresh worker well
within the turn's workflow task timeout: otherwise every retry of its task would
time out and the turn would never move again. Between steps and at gates a long
run hands itself on (tests/workflow/test_no_wedge.py); within one long step the
server's cap on a run's signals bounds it, and this is that longest history."""

from __future__ import annotations

import asyncio

import pytest

from tests.support import Stack, until
from turnkeeper import client as tk
from turnkeeper.models import TURN_TASK_TIMEOUT, TurnStatus
from turnkeeper.worker.dev_server import SIGNALS_PER_RUN

pytestmark = pytest.mark.crash

SLOW_TOOL = {
    "tool_calls": [{"name": "slow_write", "arguments": {"path": "k.txt", "content": "x", "seconds": 120}}]
}
# The first message was a signal too: these fill the run up to the server's cap.
SIGNALS = SIGNALS_PER_RUN - 1


async def test_a_long_history_replays_well_within_the_task_timeout(stack: Stack) -> None:
    ledger = stack.dir / "ledger.txt"
    stack.env_extra.update(
        {
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
            "TURNKEEPER_TOOLS": "slow_write",
            "TK_LEDGER": str(ledger),
        }
    )
    stack.script([SLOW_TOOL, {"text": "done"}])
    first = stack.spawn_worker()
    await stack.wait_serving(first)
    chat = stack.chat()
    handle = await stack.send(chat, "write slowly")
    await until(lambda: ledger.exists() and "start" in ledger.read_text(), 60, "the tool to start")

    # Stale decisions while the tool runs: each is a signal the history keeps.
    in_flight = asyncio.Semaphore(16)

    async def stale(i: int) -> None:
        async with in_flight:
            await handle.signal("dismiss", {"recovery_id": f"stale-{i}"})

    await asyncio.gather(*(stale(i) for i in range(SIGNALS)))
    # One more message is refused in words, not acknowledged and lost.
    with pytest.raises(tk.TurnTakesNoMoreMessages, match="takes no more messages"):
        await tk.send_message(
            stack.client, stack.settings(), chat, tk.new_message("one more", stack.settings())
        )
    stack.kill(first)
    second = stack.spawn_worker()
    await stack.wait_serving(second)
    gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER, timeout=60)
    assert gate.turn == 1
    assert "one more" not in [r.get("content") for r in await stack.history(chat)]

    # The new worker's first workflow task replayed the whole history (and the gate
    # it opened then hands itself on: the history is past the bound).
    run = stack.client.get_workflow_handle(tk.workflow_id(chat), run_id=handle.first_execution_run_id)
    events = list((await run.fetch_history()).events)
    assert len(events) > SIGNALS
    started = next(
        i
        for i, e in enumerate(events)
        if e.HasField("workflow_task_started_event_attributes")
        and e.workflow_task_started_event_attributes.identity.startswith(f"{second.pid}@")
    )
    completed = events[started + 1]
    assert completed.HasField("workflow_task_completed_event_attributes"), completed
    took = (completed.event_time.ToDatetime() - events[started].event_time.ToDatetime()).total_seconds()
    print(f"cold replay of {started} events: {took * 1000:.0f} ms")
    # Idle, such a replay takes about a quarter of a second (docs/performance.md); beside
    # the suite's other test processes on two cores it has taken 1.2 s: the margin is
    # that load's, and the task timeout is the bound that matters.
    assert took < TURN_TASK_TIMEOUT.total_seconds() * 0.75, took
    timed_out = [
        e.event_id for e in events[started:] if e.HasField("workflow_task_timed_out_event_attributes")
    ]
    assert not timed_out, timed_out
