"""A short run of the chaos harness (tests/chaos/): three worker processes,
SIGKILLed at random while chats send messages, follow-ups and retried ids,
their users press Continue, Dismiss and Stop at random moments (by
turnkeeper.client.decide or as bare signals, stale ids among them), a burst of
large follow-ups arrives while a
tool runs, the store is out for a few seconds, and a driver answers every
gate; then every chat gets a probe message, and the harness's checker.

The harness starts its own dev server and worker processes. Set TK_CHAOS_SEED
to replay a seed (timing still varies); a failing run keeps its work directory
(logs, ledger, store, report.json, evidence/<chat>.json) under the test's
tmp_path. The other tests check the checker's own rules, without a server."""

from __future__ import annotations

import json
import os
from datetime import UTC
from pathlib import Path

import pytest

import tests.chaos.harness as chaos
from tests.chaos.base import Action, ActionLog, error_kind, percentile
from tests.chaos.check import ended_by_reconciler, held_by_killed_workers, no_worker_gaps, unserved_s
from tests.chaos.infra import WorkerPool, WorkerProc
from tests.pg import PG_URL, pg_admin


@pytest.mark.crash
@pytest.mark.timeout(300)
async def test_short_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    seed = int(os.environ.get("TK_CHAOS_SEED", "20240611"))
    report = await chaos.run_chaos(
        chaos.ChaosConfig(
            turns=30,
            kills=5,
            workers=3,
            chats=8,
            seed=seed,
            bursts=1,
            outages=1,
            max_chaos_s=120,
            settle_timeout_s=90,
            workdir=tmp_path / "chaos",
            progress=lambda text: print(text, flush=True),
        )
    )
    print(report.summary())
    assert report.target_reached, report.summary()
    assert report.kills >= 5 and report.turns_closed >= 30
    assert report.messages["acknowledged"] > 0 and report.tools["starts"] > 0
    assert len(report.bursts) == 1 and len(report.outages) == 1
    assert sum(report.user_actions.values()) > 5, report.user_actions
    failed = {name: count for name, count in report.invariants.items() if count}
    # A workflow task held by a killed worker waits out the turn's task timeout (2 s),
    # and the sticky queue's 1 s before it: on a loaded CI machine an answer can pass
    # the 5 s bound that way. Such late answers are reported; any other fails the run.
    late = failed.pop("actions_not_answered_in_time", 0)
    explained = report.details.get("late_behind_a_workflow_task_timeout", 0)
    assert late <= explained, f"{late - explained} late answer(s) without a known cause\n{report.summary()}"
    if late:
        print(f"late answers behind a killed worker's workflow task: {late}")
    assert report.probes["answered"] == 8, report.probes
    assert not failed, f"invariants failed: {failed}\n{report.summary()}"


@pytest.mark.crash
@pytest.mark.postgres
@pytest.mark.timeout(300)
async def test_short_chaos_run_on_postgresql_keeps_every_invariant(tmp_path: Path) -> None:
    """The same on a PostgreSQL store, through each of its outages in turn: sessions
    cut off again and again, the store read-only, its tables locked against writers."""
    (await pg_admin()).terminate()  # reachable, or the test says why not (or skips when told)
    seed = int(os.environ.get("TK_CHAOS_SEED", "20261203"))
    report = await chaos.run_chaos(
        chaos.ChaosConfig(
            turns=30,
            kills=4,
            workers=3,
            chats=8,
            seed=seed,
            bursts=1,
            outages=3,
            outage_s=(2.0, 3.0),
            outage_gap_s=2.0,
            outage_kinds=("cut", "read_only", "lock"),
            postgres_url=PG_URL,
            max_chaos_s=150,
            settle_timeout_s=90,
            workdir=tmp_path / "chaos",
            progress=lambda text: print(text, flush=True),
        )
    )
    print(report.summary())
    assert report.target_reached, report.summary()
    assert [o["kind"] for o in report.outages] == ["cut", "read_only", "lock"]
    assert sum(o["sessions_cut"] for o in report.outages) > 0  # the outages reached the workers
    failed = {name: count for name, count in report.invariants.items() if count}
    late = failed.pop("actions_not_answered_in_time", 0)  # as in the run above
    assert late <= report.details.get("late_behind_a_workflow_task_timeout", 0), report.summary()
    assert report.probes["answered"] == 8, report.probes
    assert not failed, f"invariants failed: {failed}\n{report.summary()}"


