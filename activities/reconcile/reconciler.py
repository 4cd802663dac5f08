"""The reconciler (docs/contract.md, "Reconciler"): finds turns the store shows open whose run
is no longer running, judges what remains (activities/reconcile/verdict.py) and either
closes the turn (`committed`, `answer_restored`) or starts a `ChatTurn` run in
recovery mode, which opens the gate and waits for Continue or Dismiss.

A pass reads the open turns only, so its cost grows with open turns, not with
all chats; a turn whose run is running costs one describe and nothing else, unless
the run's workflow task keeps failing: a run that gets nowhere for a minute is
ended and recovered like any other (activities/reconcile/wedged_runs.py). Runs that no open
turn leads to are swept at the end of the pass (activities/reconcile/run_sweep.py).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from typing import Literal

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from turnkeeper.activities.reconcile import history_read, wedged_runs
from turnkeeper.activities.reconcile import verdict as reconcile_verdict
from turnkeeper.activities.reconcile.run_sweep import ENDED, RunSweep, describe, readable, terminate
from turnkeeper.client import RUN_DETAILS, WORKFLOW_TYPE, run_summary, workflow_id
from turnkeeper.config import Settings
from turnkeeper.inbox import chunks, wire_size
from turnkeeper.models import (
    INTERRUPTED_TOOL_TEXT,
    OPEN_STATUSES,
    TURN_TASK_TIMEOUT,
    UNSTARTED_TOOL_TEXT,
    ChatTurnInput,
    ModelReply,
    Reason,
    RecoveryStart,
    TurnRecord,
    TurnStatus,
    UserMessage,
)
from turnkeeper.reconcile_io import RECONCILE_PASS, ReconcileSummary
from turnkeeper.store import CorruptRowError, SessionStore, StoreError, TurnUpdate
from turnkeeper.store.base import TurnRef
from turnkeeper.telemetry import metrics

log = logging.getLogger("turnkeeper.reconciler")

# What a pass reports for a turn it left as it was.
Untouched = Literal["healthy", "settled", "busy"]

# Infrastructure trouble, not a bad chat: the next pass tries the chat again.
_TRANSIENT_RPC = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.ABORTED,
        RPCStatusCode.CANCELLED,
    }
)


class Reconciler:
    def __init__(self, settings: Settings, store: SessionStore) -> None:
        self._settings = settings
        self._store = store
        self._runs = RunSweep(settings, store)

    @activity.defn(name=RECONCILE_PASS)
    async def reconcile_pass(self) -> ReconcileSummary:
        client = activity.client()
        summary = ReconcileSummary()
        refs = await self._store.open_turn_refs()
        for ref in refs:
            activity.heartbeat(summary.examined)
            summary.examined += 1
            try:
                outcome = await self._reconcile(client, ref)
            except Exception as err:
                if _transient(err):
                    log.warning("chat %s turn %d: deferred to the next pass: %s", ref.chat_id, ref.turn, err)
                    summary.deferred += 1
                    continue
                log.exception("recovering chat %s turn %d failed: %s", ref.chat_id, ref.turn, err)
                if await self._mark_failed(ref):
                    summary.failed += 1
                continue
            if isinstance(outcome, Reason):
                summary.count(outcome)
            elif outcome == "healthy":
                summary.healthy += 1
            elif outcome == "settled":
                summary.settled += 1
            else:
                summary.busy += 1
        open_runs = {ref.run_id for ref in refs}
        summary.ended_wedged, handed = await self._runs.end_wedged_runs_without_turn(client, open_runs)
        summary.handed_on = handed + await self._runs.sweep_unrecorded_runs(client, open_runs)
        if summary.examined != summary.healthy or summary.handed_on or summary.ended_wedged:
            log.info("reconcile pass: %s", summary.model_dump_json())
        return summary

    async def _reconcile(self, client: Client, ref: TurnRef) -> Reason | Untouched:
        handle = client.get_workflow_handle(workflow_id(ref.chat_id), run_id=ref.run_id)
        described: WorkflowExecutionDescription | None = None
        ended_here = False
        if ref.run_id is not None:
            described = await describe(handle)
            if described is not None and described.status not in ENDED:
                stuck = await wedged_runs.wedged(handle, described)
                if stuck is None:
                    return "healthy"
                log.warning(
                    "chat %s turn %d: ending run %s: %s", ref.chat_id, ref.turn, ref.run_id, stuck.describe()
                )
                ended_here = await terminate(handle, stuck)
                described = await describe(handle)
            if described is not None and described.status == WorkflowExecutionStatus.CONTINUED_AS_NEW:
                # A long history handed on: the run it continued in adopts the turn in
                # its first workflow task (which may wait for a worker).
                current = await describe(client.get_workflow_handle(workflow_id(ref.chat_id)))
                if current is not None and current.status == WorkflowExecutionStatus.RUNNING:
                    return "busy"
        # Read again: the turn may have closed, or been adopted, since the listing.
        record = await self._store.get_turn(ref.chat_id, ref.turn)
        if record is None or record.status not in OPEN_STATUSES or record.run_id != ref.run_id:
            if ended_here and ref.run_id is not None:
                # Its turn closed meanwhile, but the run held messages for the next one: handed
                # on now, before a newer message starts a turn (the end-of-pass sweep skips this run).
                await self._runs.sweep_run(client, ref.chat_id, workflow_id(ref.chat_id), ref.run_id)
                self._runs.swept.add(ref.run_id)
            return "settled"

        events = None
        if described is not None:
            try:
                events = await readable((await handle.fetch_history()).events, client)
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
                # Deleted since the describe: the store is all that is left.
        try:
            rows = await self._store.turn_messages(ref.chat_id, ref.turn)
        except CorruptRowError as err:
            verdict = replace(
                reconcile_verdict.invalid(str(err)),
                messages=history_read.acknowledged(events) if events is not None else (),
            )
        else:
            verdict = (
                reconcile_verdict.judge_store(rows)
                if events is None
                else history_read.judge_history(events, rows, resuming=record.status == TurnStatus.RESUMING)
            )
        log.info("chat %s turn %d: %s (%s)", ref.chat_id, ref.turn, verdict.reason.value, verdict.detail)
        pending = await self._runs.uncommitted(ref.chat_id, verdict.messages)

        if verdict.closes_turn:
            await self._close(ref, record, verdict)
            if pending:
                await self._runs.hand_on(client, ref.chat_id, pending)
            return verdict.reason

        for call in verdict.unanswered:
            await self._store.record_tool_result(
                ref.chat_id,
                ref.turn,
                call.id,
                call.name,
                INTERRUPTED_TOOL_TEXT if call.started else UNSTARTED_TOOL_TEXT,
                status="interrupted",
            )
        pending = await self._bound(ref, pending)
        try:
            await client.start_workflow(
                WORKFLOW_TYPE,
                ChatTurnInput(
                    chat_id=ref.chat_id,
                    pending=pending,
                    recovery=RecoveryStart(
                        turn=ref.turn,
                        reason=verdict.reason,
                        can_continue=verdict.can_continue,
                        recovery_id=record.recovery_id,
                        attempts=record.attempts,
                        detail=verdict.detail or None,
                    ),
                ),
                id=workflow_id(ref.chat_id),
                task_queue=self._settings.task_queue,
                task_timeout=TURN_TASK_TIMEOUT,
                static_summary=run_summary(
                    ref.chat_id, f"turn {ref.turn} waits for its user ({verdict.reason.value})"
                ),
                static_details=RUN_DETAILS,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            )
        except WorkflowAlreadyStartedError:
            # That run owns the chat: a recovery run of an earlier pass, or a new turn
            # whose first task closes this one itself.
            return "busy"
        return verdict.reason

    async def _close(self, ref: TurnRef, record: TurnRecord, verdict: reconcile_verdict.Verdict) -> None:
        """Persist, then announce: the store writes recovery_state, session_updated, turn_end."""
        if verdict.reason == Reason.ANSWER_RESTORED:
            # The step after the turn's last one. The run id stays the ended run's (a
            # verdict from a history always has one).
            step = await self._store.adopt_turn(ref.chat_id, ref.turn, ref.run_id or "")
            # Not `final=True`: that would close the turn as completed; it closes
            # below as recovered/answer_restored, in one turn_end.
            await self._store.record_assistant(
                ref.chat_id, ref.turn, step, ModelReply(text=verdict.final_text), final=False
            )
        await self._store.finish_turn(
            ref.chat_id,
            ref.turn,
            TurnUpdate(
                status=TurnStatus.RECOVERED,
                reason=verdict.reason,
                recovery_id=record.recovery_id or uuid.uuid4().hex,
                can_continue=record.can_continue,
                attempts=record.attempts,
            ),
        )
        # No run ends this turn: it ends here.
        metrics.turn_ended(activity.metric_meter(), TurnStatus.RECOVERED, verdict.reason)

    async def _bound(self, ref: TurnRef, pending: list[UserMessage]) -> list[UserMessage]:
        """A recovery run's input stays under the chat's pending bound (a run of an
        older release may have held more): the earliest messages over it are
        committed to the turn now, in order, so none is lost and the input fits."""
        limit = self._settings.max_pending_bytes
        keep: list[UserMessage] = []
        size = 0
        for message in reversed(pending):
            size += wire_size(message)
            if size > limit:
                break
            keep.insert(0, message)
        early = pending[: len(pending) - len(keep)]
        for chunk in chunks(early):
            await self._store.commit_user_messages(ref.chat_id, ref.turn, chunk)
        return keep

    async def _mark_failed(self, ref: TurnRef) -> bool:
        """failed/recovery_failed, can_continue false. Not open any more, so later
        passes leave it alone. Returns whether the turn was marked."""
        try:
            try:
                record = await self._store.get_turn(ref.chat_id, ref.turn)
            except CorruptRowError:
                record = None
            if record is not None and (record.status not in OPEN_STATUSES or record.run_id != ref.run_id):
                return False  # closed or taken over meanwhile: nothing to mark
            await self._store.update_turn(
                ref.chat_id,
                ref.turn,
                TurnUpdate(
                    status=TurnStatus.FAILED,
                    reason=Reason.RECOVERY_FAILED,
                    can_continue=False,
                    recovery_id=(record.recovery_id if record else None) or uuid.uuid4().hex,
                    attempts=record.attempts if record else 0,
                ),
            )
            metrics.turn_ended(activity.metric_meter(), TurnStatus.FAILED, Reason.RECOVERY_FAILED)
            return True
        except Exception as err:
            log.exception("could not mark chat %s turn %d failed: %s", ref.chat_id, ref.turn, err)
            return False


def _transient(err: Exception) -> bool:
    if isinstance(err, RPCError):
        return err.status in _TRANSIENT_RPC
    return isinstance(err, StoreError) and not isinstance(err, CorruptRowError)
