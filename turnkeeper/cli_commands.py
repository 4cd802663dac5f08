"""The `turnkeeper` commands that talk to Temporal and to the session store.

Each returns its exit code or raises `Refused`; `turnkeeper.cli` parses the
arguments and dispatches here.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

from turnkeeper import client as tk
from turnkeeper.cli_common import (
    EXIT_OK,
    EXIT_REFUSED,
    NOT_WAITING,
    QUERY_TIMEOUT,
    NoWorker,
    Refused,
    Undecryptable,
    connect_client,
    no_chat,
    no_worker,
    open_session_store,
    query_state,
)
from turnkeeper.cli_follow import follow_turn
from turnkeeper.cli_output import (
    chat_row,
    describe_gate,
    event_line,
    event_text,
    print_json,
    replay_lines,
    transcript_line,
)
from turnkeeper.config import Settings
from turnkeeper.models import (
    CHAT_ID,
    OPEN_STATUSES,
    RECOVERY_REASON,
    TURN_STATUS,
    TurnState,
    TurnStatus,
)

if TYPE_CHECKING:
    from temporalio.client import Client

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
        return await follow_turn(client, store, args.chat, message.message_id, after, args.timeout,
                                  task_queue=settings.task_queue)
    finally:
        await store.close()


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    run_status, answer = await _run_and_state(settings, args.chat)
    if isinstance(answer, NoWorker):
        # The store still knows the turn: show that, and say why it is all we show.
        state = await _stored_turn(settings, args.chat)
        print(f"turnkeeper: {answer}; showing the session store's record", file=sys.stderr)
    else:
        state = answer
    if run_status != "running":
        state = await _failed_turn(settings, args.chat) or state
    if args.json:
        print_json(state.model_dump(mode="json"))
        return EXIT_OK
    print(describe_gate(state))
    if run_status != "running" and state.status in OPEN_STATUSES:
        # Terminated, timed out or failed: its last state is not the turn's end.
        print(f"its run has ended ({run_status.replace('_', ' ')}) without closing the turn; "
              f"the reconciler recovers it within {settings.reconcile_every} s")
    if state.pending_followups:
        print(f"pending follow-ups: {', '.join(state.pending_followups)}")
    for call in state.tool_calls:
        print(f"  tool {call.name} [{call.id}]: {call.status.value}")
    return EXIT_OK


async def _run_and_state(settings: Settings, chat_id: str) -> tuple[str, TurnState | NoWorker]:
    """The latest run's status (lower case: running, completed, ...) and its `state`
    answer, or why no worker gave one. Over Temporal's HTTP API when it answers
    (no SDK import: `status` starts in a fraction of the time), else over gRPC."""
    from turnkeeper import http_api

    try:
        return await asyncio.to_thread(_run_and_state_over_http, settings, chat_id)
    except http_api.Unavailable:
        pass
    client = await connect_client(settings)
    run_status = (await _describe(client, chat_id)).status.name.lower()
    try:
        return run_status, await query_state(client, chat_id)
    except NoWorker as err:
        return run_status, err


def _run_and_state_over_http(settings: Settings, chat_id: str) -> tuple[str, TurnState | NoWorker]:
    from turnkeeper import http_api

    address = settings.http_api_address
    if address is None:
        raise http_api.Unavailable("no HTTP address for Temporal")
    api = http_api.TemporalHttp(address, settings.namespace, timeout=QUERY_TIMEOUT.total_seconds())
    wid = tk.workflow_id(chat_id)
    try:
        try:
            run_status = api.describe_status(wid)
        except http_api.ApiError as err:
            if err.code == http_api.NOT_FOUND:
                raise Refused(no_chat(chat_id)) from None
            raise http_api.Unavailable(err.message) from None
        try:
            return run_status, TurnState.model_validate(api.query(wid, "state"))
        except http_api.ApiError as err:
            if err.code == http_api.NOT_FOUND:
                raise Refused(no_chat(chat_id)) from None
            if err.code in (http_api.FAILED_PRECONDITION, http_api.DEADLINE_EXCEEDED):
                return run_status, NoWorker(no_worker(chat_id, err.message))
            # Anything else: the SDK's way gives its own, complete answer.
            raise http_api.Unavailable(err.message) from None
        except http_api.NoAnswer as err:
            return run_status, NoWorker(no_worker(chat_id, str(err)))
    finally:
        api.close()


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
        rows.append({"chat_id": (sa.get(CHAT_ID) or [wf.id.removeprefix("chat-")])[0],
                     "status": (sa.get(TURN_STATUS) or [None])[0],
                     "reason": (sa.get(RECOVERY_REASON) or [None])[0],
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
            raise Refused(no_chat(chat_id)) from None
        raise


async def _stored_turn(settings: Settings, chat_id: str) -> TurnState:
    from turnkeeper.failed_turns import state_of

    store = await open_session_store(settings)
    try:
        record = await store.get_turn(chat_id)
    finally:
        await store.close()
    return TurnState(chat_id=chat_id) if record is None else state_of(record)


async def _failed_turn(settings: Settings, chat_id: str) -> TurnState | None:
    """The chat's latest turn if its recovery failed (no run holds it: the store does)."""
    from turnkeeper.failed_turns import failed_turn, state_of

    store = await open_session_store(settings)
    try:
        record = await failed_turn(store, chat_id)
    finally:
        await store.close()
    return None if record is None else state_of(record)


async def _decide(args: argparse.Namespace, settings: Settings, update: str) -> int:
    from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateFailedError
    from temporalio.service import RPCError

    client = await connect_client(settings)
    desc = await _describe(client, args.chat)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        # No run holds the turn: only a failed one can be decided, in the store (no worker needed).
        from turnkeeper.failed_turns import NotDecided, decide_failed_turn

        store = await open_session_store(settings)
        try:
            decided = await decide_failed_turn(store, args.chat, "dismiss" if update == "dismiss_turn" else "continue")
        except NotDecided as err:
            raise Refused(str(err)) from None
        finally:
            await store.close()
        print(describe_gate(decided))
        return EXIT_OK
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
        return await follow_turn(client, store, args.chat, None, after, args.timeout,
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


async def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    """The deploy gate: exit 0 when every recent history replays on this code, 1 otherwise."""
    from dataclasses import asdict

    from turnkeeper import replay

    client = await connect_client(settings)
    report = await replay.replay_recent(client, settings, limit=args.limit, since=args.since)
    if args.json:
        print_json({"task_queue": settings.task_queue, "replayed": report.replayed, "running": report.running,
                    "ok": report.ok, "failures": [asdict(f) for f in report.failures]})
    else:
        for line in replay_lines(report, settings.task_queue, args.since):
            print(line)
    return EXIT_OK if report.ok else EXIT_REFUSED
