"""Long chats on a real dev server: the model is sent a summary and the latest
turns within TURNKEEPER_CONTEXT_TOKENS, the transcript stays whole, and a worker
SIGKILLed while the model summarises is a lost model step like any other."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.support import Stack
from turnkeeper.activities.context import SUMMARY_HEADING
from turnkeeper.activities.providers.base import SUMMARY_INSTRUCTION
from turnkeeper.models import Reason, TurnStatus
from turnkeeper.testing import FakeChatServer

BUDGET = 600
SUMMARY_LEAD = SUMMARY_INSTRUCTION.split("{", 1)[0][:40]


def _is_summary_request(request: dict[str, Any]) -> bool:
    first = request["messages"][0]
    return first["role"] == "system" and first["content"].startswith(SUMMARY_LEAD)


def _tokens(request: dict[str, Any]) -> int:
    return len(json.dumps(request["messages"], separators=(",", ":"))) // 4


async def test_a_long_chat_folds_and_keeps_numbering_its_model_calls(stack: Stack) -> None:
    turns = 14
    # The scripted model answers call i with item i: numbering must go on across folds.
    stack.script([{"text": f"answer {i}"} for i in range(turns)])
    await stack.start_worker(TURNKEEPER_CONTEXT_TOKENS=str(BUDGET), TURNKEEPER_TOOLS="")
    chat = stack.chat("long")
    for n in range(turns):
        await stack.send(chat, f"message {n}: " + "x" * 300)
        done = await stack.wait_turn_done(chat, n + 1)
        assert done.status == TurnStatus.COMPLETED
    history = await stack.history(chat)
    assert [m["content"] for m in history if m["role"] == "assistant"] == [
        f"answer {i}" for i in range(turns)
    ]
    assert len(history) == 2 * turns  # never shortened
    loaded = await (await stack.store()).context_rows(chat)
    assert loaded.summary is not None and loaded.summary.assistant_rows > 0
    assert len(loaded.rows) < len(history)


@pytest.mark.crash
async def test_a_worker_killed_while_summarising_loses_one_model_step(stack: Stack) -> None:
    summaries: list[dict[str, Any]] = []
    answers: list[dict[str, Any]] = []

    def respond(request: dict[str, Any]) -> dict[str, Any]:
        if _is_summary_request(request):
            summaries.append(request)
            if len(summaries) == 1:
                return {"text": "never delivered", "delay": 30}
            return {"text": f"SUMMARY {len(summaries)}: the user counted messages upwards"}
        answers.append(request)
        return {"text": f"ok {len(answers)}"}

    with FakeChatServer(responder=respond) as server:
        stack.env_extra.update(
            {
                "TURNKEEPER_MODEL": "openai:fake",
                "OPENAI_BASE_URL": server.base_url,
                "OPENAI_API_KEY": "k",
                "TURNKEEPER_CONTEXT_TOKENS": str(BUDGET),
                "TURNKEEPER_TOOLS": "",
            }
        )
        worker = stack.spawn_worker()
        await stack.wait_serving(worker)
        chat = stack.chat("fold-kill")
        store = await stack.store()
        n = 0
        while not summaries:
            n += 1
            assert n < 20, "the chat never outgrew its budget"
            await stack.send(chat, f"message {n}: " + "x" * 300)
            for _ in range(600):
                record = await store.get_turn(chat, n)
                if summaries or (record and record.status == TurnStatus.COMPLETED):
                    break
                await asyncio.sleep(0.05)
        assert n > 2
        stack.kill(worker)  # while the model summarises the older turns
        stack.spawn_worker()

        gate = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER, timeout=45)
        assert (gate.turn, gate.reason, gate.can_continue) == (n, Reason.RESTART_REQUIRES_CONFIRMATION, True)
        assert (await store.context_rows(chat)).summary is None  # nothing half-made was kept
        await stack.decide(chat, "continue", gate.recovery_id)
        done = await stack.wait_turn_done(chat, n, timeout=30)
        assert (done.status, done.reason) == (TurnStatus.RECOVERED, Reason.CONTINUED)
        made = len(summaries)  # the lost one, then the fold made again (one call per part it folds)
        assert made >= 2
        summary = (await store.context_rows(chat)).summary
        assert summary is not None and summary.text == f"SUMMARY {made}: the user counted messages upwards"
        last = answers[-1]["messages"]
        assert last[0] == {"role": "system", "content": SUMMARY_HEADING + summary.text}
        assert _tokens(answers[-1]) <= BUDGET
        assert last[-1]["content"].startswith(f"message {n}:")  # the message it answers, whole

        # The next turn reuses the summary: no summary call.
        await stack.send(chat, "one more")
        # Generous: on a loaded 2-core machine this once took over 30 s behind the suite.
        await stack.wait_turn_done(chat, n + 1, timeout=90)
        assert (
            len(summaries) == made and answers[-1]["messages"][0]["content"] == SUMMARY_HEADING + summary.text
        )
        history = await stack.history(chat)
        assert [m["content"] for m in history if m["role"] == "user"] == [
            f"message {i}: " + "x" * 300 for i in range(1, n + 1)
        ] + ["one more"]
