"""The `turnkeeper` commands that talk to Temporal and to the session store.

Each returns its exit code or raises `Refused`; `turnkeeper.cli` parses the
arguments and dispatches here.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TYPE_CHECKING, Any

from turnkeeper import client as tk
from turnkeeper.cli_common import (
    EXIT_AWAITING,
    EXIT_OK,
    NOT_WAITING,
    NoWorker,
    Refused,
    Undecryptable,
    connect_client,
    open_session_store,
    query_state,
)
from turnkeeper.cli_output import chat_row, describe_gate, event_line, event_text, print_json, transcript_line
from turnkeeper.config import Settings
from turnkeeper.models import (
    CHAT_ID_ATTR,
    DISMISSED_TEXT,
    OPEN_STATUSES,
    RECOVERY_REASON_ATTR,
    TURN_STATUS_ATTR,
    Reason,
    TurnRecord,
    TurnState,
    TurnStatus,
)

if TYPE_CHECKING:
    from temporalio.client import Client

POLL_S = 0.1
# A turn normally shows its message within a second; after this long, `send`
# checks whether any worker serves the queue and says so if none does.
NO_WORKER_CHECK_S = 5.0
EVENTS_PAGE = 1000


async def cmd_send(args: argparse.Namespace, settings: Settings) -> int:
    try:
        message = tk.new_message(args.text, settings, message_id=args.message_id)
    except tk.MessageTooLarge as err:
        raise Refused(str(err)) from None
    client = await connect_client(settings)
    store = await open_session_store(settings) if not args.no_wait else None
    # A retry of a message the chat already holds starts no turn: it follows the one that took it.
    after = await store.follow_from(args.chat, message.message_id) if store is not None else 0
    await tk.send_message(client, settings, args.chat, message)
    if store is None:
        print(f"sent {message.message_id} to chat {args.chat}")
        return EXIT_OK
    try:
        return await _follow_turn(client, store, args.chat, message.message_id, after, args.timeout,
                                  task_queue=settings.task_queue)
    finally:
        await store.close()


async def _follow_turn(client: Client, store: Any, chat_id: str, message_id: str | None, after: int,
                       timeout: float, task_queue: str, turn: int | None = None) -> int:
    """Show the turn that takes our message (or `turn`): its tools as they run,
    then its answer; exit 3 if it waits for its user again."""
    answer: str | None = None
    deadline = time.monotonic() + timeout
    check_worker_at = time.monotonic() + NO_WORKER_CHECK_S
    while time.monotonic() < deadline:
        if turn is None and time.monotonic() >= check_worker_at:
            check_worker_at = deadline  # once
            if await _no_worker_polls(client, task_queue):
                print(f"turnkeeper: no worker is serving task queue {task_queue!r}; the message is safe "
                      "and waits for one (start it with `turnkeeper worker`)", file=sys.stderr, flush=True)
        for ev in await store.events(chat_id, after_seq=after):
            after = ev.seq
            p = ev.payload
            ours = message_id is not None and p.get("message_id") == message_id
            if ev.type == "message_rejected" and ours:
                raise Refused(f"message refused: {p.get('reason')}")
            if ev.type == "user_message" and ours:
                turn = p.get("turn")
            if turn is None or p.get("turn") != turn:
                continue
            if ev.type == "tool_started":
                print(f"  -> {p.get('name')} started", flush=True)
            elif ev.type in ("tool_finished", "tool_interrupted"):
                print(f"  <- {p.get('name')} {p.get('status', 'interrupted')}", flush=True)
            elif ev.type == "assistant_message" and not p.get("tool_calls"):
                answer = p.get("text")
            elif ev.type == "recovery_state" and p.get("status") == TurnStatus.AWAITING_USER.value:
                print(describe_gate(await query_state(client, chat_id)))
                return EXIT_AWAITING
            elif ev.type == "recovery_state" and p.get("status") == TurnStatus.FAILED.value:
                # Its recovery failed: no run holds the turn, only Dismiss or a new message closes it.
                record = await store.get_turn(chat_id, turn)
                print(describe_gate(_state_of(record)) if record else f"turn {turn} failed ({p.get('reason')})")
                return EXIT_AWAITING
            elif ev.type == "turn_end":
                if answer is not None:
                    print(answer)
                else:
                    print(f"turn {turn} ended: {p.get('status')} ({p.get('reason')})")
                return EXIT_OK
        await asyncio.sleep(POLL_S)
    raise Refused(f"no answer within {timeout:.0f} s (the message is safe; the turn goes on): "
                  f"see `turnkeeper status {chat_id}`")


async def _no_worker_polls(client: Client, task_queue: str) -> bool:
    """True when the server has seen no worker poll the queue lately (False if it cannot tell)."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
    from temporalio.service import RPCError

    request = DescribeTaskQueueRequest(namespace=client.namespace, task_queue=TaskQueue(name=task_queue),
                                       task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)
    try:
        return not (await client.workflow_service.describe_task_queue(request)).pollers
    except RPCError:
        return False


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.client import WorkflowExecutionStatus

    client = await connect_client(settings)
    run_status = (await _describe(client, args.chat)).status
    try:
        state = await query_state(client, args.chat)
    except NoWorker as err:
        # The store still knows the turn: show that, and say why it is all we show.
        state = await _stored_turn(settings, args.chat)
        print(f"turnkeeper: {err}; showing the session store's record", file=sys.stderr)
    if run_status != WorkflowExecutionStatus.RUNNING:
        state = await _failed_turn(settings, args.chat) or state
    if args.json:
        print_json(state.model_dump(mode="json"))
        return EXIT_OK
    print(describe_gate(state))
    if run_status != WorkflowExecutionStatus.RUNNING and state.status in OPEN_STATUSES:
        # Terminated, timed out or failed: its last state is not the turn's end.
        print(f"its run has ended ({run_status.name.lower().replace('_', ' ')}) without closing the turn; "
              f"the reconciler recovers it within {settings.reconcile_every} s")
    if state.pending_followups:
        print(f"pending follow-ups: {', '.join(state.pending_followups)}")
    for call in state.tool_calls:
        print(f"  tool {call.name} [{call.id}]: {call.status.value}")
    return EXIT_OK


