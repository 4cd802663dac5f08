"""The executor that runs workflow activations on the worker's event loop
(turnkeeper/worker/loop_activations.py)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from turnkeeper.worker import loop_activations
from turnkeeper.worker.loop_activations import LoopActivations


async def test_a_call_runs_on_the_loop_thread_outside_the_task_that_submitted_it() -> None:
    seen: list[tuple[int, asyncio.Task[object] | None]] = []

    def activate(x: int) -> int:
        seen.append((threading.get_ident(), asyncio.current_task()))
        return x + 1

    executor = LoopActivations()
    assert await asyncio.get_running_loop().run_in_executor(executor, activate, 41) == 42
    assert seen == [(threading.get_ident(), None)]
    assert executor._threads == set()  # no thread was started


async def test_the_loop_stays_registered_as_running_after_a_call_that_cleared_it() -> None:
    """A workflow's own loop registers itself while it steps and clears the
    registration when done, as `_WorkflowInstanceImpl` does."""

    def activate() -> None:
        asyncio._set_running_loop(None)

    loop = asyncio.get_running_loop()
    await loop.run_in_executor(LoopActivations(), activate)
    assert asyncio.get_running_loop() is loop


async def test_an_exception_reaches_the_awaiting_caller() -> None:
    def activate() -> None:
        raise ValueError("bad activation")

    with pytest.raises(ValueError, match="bad activation"):
        await asyncio.get_running_loop().run_in_executor(LoopActivations(), activate)


async def test_a_cancelled_call_never_runs() -> None:
    ran: list[bool] = []
    future = LoopActivations().submit(lambda: ran.append(True))
    future.cancel()
    await asyncio.sleep(0)
    assert ran == [] and future.cancelled()


async def test_a_slow_activation_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(loop_activations, "SLOW_ACTIVATION_S", 0.01)
    caplog.set_level(logging.WARNING, logger="turnkeeper.worker")
    await asyncio.get_running_loop().run_in_executor(LoopActivations(), __import__("time").sleep, 0.05)
    assert "a workflow activation took" in caplog.text


async def test_calls_take_turns_with_the_loops_other_callbacks() -> None:
    """Two activations submitted together run in two turns of the loop: what the
    first scheduled (a heartbeat's timer, say) runs between them."""
    order: list[str] = []
    loop = asyncio.get_running_loop()

    def first() -> None:
        order.append("first")
        loop.call_soon(order.append, "between")

    executor = LoopActivations()
    await asyncio.gather(
        loop.run_in_executor(executor, first), loop.run_in_executor(executor, order.append, "second")
    )
    assert order == ["first", "between", "second"]
