"""The messages a turn takes or refuses, as a mixin of `ChatTurn`.

A `user_message` that cannot be used (not decodable, malformed, over a limit) is
refused with a `message_rejected` event and never dropped silently; a client's
retry of a message the run holds is one message.
"""
from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from turnkeeper import activity_io
    from turnkeeper.models import NewEvent, Reason, UserMessage
    from turnkeeper.workflows import recovery
    from turnkeeper.workflows.inbox import Inbox, wire_size
    from turnkeeper.workflows.patches import ANNOUNCE_IDLE_REFUSALS, REFUSE_UNDECODABLE
    from turnkeeper.workflows.payloads import Undecodable, decode_payload, first_error, message_id_of
    from turnkeeper.workflows.recovery import Effect, Input
    from turnkeeper.workflows.turn_persistence import TurnPersistence

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024
# Before the worker's configuration reaches a new run (with its first store call),
# messages up to this size are taken and then judged against the configured limit.
MESSAGE_BYTES_CEILING = 1024 * 1024


class MessageIntake(TurnPersistence):
    """Needs the inbox, the settings, the interrupt fields and the patch flags from the workflow."""

    _inbox: Inbox
    _settings: activity_io.TurnSettings
    _settings_known: bool
    _interrupt: Reason | None
    _superseding: list[str]
    _complete: bool
    _idle_refusals: asyncio.Task[None] | None

    def _take_message(self, payload: RawValue | None) -> None:
        # Raw, so that a payload the converter cannot decode is refused here
        # instead of being dropped by the SDK with nothing but a worker log line.
        try:
            raw = decode_payload(payload)
        except Undecodable as err:
            if self._complete or workflow.patched(REFUSE_UNDECODABLE):  # earlier runs dropped these unseen
                self._reject_message(None, f"malformed user_message payload: {err}")
            return
        try:
            message = UserMessage.model_validate(raw)
        except ValidationError as err:
            # The id, when it is readable, so a client following its own message sees the refusal.
            self._reject_message(message_id_of(raw), f"malformed user_message payload: {first_error(err)}")
            return
        size = len(message.text.encode())
        limit = self._message_limit()
        if size > limit:
            self._reject_message(message.message_id, f"message is {size} bytes; the limit is {limit}")
            return
        if self._inbox.seen(message.message_id):
            return  # the client's retry: one message
        pending = self._inbox.pending_bytes()
        if (pending + wire_size(message) > self._settings.max_pending_bytes
                and self._complete):
            self._reject_message(message.message_id, (
                f"the chat already holds {pending} bytes of messages not yet answered and this one "
                f"would pass the limit of {self._settings.max_pending_bytes}; send it again once "
                "the turn has answered"))
            return
        self._inbox.offer(message)
        if recovery.decide(self._state.status, Input.USER_MESSAGE).effect == Effect.SUPERSEDE:
            self._superseding.append(message.message_id)
            self._interrupt = self._interrupt or Reason.SUPERSEDED

    def _message_limit(self) -> int:
        if self._settings_known:
            return self._settings.max_message_bytes
        # The configured limit arrives with the first store call: judged there.
        return MESSAGE_BYTES_CEILING if self._complete else DEFAULT_MAX_MESSAGE_BYTES

    def _reject_message(self, message_id: str | None, why: str) -> None:
        workflow.logger.warning("user_message refused for chat %s: %s", self._state.chat_id, why)
        self._events.append(NewEvent(type="message_rejected",
                                     payload={"message_id": message_id, "reason": why}))
        if (self._before_turn and (self._idle_refusals is None or self._idle_refusals.done())
                and (self._complete or workflow.patched(ANNOUNCE_IDLE_REFUSALS))):
            # A run still waiting for its first valid message would otherwise hold
            # the refusal until IDLE_TIMEOUT.
            self._idle_refusals = asyncio.create_task(self._announce_refusals())
