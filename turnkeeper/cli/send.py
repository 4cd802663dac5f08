"""`turnkeeper send`: send a message, then follow the turn that takes it
(turnkeeper.cli.follow) unless `--no-wait`."""

from __future__ import annotations

import argparse
import time
from typing import Any

from turnkeeper import client as tk
from turnkeeper.cli.common import (
    EXIT_OK,
    QUERY_TIMEOUT,
    ClientOnDemand,
    Refused,
    connect_client,
    open_session_store,
)
from turnkeeper.cli_reads import Reads
from turnkeeper.config import Settings


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

    from turnkeeper.cli.follow import saved_if_interrupted

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
    from turnkeeper.cli.follow import follow_turn, open_store_waiting

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
    from turnkeeper.cli.follow import follow_turn, saved_if_interrupted

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
