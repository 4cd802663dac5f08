"""Every cell of the recovery table on a real dev server: a turn is brought to a
status, one input arrives, and then (a) the input was answered within 2 s, (b) the
turn did what `workflows.recovery.decide` says, and (c) the chat answers its next
message and its run closes. The approval gate (`awaiting_user/approval_required`,
a tool that asks first) is a column of its own. The crash inputs (a lost step, a shutdown, a run
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

# The model asks for a tool that must be approved first (TURNKEEPER_CONFIRM_TOOLS below).
ASK = {"tool_calls": [{"name": "write_file", "arguments": {"path": "asked.txt", "content": "approved"}}]}
Column = tuple[TurnStatus, Reason | None]
APPROVAL: Column = (TurnStatus.AWAITING_USER, Reason.APPROVAL_REQUIRED)
# How each column is reached: the model's first answers, then the steps below.
REACH: dict[Column, list[dict[str, Any]]] = {
    (TurnStatus.RUNNING, None): [SLOW],
    (TurnStatus.AWAITING_USER, None): [FAIL],
    APPROVAL: [ASK],
    (TurnStatus.RESUMING, None): [FAIL, SLOW],
    (TurnStatus.COMPLETED, None): [{"text": "done"}],
    (TurnStatus.RECOVERED, None): [FAIL],
}
# (input, form, stale id?)
ACTIONS = [
    ("user_message", "signal", False),
    ("continue", "update", False), ("continue", "signal", False), ("continue", "update", True),
    ("dismiss", "update", False), ("dismiss", "signal", False), ("dismiss", "signal", True),
    ("stop", "signal", False),
]
CELLS = [(column, *action) for column in REACH for action in ACTIONS]


def _label(column: Column) -> str:
    status, reason = column
    return status.value + (f"-{reason.value}" if reason else "")


def _ok(request: dict[str, Any]) -> dict[str, Any]:
    return {"text": "ok"}


async def _reach(stack: Stack, chat: str, column: Column) -> TurnState:
    status, reason = column
    await stack.send(chat, "hello")
    if reason == Reason.APPROVAL_REQUIRED:
        return await stack.wait_state(chat, lambda s: s.reason == Reason.APPROVAL_REQUIRED)
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


def _expected(column: Column, name: str, stale: bool, can_continue: bool) -> Effect:
    status, reason = column
    return decide(status, Input(name), id_matches=not stale, can_continue=can_continue, reason=reason).effect


@pytest.mark.parametrize(("column", "name", "form", "stale"), CELLS,
                         ids=[f"{_label(c)}-{n}-{f}{'-stale' if st else ''}" for c, n, f, st in CELLS])
async def test_cell(stack: Stack, column: Column, name: str, form: str, stale: bool) -> None:
    status = column[0]
    with FakeChatServer(REACH[column], responder=_ok) as server:
        stack.env_extra.update({"TURNKEEPER_MODEL": "openai:fake", "OPENAI_BASE_URL": server.base_url,
                                "OPENAI_API_KEY": "k", "TURNKEEPER_CONFIRM_TOOLS": "write_file"})
        await stack.start_worker()
        chat = stack.chat()
        reached = await _reach(stack, chat, column)
        handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
        before = await _turn_status(stack, chat, 1)

        started = time.monotonic()
        answer = await _act(stack, chat, name, form, "stale-id" if stale else reached.recovery_id)
        assert time.monotonic() - started < ANSWER_WITHIN_S, f"{name} {form} answered after {time.monotonic() - started:.2f} s"

        effect = _expected(column, name, stale, reached.can_continue)
        if form == "update" and effect == Effect.REFUSE:
            assert answer != "accepted", answer
        closed = status in (TurnStatus.COMPLETED, TurnStatus.RECOVERED)
        if effect in (Effect.REFUSE, Effect.NOTHING):
            if not closed:  # the run is open: the refusal is recorded, the turn unchanged
                await asyncio.sleep(0.3)
                assert await _turn_status(stack, chat, 1) == before
        elif effect == Effect.RESUME:
            await _until_turn(stack, chat, 1, (TurnStatus.RECOVERED, Reason.CONTINUED))
        elif effect == Effect.APPROVE:
            await _until_turn(stack, chat, 1, (TurnStatus.COMPLETED, None))
        elif effect in (Effect.DISMISS, Effect.CANCEL_AND_DISMISS, Effect.DENY):
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
        # The asked-for tool ran once if the user approved it, and never otherwise.
        written = (stack.ws / "asked.txt").exists()
        assert written == (effect == Effect.APPROVE), f"{effect}: the tool {'ran' if written else 'did not run'}"
