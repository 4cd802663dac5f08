"""The `turnkeeper` commands that read: status, history, events, list.

Each has one way to what it reads. `status` and `list` read Temporal over its
HTTP API (turnkeeper.cli.temporal_http): the SDK's import alone would take
longer than either may take in all. Only where that API's address is unknown
(TEMPORAL_ADDRESS alone) do they read over gRPC (turnkeeper.cli.temporal_grpc). `status` also reads the store when no run
holds the turn or no worker answers; `history` and `events` read only the
store. Each returns its exit code (a coroutine of it for those that always
read the store) or raises `Refused`; `turnkeeper.cli` dispatches here.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import closing
from typing import TYPE_CHECKING

from turnkeeper import client as tk
from turnkeeper.cli.common import (
    EXIT_OK,
    QUERY_TIMEOUT,
    NoWorker,
    Refused,
    Undecryptable,
    no_chat,
    no_worker,
    open_session_store,
)
from turnkeeper.cli.output import (
    chat_row,
    describe_gate,
    describe_subagents,
    event_line,
    event_text,
    print_json,
    transcript_line,
)
from turnkeeper.cli.temporal_http import (
    DEADLINE_EXCEEDED,
    FAILED_PRECONDITION,
    NOT_FOUND,
    ApiError,
    Execution,
    NoAnswer,
    TemporalHttp,
    Unreachable,
)
from turnkeeper.config import Settings
from turnkeeper.statuses import (
    CHAT_ID,
    OPEN_STATUSES,
    RECOVERY_REASON,
    TURN_STATUS,
    TurnStatus,
)

if TYPE_CHECKING:
    from turnkeeper.cli.temporal_grpc import TemporalGrpc
    from turnkeeper.models import TurnState

EVENTS_PAGE = 1000
# A worker that met the run mid-task refuses one query on purpose and answers the
# next (turnkeeper/worker/catch_up.py); as turnkeeper.client.query_state, ask up to three times.
QUERY_TRIES = 3


def temporal_http(settings: Settings) -> TemporalHttp | TemporalGrpc:
    """Temporal's HTTP API where its address is known (the embedded server's, or
    TURNKEEPER_TEMPORAL_HTTP_ADDRESS); with only TEMPORAL_ADDRESS, its gRPC API."""
    address = settings.http_api_address
    if address is None:
        from turnkeeper.cli.temporal_grpc import TemporalGrpc

        try:
            return TemporalGrpc(settings, QUERY_TIMEOUT.total_seconds())
        except Unreachable as err:
            raise Refused(
                f"cannot reach Temporal at {settings.temporal_address} ({err}); is the worker running? "
                "Start it with `turnkeeper worker`."
            ) from None
    try:
        return TemporalHttp(
            address,
            settings.namespace,
            keys=settings.encryption_keys,
            timeout=QUERY_TIMEOUT.total_seconds(),
        )
    except Unreachable as err:
        raise Refused(f"TURNKEEPER_TEMPORAL_HTTP_ADDRESS: {err}") from None


def unreachable(api: TemporalHttp | TemporalGrpc, err: Exception) -> Refused:
    return Refused(
        f"cannot reach Temporal's HTTP API at {api.address} ({err}); is the worker running? "
        "Start it with `turnkeeper worker`."
    )


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    run_status, answer = _run_and_state(settings, args.chat)
    stored: TurnState | None = None
    if isinstance(answer, NoWorker) or run_status != "running":
        # No worker answered, or no run holds the turn: the store knows it still.
        import asyncio

        stored = asyncio.run(_stored_state(settings, args.chat))
    if isinstance(answer, NoWorker):
        from turnkeeper.models import TurnState

        state = stored or TurnState(chat_id=args.chat)
        print(f"turnkeeper: {answer}; showing the session store's record", file=sys.stderr)
    else:
        state = answer
    if run_status != "running" and stored is not None and stored.status == TurnStatus.FAILED:
        state = stored  # its recovery failed: no run holds the turn, the store does
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
    for line in describe_subagents(state):
        print(line)
    return EXIT_OK


async def _stored_state(settings: Settings, chat_id: str) -> TurnState | None:
    """The chat's latest turn as the store shows it (failed_turns.state_of); None if it has none."""
    from turnkeeper.failed_turns import state_of

    store = await open_session_store(settings)
    try:
        record = await store.get_turn(chat_id)
    finally:
        await store.close()
    return None if record is None else state_of(record)