def test_answer_times_count_late_and_unanswered_actions_but_not_bursts() -> None:
    log = ActionLog()
    log.add(
        Action(kind="continue/decide", chat_id="c", source="gate", at_s=1, latency_s=0.2, outcome="accepted")
    )
    log.add(
        Action(
            kind="dismiss/decide", chat_id="c", source="user", at_s=2, latency_s=6.0, outcome="refused: stale"
        )
    )
    log.add(
        Action(kind="stop/signal", chat_id="c", source="user", at_s=3, latency_s=None, outcome="no answer")
    )
    log.add(Action(kind="burst", chat_id="c", source="burst", at_s=4, latency_s=0.0, outcome="12 follow-ups"))
    log.add(Action(kind="followup", chat_id="c", source="user", at_s=5, latency_s=0.1, outcome="accepted"))
    log.add(
        Action(
            kind="stop/decide",
            chat_id="c",
            source="user",
            at_s=6,
            latency_s=0.3,
            outcome="refused: not running",
        )
    )
    late = log.unanswered(chaos.ChaosConfig().answer_bound_s)
    assert [a.kind for a in late] == ["dismiss/decide", "stop/signal"]
    assert log.counts() == {
        "continue/decide": 1,
        "dismiss/decide": 1,
        "stop/signal": 1,
        "burst": 1,
        "stop/decide": 1,
    }
    assert log.latency()["decisions"] == {"n": 3, "max_s": 6.0, "p99_s": 6.0}


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 99) == 0.0


def test_refusals_are_sorted_by_their_words() -> None:
    assert error_kind("recovery id 'x' is stale") == "stale"
    assert error_kind("not waiting for confirmation") == "not waiting"
    assert error_kind("recovery context is unavailable") == "context unavailable"
    assert error_kind("no turn is running") == "not running"
    assert error_kind('malformed dismiss payload; expected {"recovery_id": "..."}') == "malformed"
    assert error_kind("RPCError: workflow execution already completed") == "run closed"
    assert error_kind("something else") == "other"


def test_a_run_looks_idle_when_its_state_shows_nothing_to_do() -> None:
    tool = {"id": "t1", "name": "ledger_write", "status": "running"}
    assert chaos._looks_idle({"status": "recovered", "reason": "continued"})
    assert chaos._looks_idle({"status": "running", "tool_calls": []})
    assert chaos._looks_idle("query failed: RPCError")
    assert not chaos._looks_idle({"status": "running", "tool_calls": [tool]})
    assert not chaos._looks_idle({"status": "resuming", "store_unavailable": True})
    assert not chaos._looks_idle({"status": "awaiting_user", "reason": "tool_state_unknown"})
    # A state that moves is no wedge: the signature changes with it.
    assert chaos.state_signature({"status": "running", "tool_calls": [tool]}) != chaos.state_signature(
        {"status": "running", "tool_calls": [{**tool, "status": "done"}]}
    )


def test_time_with_no_worker_serving_is_not_counted_against_an_answer(tmp_path: Path) -> None:
    pool = WorkerPool({}, tmp_path)
    t0 = 1000.0
    # Two workers: one serves 2-10 s and is killed, its replacement serves from 13 s.
    for serving, ended in ((1002.0, 1010.0), (1013.0, None), (None, 1011.0)):
        w = WorkerProc(len(pool.lives), proc=None, log=tmp_path / "w.log", started=t0)  # type: ignore[arg-type]
        w.serving_at, w.ended_at = serving, ended
        pool.lives.append(w)
    windows = pool.serving_windows(until=1030.0)
    assert windows == [(1002.0, 1010.0), (1013.0, 1030.0)]
    gaps = no_worker_gaps(windows, t0, from_s=2.0, until_s=30.0)
    assert gaps == [(10.0, 13.0)]
    # An update sent at 9 s and answered at 15 s (6 s) waited 3 s with no worker: 3 s counted.
    assert unserved_s(9.0, 6.0, gaps) == 3.0
    assert unserved_s(20.0, 1.0, gaps) == 0.0
    # Overlapping spans (no worker, and a dead worker's task) count once.
    assert unserved_s(9.0, 6.0, [(10.0, 13.0), (12.0, 14.0)]) == 4.0


