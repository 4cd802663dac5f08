"""A tool from a plain function: its name, description and the JSON schema of
its arguments, read from its signature and type hints.

Each parameter the model fills becomes a field of a pydantic model (aliased, so
any parameter name works) whose schema, without pydantic's titles, is what the
model sees. A parameter annotated `ToolContext` is filled by the registry with
the call's facts instead, and never shows in the schema.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from turnkeeper.models import EffectClass, ToolSpec

EffectLike = EffectClass | Literal["read", "idempotent", "write"]

# The name pattern OpenAI-style function calling accepts.
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolContext:
    """Per-call facts a tool may ask for by annotating a parameter `ToolContext`."""

    workspace: Path
    chat_id: str
    turn: int
    tool_call_id: str
    idempotency_key: str  # "<chat_id>/<turn>/<tool_call_id>": stable across retries of the call
    exec_timeout: float
    # Details, if any, go with the beat (an MCP server's progress).
    heartbeat: Callable[..., None] | None = None

    @classmethod
    def for_call(
        cls,
        *,
        workspace: Path,
        chat_id: str,
        turn: int,
        tool_call_id: str,
        exec_timeout: float,
        heartbeat: Callable[..., None] | None = None,
    ) -> ToolContext:
        return cls(
            workspace=workspace,
            chat_id=chat_id,
            turn=turn,
            tool_call_id=tool_call_id,
            idempotency_key=f"{chat_id}/{turn}/{tool_call_id}",
            exec_timeout=exec_timeout,
            heartbeat=heartbeat,
        )


class ExternalTool(Protocol):
    """A tool served from elsewhere (an MCP server's): it checks its arguments
    against its own JSON schema, and says whether its call failed."""

    def check(self, arguments: dict[str, Any]) -> str | None:
        """Why `arguments` do not fit the tool's schema; None when they do."""
        ...

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> tuple[bool, str]:
        """(whether the call failed, what the model reads)."""
        ...


@dataclass(frozen=True)
class RegisteredTool:
    """A registered tool: its function, the model of its arguments and the schema the model sees."""

    name: str
    description: str
    effect: EffectClass
    fn: Callable[..., Any]
    args_model: type[BaseModel]
    # (model field, parameter name): fields are aliased so any parameter name works.
    params: tuple[tuple[str, str], ...]
    ctx_params: tuple[str, ...]
    parameters_schema: dict[str, Any]
    confirm: bool = False
    """Never run on the model's word alone: the turn waits for the user's approval first."""
    external: ExternalTool | None = None
    """Set for a tool served from elsewhere: the registry calls it with the arguments as given."""

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.description,
            parameters=self.parameters_schema,
            effect=self.effect,
        )


def _first_paragraph(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.strip().split("\n\n", 1)[0].split())


def build_tool(
    fn: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    effect: EffectLike,
    confirm: bool = False,
) -> RegisteredTool:
    """Read `fn`'s signature into a tool; raises for a name or a parameter a model could not call."""
    tool_name = name if name else str(getattr(fn, "__name__", ""))
    if not _NAME_RE.match(tool_name):
        raise ValueError(f"invalid tool name {tool_name!r}: use 1-64 letters, digits, '_' or '-'")
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as e:
        raise TypeError(f"tool {tool_name!r}: cannot resolve type hints: {e}") from e

    fields: dict[str, Any] = {}
    params: list[tuple[str, str]] = []
    ctx_params: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(f"tool {tool_name!r}: parameter {param.name!r} must be passable by keyword")
        annotation = hints.get(param.name, Any)
        if annotation is ToolContext:
            ctx_params.append(param.name)
            continue
        field = f"p{len(params)}"
        default = ... if param.default is param.empty else param.default
        # Aliases keep parameter names like `json` or `_x` from clashing with BaseModel.
        fields[field] = (Annotated[annotation, Field(alias=param.name)], default)
        params.append((field, param.name))

    model = create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    schema = arguments_schema(model)
    return RegisteredTool(
        name=tool_name,
        description=_first_paragraph(fn) if description is None else description,
        effect=EffectClass(effect),
        fn=fn,
        args_model=model,
        params=tuple(params),
        ctx_params=tuple(ctx_params),
        parameters_schema=schema,
        confirm=confirm,
    )


def arguments_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema a model sees for arguments shaped as `model`."""
    schema: dict[str, Any] = _strip_titles(model.model_json_schema())
    schema.setdefault("properties", {})
    return schema


def external_tool(
    tool: ExternalTool,
    *,
    name: str,
    description: str,
    parameters: dict[str, Any],
    effect: EffectLike,
    confirm: bool = False,
) -> RegisteredTool:
    """A tool whose schema and checks are its server's; raises for a name a model could not call."""
    if not _NAME_RE.match(name):
        raise ValueError(f"{name!r} is not a valid tool name: use 1-64 letters, digits, '_' or '-'")
    return RegisteredTool(
        name=name,
        description=description,
        effect=EffectClass(effect),
        fn=tool.__call__,
        args_model=_ANY_ARGUMENTS,
        params=(),
        ctx_params=(),
        parameters_schema=parameters,
        confirm=confirm,
        external=tool,
    )


# Unused for an external tool (it checks its own arguments); a model for the field's type.
_ANY_ARGUMENTS = create_model("external_arguments", __config__=ConfigDict(extra="allow"))

_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})
_SCHEMA_DATA = frozenset({"default", "const", "enum", "examples", "required"})


def _strip_titles(node: Any) -> Any:
    """Drop pydantic's generated `title`s: noise to the model, tokens on every call."""
    if isinstance(node, list):
        return [_strip_titles(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: _strip_titles(v) for k, v in value.items()}  # keys are names, keep them
        elif key in _SCHEMA_DATA:
            out[key] = value
        else:
            out[key] = _strip_titles(value)
    return out
