"""A model that plays back a fixed list of answers: for tests and reproducible demos.

Item N answers the model call made when the history already holds N assistant
rows, so a retried or resumed turn gets the same answer again. A summary of
older rows uses no item: it lists the start of each row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from turnkeeper.activities.providers.base import (
    ModelProvider,
    PermanentProviderError,
    SummaryRequest,
    TextSink,
    fallback_tool_call_id,
    listed_summary,
    stream_words,
)
from turnkeeper.models import ChatMessage, ModelReply, ToolCall, ToolSpec

ITEM_FORMS = '{"text": str}, {"tool_calls": [{"name": str, "arguments": object}]} or {"error": str}'


def _validate_item(index: int, item: object) -> dict[str, Any]:
    where = f"item {index}"
    if not isinstance(item, dict) or len(item) != 1:
        raise ValueError(f"{where} must be exactly one of {ITEM_FORMS}, got {item!r}")
    ((key, value),) = item.items()
    if key in ("text", "error"):
        if not isinstance(value, str):
            raise ValueError(f"{where}: {key!r} must be a string, got {value!r}")
        return {key: value}
    if key != "tool_calls":
        raise ValueError(f"{where}: unknown key {key!r}; expected one of {ITEM_FORMS}")
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: 'tool_calls' must be a non-empty list")
    calls: list[dict[str, Any]] = []
    for j, call in enumerate(value):
        cwhere = f"{where}, tool call {j}"
        if not isinstance(call, dict):
            raise ValueError(f'{cwhere} must be an object like {{"name": ..., "arguments": {{...}}}}')
        extra = set(call) - {"name", "arguments"}
        if extra:
            raise ValueError(f"{cwhere}: unknown keys {sorted(extra)}; expected 'name' and 'arguments'")
        name = call.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{cwhere}: 'name' must be a non-empty string")
        arguments = call.get("arguments", {})
        # A string is sent verbatim, so a script can exercise malformed arguments.
        if not isinstance(arguments, (dict, str)):
            raise ValueError(f"{cwhere}: 'arguments' must be an object (or a JSON string)")
        calls.append({"name": name, "arguments": arguments})
    return {"tool_calls": calls}


def validate_script(data: object) -> list[dict[str, Any]]:
    """Check a script's shape; `ValueError` naming the first bad item otherwise."""
    if not isinstance(data, list):
        raise ValueError(f"a script must be a JSON list of items, each one of {ITEM_FORMS}")
    return [_validate_item(i, item) for i, item in enumerate(data)]


def load_script(path: str | Path) -> list[dict[str, object]]:
    """Read and validate a scripted-model file (see `validate_script`)."""
    p = Path(path).expanduser()
    try:
        raw = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"scripted model file not found: {p}") from None
    except OSError as e:
        raise ValueError(f"cannot read scripted model file {p}: {e.strerror or e}") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"scripted model file {p} is not valid JSON: {e}") from None
    try:
        return validate_script(data)
    except ValueError as e:
        raise ValueError(f"scripted model file {p}: {e}") from None


class ScriptedProvider(ModelProvider):
    name = "scripted"

    def __init__(self, items: Sequence[dict[str, Any]]) -> None:
        self.items = validate_script(list(items))

    async def summarise(self, request: SummaryRequest) -> str:
        return listed_summary(request)

    async def complete(
        self,
        history: list[ChatMessage],
        tools: list[ToolSpec],
        *,
        call_index: int,
        on_text: TextSink | None = None,
    ) -> ModelReply:
        # Word by word at once: a test sees the deltas without waiting for them.
        return await stream_words(self._reply(call_index), on_text, 0.0)

    def _reply(self, call_index: int) -> ModelReply:
        if not 0 <= call_index < len(self.items):
            raise PermanentProviderError(
                f"scripted model has no answer for call {call_index} (the script has {len(self.items)} items)"
            )
        item = self.items[call_index]
        if "error" in item:
            raise PermanentProviderError(item["error"])
        if "text" in item:
            return ModelReply(text=item["text"])
        return ModelReply(
            tool_calls=[
                ToolCall(
                    id=fallback_tool_call_id(call_index, i),
                    name=call["name"],
                    arguments=(
                        call["arguments"]
                        if isinstance(call["arguments"], str)
                        else json.dumps(call["arguments"])
                    ),
                )
                for i, call in enumerate(item["tool_calls"])
            ]
        )
