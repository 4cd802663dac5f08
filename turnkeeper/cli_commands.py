"""The `turnkeeper` commands that send and read: send, status, history, events,
list, and the deploy gate, replay. Those that decide a turn (continue, dismiss,
stop) are in turnkeeper.cli_decisions.

Each returns its exit code (a coroutine of it for those that always talk gRPC)
or raises `Refused`; `turnkeeper.cli` parses the arguments and dispatches here.

`status`, `history`, `events` and `list` load neither the Temporal SDK, nor
pydantic, nor asyncio when Temporal's HTTP API and a SQLite store serve them
(turnkeeper.http_api, turnkeeper.cli_reads, turnkeeper.cli_views): each of
those imports takes a good part of what the whole command may take. They run
an event loop only to fall back to gRPC or to the store.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from turnkeeper import client as tk
from turnkeeper.cli_common import (
    EXIT_OK,
    EXIT_REFUSED,
    QUERY_TIMEOUT,
    ClientOnDemand,
    NoWorker,
    Refused,
    connect_client,
    describe_run,
    no_chat,
    no_worker,
    open_session_store,
    query_state,
)
from turnkeeper.cli_output import (
    chat_row,
    describe_gate,
    event_line,
    event_text,
    print_json,
    replay_lines,
    transcript_line,
)
from turnkeeper.cli_reads import Reads
from turnkeeper.cli_views import StateView, turn_state
from turnkeeper.config import Settings
from turnkeeper.statuses import (
    CHAT_ID,
    OPEN_STATUSES,
    RECOVERY_REASON,
    TURN_STATUS,
    TurnStatus,
)

if TYPE_CHECKING:
    from turnkeeper.models import TurnState

EVENTS_PAGE = 1000


def cmd_send(args: argparse.Namespace, settings: Settings) -> Any:
    """Over Temporal's HTTP API, reading the SQLite file itself, when both can serve it
    (then neither the SDK nor pydantic loads before the message is durable; only
    following the turn loads pydantic and the store): the same request, the same
    reads. Otherwise the SDK's way (a coroutine)."""
    import uuid

    try:
        tk.check_message_size(args.text, settings)
    except tk.MessageTooLarge as err:
        raise Refused(str(err)) from None
    message_id = args.message_id or uuid.uuid4().hex
    if settings.http_api_address is None or settings.encryption_keys or settings.otlp_endpoint:
        # Payloads the codec must encrypt, or a traced start: only the SDK's client makes those.
        return _send_with_the_sdk(args, settings, message_id)
    after = 0
    if not args.no_wait:
        reads = Reads(settings)
        try:
            if not reads.plain:  # the store must open (or create) the file: as before, once Temporal answers
                return _send_with_the_sdk(args, settings, message_id)
            # A retry of a message the chat already holds starts no turn: it follows the one that took it.
            after = reads.follow_from(args.chat, message_id)
        finally:
            reads.close()
    from turnkeeper import http_api

    try:
        _send_over_http(settings, args.chat, message_id, args.text)
    except http_api.Unavailable:
        import asyncio

        # Also when the request may have arrived: the chat takes a message id once.
        asyncio.run(_send_over_grpc(settings, args.chat, message_id, args.text))
    if args.no_wait:
        print(f"sent {message_id} to chat {args.chat}")
        return EXIT_OK
    import asyncio

    from turnkeeper.cli_follow import saved_if_interrupted

    with saved_if_interrupted(
        args.chat, message_id
    ):  # the message is durable: Ctrl-C stops only the watching
        return asyncio.run(_follow_sent(settings, args.chat, message_id, after, args.timeout))


def _send_over_http(settings: Settings, chat_id: str, message_id: str, text: str) -> None:
    from turnkeeper import http_api

    address = settings.http_api_address
    assert address is not None
    try:
        request = tk.signal_with_start_request(settings, chat_id, message_id, text)
    except UnicodeEncodeError as err:  # text the model's JSON cannot hold: the SDK's way says so its way
        raise http_api.Unavailable(str(err)) from None
    api = http_api.TemporalHttp(address, settings.namespace, timeout=QUERY_TIMEOUT.total_seconds())
    try:
        api.signal_with_start(tk.workflow_id(chat_id), "user_message", request)
    except (http_api.ApiError, http_api.NoAnswer) as err:
        raise http_api.Unavailable(str(err)) from None
    finally:
        api.close()


