"""Replay recorded histories against today's workflow code: a change that would
break turns already running fails here, not in production.

Record new ones with `TK_RECORD_HISTORIES=1 pytest tests/workflow/test_turns.py tests/process/test_crash.py
tests/workflow/test_recovery.py tests/workflow/test_no_wedge.py tests/workflow/test_approval.py
tests/workflow/test_run_end.py` (every run of each
test's chats is written to tests/histories/); keep the older ones in a subfolder: turns
started by an earlier release must still replay (`complete-machine/`: recorded before the
`act-at-wait-points` patch and single-batch activations; `three-markers/`: before
`recovery-machine-2` stood for the three patch markers that runs recorded until then;
`machine-2/`: before `recovery-machine-3` stood for that one and `tools-ask-first`; its
runs of tests/workflow/test_approval.py, with an approval gate in each, fail here if the
`tools-ask-first` gate is removed; `machine-3/`: before `recovery-machine-4` stood for
`recovery-machine-3` and a Continue whose store write finds the turn closed; `machine-4/`:
before `recovery-machine-5` handed running turns on between steps and gates at the same,
shorter bound; `machine-5/`: before `recovery-machine-6` took a Stop that comes while the
store numbers the turn; `machine-6/`: before `recovery-machine-8` judged a gate's store
check of superseding messages by the ids it sent alone; `machine-8/`: before
`recovery-machine-9` ended a run whose last wake-up was a store call's result after an
`end_of_run` activity; `machine-9/`: before `recovery-machine-10` judged a store check of
superseding messages, and refusals written at a gate, after `end_of_run` too; `machine-10/`:
before `recovery-machine-11` kept the messages out of a step that a Stop, Dismiss or newer
message is about to cancel; its `chaos_582_*` run, fetched from chaos seed 582's server,
completed without a newer message, and `test_a_newer_message_that_came_with_a_continued_steps_end_is_handed_on`
replays it as a run of `recovery-machine-11`). `late_store_result_then_end_of_run*.json` are runs of
`test_dismiss_while_a_continued_turn_runs_after_a_crash` in which the SDK handed the
closing store write's result over a task after the task that recorded it, and the run
then ended after `end_of_run`, a message signalled meanwhile.
`query_replay_ran_a_store_check_before_a_later_message.json` is chaos seed 567's run whose
recorded store check answered for one of the two messages the replay checks (a `state`
query's replay ran it early), with its two `held_messages` answers rewritten in the form
that names the ids asked, as runs of `recovery-machine-10` record them: it fails here if
the gate judges ids the answer does not cover. The runs that hand on in `test_a_gate_whose_history_grows_long_hands_itself_on`,
`test_a_waiting_approval_handed_on_keeps_its_calls` and
`test_a_running_turn_whose_history_grows_long_hands_itself_on` (recorded with a patched
limit) and the run that fails on purpose are not kept.
`before-unreadable-signals/` holds runs recorded before unreadable signal payloads were
refused, two of them (`unreadable_*`) fed such payloads on purpose: they fail here if a
`workflow.patched` gate in `ChatTurn` is removed.
`reconcile_*.json` are `Reconcile` runs (`TK_RECORD_HISTORIES=1 pytest tests/workflow/test_reconciler.py
-k leave_no_run` rewrites them); `before-quiet-passes/` holds one recorded before passes
deleted the quiet ones, which fails here if the `QUIET_PASSES` gate is removed."""
from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner
from temporalio.workflow import NondeterminismError

from tests.support import HISTORIES as HISTORIES_DIR
from turnkeeper.replay_watch import FailureWatch
from turnkeeper.workflows.chat_turn import ChatTurn
from turnkeeper.workflows.reconcile import Reconcile

HISTORIES = sorted(HISTORIES_DIR.rglob("*.json"))


def test_histories_are_kept() -> None:
    assert len(HISTORIES) >= 10


async def _replayed(paths: list[Path]) -> AsyncIterator[WorkflowHistory]:
    for path in paths:
        yield WorkflowHistory.from_json(f"{path.parent.name}/{path.stem}", path.read_text())


async def test_replay() -> None:
    """Every kept history, through one replayer (one worker for all of them: half the
    time of a replayer each); every history that does not replay is named."""
    # Unsandboxed, as the worker runs them by default: a quarter of the time. The
    # in-process worker tests run the same code in the sandbox.
    # Watched: a failure in the task after a history's last completed one is named too.
    watch = FailureWatch(UnsandboxedWorkflowRunner())
    replayer = Replayer(workflows=[ChatTurn, Reconcile], data_converter=pydantic_data_converter,
                        workflow_runner=watch)
    failures: list[str] = []
    replayed = 0
    async with replayer.workflow_replay_iterator(_replayed(HISTORIES)) as results:
        async for result in results:
            replayed += 1
            if result.replay_failure is not None:
                failures.append(f"{result.history.workflow_id}: {result.replay_failure!r}")
            elif (failed := watch.next_task_failure(result.history.run_id)) is not None:
                failures.append(f"{result.history.workflow_id}: {failed}")
    assert replayed == len(HISTORIES)
    assert not failures, "\n".join(failures)


# Chaos seed 582's run, recorded by `recovery-machine-10`: a worker that took the run
# over got a continued tool step's end and a newer message ("m5") in one activation.
CHAOS_582 = HISTORIES_DIR / "machine-10" / "chaos_582_newer_message_with_a_continued_steps_end.json"


def _as_machine(history_json: str, machine: str) -> str:
    """The history as if its run had asked `machine` instead of recovery-machine-10."""
    history = json.loads(history_json)
    for event in history["events"]:
        fields: list[dict[str, str]] = []
        marker = event.get("markerRecordedEventAttributes")
        if marker and marker.get("markerName") == "core_patch":
            fields = marker["details"]["patch-data"]["payloads"]
        upsert = event.get("upsertWorkflowSearchAttributesEventAttributes")
        if upsert and "TemporalChangeVersion" in upsert["searchAttributes"]["indexedFields"]:
            fields = [upsert["searchAttributes"]["indexedFields"]["TemporalChangeVersion"]]
        for field in fields:
            text = base64.b64decode(field["data"]).decode().replace("recovery-machine-10", machine)
            field["data"] = base64.b64encode(text.encode()).decode()
    return json.dumps(history)


async def test_a_newer_message_that_came_with_a_continued_steps_end_is_handed_on() -> None:
    """Replayed, that task applies the message first, and `recovery-machine-10` handed
    it to the next model call, whose input (recorded live, before the message) was
    empty; the call's answer beat its cancel, and the run counted the message as
    committed and completed without it. The same events under `recovery-machine-11`
    keep the message for the next turn: the run continues as new where the recorded
    one completed (the replay parts from the history at the run's last event)."""
    replayer = Replayer(workflows=[ChatTurn], data_converter=pydantic_data_converter,
                        workflow_runner=UnsandboxedWorkflowRunner())
    recorded = await replayer.replay_workflow(WorkflowHistory.from_json("chaos-582", CHAOS_582.read_text()))
    assert recorded.replay_failure is None
    machine_11 = WorkflowHistory.from_json("chaos-582", _as_machine(CHAOS_582.read_text(), "recovery-machine-11"))
    result = await replayer.replay_workflow(machine_11, raise_on_replay_failure=False)
    assert isinstance(result.replay_failure, NondeterminismError)
    assert "Continue as new" in str(result.replay_failure) and "WorkflowExecutionCompleted" in str(
        result.replay_failure)
