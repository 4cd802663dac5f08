"""`turnkeeper send`: send a message by the SDK's client, then follow the turn
that takes it (turnkeeper.cli.follow) unless `--no-wait`.

One way for every configuration: the SDK's client is the one that encrypts
payloads (TURNKEEPER_ENCRYPTION_KEYS) and traces the turn it starts
(OTEL_EXPORTER_OTLP_ENDPOINT), and following the turn reads the store.
"""

from __future__ import annotations

import argparse

from turnkeeper import client as tk
from turnkeeper.cli.common import EXIT_OK, Refused, connect_client, open_session_store
from turnkeeper.cli.output import print_json, print_turn_json, quiet_if
from turnkeeper.config import Settings


async def cmd_send(args: argparse.Namespace, settings: Settings) -> int:
    try:
        message = tk.new_message(args.text, settings, message_id=args.message_id)
    except tk.MessageTooLarge as err:
        raise Refused(str(err)) from None
    client = await connect_client(settings)
    store = await open_session_store(settings) if not args.no_wait else None
    try:
        # A retry of a message the chat already holds starts no turn: it follows the one that took it.
        after = await store.follow_from(args.chat, message.message_id) if store is not None else 0
        try:
            await tk.send_message(client, settings, args.chat, message)
        except tk.TurnTakesNoMoreMessages as err:
            raise Refused(str(err)) from None
        if store is None:
            if args.json:
                print_json({"chat_id": args.chat, "message_id": message.message_id, "sent": True})
            else:
                print(f"sent {message.message_id} to chat {args.chat}")
            return EXIT_OK
        from turnkeeper.cli.follow import follow_turn, saved_if_interrupted

        # The message is durable: Ctrl-C stops only the watching.
        with saved_if_interrupted(args.chat, message.message_id), quiet_if(args.json):
            code = await follow_turn(
                client,
                store,
                args.chat,
                message.message_id,
                after,
                args.timeout,
                task_queue=settings.task_queue,
            )
        if args.json:
            await print_turn_json(store, args.chat)
        return code
    finally:
        if store is not None:
            await store.close()
