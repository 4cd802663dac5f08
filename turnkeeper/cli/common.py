"""What every `turnkeeper` command shares: exit codes, refusals, the SDK's way to
Temporal (for the commands that write: send, the decisions, replay) and the way
to the session store. `status` and `list` read Temporal over its HTTP API
instead (turnkeeper.cli.temporal_http).

Imports that only some commands need (the Temporal client and its RPC errors,
the session store, the models and so pydantic, telemetry) are made in the
functions that use them: every command pays for its own imports only
(tests/process/test_cli_startup.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from turnkeeper import client as tk
from turnkeeper.config import Settings

if TYPE_CHECKING:
    from temporalio.client import Client

    from turnkeeper.models import TurnState
    from turnkeeper.store import SessionStore

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_AWAITING = 0, 1, 2, 3
# A worker answers `state` in milliseconds; without one the server would hold the query.
# 5 s covers the worst wait while a worker lives: a task held by a killed worker
# (TURN_TASK_TIMEOUT, 2 s) and then a cold replay of a bounded history (< 0.5 s).
QUERY_TIMEOUT = timedelta(seconds=5)


class Refused(Exception):
    """The action is refused; the message goes to stderr and the exit code is 1."""


async def connect_client(settings: Settings) -> Client:
    from turnkeeper.telemetry import exporters as telemetry

    try:
        client = await tk.connect(settings)
    except Exception as err:
        where = settings.temporal_address or f"127.0.0.1:{settings.dev_server_port}"
        raise Refused(
            f"cannot reach Temporal at {where} ({tk.why_unreachable(err)}); is the worker running? "
            "Start it with `turnkeeper worker`."
        ) from None
    # A turn the CLI starts is traced from here (OTEL_EXPORTER_OTLP_ENDPOINT).
    return telemetry.traced(client, settings, "turnkeeper-cli")


async def open_session_store(settings: Settings) -> SessionStore:
    from turnkeeper.store import open_store

    store = open_store(settings)
    await store.open()
    return store


class NoWorker(Refused):
    """No worker answered the `state` query: the run's state is out of reach."""


class Undecryptable(NoWorker):
    """The run's history, or the state, holds a payload that cannot be decrypted
    (its key is not in TURNKEEPER_ENCRYPTION_KEYS, of the worker or of this command):
    as when no worker answers, the state is out of reach until the key is back."""


async def query_state(client: Client, chat_id: str) -> TurnState:
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError, RPCStatusCode

    from turnkeeper.payloads.encryption import DecryptionError, names_decryption_error

    try:
        return await tk.query_state(client, chat_id, rpc_timeout=QUERY_TIMEOUT)
    except DecryptionError as err:  # the answer came, under a key this command lacks
        raise Undecryptable(f"chat {chat_id!r}: the worker's answer is unreadable here ({err})") from None
    except WorkflowQueryFailedError as err:
        if names_decryption_error(err.message):  # the worker could not replay the run
            raise Undecryptable(
                f"chat {chat_id!r}: the worker cannot read the run's history: {err.message}"
            ) from None
        raise
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise Refused(no_chat(chat_id)) from None
        # "no poller seen for task queue recently", or no answer in time (the client
        # reports its own timeout as CANCELLED "Timeout expired"): a query needs a
        # worker, and none is serving the chat's task queue.
        if err.status in (
            RPCStatusCode.FAILED_PRECONDITION,
            RPCStatusCode.DEADLINE_EXCEEDED,
            RPCStatusCode.CANCELLED,
        ):
            raise NoWorker(no_worker(chat_id, err.message)) from None
        raise


async def describe_run(client: Client, chat_id: str) -> Any:
    """The chat's latest run, described (its status, ...); `Refused` if it has none."""
    from temporalio.service import RPCError, RPCStatusCode

    try:
        return await client.get_workflow_handle(tk.workflow_id(chat_id)).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise Refused(no_chat(chat_id)) from None
        raise


def no_chat(chat_id: str) -> str:
    return f"no chat {chat_id!r}: nothing was ever sent to it"


# The server's words when the run's workflow task fails: workers serve, but not this run.
TASK_FAILING = "Workflow Task in failed state"


def no_worker(chat_id: str, why: str) -> str:
    if TASK_FAILING in why:
        return (
            f"chat {chat_id!r}: its run's workflow task keeps failing ({why}); the worker's log says why, "
            "and a reconcile pass ends such a run after a minute of failures and recovers its turn"
        )
    return f"no worker answered for chat {chat_id!r} ({why}); start one with `turnkeeper worker`"
