"""The `turnkeeper` commands that decide a turn: `continue` and `dismiss` (the
user's answer to an interrupted turn) and `stop` (the running one).

Each is a coroutine of its exit code, or raises `Refused`; `turnkeeper.cli`
parses the arguments and dispatches here. The commands that send and read
(send, status, history, events, list, replay) are in turnkeeper.cli.read.
They talk gRPC: the Temporal SDK, the models and the store are imported in
the functions that use them, as in every command (tests/process/test_cli_startup.py).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from turnkeeper import client as tk
from turnkeeper.cli.common import (
    EXIT_OK,
    NoWorker,
    Refused,
    Undecryptable,
    connect_client,
    describe_run,
    open_session_store,
    query_state,
)
from turnkeeper.cli.output import describe_gate, print_json, print_turn_json, quiet_if
from turnkeeper.config import Settings
from turnkeeper.statuses import OPEN_STATUSES

if TYPE_CHECKING:
    from turnkeeper.models import TurnState
    from turnkeeper.recovery import Action


async def _stored_turn(settings: Settings, chat_id: str) -> TurnState:
    from turnkeeper.failed_turns import state_of
    from turnkeeper.models import TurnState

    store = await open_session_store(settings)
    try:
        record = await store.get_turn(chat_id)
    finally:
        await store.close()
    return TurnState(chat_id=chat_id) if record is None else state_of(record)


async def _decide(args: argparse.Namespace, settings: Settings, action: Action) -> int:
    from temporalio.client import WorkflowExecutionStatus

    from turnkeeper.recovery import (
        NOT_WAITING,  # the commands refuse in its words
    )

    client = await connect_client(settings)
    desc = await describe_run(client, args.chat)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        # No run holds the turn: only a failed one can be decided, in the store (no worker needed).
        from turnkeeper.failed_turns import NotDecided, decide_failed_turn

        failed = await open_session_store(settings)
        try:
            decided = await decide_failed_turn(failed, args.chat, action)
        except NotDecided as err:
            raise Refused(str(err)) from None
        finally:
            await failed.close()
        _show(args, decided)
        return EXIT_OK
    state = await query_state(client, args.chat)
    if not state.recovery_id:
        raise Refused(NOT_WAITING)
    store = await open_session_store(settings) if getattr(args, "wait", False) else None
    try:
        after = await store.follow_from(args.chat) if store else 0
        try:
            new_state = await tk.decide(client, args.chat, action, state.recovery_id, run_id=desc.run_id)
        except tk.DecisionRefused as err:
            raise Refused(str(err)) from None
        except tk.DecisionPending as err:
            raise Refused(f"{err} (is a worker running?)") from None
        if store is None:
            _show(args, new_state)
            return EXIT_OK
        if not args.json:
            print(describe_gate(new_state), flush=True)
        from turnkeeper.cli.follow import follow_turn

        with quiet_if(args.json):
            code = await follow_turn(
                client,
                store,
                args.chat,
                None,
                after,
                args.timeout,
                task_queue=settings.task_queue,
                turn=new_state.turn,
                # Continue went to a subagent's gate: the turn waits for it still.
                delegating=any(v.mode == "wait" and v.status in OPEN_STATUSES for v in new_state.subagents),
            )
        if args.json:
            await print_turn_json(store, args.chat)
        return code
    finally:
        if store is not None:
            await store.close()


async def cmd_continue(args: argparse.Namespace, settings: Settings) -> int:
    return await _decide(args, settings, "continue")


async def cmd_dismiss(args: argparse.Namespace, settings: Settings) -> int:
    return await _decide(args, settings, "dismiss")


async def cmd_stop(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.client import WorkflowExecutionStatus

    client = await connect_client(settings)
    desc = await describe_run(client, args.chat)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        raise Refused(f"no turn of chat {args.chat!r} is running")
    later = ""
    try:
        state = await query_state(client, args.chat)
    except NoWorker as err:
        # A signal is durable: the run acts on it once a worker serves it again.
        state = await _stored_turn(settings, args.chat)
        later = (
            f" ({err}: the turn stops once a worker can read it)"
            if isinstance(err, Undecryptable)
            else " (no worker is serving it now: the turn stops when one starts)"
        )
    if state.status not in OPEN_STATUSES:
        raise Refused(f"no turn of chat {args.chat!r} is running")
    try:
        await tk.decide(
            client, args.chat, "stop", run_id=desc.run_id, timeout=0 if later else tk.DECISION_WAIT_S
        )
    except tk.DecisionRefused as err:
        raise Refused(f"chat {args.chat!r}: {err}") from None
    except tk.DecisionPending:
        later = later or " (no worker has taken it yet: the turn stops when one does)"
    if args.json:
        print_json(
            {"chat_id": args.chat, "turn": state.turn, "stop": "sent", "note": later.strip(" ()") or None}
        )
    else:
        print(f"stop sent to chat {args.chat}, turn {state.turn}{later}")
    return EXIT_OK


def _show(args: argparse.Namespace, state: TurnState) -> None:
    if args.json:
        print_json(json.loads(state.model_dump_json()))
    else:
        print(describe_gate(state), flush=True)