async def cmd_history(args: argparse.Namespace, settings: Settings) -> int:
    store = await open_session_store(settings)
    try:
        rows = await store.history(args.chat)
    finally:
        await store.close()
    if args.json:
        print_json([m.public() for m in rows])
        return EXIT_OK
    if not rows:
        raise Refused(f"no chat {args.chat!r}: nothing was ever committed to it")
    for m in rows:
        print(transcript_line(m))
    return EXIT_OK




async def cmd_events(args: argparse.Namespace, settings: Settings) -> int:
    store = await open_session_store(settings)
    after = args.after
    try:
        while True:
            page = await store.events(args.chat, after_seq=after, limit=EVENTS_PAGE)
            if not page and after == 0 and not args.follow:
                raise Refused(f"no chat {args.chat!r}: it has no events")
            for ev in page:
                after = ev.seq
                if args.json:
                    print(event_line(ev), flush=True)
                else:
                    print(event_text(ev), flush=True)
            if len(page) == EVENTS_PAGE:
                continue  # more already written
            if not args.follow:
                return EXIT_OK
            await asyncio.sleep(0.25)
    finally:
        await store.close()


async def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect_client(settings)
    query = f"WorkflowType='{tk.WORKFLOW_TYPE}'"
    status = TurnStatus.AWAITING_USER.value if args.awaiting else args.status
    if status:
        query += f" AND TurnStatus='{status}'"
    latest: dict[str, Any] = {}
    async for wf in client.list_workflows(query):
        known = latest.get(wf.id)
        if known is None or wf.start_time > known.start_time:
            latest[wf.id] = wf
    rows = []
    for wf in sorted(latest.values(), key=lambda w: w.start_time, reverse=True):
        sa = wf.search_attributes
        rows.append({"chat_id": (sa.get(CHAT_ID_ATTR.name) or [wf.id.removeprefix("chat-")])[0],
                     "status": (sa.get(TURN_STATUS_ATTR.name) or [None])[0],
                     "reason": (sa.get(RECOVERY_REASON_ATTR.name) or [None])[0],
                     "workflow_id": wf.id, "run_id": wf.run_id, "started": wf.start_time.isoformat()})
    if args.json:
        print_json(rows)
        return EXIT_OK
    for r in rows:
        print(chat_row(r))
    return EXIT_OK


async def _describe(client: Client, chat_id: str) -> Any:
    from temporalio.service import RPCError, RPCStatusCode

    try:
        return await client.get_workflow_handle(tk.workflow_id(chat_id)).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise Refused(f"no chat {chat_id!r}: nothing was ever sent to it") from None
        raise


async def _stored_turn(settings: Settings, chat_id: str) -> TurnState:
    store = await open_session_store(settings)
    try:
        record = await store.get_turn(chat_id)
    finally:
        await store.close()
    if record is None:
        return TurnState(chat_id=chat_id)
    return _state_of(record)