async def _send_over_grpc(settings: Settings, chat_id: str, message_id: str, text: str) -> None:
    client = await connect_client(settings)
    try:
        await tk.send_message(
            client, settings, chat_id, tk.new_message(text, settings, message_id=message_id)
        )
    except tk.TurnTakesNoMoreMessages as err:
        raise Refused(str(err)) from None


async def _follow_sent(settings: Settings, chat_id: str, message_id: str, after: int, timeout: float) -> int:
    from turnkeeper.cli_follow import follow_turn, open_store_waiting

    started = time.monotonic()
    store = await open_store_waiting(settings, timeout)  # the message is sent: an outage is waited out
    try:
        return await follow_turn(
            ClientOnDemand(settings),
            store,
            chat_id,
            message_id,
            after,
            max(0.0, timeout - (time.monotonic() - started)),
            task_queue=settings.task_queue,
        )
    finally:
        await store.close()


async def _send_with_the_sdk(args: argparse.Namespace, settings: Settings, message_id: str) -> int:
    message = tk.new_message(args.text, settings, message_id=message_id)
    client = await connect_client(settings)
    store = await open_session_store(settings) if not args.no_wait else None
    # A retry of a message the chat already holds starts no turn: it follows the one that took it.
    after = await store.follow_from(args.chat, message.message_id) if store is not None else 0
    try:
        await tk.send_message(client, settings, args.chat, message)
    except tk.TurnTakesNoMoreMessages as err:
        if store is not None:
            await store.close()
        raise Refused(str(err)) from None
    if store is None:
        print(f"sent {message.message_id} to chat {args.chat}")
        return EXIT_OK
    from turnkeeper.cli_follow import follow_turn, saved_if_interrupted

    try:
        with saved_if_interrupted(args.chat, message.message_id):
            return await follow_turn(
                ClientOnDemand(settings, client),
                store,
                args.chat,
                message.message_id,
                after,
                args.timeout,
                task_queue=settings.task_queue,
            )
    finally:
        await store.close()


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    run_status, answer = _run_and_state(settings, args.chat)
    reads = Reads(settings)
    try:
        if isinstance(answer, NoWorker):
            # The store still knows the turn: show that, and say why it is all we show.
            state = reads.turn_state(args.chat) or StateView(chat_id=args.chat)
            print(f"turnkeeper: {answer}; showing the session store's record", file=sys.stderr)
        else:
            state = answer
        if run_status != "running":
            # The chat's latest turn if its recovery failed: no run holds it, the store does.
            stored = reads.turn_state(args.chat)
            state = stored if stored is not None and stored.status == TurnStatus.FAILED else state
    finally:
        reads.close()
    if args.json:
        print_json(state.model_dump(mode="json"))
        return EXIT_OK
    print(describe_gate(state))
    if run_status != "running" and state.status in OPEN_STATUSES:
        # Terminated, timed out or failed: its last state is not the turn's end.
        print(
            f"its run has ended ({run_status.replace('_', ' ')}) without closing the turn; "
            f"the reconciler recovers it within {settings.reconcile_every} s"
        )
    if state.pending_followups:
        print(f"pending follow-ups: {', '.join(state.pending_followups)}")
    for call in state.tool_calls:
        print(f"  tool {call.name} [{call.id}]: {call.status.value}")
    return EXIT_OK


def _run_and_state(settings: Settings, chat_id: str) -> tuple[str, StateView | TurnState | NoWorker]:
    """The latest run's status (lower case: running, completed, ...) and its `state`
    answer, or why no worker gave one. Over Temporal's HTTP API when it answers
    (no SDK import: `status` starts in a fraction of the time), else over gRPC."""
    from turnkeeper import http_api

    try:
        return _run_and_state_over_http(settings, chat_id)
    except http_api.Unavailable:
        pass
    import asyncio

    return asyncio.run(_run_and_state_over_grpc(settings, chat_id))


