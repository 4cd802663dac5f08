"""Talking to Temporal from outside a workflow: connect, send, query, decide.

The CLI imports this module for every command, also for those that never talk to
Temporal (`history`, `events`) or read it over HTTP (`status`, `list`): the
SDK, the models (pydantic) and what only some calls need (the Temporal client,
its pydantic converter, the operator API, the dev server, `envconfig`) are
imported in the function that needs them, so that a short command starts fast;
so are asyncio and uuid, which the commands read over HTTP never need.
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from turnkeeper.chat_ids import check_chat_id
from turnkeeper.config import Settings
from turnkeeper.query_attempts import QueryAttempts, first_answer

if TYPE_CHECKING:
    from temporalio.client import Client, WorkflowHandle
    from temporalio.converter import DataConverter

    from turnkeeper.models import TurnState, UserMessage

WORKFLOW_TYPE = "ChatTurn"


class MessageTooLarge(ValueError):
    pass


class MalformedMessage(ValueError):
    """Text or an id that no payload or store row can carry."""


class TurnTakesNoMoreMessages(Exception):
    """The server refused the message: the running turn's run has taken as many
    signals as the server allows one run (`history.maximumSignalsPerExecution`)."""


# The server's words for that refusal (INVALID_ARGUMENT).
_SIGNAL_LIMIT = "exceeded workflow execution limit for signal"


def workflow_id(chat_id: str) -> str:
    return f"chat-{chat_id}"


# The run's page in the Temporal UI: what the run is and how to steer it. No message
# text: a summary is stored beside the history, and the text may be private.
RUN_DETAILS = (
    "One chat turn. `state` (query) tells its status; when it waits for its user, "
    'signal `continue` or `dismiss` with `{"recovery_id": ...}` '
    "(or `turnkeeper continue|dismiss <chat>`); `stop` (or Request Cancellation) stops it."
)


def why_unreachable(err: BaseException) -> str:
    """The SDK's connect error in a few words (it carries the transport's debug text)."""
    text = str(err)
    for needle, words in (
        ("Connection refused", "connection refused"),
        ("dns error", "the host name does not resolve"),
        ("certificate", "its TLS certificate is refused"),
        ("tls", "the TLS handshake failed"),
        ("timed out", "no answer"),
        ("deadline", "no answer"),
        ("Unauthenticated", "the credentials are refused"),
        ("PermissionDenied", "the credentials are refused"),
    ):
        if needle.lower() in text.lower():
            return words
    return text.split(":")[0][:120] or type(err).__name__


def run_summary(chat_id: str, why: str | None = None) -> str:
    return f"chat {chat_id}: {why}" if why else f"chat {chat_id}: a turn"


def data_converter(settings: Settings) -> DataConverter:
    """The one data converter of every client of ours (worker, CLI, web, reconciler):
    pydantic, encrypted under TURNKEEPER_ENCRYPTION_KEYS when set."""
    from turnkeeper.payloads.encryption import data_converter as converter

    return converter(settings.encryption_keys)


async def connect(settings: Settings, *, start_dev_server: bool = False) -> Client:
    """With TEMPORAL_ADDRESS set, connect through `temporalio.envconfig` (namespace,
    TLS and API key come from the TEMPORAL_* variables or a config profile);
    otherwise use the embedded dev server, starting it when asked."""
    from temporalio.client import Client

    converter = data_converter(settings)
    if settings.temporal_address:
        from temporalio.envconfig import ClientConfig

        config: dict[str, Any] = dict(ClientConfig.load_client_connect_config())
        config["target_host"] = settings.temporal_address
        config.setdefault("namespace", settings.namespace)
        return await Client.connect(**config, data_converter=converter)
    address = f"127.0.0.1:{settings.dev_server_port}"
    if start_dev_server:
        from turnkeeper.worker.dev_server import ensure_dev_server

        address = await ensure_dev_server(settings)
    return await Client.connect(address, namespace=settings.namespace, data_converter=converter)


async def ensure_search_attributes(client: Client, namespace: str) -> list[str]:
    """Register our Keyword search attributes when missing; returns those added."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import (
        AddSearchAttributesRequest,
        ListSearchAttributesRequest,
    )

    from turnkeeper.worker.dev_server import SEARCH_ATTRIBUTES

    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    missing = [n for n in SEARCH_ATTRIBUTES if n not in listed.custom_attributes]
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=namespace,
                search_attributes={n: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for n in missing},
            )
        )
    return missing


