"""Runs that no open turn leads to, swept by each reconcile pass (activities/reconcile/reconciler.py).

A run can hold acknowledged messages that no turn row of the store leads to: it
ended abnormally before the store recorded its turn (say, terminated while the
store was down), a newer message closed its turn before any pass looked at it,
or its workflow task keeps failing before its turn was numbered or after it
closed. The sweep finds such runs on the server (by their close, or by the
server's mark on a wedged run), ends the wedged ones, and hands on the messages
the store lacks, in order, as a client's send would. Also here: how the
reconciler looks at one run (describe, terminate, a readable history).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from turnkeeper.activities.reconcile import history_read, wedged_runs
from turnkeeper.client import RUN_DETAILS, WORKFLOW_TYPE, run_summary, workflow_id
from turnkeeper.config import Settings
from turnkeeper.models import TURN_TASK_TIMEOUT, ChatTurnInput, TurnState, UserMessage
from turnkeeper.payloads.encryption import DecryptionError
from turnkeeper.store import SessionStore

log = logging.getLogger("turnkeeper.reconciler")

WORKFLOW_ID_PREFIX = workflow_id("")
# Visibility is eventually consistent: each pass looks a little further back.
SWEEP_OVERLAP = timedelta(minutes=5)
SWEEP_FIRST_LOOKBACK = timedelta(days=1)


class RunSweep:
    def __init__(self, settings: Settings, store: SessionStore) -> None:
        self._settings = settings
        self._store = store
        # Abnormally closed runs already looked at, and how far back the next pass looks.
        self.swept: set[str] = set()
        self.swept_until = datetime.now(UTC) - SWEEP_FIRST_LOOKBACK

    async def end_wedged_runs_without_turn(
        self, client: Client, open_runs: set[str | None]
    ) -> tuple[int, int]:
        """Runs whose task keeps failing and that no open turn row leads to: wedged
        before the store numbered their turn, or after it closed, holding the next
        turn's messages. The server marks such runs (TemporalReportedProblems, which
        dynamic config turns on); each is ended and its messages handed on in order,
        before a newer message starts a turn. Returns (runs ended, messages handed on)."""
        query = (
            f"WorkflowType = '{WORKFLOW_TYPE}' AND TaskQueue = '{self._settings.task_queue}' AND "
            f"ExecutionStatus = 'Running' AND {wedged_runs.REPORTED_PROBLEMS} IS NOT NULL"
        )
        ended = handed = 0
        try:
            runs = [run async for run in client.list_workflows(query)]
        except RPCError as err:
            # A server without the attribute refuses the query: the rest of the pass goes on.
            log.warning("runs marked with %s not listed this pass: %s", wedged_runs.REPORTED_PROBLEMS, err)
            return 0, 0
        for run in runs:
            if run.run_id in open_runs or not run.id.startswith(WORKFLOW_ID_PREFIX):
                continue
            chat_id = run.id[len(WORKFLOW_ID_PREFIX) :]
            handle = client.get_workflow_handle(run.id, run_id=run.run_id)
            try:
                described = await describe(handle)
                if described is None or described.status in ENDED:
                    continue  # the closed-run sweep looks at it
                stuck = await wedged_runs.wedged(handle, described)
                if stuck is None:
                    continue
                log.warning(
                    "chat %s: ending run %s, which holds no open turn: %s",
                    chat_id,
                    run.run_id,
                    stuck.describe(),
                )
                if await terminate(handle, stuck):
                    ended += 1
                handed += await self.sweep_run(client, chat_id, run.id, run.run_id)
                self.swept.add(run.run_id)
            except Exception as err:
                log.warning("chat %s run %s: not judged this pass: %s", chat_id, run.run_id, err)
        return ended, handed

    async def sweep_unrecorded_runs(self, client: Client, open_runs: set[str | None]) -> int:
        """Runs that ended abnormally hold acknowledged messages that no open turn row
        leads to: a run that ended before the store recorded its turn (say, terminated
        while the store was down), or one whose turn a newer message closed before any
        pass looked at it. Find them by the run's close and hand their uncommitted
        messages on; runs in `open_runs` are the open-turn path's. Cost: one
        visibility query a pass, and a look at each such run once."""
        since = self.swept_until - SWEEP_OVERLAP
        started = datetime.now(UTC)
        query = (
            f"WorkflowType = '{WORKFLOW_TYPE}' AND TaskQueue = '{self._settings.task_queue}' AND CloseTime > '{since.strftime('%Y-%m-%dT%H:%M:%SZ')}' AND "
            "(ExecutionStatus = 'Terminated' OR ExecutionStatus = 'Failed' OR ExecutionStatus = 'TimedOut')"
        )
        handed = 0
        complete = True
        async for run in client.list_workflows(query):
            if run.run_id in self.swept or not run.id.startswith(WORKFLOW_ID_PREFIX):
                continue
            chat_id = run.id[len(WORKFLOW_ID_PREFIX) :]
            try:
                if run.run_id not in open_runs:
                    handed += await self.sweep_run(client, chat_id, run.id, run.run_id)
            except Exception as err:
                log.warning("chat %s run %s: not swept this pass: %s", chat_id, run.run_id, err)
                complete = False
                continue
            self.swept.add(run.run_id)
        if complete:
            self.swept_until = started
        return handed

    async def sweep_run(self, client: Client, chat_id: str, workflow_id_: str, run_id: str) -> int:
        if not chat_id.strip():
            # `ChatTurn` fails a run whose chat id is blank (started by hand, e.g. with the
            # `temporal` CLI): its messages, handed on, would fail another run every pass.
            log.warning(
                "chat %r: run %s failed for its blank chat id; its messages are not handed on "
                "(send them to a chat with a name)",
                chat_id,
                run_id,
            )
            return 0
        events = await readable(
            (await client.get_workflow_handle(workflow_id_, run_id=run_id).fetch_history()).events, client
        )
        lost = await self.uncommitted(chat_id, history_read.acknowledged(events))
        if lost:
            # A run that holds the chat now may have them already (handed on by an earlier pass).
            live = client.get_workflow_handle(workflow_id_)
            if (await live.describe()).status == WorkflowExecutionStatus.RUNNING:
                state = await live.query("state", result_type=TurnState)
                lost = [m for m in lost if m.message_id not in state.pending_followups]
        if lost:
            log.info(
                "chat %s: %d message(s) of run %s, which ended abnormally, handed on",
                chat_id,
                len(lost),
                run_id,
            )
            await self.hand_on(client, chat_id, lost)
        return len(lost)

    async def uncommitted(self, chat_id: str, messages: tuple[UserMessage, ...]) -> list[UserMessage]:
        """Acknowledged messages of the dead run the store does not hold yet: the
        recovery run (or the next turn) takes them over, so none is lost."""
        limit = self._settings.max_message_bytes
        offered = [m for m in messages if len(m.text.encode()) <= limit]  # the run refused larger ones
        if not offered:
            return []
        held = set(await self._store.held_message_ids(chat_id, [m.message_id for m in offered]))
        return [m for m in offered if m.message_id not in held]

    async def hand_on(self, client: Client, chat_id: str, messages: list[UserMessage]) -> None:
        """The turn is closed; its follow-ups start the next turn, as a client's send would."""
        for message in messages:
            await client.start_workflow(
                WORKFLOW_TYPE,
                ChatTurnInput(chat_id=chat_id),
                id=workflow_id(chat_id),
                task_queue=self._settings.task_queue,
                task_timeout=TURN_TASK_TIMEOUT,
                start_signal="user_message",
                start_signal_args=[message],
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                static_summary=run_summary(chat_id),
                static_details=RUN_DETAILS,
            )


