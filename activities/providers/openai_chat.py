"""OpenAI Chat Completions (and compatible servers: vLLM, Ollama, llama.cpp, ...).

The official client retries transient failures itself (`max_retries`); what is
left when it gives up is classified into Retryable / Permanent provider errors.
The response body is parsed from the raw JSON rather than the SDK's models so
that malformed output from a compatible server is reported, not crashed on.
With a text sink the call streams (`stream=True`): the text goes to the sink as
it arrives, and `StreamAssembler` puts the reply together from the chunks,
tool calls included (their ids, names and arguments come in pieces by index).
"""

from __future__ import annotations

import json
from typing import Any

import openai

from turnkeeper.activities.providers.base import (
    DEFAULT_CONTEXT_WINDOW,
    PLACEHOLDER_API_KEY,
    ModelProvider,
    PermanentProviderError,
    ProviderError,
    RetryableProviderError,
    TextSink,
    ensure_tool_call_ids,
)
from turnkeeper.models import ChatMessage, ModelReply, ToolCall, ToolSpec

DEFAULT_BASE_URL = "https://api.openai.com/v1"
RETRYABLE_STATUSES = frozenset({408, 409, 429})
# Context windows of some well-known models, by name prefix (longest first); any
# other model counts as DEFAULT_CONTEXT_WINDOW: set TURNKEEPER_CONTEXT_TOKENS for one with less.
KNOWN_WINDOWS: tuple[tuple[str, int], ...] = (
    ("gpt-3.5-turbo", 16_385),
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
)


def context_window_of(model: str) -> int:
    return next((n for prefix, n in KNOWN_WINDOWS if model.startswith(prefix)), DEFAULT_CONTEXT_WINDOW)


def to_openai_messages(history: list[ChatMessage]) -> list[dict[str, Any]]:
    """Committed transcript rows -> Chat Completions `messages`."""
    out: list[dict[str, Any]] = []
    for m in history:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content or ""})
        elif m.role == "assistant" and m.tool_calls:
            out.append(
                {
                    "role": "assistant",
                    "content": m.content,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments},
                        }
                        for c in m.tool_calls
                    ],
                }
            )
        else:
            out.append({"role": m.role, "content": m.content or ""})
    return out


def to_openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def _malformed(detail: str) -> PermanentProviderError:
    return PermanentProviderError(f"malformed model output: {detail}")


