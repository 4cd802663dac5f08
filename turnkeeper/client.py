"""Talking to Temporal from outside a workflow: connect, send, query, decide.

The CLI imports this module for every command, also for those that never talk to
Temporal (`history`, `events`) or talk to it over HTTP (`status`): the SDK and
what only some calls need (the Temporal client, its pydantic converter, the
operator API, the dev server, `envconfig`) are imported in the function that
needs them, so that a short command starts fast.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from turnkeeper.config import Settings
from turnkeeper.models import (
    TURN_TASK_TIMEOUT,
    ChatTurnInput,
    RecoveryAction,
    TurnState,
    TurnStatus,
    UserMessage,
)

if TYPE_CHECKING:
    from temporalio.client import Client, WorkflowHandle
    from temporalio.converter import DataConverter

log = logging.getLogger("turnkeeper.client")

WORKFLOW_TYPE = "ChatTurn"


class MessageTooLarge(ValueError):
    pass


def workflow_id(chat_id: str) -> str:
    return f"chat-{chat_id}"


def data_converter(settings: Settings) -> DataConverter:
    """The one data converter of every client of ours (worker, CLI, web, reconciler):
    pydantic, encrypted under TURNKEEPER_ENCRYPTION_KEYS when set."""
    from turnkeeper.encryption import data_converter as converter

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
        from turnkeeper.dev_server import ensure_dev_server

        address = await ensure_dev_server(settings)
    return await Client.connect(address, namespace=settings.namespace, data_converter=converter)


async def ensure_search_attributes(client: Client, namespace: str) -> list[str]:
    """Register our Keyword search attributes when missing; returns those added."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest

    from turnkeeper.dev_server import SEARCH_ATTRIBUTES

    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace))
    missing = [n for n in SEARCH_ATTRIBUTES if n not in listed.custom_attributes]
    if missing:
        await client.operator_service.add_search_attributes(AddSearchAttributesRequest(
            namespace=namespace,
            search_attributes={n: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for n in missing}))
    return missing


def new_message(text: str, settings: Settings, message_id: str | None = None,
                sender: str | None = None) -> UserMessage:
    size = len(text.encode())
    if size > settings.max_message_bytes:
        raise MessageTooLarge(f"message is {size} bytes; the limit is {settings.max_message_bytes} "
                              "(TURNKEEPER_MAX_MESSAGE_BYTES)")
    return UserMessage(message_id=message_id or uuid.uuid4().hex, text=text, sender=sender)


async def send_message(client: Client, settings: Settings, chat_id: str,
                       message: UserMessage) -> WorkflowHandle[Any, Any]:
    """Signal-with-start: a follow-up to the running turn, or the start of a new one.
    Once this returns, the message is durable in the workflow's history."""
    from temporalio.common import (
        SearchAttributePair,
        TypedSearchAttributes,
        WorkflowIDConflictPolicy,
        WorkflowIDReusePolicy,
    )

    from turnkeeper.search_attributes import CHAT_ID_ATTR, TURN_STATUS_ATTR

    return await client.start_workflow(
        WORKFLOW_TYPE, ChatTurnInput(chat_id=chat_id), id=workflow_id(chat_id),
        task_queue=settings.task_queue, task_timeout=TURN_TASK_TIMEOUT,
        # Set at start so the new run need not upsert them (ignored for a running one).
        search_attributes=TypedSearchAttributes([
            SearchAttributePair(CHAT_ID_ATTR, chat_id),
            SearchAttributePair(TURN_STATUS_ATTR, TurnStatus.RUNNING.value),
        ]),
        start_signal="user_message", start_signal_args=[message],
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        result_type=TurnState,
    )


# The server's answer when the workflow task that carried an update failed (say, a
# signal raced the run's completion): the update was never taken, so asking again is safe.
_UPDATE_TASK_FAILED = "unexpected workflow task failure"
DECISION_ATTEMPTS = 5


async def decide(client: Client, chat_id: str, update: str, recovery_id: str) -> TurnState:
    """Run `continue_turn` or `dismiss_turn`: the new state, or the validator's
    refusal as `WorkflowUpdateFailedError`."""
    from temporalio.service import RPCError

    handle = client.get_workflow_handle(workflow_id(chat_id))
    for attempt in range(1, DECISION_ATTEMPTS + 1):
        try:
            return await handle.execute_update(update, RecoveryAction(recovery_id=recovery_id),
                                               result_type=TurnState)
        except RPCError as err:
            if _UPDATE_TASK_FAILED not in str(err) or attempt == DECISION_ATTEMPTS:
                raise
            await asyncio.sleep(0.1 * attempt)
    raise AssertionError("unreachable")


async def query_state(client: Client, chat_id: str, rpc_timeout: timedelta | None = None) -> TurnState:
    handle = client.get_workflow_handle(workflow_id(chat_id))
    return await handle.query("state", result_type=TurnState, rpc_timeout=rpc_timeout)