async def _run_and_state_over_grpc(settings: Settings, chat_id: str) -> tuple[str, TurnState | NoWorker]:
    client = await connect_client(settings)
    run_status = (await describe_run(client, chat_id)).status.name.lower()
    try:
        return run_status, await query_state(client, chat_id)
    except NoWorker as err:
        return run_status, err


def _run_and_state_over_http(
    settings: Settings, chat_id: str
) -> tuple[str, StateView | TurnState | NoWorker]:
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
            return run_status, turn_state(api.query(wid, "state"))
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


def cmd_history(args: argparse.Namespace, settings: Settings) -> int:
    reads = Reads(settings)
    try:
        rows = reads.history(args.chat)
    finally:
        reads.close()
    if args.json:
        print_json([m.public() for m in rows])
        return EXIT_OK
    if not rows:
        raise Refused(f"no chat {args.chat!r}: nothing was ever committed to it")
    for m in rows:
        print(transcript_line(m))
    return EXIT_OK


def cmd_events(args: argparse.Namespace, settings: Settings) -> int:
    reads = Reads(settings)
    after = args.after
    try:
        while True:
            page = reads.events(args.chat, after_seq=after, limit=EVENTS_PAGE)
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
            time.sleep(0.25)
    finally:
        reads.close()


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    from turnkeeper import http_api

    query = f"WorkflowType='{tk.WORKFLOW_TYPE}'"
    status = TurnStatus.AWAITING_USER.value if args.awaiting else args.status
    if status:
        query += f" AND TurnStatus='{status}'"
    try:
        listed = _list_over_http(settings, query)
    except http_api.Unavailable:
        import asyncio

        listed = asyncio.run(_list_over_grpc(settings, query))
    latest: dict[str, Any] = {}
    for wf in listed:
        known = latest.get(wf.id)
        if known is None or wf.start_time > known.start_time:
            latest[wf.id] = wf
    rows = []
    for wf in sorted(latest.values(), key=lambda w: w.start_time, reverse=True):
        sa = wf.search_attributes
        rows.append(
            {
                "chat_id": (sa.get(CHAT_ID) or [wf.id.removeprefix("chat-")])[0],
                "status": (sa.get(TURN_STATUS) or [None])[0],
                "reason": (sa.get(RECOVERY_REASON) or [None])[0],
                "workflow_id": wf.id,
                "run_id": wf.run_id,
                "started": wf.start_time.isoformat(),
            }
        )
    if args.json:
        print_json(rows)
        return EXIT_OK
    for r in rows:
        print(chat_row(r))
    return EXIT_OK


def _list_over_http(settings: Settings, query: str) -> list[Any]:
    """The runs `query` selects, over Temporal's HTTP API (no SDK import); any error
    is `Unavailable`: the SDK's way then lists them, or reports it its own way."""
    from turnkeeper import http_api

    address = settings.http_api_address
    if address is None:
        raise http_api.Unavailable("no HTTP address for Temporal")
    api = http_api.TemporalHttp(address, settings.namespace, timeout=QUERY_TIMEOUT.total_seconds())
    try:
        return list(api.list_workflows(query, (CHAT_ID, TURN_STATUS, RECOVERY_REASON)))
    except (http_api.ApiError, http_api.NoAnswer) as err:
        raise http_api.Unavailable(str(err)) from None
    finally:
        api.close()


async def _list_over_grpc(settings: Settings, query: str) -> list[Any]:
    client = await connect_client(settings)
    return [wf async for wf in client.list_workflows(query)]


async def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    """The deploy gate: exit 0 when every recent history replays on this code, 1 otherwise."""
    from dataclasses import asdict

    from turnkeeper import replay

    client = await connect_client(settings)
    report = await replay.replay_recent(client, settings, limit=args.limit, since=args.since)
    if args.json:
        print_json(
            {
                "task_queue": settings.task_queue,
                "replayed": report.replayed,
                "running": report.running,
                "ok": report.ok,
                "failures": [asdict(f) for f in report.failures],
            }
        )
    else:
        for line in replay_lines(report, settings.task_queue, args.since):
            print(line)
    return EXIT_OK if report.ok else EXIT_REFUSED