def new_message(
    text: str, settings: Settings, message_id: str | None = None, sender: str | None = None
) -> UserMessage:
    import uuid

    from turnkeeper.models import UserMessage

    check_message_size(text, settings)
    if message_id is not None:
        check_message_id(message_id)
    return UserMessage(message_id=message_id or uuid.uuid4().hex, text=text, sender=sender)


def check_message_id(message_id: str) -> None:
    """Refused before sending: PostgreSQL keeps no NUL in a text column, so a message
    with such an id could never begin its turn there."""
    if len(message_id) not in MESSAGE_ID_LENGTHS:
        raise MalformedMessage(
            f"a message id is 1-{MESSAGE_ID_LENGTHS.stop - 1} characters, got {len(message_id)}"
        )
    _utf8(message_id, "the message id")
    if "\x00" in message_id:
        raise MalformedMessage("the message id holds a NUL character")


def _utf8(value: str, what: str) -> bytes:
    try:
        return value.encode()
    except UnicodeEncodeError as err:
        # A lone surrogate: JSON can escape one ("\\ud800"), UTF-8 cannot carry it.
        raise MalformedMessage(
            f"{what} is not valid Unicode (a lone surrogate at character {err.start + 1})"
        ) from None


def check_message_size(text: str, settings: Settings) -> None:
    """Also refuses text that is not valid Unicode (`MalformedMessage`)."""
    size = len(_utf8(text, "the text"))
    if size > settings.max_message_bytes:
        raise MessageTooLarge(
            f"message is {size} bytes; the limit is {settings.max_message_bytes} "
            "(TURNKEEPER_MAX_MESSAGE_BYTES)"
        )


# models.UserMessage's bounds on an id.
MESSAGE_ID_LENGTHS = range(1, 201)


async def send_message(
    client: Client, settings: Settings, chat_id: str, message: UserMessage, *, eager: bool = False
) -> WorkflowHandle[Any, Any]:
    """Signal-with-start: a follow-up to the running turn, or the start of a new one.
    Once this returns, the message is durable in the workflow's history.

    `eager`: a worker of this task queue runs in this process on this client (the
    web process with TURNKEEPER_WEB_WORKER=1). A chat with no running turn then
    starts one with the message in the run's input, and the server hands the run's
    first workflow task to that worker in its reply instead of through the task
    queue (signal-with-start cannot ask for that). A chat whose turn runs gets the
    message by signal-with-start as always.

    Raises `turnkeeper.chat_ids.InvalidChatId` for a chat id outside its rule."""
    check_chat_id(chat_id)
    from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

    from turnkeeper import search_attributes
    from turnkeeper.models import (
        TURN_TASK_TIMEOUT,
        ChatTurnInput,
        TurnState,
    )

    common: dict[str, Any] = {
        "id": workflow_id(chat_id),
        "task_queue": settings.task_queue,
        "task_timeout": TURN_TASK_TIMEOUT,
        # Set at start so the new run need not upsert them (ignored for a running one).
        "search_attributes": search_attributes.at_start(chat_id),
        "id_reuse_policy": WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        "result_type": TurnState,
        "static_summary": run_summary(chat_id),
        "static_details": RUN_DETAILS,
    }
    if eager:
        from temporalio.exceptions import WorkflowAlreadyStartedError

        try:
            return await client.start_workflow(
                WORKFLOW_TYPE,
                ChatTurnInput(chat_id=chat_id, pending=[message]),
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                request_eager_start=True,
                **common,
            )
        except WorkflowAlreadyStartedError:
            pass  # a turn runs: the message joins it below
    from temporalio.service import RPCError

    try:
        return await client.start_workflow(
            WORKFLOW_TYPE,
            ChatTurnInput(chat_id=chat_id),
            start_signal="user_message",
            start_signal_args=[message],
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            **common,
        )
    except RPCError as err:
        if _SIGNAL_LIMIT not in str(err):
            raise
        raise TurnTakesNoMoreMessages(
            f"chat {chat_id}: the running turn takes no more messages (the server's limit of signals a run "
            f"takes); the message was not sent: send it again once the turn has ended"
        ) from None


