"""The `turnkeeper` commands that read: status, history, events, list.

Each returns its exit code or raises `Refused`; `turnkeeper.cli` parses the
arguments and dispatches here.

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
from turnkeeper.cli.common import (
    EXIT_OK,
    QUERY_TIMEOUT,
    NoWorker,
    Refused,
    connect_client,
    describe_run,
    no_chat,
    no_worker,
    query_state,
)
from turnkeeper.cli.output import (
    chat_row,
    describe_gate,
    event_line,
    event_text,
    print_json,
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