def _run_and_state(settings: Settings, chat_id: str) -> tuple[str, TurnState | NoWorker]:
    """The latest run's status (lower case: running, completed, ...) and its `state`
    answer, or why no worker gave one. Only a failed query loads the codec's module
    (and the SDK's converter with it), to tell a payload it cannot decrypt."""
    wid = tk.workflow_id(chat_id)
    with closing(temporal_http(settings)) as api:
        try:
            run_status = api.describe_status(wid)
        except ApiError as err:
            if err.code == NOT_FOUND:
                raise Refused(no_chat(chat_id)) from None
            raise Refused(f"chat {chat_id!r}: Temporal: {err.message}") from None
        except (Unreachable, NoAnswer) as err:
            raise unreachable(api, err) from None
        for attempt in range(QUERY_TRIES):
            try:
                answer = api.query(wid, "state")
                break
            except ApiError as err:
                if err.code == NOT_FOUND:
                    raise Refused(no_chat(chat_id)) from None
                # "no poller seen for task queue recently", or no answer in time: a
                # query needs a worker, and none is serving the chat's task queue.
                if err.code in (FAILED_PRECONDITION, DEADLINE_EXCEEDED):
                    return run_status, NoWorker(no_worker(chat_id, err.message))
                from turnkeeper.payloads.encryption import names_decryption_error

                if names_decryption_error(err.message):  # the worker could not replay the run
                    return run_status, Undecryptable(
                        f"chat {chat_id!r}: the worker cannot read the run's history: {err.message}"
                    )
                if "QueryCatchUp" in err.message and attempt < QUERY_TRIES - 1:
                    continue
                raise Refused(
                    f"chat {chat_id!r}: the worker did not answer its state: {err.message}"
                ) from None
            except NoAnswer as err:
                return run_status, NoWorker(no_worker(chat_id, str(err)))
            except Unreachable as err:
                raise unreachable(api, err) from None
            except ValueError as err:
                from turnkeeper.payloads.encryption import DecryptionError

                if not isinstance(err, DecryptionError):
                    raise
                # The answer came, under a key this command lacks.
                return run_status, Undecryptable(
                    f"chat {chat_id!r}: the worker's answer is unreadable here ({err})"
                )
    from turnkeeper.models import TurnState

    return run_status, TurnState.model_validate_json(answer)


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
    import asyncio

    store = await open_session_store(settings)
    after = args.after
    try:
        while True:
            page = await store.events(args.chat, after_seq=after, limit=EVENTS_PAGE)
            if not page and after == 0 and not args.follow:
                raise Refused(f"no chat {args.chat!r}: it has no events")
            for ev in page:
                after = ev.seq
                print(event_line(ev) if args.json else event_text(ev), flush=True)
            if len(page) == EVENTS_PAGE:
                continue  # more already written
            if not args.follow:
                return EXIT_OK
            await asyncio.sleep(0.25)
    finally:
        await store.close()


OPEN = {TurnStatus.RUNNING.value, TurnStatus.AWAITING_USER.value, TurnStatus.RESUMING.value}


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    # This deployment's chats only: another on the same namespace has its own task queue.
    query = f"WorkflowType='{tk.WORKFLOW_TYPE}' AND TaskQueue='{settings.task_queue}'"
    status = TurnStatus.AWAITING_USER.value if args.awaiting else args.status
    if status:
        query += f" AND TurnStatus='{status}'"
    if status in OPEN:
        # A run terminated while open keeps the status it last set: only running ones count.
        query += " AND ExecutionStatus='Running'"
    with closing(temporal_http(settings)) as api:
        try:
            listed = list(api.list_workflows(query, (CHAT_ID, TURN_STATUS, RECOVERY_REASON)))
        except ApiError as err:
            raise Refused(f"Temporal: {err.message}") from None
        except (Unreachable, NoAnswer) as err:
            raise unreachable(api, err) from None
    latest: dict[str, Execution] = {}
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