def parse_completion(body: object) -> ModelReply:
    """A Chat Completions response body -> ModelReply (ids not yet checked).

    Tool call arguments are kept verbatim, even when they are not valid JSON:
    the tool layer reports that back to the model.
    """
    if not isinstance(body, dict):
        raise _malformed(f"expected a JSON object, got {type(body).__name__}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise _malformed("the response has no choices")
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        raise _malformed("the first choice has no message")

    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise _malformed(f"message content is a {type(content).__name__}, not a string")
    if not content and isinstance(message.get("refusal"), str):
        content = message["refusal"]

    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise _malformed("tool_calls is not a list")
    calls: list[ToolCall] = []
    for i, rc in enumerate(raw_calls):
        fn = rc.get("function") if isinstance(rc, dict) else None
        if not isinstance(fn, dict):
            raise _malformed(f"tool call {i} has no function name")
        calls.append(_tool_call(i, rc.get("id"), fn.get("name"), fn.get("arguments")))

    if not content and not calls:
        raise _malformed("the message has neither content nor tool calls")
    return ModelReply(text=content or None, tool_calls=calls)


def _tool_call(i: int, call_id: object, name: object, arguments: object) -> ToolCall:
    if not isinstance(name, str) or not name:
        raise _malformed(f"tool call {i} has no function name")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        # Some compatible servers send an object; the wire format says string.
        arguments = json.dumps(arguments)
    return ToolCall(id=call_id if isinstance(call_id, str) else "", name=name, arguments=arguments)


class StreamAssembler:
    """A streamed completion's chunks (as JSON objects) -> one ModelReply; the
    text also goes to `on_text` piece by piece."""

    def __init__(self, on_text: TextSink | None = None) -> None:
        self._on_text = on_text
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self.finished = False
        """A chunk said why the answer ended: without one, the stream broke off."""

    def add(self, chunk: object) -> None:
        if not isinstance(chunk, dict):
            raise _malformed(f"a stream chunk is a {type(chunk).__name__}, not an object")
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise _malformed("a stream chunk's choices is not a list")
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # only the first choice is asked for
            if choice.get("finish_reason"):
                self.finished = True
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise _malformed("a stream chunk's delta is not an object")
            self._add_text(delta.get("content"), self._text, "content")
            self._add_text(delta.get("refusal"), self._refusal, "refusal")
            calls = delta.get("tool_calls") or []
            if not isinstance(calls, list):
                raise _malformed("a stream chunk's tool_calls is not a list")
            for piece in calls:
                self._add_call(piece)

    def _add_text(self, value: object, parts: list[str], field: str) -> None:
        if value is None or value == "":
            return
        if not isinstance(value, str):
            raise _malformed(f"a stream chunk's {field} is a {type(value).__name__}, not a string")
        parts.append(value)
        if field == "content" and self._on_text is not None:
            self._on_text(value)

    def _add_call(self, piece: object) -> None:
        if not isinstance(piece, dict):
            raise _malformed("a streamed tool call is not an object")
        index = piece.get("index", len(self._calls))
        if not isinstance(index, int):
            raise _malformed("a streamed tool call's index is not a number")
        call = self._calls.setdefault(index, {"id": None, "name": "", "arguments": None})
        if isinstance(piece.get("id"), str) and piece["id"]:
            call["id"] = piece["id"]
        fn = piece.get("function") or {}
        if not isinstance(fn, dict):
            raise _malformed("a streamed tool call's function is not an object")
        name = fn.get("name")
        # The name comes once (OpenAI) or again in every piece (some compatible servers).
        if isinstance(name, str) and name and name != call["name"]:
            call["name"] += name
        arguments = fn.get("arguments")
        if isinstance(arguments, str):
            call["arguments"] = (call["arguments"] or "") + arguments
        elif arguments is not None:
            call["arguments"] = arguments  # an object, sent whole

    def reply(self) -> ModelReply:
        content = "".join(self._text) or "".join(self._refusal)
        calls = [
            _tool_call(i, c["id"], c["name"], c["arguments"])
            for i, (_, c) in enumerate(sorted(self._calls.items()))
        ]
        if not content and not calls:
            raise _malformed("the message has neither content nor tool calls")
        return ModelReply(text=content or None, tool_calls=calls)


class OpenAIChatProvider(ModelProvider):
    name = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout: float = 60,
        max_retries: int = 2,
    ) -> None:
        self.model = model
        self.context_window = context_window_of(model)
        self.timeout = timeout
        # Kept only to scrub it from error text; never logged or put in a message.
        self._secret = api_key if api_key and api_key != PLACEHOLDER_API_KEY else None
        # Explicit base URL so the client does not read OPENAI_BASE_URL behind our back.
        self._client = openai.AsyncOpenAI(
            api_key=api_key or PLACEHOLDER_API_KEY,
            base_url=base_url or DEFAULT_BASE_URL,
            timeout=timeout,
            max_retries=max_retries,
        )

    def __repr__(self) -> str:
        return f"OpenAIChatProvider(model={self.model!r}, base_url={str(self._client.base_url)!r})"

    async def complete(
        self,
        history: list[ChatMessage],
        tools: list[ToolSpec],
        *,
        call_index: int,
        on_text: TextSink | None = None,
    ) -> ModelReply:
        request: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(history)}
        if tools:
            request["tools"] = to_openai_tools(tools)
        reply = await (self._stream(request, on_text) if on_text is not None else self._whole(request))
        if reply.tool_calls:
            reply.tool_calls = ensure_tool_call_ids(reply.tool_calls, history, call_index=call_index)
        return reply

    async def _whole(self, request: dict[str, Any]) -> ModelReply:
        try:
            raw = await self._client.chat.completions.with_raw_response.create(**request)
        except openai.OpenAIError as e:
            raise self._classify(e) from None  # the cause carries request headers: drop it
        try:
            body = raw.http_response.json()
        except ValueError:
            raise _malformed("the response body is not JSON") from None
        return parse_completion(body)

    async def _stream(self, request: dict[str, Any], on_text: TextSink) -> ModelReply:
        assembler = StreamAssembler(on_text)
        try:
            stream = await self._client.chat.completions.create(**request, stream=True)
            async with stream:
                async for chunk in stream:
                    assembler.add(chunk.to_dict())
        except ProviderError:
            raise  # malformed chunks, from the assembler
        except openai.OpenAIError as e:
            raise self._classify(e) from None
        except ValueError as e:  # a chunk that is not JSON
            raise _malformed(self._scrub(f"a stream chunk is not JSON: {e}")) from None
        except Exception as e:
            # Broken off mid-stream: the client retries only before the first byte.
            raise RetryableProviderError(
                self._scrub(f"the model API's stream broke off: {type(e).__name__}: {e}")
            ) from None
        if not assembler.finished:
            raise RetryableProviderError("the model API's stream ended before the answer did")
        return assembler.reply()

    async def aclose(self) -> None:
        await self._client.close()

    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    def _classify(self, e: openai.OpenAIError) -> ProviderError:
        if isinstance(e, openai.APITimeoutError):
            return RetryableProviderError(f"model API request timed out after {self.timeout:g}s")
        if isinstance(e, openai.APIConnectionError):
            cause = e.__cause__
            why = f": {type(cause).__name__}: {cause}" if cause else ""
            return RetryableProviderError(self._scrub(f"could not connect to the model API{why}"))
        if isinstance(e, openai.APIStatusError):
            status = e.status_code
            body = e.body
            detail = body.get("message") if isinstance(body, dict) else None
            message = self._scrub(f"model API error {status}: {detail or e.message}")
            if status >= 500 or status in RETRYABLE_STATUSES:
                return RetryableProviderError(message, status_code=status)
            return PermanentProviderError(message, status_code=status)
        if isinstance(e, openai.APIResponseValidationError):
            return _malformed(self._scrub(e.message))
        return PermanentProviderError(self._scrub(f"model API call failed: {type(e).__name__}: {e}"))