def test_the_time_a_killed_worker_held_a_task_is_read_from_the_history() -> None:
    from google.protobuf.timestamp_pb2 import Timestamp
    from temporalio.api.enums.v1 import EventType
    from temporalio.api.history.v1 import HistoryEvent
    from temporalio.client import WorkflowHistory

    def event(kind: int, at: float, identity: str | None = None) -> HistoryEvent:
        ev = HistoryEvent(event_type=kind, event_time=Timestamp(seconds=int(at), nanos=int(at % 1 * 1e9)))
        if identity is not None:
            ev.workflow_task_started_event_attributes.identity = identity
        return ev

    E = EventType
    events = [
        # Started by pid 41, which was killed: held from 100 s until it timed out.
        event(E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, 99.5),
        event(E.EVENT_TYPE_WORKFLOW_TASK_STARTED, 100.0, "41@h"),
        event(E.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT, 102.0),
        # Sent to a dead worker's sticky queue: never started, timed out after 1 s.
        event(E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, 110.0),
        event(E.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT, 111.0),
        # Started by a live worker (pid 7, never killed) that was slow: not the killer's time.
        event(E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, 120.0),
        event(E.EVENT_TYPE_WORKFLOW_TASK_STARTED, 120.1, "7@h"),
        event(E.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT, 122.1),
        event(E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, 122.1),
        event(E.EVENT_TYPE_WORKFLOW_TASK_STARTED, 122.2, "8@h"),
        event(E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 122.3),
    ]
    spans = held_by_killed_workers([WorkflowHistory("chat-c1", events)], killed_pids={41})
    assert spans == {"c1": [(100.0, 102.0), (110.0, 111.0)]}


def test_a_workers_serving_time_is_read_from_its_log(tmp_path: Path) -> None:
    import time

    log = tmp_path / "worker.log"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - 5))
    log.write_text(
        f"{stamp},250 INFO turnkeeper.worker: registered search attributes []\n"
        f"{stamp},500 INFO turnkeeper.worker: worker serving task queue 'q' (model demo)\n"
    )
    w = WorkerProc(0, proc=None, log=log, started=time.monotonic() - 6)  # type: ignore[arg-type]
    w.look_for_serving()
    assert w.serving_at is not None
    assert 4.0 < time.monotonic() - w.serving_at < 6.0


async def test_runs_the_reconciler_ended_for_a_failing_task_are_counted_from_the_history() -> None:
    """The reason is the reconciler's own (activities/reconcile/run_sweep.py terminate), read back
    from the run's history; an operator's terminate is not counted."""
    from datetime import datetime

    from temporalio.api.enums.v1 import EventType
    from temporalio.api.history.v1 import HistoryEvent
    from temporalio.client import WorkflowHistory

    from turnkeeper.activities.reconcile import run_sweep, wedged_runs

    class Handle:
        reason = ""

        async def terminate(self, reason: str) -> None:
            self.reason = reason

    handle = Handle()
    await run_sweep.terminate(
        handle,
        wedged_runs.Wedged(  # type: ignore[arg-type]
            failures=3, since=datetime.now(UTC), cause="nondeterminism"
        ),
    )

    def run(run_id: str, terminated_by: str | None) -> WorkflowHistory:
        started = HistoryEvent(event_id=1, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED)
        started.workflow_execution_started_event_attributes.original_execution_run_id = run_id
        events = [started]
        if terminated_by is not None:
            ended = HistoryEvent(event_id=2, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED)
            ended.workflow_execution_terminated_event_attributes.reason = terminated_by
            events.append(ended)
        return WorkflowHistory("chat-c1", events)

    histories = [run("r1", handle.reason), run("r2", "an operator"), run("r3", None)]
    assert ended_by_reconciler(histories) == {"r1": handle.reason}


