"""Every cell of the recovery table on a real dev server: a turn is brought to a
status, one input arrives, and then (a) the input was answered within 2 s (a
decision read back in the table's words), (b) the turn did what
`turnkeeper.recovery.decide` says, and (c) the chat answers its next message, its
runs close and none is left listed as open. The approval gate (`awaiting_user/approval_required`,
a tool that asks first) is a column of its own. The crash inputs (a lost step, a shutdown, a run
that ended abnormally) have their own tests in test_recovery.py and
test_reconciler.py; the store outage in test_no_wedge.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from tests.support import Stack
from turnkeeper import client as tk
from turnkeeper.models import Reason, TurnState, TurnStatus
from turnkeeper.recovery import Effect, Input, decide
from turnkeeper.testing import FakeChatServer

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
# (input, form, stale id?): "decide" reads the answer back (turnkeeper.client.decide),
# "signal" sends it as any Temporal client can, without a request id.
ACTIONS = [
    ("user_message", "signal", False),
    ("continue", "decide", False),
    ("continue", "signal", False),
    ("continue", "decide", True),
    ("dismiss", "decide", False),
    ("dismiss", "signal", False),
    ("dismiss", "signal", True),
    ("stop", "decide", False),
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
        # The store has the turn's row once the first model call has begun it.
        await _until_turn(stack, chat, 1, (TurnStatus.RUNNING, None))
        return await stack.state(chat)
    if status == TurnStatus.COMPLETED:
        return await stack.wait_turn_done(chat, 1)
    gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
    if status == TurnStatus.AWAITING_USER:
        return gate
    decided = await stack.decide(
        chat, "continue" if status == TurnStatus.RESUMING else "dismiss", gate.recovery_id
    )
    # The answer comes as the turn judges it; the store has it once the write that follows lands.
    await _until_turn(stack, chat, 1, (decided.status, decided.reason))
    return decided


async def _act(stack: Stack, chat: str, name: str, form: str, recovery_id: str | None) -> str:
    """Send the input; 'accepted', or the words it was refused with. A message goes
    as every client sends one: signal-with-start."""
    handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
    try:
        if name == "user_message":
            await stack.send(chat, "another message", message_id="m-input")
        elif form == "decide":
            await tk.decide(stack.client, chat, name, recovery_id, timeout=ANSWER_WITHIN_S)
        elif name == "stop":
            await handle.signal("stop", {})
        else:
            await handle.signal(name, {"recovery_id": recovery_id})
    except tk.DecisionRefused as err:
        return str(err)
    except RPCError as err:  # a closed run refuses at the server
        return str(err)
    return "accepted"


async def _turn_status(stack: Stack, chat: str, turn: int) -> tuple[TurnStatus, Reason | None]:
    record = await (await stack.store()).get_turn(chat, turn)
    assert record is not None
    return record.status, record.reason


async def _until_turn(
    stack: Stack, chat: str, turn: int, want: tuple[TurnStatus, Reason | None], timeout: float = 15.0
) -> None:
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        record = await (await stack.store()).get_turn(chat, turn)
        got = record and (record.status, record.reason)
        if got == want:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"turn {turn} of {chat}: wanted {want}, last {got}")


def _refusal(column: Column, name: str, stale: bool, can_continue: bool) -> str | None:
    """The table's words for a refusal by an open run ("stale" with the id it names)."""
    status, reason = column
    words = decide(
        status, Input(name), id_matches=not stale, can_continue=can_continue, reason=reason
    ).refusal
    return "recovery id 'stale-id' is stale" if words == "stale" else words


def _expected(column: Column, name: str, stale: bool, can_continue: bool) -> Effect:
    status, reason = column
    return decide(status, Input(name), id_matches=not stale, can_continue=can_continue, reason=reason).effect


@pytest.mark.parametrize(
    ("column", "name", "form", "stale"),
    CELLS,
    ids=[f"{_label(c)}-{n}-{f}{'-stale' if st else ''}" for c, n, f, st in CELLS],
)
async def test_cell(stack: Stack, column: Column, name: str, form: str, stale: bool) -> None:
    status = column[0]
    with FakeChatServer(REACH[column], responder=_ok) as server:
        stack.env_extra.update(
            {
                "TURNKEEPER_MODEL": "openai:fake",
                "OPENAI_BASE_URL": server.base_url,
                "OPENAI_API_KEY": "k",
                "TURNKEEPER_CONFIRM_TOOLS": "write_file",
            }
        )
        await stack.start_worker()
        chat = stack.chat()
        reached = await _reach(stack, chat, column)
        handle = stack.client.get_workflow_handle(tk.workflow_id(chat))
        before = await _turn_status(stack, chat, 1)

        started = time.monotonic()
        answer = await _act(stack, chat, name, form, "stale-id" if stale else reached.recovery_id)
        assert time.monotonic() - started < ANSWER_WITHIN_S, (
            f"{name} {form} answered after {time.monotonic() - started:.2f} s"
        )

        effect = _expected(column, name, stale, reached.can_continue)
        closed = status in (TurnStatus.COMPLETED, TurnStatus.RECOVERED)
        if form == "decide":  # the answer read back is the table's
            assert (answer != "accepted") == (effect == Effect.REFUSE), f"{effect}: {answer}"
            if effect == Effect.REFUSE and not closed:  # a closed run is refused by the server
                if name != "stop" and not stale and reached.recovery_id is None:
                    # No gate, no id to send: the payload is refused as malformed, in words.
                    assert answer.startswith(f"malformed {name} payload"), answer
                else:
                    assert answer == _refusal(column, name, stale, reached.can_continue), answer
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
        # No run of the chat is left listed as open once all have closed.
        query = (
            f"WorkflowId='{tk.workflow_id(chat)}' AND TurnStatus IN ('running', 'awaiting_user', 'resuming')"
        )
        deadline = time.monotonic() + 10
        while listed := [wf.run_id async for wf in stack.client.list_workflows(query)]:
            assert time.monotonic() < deadline, f"closed runs listed as open: {listed}"
            await asyncio.sleep(0.2)
        # The asked-for tool ran once if the user approved it, and never otherwise.
        written = (stack.ws / "asked.txt").exists()
        assert written == (effect == Effect.APPROVE), (
            f"{effect}: the tool {'ran' if written else 'did not run'}"
        )