class DecisionRefused(Exception):
    """The turn refused a Continue, Dismiss or Stop; the message is the recovery table's words."""


class DecisionPending(Exception):
    """The signal is in the run's history, and no worker has judged it yet."""


DECISION_WAIT_S = 10.0


async def decide(
    client: Client,
    chat_id: str,
    action: str,
    recovery_id: str | None = None,
    run_id: str | None = None,
    timeout: float = DECISION_WAIT_S,
) -> TurnState:
    """Send `continue`, `dismiss` or `stop` to the chat's run (`run_id`, else the current
    one) and wait for its answer: the state it led to, or `DecisionRefused` in the
    table's words. The signal carries a request id and the run records how it judged
    it (`state.decisions`): asking the run that took the signal, even once it has
    closed, reads the answer back. `DecisionPending` when no worker judged it in time
    (the signal stays: a worker judges it when it comes)."""
    import asyncio
    import time
    import uuid

    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError, RPCStatusCode

    from turnkeeper.models import TurnState
    from turnkeeper.recovery import NOT_RUNNING, NOT_WAITING

    if run_id is None:
        run_id = (await client.get_workflow_handle(workflow_id(chat_id)).describe()).run_id
    handle = client.get_workflow_handle(workflow_id(chat_id), run_id=run_id)
    request_id = uuid.uuid4().hex
    payload: dict[str, Any] = {"request_id": request_id}
    if action != "stop":
        payload["recovery_id"] = recovery_id
    try:
        await handle.signal(action, payload)
    except RPCError as err:
        if "already completed" in str(err):
            raise DecisionRefused(NOT_RUNNING if action == "stop" else NOT_WAITING) from None
        raise
    deadline = time.monotonic() + timeout
    # Polled by hand: a query has no RetryPolicy (that retries activities and workflows).
    pause, attempts = 0.01, QueryAttempts()

    def ask() -> Awaitable[TurnState]:
        left = max(deadline - time.monotonic(), 0.5)
        rpc_timeout = timedelta(seconds=min(left, attempts.seconds))
        return handle.query("state", result_type=TurnState, rpc_timeout=rpc_timeout)

    while True:
        try:
            state = await first_answer(ask, until=deadline)
        except (RPCError, WorkflowQueryFailedError) as err:
            attempts.failed(
                timed_out=isinstance(err, RPCError) and err.status == RPCStatusCode.DEADLINE_EXCEEDED
            )
            if time.monotonic() < deadline:
                await asyncio.sleep(pause)
                continue
            raise DecisionPending(
                f"chat {chat_id}: the {action} is sent; no worker has judged it yet"
            ) from None
        for record in state.decisions:
            if record.request_id == request_id:
                if record.refusal is not None:
                    raise DecisionRefused(record.refusal)
                return state
        if time.monotonic() >= deadline:
            raise DecisionPending(f"chat {chat_id}: the {action} is sent; no worker has judged it yet")
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.2)


async def query_state(client: Client, chat_id: str, rpc_timeout: timedelta | None = None) -> TurnState:
    """The `state` query, within `rpc_timeout` in all, asked again while no answer has
    come (`first_answer`). A worker that would answer it with events of a workflow task
    it does not hold refuses it on purpose (turnkeeper/worker/catch_up.py): asked again,
    the query is answered from the history as it stands."""
    import time

    from temporalio.client import WorkflowQueryFailedError

    from turnkeeper.models import TurnState

    handle = client.get_workflow_handle(workflow_id(chat_id))
    until = None if rpc_timeout is None else time.monotonic() + rpc_timeout.total_seconds()

    def ask() -> Awaitable[TurnState]:
        left = None if until is None else timedelta(seconds=max(until - time.monotonic(), 0.1))
        return handle.query("state", result_type=TurnState, rpc_timeout=left)

    for attempt in range(3):
        try:
            return await first_answer(ask, until=until)
        except WorkflowQueryFailedError as err:
            if "QueryCatchUp" not in err.message or attempt == 2:
                raise
    raise AssertionError("unreachable")
