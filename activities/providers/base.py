"""The model provider interface, its errors, and what the providers share.

A provider turns the committed history plus the enabled tools into one
`ModelReply`. Providers are used from activities only (they do I/O). Which one
TURNKEEPER_MODEL names is chosen in `loading.py`, above the providers: this
module imports none of them.
"""

from __future__ import annotations

import asyncio
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

from pydantic import BaseModel

from turnkeeper.models import ChatMessage, ModelReply, ToolCall, ToolSpec

# Local OpenAI-compatible servers ignore the key, but the client refuses to start without one.
PLACEHOLDER_API_KEY = "not-needed"


class ProviderError(Exception):
    """A model call failed. `retryable` says whether trying again may help."""

    retryable: bool = False

    def __init__(
        self, message: str, *, retryable: bool | None = None, status_code: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable
        self.status_code = status_code


class RetryableProviderError(ProviderError):
    """Transient: rate limit, 5xx, connection error, timeout."""

    retryable = True


class PermanentProviderError(ProviderError):
    """Trying again will not help: auth, bad request, unknown model, malformed output, ..."""

    retryable = False


TextSink = Callable[[str], None]
"""Takes each piece of the answer's text as the model produces it."""


# A model's context window in tokens when its provider knows no better, and the room
# kept for its answer: the context a call sends is the one less the other by default.
DEFAULT_CONTEXT_WINDOW = 128_000
DEFAULT_ANSWER_TOKENS = 4_096
# `call_index` of a summary call: it answers no turn, and numbers no tool call.
SUMMARY_CALL = -1

SUMMARY_INSTRUCTION = (
    "You keep the memory of a long conversation between a user and an assistant that uses tools. "
    "Summarise the conversation below for the assistant's own later use: what the user wants, the facts, "
    "names, numbers and decisions, what the tools did and found, and what is still open. "
    "Write plain prose, at most {words} words. Do not address the user."
)


class SummaryRequest(BaseModel):
    """Older transcript rows to fold into a summary, with the summary they follow."""

    earlier: str | None = None
    """The summary of what came before these rows, if any."""
    rows: list[ChatMessage]
    max_tokens: int


def summary_transcript(request: SummaryRequest) -> str:
    """The rows as plain text: any model reads it, whatever its tool-call format."""
    lines = [f"Summary so far: {request.earlier}"] if request.earlier else []
    for m in request.rows:
        if m.role == "tool":
            lines.append(f"tool {m.name or ''} result: {m.content or ''}")
            continue
        if m.content:
            lines.append(f"{m.role}: {m.content}")
        lines.extend(f"{m.role} calls {c.name}({c.arguments})" for c in m.tool_calls or [])
    return "\n".join(lines)


def summary_prompt(request: SummaryRequest) -> list[ChatMessage]:
    words = max(20, request.max_tokens * 3 // 4)
    return [
        ChatMessage(role="system", content=SUMMARY_INSTRUCTION.format(words=words)),
        ChatMessage(role="user", content=summary_transcript(request)),
    ]


class ModelProvider(ABC):
    """One model behind one method. `call_index` is the number of assistant rows
    already in `history`; providers that invent tool call ids derive them from it.
    With `on_text`, the provider hands over the reply's text as it comes (the
    pieces add up to `ModelReply.text`); the reply it returns is the truth."""

    name: str
    context_window: int = DEFAULT_CONTEXT_WINDOW
    answer_tokens: int = DEFAULT_ANSWER_TOKENS

    @abstractmethod
    async def complete(
        self,
        history: list[ChatMessage],
        tools: list[ToolSpec],
        *,
        call_index: int,
        on_text: TextSink | None = None,
    ) -> ModelReply: ...

    async def summarise(self, request: SummaryRequest) -> str:
        """Fold older rows into a summary: one call of this model, without tools."""
        reply = await self.complete(summary_prompt(request), [], call_index=SUMMARY_CALL)
        text = (reply.text or "").strip()
        if not text:
            raise PermanentProviderError("the model's summary of the earlier conversation came back empty")
        return text

    async def aclose(self) -> None:
        """Release resources (HTTP clients); the default has none."""
        return None


_WORD = re.compile(r"\S+\s*|\s+")


def word_chunks(text: str) -> list[str]:
    """`text` in word-sized pieces (each word with the space after it)."""
    return _WORD.findall(text)


async def stream_words(reply: ModelReply, on_text: TextSink | None, delay_s: float) -> ModelReply:
    """Hand a ready reply's text over word by word, `delay_s` apart: how the
    offline models stream, so that the page shows it without an API key."""
    if on_text is not None and reply.text:
        for i, piece in enumerate(word_chunks(reply.text)):
            if i and delay_s > 0:
                await asyncio.sleep(delay_s)
            on_text(piece)
    return reply


def listed_summary(request: SummaryRequest) -> str:
    """An offline model's summary: the summary so far, then the start of each row."""
    parts = [request.earlier] if request.earlier else []
    for m in request.rows:
        text = (m.content or " ".join(f"{c.name}({c.arguments})" for c in m.tool_calls or [])).strip()
        parts.append(f"{m.role}: {' '.join(text.split())[:60]}")
    return "; ".join(parts)


# A tool call id is a store key (with the chat and turn): short, printable, and
# storable everywhere (PostgreSQL keeps no NUL in text). Longer or odd ones are replaced.
MAX_TOOL_CALL_ID_CHARS = 128
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str, always a lone one: pairs decode to one character


def usable_tool_call_id(call_id: str) -> bool:
    return (
        0 < len(call_id) <= MAX_TOOL_CALL_ID_CHARS
        and not _CONTROL.search(call_id)
        and _valid_unicode(call_id)
    )


def _valid_unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _mended(text: str) -> str:
    # JSON can escape a lone surrogate ("\ud800"), which no payload or store row can carry.
    return text if _valid_unicode(text) else _SURROGATE.sub("\ufffd", text)


def well_formed(reply: ModelReply) -> ModelReply:
    """A provider's answer as the turn can record it: lone surrogates in its text,
    tool names and arguments become U+FFFD, and an unusable tool call id becomes
    empty, for `ensure_tool_call_ids` to replace. Any provider, ours or a user's."""
    calls = [
        c
        if usable_tool_call_id(c.id) and _valid_unicode(c.name + c.arguments)
        else c.model_copy(
            update={
                "id": c.id if usable_tool_call_id(c.id) else "",
                "name": _mended(c.name),
                "arguments": _mended(c.arguments),
            }
        )
        for c in reply.tool_calls
    ]
    text = reply.text if reply.text is None else _mended(reply.text)
    if text == reply.text and all(a is b for a, b in zip(calls, reply.tool_calls, strict=False)):
        return reply
    return reply.model_copy(update={"text": text, "tool_calls": calls})


def fallback_tool_call_id(call_index: int, i: int) -> str:
    return f"call_{call_index}_{i}"


def used_tool_call_ids(history: Iterable[ChatMessage]) -> set[str]:
    return {c.id for m in history for c in (m.tool_calls or ())}


def ensure_tool_call_ids(
    calls: list[ToolCall], history: Iterable[ChatMessage], *, call_index: int
) -> list[ToolCall]:
    """Give every call a non-empty id unique within the chat.

    Ids are the store's keys for tool results, so an empty or unusable id
    (`usable_tool_call_id`) or one a server reuses (some local servers do) is
    replaced by a deterministic fallback.
    """
    taken = used_tool_call_ids(history)
    out: list[ToolCall] = []
    for i, call in enumerate(calls):
        new_id = call.id
        if not usable_tool_call_id(new_id) or new_id in taken:
            new_id = fallback_tool_call_id(call_index, i)
            n = 1
            while new_id in taken:
                new_id = f"{fallback_tool_call_id(call_index, i)}_{n}"
                n += 1
        taken.add(new_id)
        out.append(call if new_id == call.id else call.model_copy(update={"id": new_id}))
    return out
