"""Three worker processes on one task queue share the load; SIGKILLing one of
them mid-tool leaves the other two serving, and the killed worker's turn
recovers by the rules (tool_state_unknown, the tool never run again, Continue
completes it)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState

from tests.support import Stack, until
from turnkeeper import client as tk
from turnkeeper.models import INTERRUPTED_TOOL_TEXT, Reason, ToolCallStatus, TurnState, TurnStatus
from turnkeeper.testing import FakeChatServer

pytestmark = pytest.mark.crash

SLOW_TOOL_S = 8.0
QUICK_TOOL_S = 0.3


def _responder(request: dict[str, Any]) -> dict[str, Any]:
    """After a user message, one `slow_write` (slow when the message says so);
    after a tool result, the final answer quoting it."""
    messages = request["messages"]
    last = messages[-1]
    if last["role"] == "user":
        seconds = SLOW_TOOL_S if last["content"].startswith("slow") else QUICK_TOOL_S
        return {
            "tool_calls": [
                {
                    "name": "slow_write",
                    "arguments": {
                        "path": f"f{len(messages)}.txt",
                        "content": last["content"],
                        "seconds": seconds,
                    },
                }
            ]
        }
    return {"text": f"finished: {last.get('content')}"}


def _ledger_starts(ledger: Path) -> list[str]:
    return (
        [line.split()[1] for line in ledger.read_text().splitlines() if line.startswith("start ")]
        if ledger.exists()
        else []
    )


async def _identities(stack: Stack, chat: str) -> set[str]:
    """Worker identities (`<pid>@<host>`) that started workflow or activity tasks of every run of `chat`."""
    found: set[str] = set()
    async for wf in stack.client.list_workflows(f"WorkflowId='{tk.workflow_id(chat)}'"):
        history = await stack.client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        for ev in history.events:
            if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                found.add(ev.workflow_task_started_event_attributes.identity)
            elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                found.add(ev.activity_task_started_event_attributes.identity)
    found.discard("")
    return found


def _pid(identity: str) -> int:
    return int(identity.split("@", 1)[0])


async def _run_turns(stack: Stack, chats: list[str], text: str, timeout: float = 90) -> list[TurnState]:
    handles = await asyncio.gather(*(stack.send(c, text) for c in chats))
    results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), timeout)
    return [TurnState.model_validate(r) if isinstance(r, dict) else r for r in results]


async def test_three_workers_share_turns_and_survive_a_sigkill(stack: Stack) -> None:
    ledger = stack.dir / "ledger.txt"
    stack.env_extra.update(
        {
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
            "TURNKEEPER_TOOLS": "slow_write",
            "TK_LEDGER": str(ledger),
        }
    )
    with FakeChatServer(responder=_responder) as server:
        stack.env_extra.update(
            {"TURNKEEPER_MODEL": "openai:fake", "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "k"}
        )
        procs = [stack.spawn_worker() for _ in range(3)]
        await stack.wait_serving(*procs)
        pids = {p.pid for p in procs}

        # 1. Twenty chats at once: every turn completes, and the load is shared.
        chats = [stack.chat(f"load{i}") for i in range(20)]
        states = await _run_turns(stack, chats, "write a file")
        assert all(s.status == TurnStatus.COMPLETED and s.turn == 1 for s in states)
        served: dict[int, int] = {}
        for chat in chats:
            for identity in await _identities(stack, chat):
                served[_pid(identity)] = served.get(_pid(identity), 0) + 1
        assert set(served) <= pids, f"unknown workers {set(served) - pids}"
        print(f"chats each worker pid served tasks of: {served}")
        assert len(served) >= 2, f"one worker served every turn: {served}"

        # 2. SIGKILL the worker running a slow tool of one chat.
        victim_chat = stack.chat("victim")
        await stack.send(victim_chat, "slow write, please")
        await until(
            lambda: any(k.startswith(f"{victim_chat}/") for k in _ledger_starts(ledger)),
            30,
            "the slow tool started",
        )
        [key] = [k for k in _ledger_starts(ledger) if k.startswith(f"{victim_chat}/")]
        handle = stack.client.get_workflow_handle(tk.workflow_id(victim_chat))
        desc = await handle.describe()
        [pending] = [
            a
            for a in desc.raw_description.pending_activities
            if a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
        ]
        victim_pid = _pid(pending.last_worker_identity)
        [victim] = [p for p in procs if p.pid == victim_pid]
        stack.kill(victim)
        killed_at = time.monotonic()
        survivors = pids - {victim_pid}

        # 3. The other two keep serving: new turns complete while the victim's turn recovers.
        fresh = [stack.chat(f"after{i}") for i in range(6)]
        states = await _run_turns(stack, fresh, "write another file")
        assert all(s.status == TurnStatus.COMPLETED for s in states)
        for chat in fresh:
            assert {_pid(i) for i in await _identities(stack, chat)} <= survivors

        # 4. The killed worker's turn waits for its user; its tool is never run again.
        gate = await stack.wait_state(victim_chat, lambda s: s.status == TurnStatus.AWAITING_USER, timeout=45)
        assert gate.reason == Reason.TOOL_STATE_UNKNOWN and gate.can_continue
        assert [c.status for c in gate.tool_calls] == [ToolCallStatus.INTERRUPTED]
        history = await stack.history(victim_chat)
        assert history[-1]["role"] == "tool" and history[-1]["content"] == INTERRUPTED_TOOL_TEXT
        # Longer than the tool takes: had anyone run it again, the ledger would show it.
        await asyncio.sleep(max(0.0, killed_at + SLOW_TOOL_S + 1 - time.monotonic()))
        assert _ledger_starts(ledger).count(key) == 1
        assert f"done {key}" not in ledger.read_text()

        # 5. Continue completes it on a surviving worker, still without running the tool again.
        resumed = await stack.decide(victim_chat, "continue", gate.recovery_id)
        assert resumed.status == TurnStatus.RESUMING
        done = await stack.wait_turn_done(victim_chat, 1, timeout=45)
        assert (done.status, done.reason) == (TurnStatus.RECOVERED, Reason.CONTINUED)
        final = await stack.history(victim_chat)
        assert final[-1] == {"role": "assistant", "content": f"finished: {INTERRUPTED_TOOL_TEXT}"}
        assert _ledger_starts(ledger).count(key) == 1
        assert victim_pid in {_pid(i) for i in await _identities(stack, victim_chat)}
