"""Every cell of the recovery table on a real dev server: a turn is brought to a
status, one input arrives, and then (a) the input was answered within 2 s, (b) the
turn did what `workflows.recovery.decide` says, and (c) the chat answers its next
message and its run closes. The crash inputs (a lost step, a shutdown, a run
that ended abnormally) have their own tests in test_recovery.py and
test_reconciler.py; the store outage in test_no_wedge.py."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.service import RPCError

from tests.support import Stack
from turnkeeper import client as tk
from turnkeeper.models import Reason, TurnState, TurnStatus
from turnkeeper.testing import FakeChatServer
from turnkeeper.workflows.recovery import Effect, Input, decide

ANSWER_WITHIN_S = 2.0
FAIL = {"status": 400, "message": "provider says no"}
SLOW = {"text": "a slow answer", "delay": 2.5}

# How each status is reached: the model's first answers, then the steps below.
REACH: dict[TurnStatus, list[dict[str, Any]]] = {
    TurnStatus.RUNNING: [SLOW],
    TurnStatus.AWAITING_USER: [FAIL],
    TurnStatus.RESUMING: [FAIL, SLOW],
    TurnStatus.COMPLETED: [{"text": "done"}],
    TurnStatus.RECOVERED: [FAIL],
}
# (input, form, stale id?)
ACTIONS = [
    ("user_message", "signal", False),
    ("continue", "update", False), ("continue", "signal", False), ("continue", "update", True),
    ("dismiss", "update", False), ("dismiss", "signal", False), ("dismiss", "signal", True),
    ("stop", "signal", False),
]
CELLS = [(status, *action) for status in REACH for action in ACTIONS]


def _ok(request: dict[str, Any]) -> dict[str, Any]:
    return {"text": "ok"}


async def _reach(stack: Stack, chat: str, status: TurnStatus) -> TurnState:
    await stack.send(chat, "hello")
    if status == TurnStatus.RUNNING:
        return await stack.wait_state(chat, lambda s: s.turn == 1)
    if status == TurnStatus.COMPLETED:
        return await stack.wait_turn_done(chat, 1)
    gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
    if status == TurnStatus.AWAITING_USER:
        return gate
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
    update = "continue_turn" if status == TurnStatus.RESUMING else "dismiss_turn"
    return await handle.execute_update(update, {"recovery_id": gate.recovery_id}, result_type=TurnState)


async def _act(stack: Stack, chat: str, name: str, form: str, recovery_id: str | None) -> str:
    """Send the input; 'accepted', or the words it was refused with. A message goes
    as every client sends one: signal-with-start."""
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
    try:
        if name == "user_message":
            await stack.send(chat, "another message", message_id="m-input")
        elif name == "stop":
            await handle.signal("stop", {})
        elif form == "signal":
            await handle.signal(name, {"recovery_id": recovery_id})
        else:
            await handle.execute_update(f"{name}_turn", {"recovery_id": recovery_id}, result_type=TurnState)
    except WorkflowUpdateFailedError as err:
        return str(err.cause.message if err.cause else err)
    except RPCError as err:  # a closed run refuses at the server
        return str(err)
    return "accepted"


async def _turn_status(stack: Stack, chat: str, turn: int) -> tuple[TurnStatus, Reason | None]:
    record = await (await stack.store()).get_turn(chat, turn)
    assert record is not None
    return record.status, record.reason


async def _until_turn(stack: Stack, chat: str, turn: int, want: tuple[TurnStatus, Reason | None],
                      timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        record = await (await stack.store()).get_turn(chat, turn)
        got = record and (record.status, record.reason)
        if got == want:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"turn {turn} of {chat}: wanted {want}, last {got}")


def _expected(status: TurnStatus, name: str, stale: bool, can_continue: bool) -> Effect:
    return decide(status, Input(name), id_matches=not stale, can_continue=can_continue).effect


@pytest.mark.parametrize(("status", "name", "form", "stale"), CELLS,
                         ids=[f"{s.value}-{n}-{f}{'-stale' if st else ''}" for s, n, f, st in CELLS])
async def test_cell(stack: Stack, status: TurnStatus, name: str, form: str, stale: bool) -> None:
    with FakeChatServer(REACH[status], responder=_ok) as server:
        stack.env_extra.update({"TURNKEEPER_MODEL": "openai:fake", "OPENAI_BASE_URL": server.base_url,
                                "OPENAI_API_KEY": "k"})
        await stack.start_worker()
        chat = stack.chat()
        reached = await _reach(stack, chat, status)
        handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
        before = await _turn_status(stack, chat, 1)

        started = time.monotonic()
        answer = await _act(stack, chat, name, form, "stale-id" if stale else reached.recovery_id)
        assert time.monotonic() - started < ANSWER_WITHIN_S, f"{name} {form} answered after {time.monotonic() - started:.2f} s"

        effect = _expected(status, name, stale, reached.can_continue)
        if form == "update" and effect == Effect.REFUSE:
            assert answer != "accepted", answer
        closed = status in (TurnStatus.COMPLETED, TurnStatus.RECOVERED)
        if effect in (Effect.REFUSE, Effect.NOTHING):
            if not closed:  # the run is open: the refusal is recorded, the turn unchanged
                await asyncio.sleep(0.3)
                assert await _turn_status(stack, chat, 1) == before
        elif effect == Effect.RESUME:
            await _until_turn(stack, chat, 1, (TurnStatus.RECOVERED, Reason.CONTINUED))
        elif effect in (Effect.DISMISS, Effect.CANCEL_AND_DISMISS):
            await _until_turn(stack, chat, 1, (TurnStatus.RECOVERED, Reason.DISMISSED))
        elif effect == Effect.STOP:
            await _until_turn(stack, chat, 1, (TurnStatus.RECOVERED, Reason.STOPPED))
        elif effect == Effect.SUPERSEDE:
            await _until_turn(stack, chat, 1, (TurnStatus.RECOVERED, Reason.SUPERSEDED))
        elif effect == Effect.JOIN:
            await _until_turn(stack, chat, 1, (TurnStatus.COMPLETED, None))
        else:
            assert effect == Effect.NEXT_TURN and closed
            assert answer == "accepted"  # signal-with-start: the next turn

        # The chat answers its next message, and no run is left with nothing to do.
        await stack.send(chat, "probe", message_id="m-probe")
        deadline = time.monotonic() + 20
        while True:
            rows = await stack.history(chat)
            ids = [r.get("content") for r in rows]
            if "probe" in ids and rows[-1]["role"] == "assistant" and ids.index("probe") < len(ids) - 1:
                desc = await handle.describe()
                if desc.status != WorkflowExecutionStatus.RUNNING:
                    break
            assert time.monotonic() < deadline, f"the probe was not answered: {rows}"
            await asyncio.sleep(0.1)
        assert ids.count("probe") == 1