def test_the_model_tells_a_sub_chat_and_a_report_from_the_messages_alone() -> None:
    import random

    from tests.chaos.infra import ChaosModel, task_text

    cfg = chaos.ChaosConfig(delegate=1.0, nested=1.0, fanout=0.0, bad_delegate=0.0, provider_errors=0.0)
    model = ChaosModel(cfg, random.Random(3))
    tools = [{"type": "function", "function": {"name": n}} for n in ("ledger_write", "delegate")]
    # A chat's user message: a delegate call whose task names itself, its depth and its mode.
    reply = model({"messages": [{"role": "user", "content": "message 1 of c"}], "tools": tools})
    (call,) = reply["tool_calls"]
    assert call["name"] == "delegate" and call["arguments"]["task"].startswith("subtask n")
    assert " d1 " in call["arguments"]["task"]
    # A sub-chat at depth 1 delegates once more, in wait mode; at the depth bound it is not offered the tool.
    task = {"role": "user", "content": task_text(7, 1, "background")}
    (nested,) = model({"messages": [task], "tools": tools})["tool_calls"]
    assert nested["arguments"]["mode"] == "wait" and " d2 wait:" in nested["arguments"]["task"]
    deep = {"role": "user", "content": task_text(8, 2, "wait")}
    (ledger,) = model({"messages": [deep], "tools": tools[:1]})["tool_calls"]
    assert ledger["name"] == "ledger_write"
    # Its final answer names its task.
    done = model(
        {
            "messages": [
                deep,
                {"role": "assistant", "tool_calls": [{"id": "t1", "function": {"name": "ledger_write"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "noted"},
            ],
            "tools": tools[:1],
        }
    )
    assert done["text"] == "answer of subtask n8: done after 1 tool round(s)"
    # A background subagent's report gets words, never another delegation.
    report = {
        "role": "user",
        "content": "Subagent (chat c.sub1-x, task: ...) answered:\nanswer of subtask n7",
    }
    assert "text" in model(
        {"messages": [{"role": "user", "content": "message 1 of c"}, report], "tools": tools}
    )


def test_delegate_calls_name_their_sub_chats_and_the_calls_that_must_be_refused() -> None:
    from tests.chaos.check import delegate_calls, final_answer, is_report_id, report_of
    from turnkeeper.models import ChatMessage
    from turnkeeper.store import TranscriptRow
    from turnkeeper.subagents import report_message_id, sub_chat_id

    def row(i: int, turn: int, message: dict[str, object], message_id: str | None = None) -> TranscriptRow:
        return TranscriptRow(
            id=i, turn=turn, message=ChatMessage.model_validate(message), message_id=message_id
        )

    def assistant(calls: list[tuple[str, dict[str, object]]]) -> dict[str, object]:
        return {
            "role": "assistant",
            "tool_calls": [{"id": c, "name": "delegate", "arguments": json.dumps(a)} for c, a in calls],
        }

    task = {"task": "subtask n1 d1 wait: x", "mode": "wait"}
    rows = {
        "c": [
            row(1, 1, {"role": "user", "content": "message 1"}, "c-m1"),
            row(
                2,
                1,
                assistant(
                    [("a", task), ("b", {**task, "mode": "background"}), ("p", {**task, "profile": "x"})]
                ),
            ),
            row(
                3, 1, assistant([("m", {**task, "mode": "later"}), ("f1", task), ("f2", task), ("f3", task)])
            ),
        ],
        "c.sub1-abc.sub1-def": [row(4, 1, assistant([("deep", task)]))],
    }
    calls = {c.call_id: c for c in delegate_calls(rows, max_depth=2, max_fanout=3)}
    assert calls["a"].sub_chat == sub_chat_id("c", 1, "a") and calls["a"].refusal is None
    assert calls["b"].mode == "background" and calls["b"].refusal is None
    assert "profile" in str(calls["p"].refusal)
    assert calls["m"].refusal is not None  # not a mode
    assert calls["f2"].refusal is None and "> 3" in str(calls["f3"].refusal)  # the fourth call of its reply
    assert "depth 3" in str(calls["deep"].refusal)
    from tests.chaos.users import delegating_turn, is_sub_chat, parent_chat

    nested = sub_chat_id(sub_chat_id("c", 12, "a"), 3, "b")
    assert is_sub_chat(nested) and parent_chat(nested) == sub_chat_id("c", 12, "a") and not is_sub_chat("c")
    assert delegating_turn(nested) == 3 and delegating_turn(parent_chat(nested)) == 12
    mid = report_message_id("c.sub1-abc", 2)
    assert is_report_id(mid) and report_of(mid) == "c.sub1-abc" and not is_report_id("c-m1")
    answer = [
        row(1, 1, {"role": "user", "content": "t"}),
        row(2, 1, {"role": "assistant", "content": "answer of subtask n1: done"}),
    ]
    assert final_answer(answer, 1) == "answer of subtask n1: done" and final_answer(answer, 2) is None
    assert final_answer([*answer, row(3, 1, assistant([("x", task)]))], 1) is None


def _delegation_checker(parent_row: str, reports: list[str]) -> object:
    """A checker over one chat whose turn delegated a waiting and a background task,
    both answered; `parent_row` is the waiting call's result row."""
    from collections import Counter
    from types import SimpleNamespace

    from tests.chaos.base import Report
    from tests.chaos.check import Checker
    from turnkeeper.models import ChatMessage
    from turnkeeper.store import TranscriptRow
    from turnkeeper.subagents import sub_chat_id

    def row(i: int, message: dict[str, object], message_id: str | None = None) -> TranscriptRow:
        return TranscriptRow(id=i, turn=1, message=ChatMessage.model_validate(message), message_id=message_id)

    wait, bg = sub_chat_id("c", 1, "a"), sub_chat_id("c", 1, "b")
    calls = [
        {"id": "a", "name": "delegate", "arguments": json.dumps({"task": "subtask n1 d1 wait: x"})},
        {
            "id": "b",
            "name": "delegate",
            "arguments": json.dumps({"task": "subtask n2 d1 background: x", "mode": "background"}),
        },
    ]
    parent = [
        row(1, {"role": "user", "content": "message 1"}, "c-m1"),
        row(2, {"role": "assistant", "tool_calls": calls}),
        row(3, {"role": "tool", "tool_call_id": "a", "content": parent_row}),
        row(4, {"role": "tool", "tool_call_id": "b", "content": "Started subagent"}),
        *(
            row(5 + i, {"role": "user", "content": "Subagent (...) answered:\nanswer of subtask n2: done"}, m)
            for i, m in enumerate(reports)
        ),
    ]

    def sub(task_call: str, task: str, answer: str) -> list[TranscriptRow]:
        return [
            row(10, {"role": "user", "content": task}, f"delegated:{task_call}"),
            row(11, {"role": "assistant", "content": answer}),
        ]

    cfg = chaos.ChaosConfig()
    h = SimpleNamespace(cfg=cfg, subagent_gates_decided=Counter(), actions=ActionLog(), chats={})
    checker = Checker(h, Report(seed=0, config={}, workdir=""))  # type: ignore[arg-type]
    checker.det = Counter()
    checker.rows_of = {
        "c": parent,
        wait: sub("a", "subtask n1 d1 wait: x", "answer of subtask n1: done"),
        bg: sub("b", "subtask n2 d1 background: x", "answer of subtask n2: done"),
    }
    turn = {"turn": 1, "status": "completed", "reason": None}
    checker.turns = [{"chat_id": c, **turn} for c in ("c", wait, bg)]
    checker.turns_of = {t["chat_id"]: {1: t} for t in checker.turns}
    checker.children = {f"chat-{wait}": {"r1"}, f"chat-{bg}": {"r2"}}
    checker.refused_ids, checker.events = {}, []
    checker.senders = {("c", m): "subagent" for m in reports}
    checker._delegations()
    return checker


def test_the_checker_finds_a_lost_child_answer_and_a_lost_or_misplaced_report() -> None:
    from turnkeeper.subagents import report_message_id, sub_chat_id

    bg_report = report_message_id(sub_chat_id("c", 1, "b"), 1)
    fine = _delegation_checker("answer of subtask n1: done", [bg_report])
    assert not +fine.det, fine.report.failures  # type: ignore[attr-defined]
    assert fine.report.subagents["wait_answers_matched"] == 1 and fine.report.subagents["reports"] == 1  # type: ignore[attr-defined]
    wait_report = report_message_id(sub_chat_id("c", 1, "a"), 1)
    bad = _delegation_checker("Error: the subagent's turn ended stopped", [wait_report])
    assert +bad.det == {  # type: ignore[attr-defined]
        "wait_answers_lost": 1,
        "background_reports_lost": 1,
        "reports_from_waiting_children": 1,
        "reports_for_turns_not_ended": 1,
    }
