"""A chat's transcript: the user, assistant and tool rows a turn writes, each with
its event, and the reads of them; written once for every backend, a part of
`SQLStore`, which supplies `_write`, `_rows` and the commits."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from turnkeeper.models import OPEN_STATUSES, ChatMessage, ModelReply, ToolCall, TurnStatus, UserMessage
from turnkeeper.store import codec
from turnkeeper.store.base import CorruptRowError, TranscriptRow
from turnkeeper.store.transaction import ChatWrite

_OPEN_VALUES = frozenset(s.value for s in OPEN_STATUSES)


class TranscriptSQL:
    # Provided by SQLStore.
    _write: Callable[..., Coroutine[Any, Any, Any]]
    _rows: Callable[..., Coroutine[Any, Any, Any]]

    async def commit_user_messages(self, chat_id: str, turn: int, messages: list[UserMessage]) -> list[str]:
        return await self._write(chat_id, self._commit_user_tx, turn, list(messages))

    @staticmethod
    async def _commit_user_tx(chat: ChatWrite, turn: int, messages: list[UserMessage]) -> list[str]:
        committed: list[str] = []
        for message in messages:
            if await chat.insert_message(
                turn, ChatMessage(role="user", content=message.text), message_id=message.message_id
            ):
                committed.append(message.message_id)
                await chat.emit(
                    "user_message",
                    {
                        "turn": turn,
                        "message_id": message.message_id,
                        "text": message.text,
                        "sender": message.sender,
                    },
                )
        return committed

    async def record_assistant(
        self, chat_id: str, turn: int, step: int, reply: ModelReply, final: bool
    ) -> None:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        await self._write(chat_id, self._record_assistant_tx, turn, step, reply, final)

    @staticmethod
    async def _record_assistant_tx(
        chat: ChatWrite, turn: int, step: int, reply: ModelReply, final: bool
    ) -> None:
        tx, chat_id = chat.tx, chat.chat_id
        message = ChatMessage(role="assistant", content=reply.text, tool_calls=reply.tool_calls or None)
        row = await tx.fetchone(
            "SELECT id, body FROM messages WHERE chat_id = ? AND turn = ? AND step = ?", chat_id, turn, step
        )
        if row is None:
            changed = await chat.insert_message(turn, message, step=step)
        else:
            try:
                changed = codec.decode_message(chat_id, row) != message
            except CorruptRowError:
                changed = True  # an undecodable row is exactly what a rewrite should repair
            if changed:
                # UPDATE in place: the row keeps its id, hence its place in the transcript.
                await tx.execute(
                    "UPDATE messages SET body = ? WHERE id = ?", codec.message_body(message), row["id"]
                )
        # The reply is the truth now: no client should show its draft any more.
        await tx.execute(
            "UPDATE drafts SET recorded = ?, text = '' WHERE chat_id = ? AND turn = ? AND step = ?",
            True,
            chat_id,
            turn,
            step,
        )
        if changed:
            await chat.emit(
                "assistant_message",
                {
                    "turn": turn,
                    "step": step,
                    "text": reply.text,
                    "tool_calls": [call.model_dump() for call in reply.tool_calls],
                },
            )
        if final:
            current = await chat.turn_row(turn)
            # Only an open turn completes: a late answer never reopens a closed one.
            if current["status"] in _OPEN_VALUES and not current["ended"]:
                await tx.execute(
                    "UPDATE turns SET status = ?, reason = NULL, updated_at = ? WHERE chat_id = ? AND turn = ?",
                    TurnStatus.COMPLETED.value,
                    chat.now,
                    chat_id,
                    turn,
                )
                await chat.end_turn(turn, {"turn": turn, "status": TurnStatus.COMPLETED.value})

    async def tool_started(self, chat_id: str, turn: int, call: ToolCall, idempotency_key: str) -> bool:
        # On disk before the tool acts: should the Temporal server lose its last
        # moments in a power cut and schedule the call again, this row refuses it.
        return await self._write(chat_id, self._tool_started_tx, turn, call, idempotency_key, durable=True)

    @staticmethod
    async def _tool_started_tx(chat: ChatWrite, turn: int, call: ToolCall, idempotency_key: str) -> bool:
        if (
            await chat.tx.execute(
                "INSERT INTO tool_runs (idempotency_key, chat_id, turn, tool_call_id, started_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                idempotency_key,
                chat.chat_id,
                turn,
                call.id,
                chat.now,
            )
            != 1
        ):
            return False
        await chat.emit(
            "tool_started",
            {
                "turn": turn,
                "tool_call_id": call.id,
                "name": call.name,
                "idempotency_key": idempotency_key,
            },
        )
        return True

    async def record_tool_result(
        self, chat_id: str, turn: int, tool_call_id: str, name: str, content: str, status: str
    ) -> bool:
        if status not in codec.TOOL_RESULT_STATUSES:
            raise ValueError(
                f"tool result status must be one of {sorted(codec.TOOL_RESULT_STATUSES)}, got {status!r}"
            )
        return await self._write(chat_id, self._tool_result_tx, turn, tool_call_id, name, content, status)

    @staticmethod
    async def _tool_result_tx(
        chat: ChatWrite, turn: int, tool_call_id: str, name: str, content: str, status: str
    ) -> bool:
        message = ChatMessage(role="tool", content=content, tool_call_id=tool_call_id, name=name)
        if not await chat.insert_message(turn, message):
            return False
        if status == "interrupted":
            await chat.emit("tool_interrupted", {"turn": turn, "tool_call_id": tool_call_id, "name": name})
        else:
            await chat.emit(
                "tool_finished", {"turn": turn, "tool_call_id": tool_call_id, "name": name, "status": status}
            )
        return True

    async def turn_messages(self, chat_id: str, turn: int) -> list[ChatMessage]:
        return await self._rows(
            partial(codec.decode_message, chat_id),
            "SELECT id, body FROM messages WHERE chat_id = ? AND turn = ? ORDER BY id",
            chat_id,
            turn,
        )

    async def history(self, chat_id: str) -> list[ChatMessage]:
        return await self._rows(
            partial(codec.decode_message, chat_id),
            "SELECT id, body FROM messages WHERE chat_id = ? ORDER BY id",
            chat_id,
        )

    async def transcript_rows(self, chat_id: str) -> list[TranscriptRow]:
        return await self._rows(
            partial(codec.decode_transcript_row, chat_id),
            "SELECT id, turn, message_id, step, body FROM messages WHERE chat_id = ? ORDER BY id",
            chat_id,
        )