async def readable(events: Sequence[HistoryEvent], client: Client) -> Sequence[HistoryEvent]:
    """A fetched history holds payloads as stored (encrypted under TURNKEEPER_ENCRYPTION_KEYS):
    decode those history_read reads with the client's codec. One that does not decrypt
    stays as it is, and the verdict names its key id."""
    codec = client.data_converter.payload_codec
    if codec is None:
        return events
    for event in events:
        payloads = history_read.payloads_read(event)
        if payloads is None or not payloads.payloads:
            continue
        try:
            decoded = await codec.decode(payloads.payloads)
        except DecryptionError:
            continue
        del payloads.payloads[:]
        payloads.payloads.extend(decoded)
    return events


ENDED = frozenset(
    {
        WorkflowExecutionStatus.COMPLETED,
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.CANCELED,
        WorkflowExecutionStatus.TERMINATED,
        WorkflowExecutionStatus.CONTINUED_AS_NEW,
        WorkflowExecutionStatus.TIMED_OUT,
    }
)


async def terminate(handle: WorkflowHandle[Any, Any], stuck: wedged_runs.Wedged) -> bool:
    """False when the run ended by itself meanwhile: it is then judged as it ended."""
    try:
        await handle.terminate(reason=f"turnkeeper reconciler: {stuck.describe()}")
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        return False
    return True


async def describe(handle: WorkflowHandle[Any, Any]) -> WorkflowExecutionDescription | None:
    """The exact run the turn records; None when it and its history are gone."""
    try:
        return await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
