"""OpenAI Chat Completions (and compatible servers: vLLM, Ollama, llama.cpp, ...).

The official client retries transient failures itself (`max_retries`); what is
left when it gives up is classified into Retryable / Permanent provider errors.
The response body is parsed from the raw JSON rather than the SDK's models so
that malformed output from a compatible server is reported, not crashed on.
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
    ensure_tool_call_ids,
)
from turnkeeper.models import ChatMessage, ModelReply, ToolCall, ToolSpec

DEFAULT_BASE_URL = "https://api.openai.com/v1"
RETRYABLE_STATUSES = frozenset({408, 409, 429})
# Context windows of some well-known models, by name prefix (longest first); any
# other model counts as DEFAULT_CONTEXT_WINDOW: set TURNKEEPER_CONTEXT_TOKENS for one with less.
KNOWN_WINDOWS: tuple[tuple[str, int], ...] = (
    ("gpt-3.5-turbo", 16_385), ("gpt-4.1", 1_047_576), ("gpt-4o", 128_000))


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
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise _malformed(f"tool call {i} has no function name")
        arguments = fn.get("arguments") if isinstance(fn, dict) else None
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            # Some compatible servers send an object; the wire format says string.
            arguments = json.dumps(arguments)
        call_id = rc.get("id")
        calls.append(ToolCall(id=call_id if isinstance(call_id, str) else "", name=name, arguments=arguments))

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
        self, history: list[ChatMessage], tools: list[ToolSpec], *, call_index: int
    ) -> ModelReply:
        request: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(history)}
        if tools:
            request["tools"] = to_openai_tools(tools)
        try:
            raw = await self._client.chat.completions.with_raw_response.create(**request)
        except openai.OpenAIError as e:
            raise self._classify(e) from None  # the cause carries request headers: drop it
        try:
            body = raw.http_response.json()
        except ValueError:
            raise _malformed("the response body is not JSON") from None
        reply = parse_completion(body)
        if reply.tool_calls:
            reply.tool_calls = ensure_tool_call_ids(reply.tool_calls, history, call_index=call_index)
        return reply

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