def _state_of(record: TurnRecord) -> TurnState:
    return TurnState(chat_id=record.chat_id, turn=record.turn, status=record.status, reason=record.reason,
                     recovery_id=record.recovery_id, can_continue=record.can_continue,
                     attempts=record.attempts)


async def _failed_turn(settings: Settings, chat_id: str, dismiss: bool = False) -> TurnState | None:
    """The chat's latest turn if the reconciler could not recover it (failed /
    recovery_failed). No run holds such a turn, so the store is its only record:
    `status` shows it from there, and Dismiss closes it there, as the workflow
    would have (interrupted rows for unanswered calls, one closing row)."""
    from turnkeeper.activities.store import TurnUpdate

    store = await open_session_store(settings)
    try:
        record = await store.get_turn(chat_id)
        if record is None or record.status != TurnStatus.FAILED:
            return None
        if not dismiss:
            return _state_of(record)
        from turnkeeper.workflows import recovery  # only here: `status` stays light

        state = _state_of(record)
        if recovery.refusal(state, "dismiss", record.recovery_id) is not None:
            return None
        recovery.end_recovered(state, Reason.DISMISSED)
        await store.close_unanswered_calls(chat_id, record.turn)
        # Only from `failed`: a message sent meanwhile may have closed it as superseded.
        if not await store.finish_turn(chat_id, record.turn, TurnUpdate(
                status=state.status, reason=state.reason, recovery_id=record.recovery_id,
                can_continue=record.can_continue, attempts=record.attempts),
                closing_text=DISMISSED_TEXT, only_from=frozenset({TurnStatus.FAILED})):
            return None
        closed = await store.get_turn(chat_id, record.turn)
        assert closed is not None  # written just now
        return _state_of(closed)
    finally:
        await store.close()


async def _decide(args: argparse.Namespace, settings: Settings, update: str) -> int:
    from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateFailedError
    from temporalio.service import RPCError

    client = await connect_client(settings)
    desc = await _describe(client, args.chat)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        # No run holds the turn: only a failed one can be decided, in the store (no worker needed).
        if update == "dismiss_turn":
            dismissed = await _failed_turn(settings, args.chat, dismiss=True)
            if dismissed is not None:
                print(describe_gate(dismissed))
                return EXIT_OK
        raise Refused(NOT_WAITING)
    state = await query_state(client, args.chat)
    if not state.recovery_id:
        raise Refused(NOT_WAITING)
    store = await open_session_store(settings) if getattr(args, "wait", False) else None
    try:
        after = await store.follow_from(args.chat) if store else 0
        try:
            new_state = await tk.decide(client, args.chat, update, state.recovery_id)
        except WorkflowUpdateFailedError as err:
            raise Refused(str(err.cause.message if err.cause else err)) from None
        except RPCError as err:
            if "already completed" in str(err):
                raise Refused(NOT_WAITING) from None
            raise
        print(describe_gate(new_state), flush=True)
        if store is None:
            return EXIT_OK
        return await _follow_turn(client, store, args.chat, None, after, args.timeout,
                                  task_queue=settings.task_queue, turn=new_state.turn)
    finally:
        if store is not None:
            await store.close()


async def cmd_continue(args: argparse.Namespace, settings: Settings) -> int:
    return await _decide(args, settings, "continue_turn")


async def cmd_dismiss(args: argparse.Namespace, settings: Settings) -> int:
    return await _decide(args, settings, "dismiss_turn")


async def cmd_stop(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    client = await connect_client(settings)
    handle = client.get_workflow_handle(tk.workflow_id(args.chat))
    if (await _describe(client, args.chat)).status != WorkflowExecutionStatus.RUNNING:
        raise Refused(f"no turn of chat {args.chat!r} is running")
    later = ""
    try:
        state = await query_state(client, args.chat)
    except NoWorker as err:
        # A signal is durable: the run acts on it once a worker serves it again.
        state = await _stored_turn(settings, args.chat)
        later = (f" ({err}: the turn stops once a worker can read it)" if isinstance(err, Undecryptable)
                 else " (no worker is serving it now: the turn stops when one starts)")
    if state.status not in OPEN_STATUSES or not state.turn:
        raise Refused(f"no turn of chat {args.chat!r} is running")
    try:
        await handle.signal("stop", {})
    except RPCError as err:
        if "already completed" in str(err):
            raise Refused(f"no turn of chat {args.chat!r} is running") from None
        raise
    print(f"stop sent to chat {args.chat}, turn {state.turn}{later}")
    return EXIT_OK
