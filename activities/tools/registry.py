"""Tool registration and safe execution.

A tool is a plain (sync or async) function; `@tool` registers it with the schema
the model sees, derived from its type hints (`schema.py`). `ToolRegistry.run`
turns everything a model can get wrong (unknown name, bad JSON, bad arguments, a
raising tool) into an error outcome the model can read, so a tool call never
fails the activity.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
from collections.abc import Callable, Collection, Iterable
from types import ModuleType
from typing import Any, Literal, TypeVar, overload

from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from turnkeeper.models import EffectClass, ToolSpec

from .schema import EffectLike, ExternalTool, RegisteredTool, ToolContext, build_tool

F = TypeVar("F", bound=Callable[..., Any])


class ToolOutcome(BaseModel):
    """What a tool call produced; `content` is what the model reads."""

    status: Literal["done", "error"]
    content: str

    @property
    def is_error(self) -> bool:
        return self.status == "error"


class ToolLoadError(ImportError):
    """A configured tool module could not be imported."""


class ToolRegistry:
    """Named tools; which of them a model may call is decided per call by `enabled`."""

    def __init__(self) -> None:
        self._tools: dict[str, RegisteredTool] = {}

    # --- registration -----------------------------------------------------------

    def register(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        description: str | None = None,
        effect: EffectLike = EffectClass.WRITE,
        confirm: bool = False,
    ) -> RegisteredTool:
        entry = build_tool(fn, name=name, description=description, effect=effect, confirm=confirm)
        existing = self._tools.get(entry.name)
        if existing is not None and _origin(existing.fn) != _origin(fn):
            # Same origin means the module was reloaded; anything else is a clash.
            raise ValueError(f"tool {entry.name!r} is already registered by {_origin(existing.fn)}")
        self._tools[entry.name] = entry
        return entry

    def add(self, entry: RegisteredTool) -> None:
        """Register a tool built elsewhere (an MCP server's); refused if its name is taken."""
        if entry.name in self._tools:
            raise ValueError(f"tool {entry.name!r} is already registered")
        self._tools[entry.name] = entry

    def copy(self) -> ToolRegistry:
        """A registry holding these tools, for a worker to add its own to."""
        other = ToolRegistry()
        other._tools = dict(self._tools)
        return other

    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(
        self,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        effect: EffectLike = EffectClass.WRITE,
        confirm: bool = False,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        effect: EffectLike = EffectClass.WRITE,
        confirm: bool = False,
    ) -> F | Callable[[F], F]:
        """Decorator registering into this registry; returns the function unchanged."""

        def decorate(f: F) -> F:
            self.register(f, name=name, description=description, effect=effect, confirm=confirm)
            return f

        return decorate(fn) if fn is not None else decorate

    # --- lookup -------------------------------------------------------------------

    def get(self, name: str) -> RegisteredTool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def needs_approval(self, name: str, confirm_tools: Collection[str] = ()) -> bool:
        """Whether a call of `name` waits for the user's approval: registered with
        `confirm=True`, or named in `confirm_tools` (TURNKEEPER_CONFIRM_TOOLS)."""
        entry = self._tools.get(name)
        return name in confirm_tools or (entry is not None and entry.confirm)

    def confirm_names(self, enabled: Iterable[str], confirm_tools: Collection[str] = ()) -> list[str]:
        """The tools of `enabled` whose calls wait for approval, and `confirm_tools`, sorted."""
        return sorted(set(confirm_tools) | {n for n in enabled if self.needs_approval(n)})

    def specs(self, enabled: Iterable[str]) -> list[ToolSpec]:
        """Specs of the enabled tools, in `enabled` order; unknown names are skipped."""
        return [self._tools[n].spec for n in _known(self._tools, enabled)]

    # --- execution ----------------------------------------------------------------

    async def run(
        self,
        name: str,
        arguments_json: str,
        ctx: ToolContext,
        *,
        enabled: Collection[str],
        max_output_bytes: int,
    ) -> ToolOutcome:
        """Run one tool call. Never raises for anything the model got wrong (or a
        tool raising); cancellation still propagates."""
        entry = self._tools.get(name) if name in enabled else None
        if entry is None:
            available = ", ".join(_known(self._tools, enabled)) or "(none)"
            return _error(f"Error: unknown tool {name!r}. Available tools: {available}", max_output_bytes)

        # Models send "" for argument-less calls often enough to accept it.
        raw = arguments_json if arguments_json and arguments_json.strip() else "{}"
        try:
            arguments = json.loads(raw)
        except (json.JSONDecodeError, RecursionError) as e:
            return _error(f"Error: malformed arguments for {name!r}: {e}", max_output_bytes)
        if not isinstance(arguments, dict):
            kind = _JSON_KINDS.get(type(arguments), type(arguments).__name__)
            return _error(
                f"Error: malformed arguments for {name!r}: expected a JSON object, got {kind}",
                max_output_bytes,
            )

        if entry.external is not None:
            return await _run_external(name, entry.external, arguments, ctx, max_output_bytes)
        try:
            validated = entry.args_model.model_validate(arguments)
        except ValidationError as e:
            return _error(f"Error: invalid arguments for {name!r}: {_describe(e)}", max_output_bytes)

        is_async = inspect.iscoroutinefunction(entry.fn)
        if not is_async and ctx.heartbeat is not None:
            ctx = _loop_heartbeat(ctx, ctx.heartbeat)
        kwargs: dict[str, Any] = {param: getattr(validated, field) for field, param in entry.params}
        kwargs.update((param, ctx) for param in entry.ctx_params)
        try:
            if is_async:
                result = await entry.fn(**kwargs)
            else:
                # Sync tools run in a thread so they never stall the worker's event loop.
                result = await asyncio.to_thread(entry.fn, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
        except Exception as e:
            return _error(_raised(e), max_output_bytes)
        return ToolOutcome(status="done", content=truncate_output(_render(result), max_output_bytes))


_DEFAULT = ToolRegistry()

_JSON_KINDS: dict[type, str] = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def default_registry() -> ToolRegistry:
    """The registry `@tool` fills, with the built-in tools registered: this module is
    imported through its package, whose `__init__` imports `builtin` right after it
    (so the registry never imports the tools that register into it)."""
    return _DEFAULT


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    effect: EffectLike = EffectClass.WRITE,
    confirm: bool = False,
    registry: ToolRegistry | None = None,
) -> Callable[[F], F]: ...


def tool(
    fn: F | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: EffectLike = EffectClass.WRITE,
    confirm: bool = False,
    registry: ToolRegistry | None = None,
) -> F | Callable[[F], F]:
    """Register a function as a tool (bare `@tool` or `@tool(...)`); returns it unchanged.

    Defaults: name = function name, description = first docstring paragraph,
    effect = write (never assumed safe to repeat), confirm = False (`True`: a call
    waits for the user's approval before it runs). Registers into the default
    registry unless `registry` is given.
    """
    decorate = (registry or _DEFAULT).tool(name=name, description=description, effect=effect, confirm=confirm)
    return decorate(fn) if fn is not None else decorate


def load_tool_modules(modules: Iterable[str]) -> list[ModuleType]:
    """Import each module so its `@tool` functions register into the default registry."""
    loaded: list[ModuleType] = []
    for module in modules:
        try:
            loaded.append(importlib.import_module(module))
        except Exception as e:
            raise ToolLoadError(
                f"cannot load tool module {module!r}: {type(e).__name__}: {e}", name=module
            ) from e
    return loaded


def truncate_output(text: str, max_bytes: int) -> str:
    """Cap `text` at `max_bytes` UTF-8 bytes on a character boundary, noting the cut."""
    # Lone surrogates would break encoding later (JSON, the store): replace them now.
    data = text.encode("utf-8", errors="replace")
    text = data.decode("utf-8")
    if len(data) <= max_bytes:
        return text
    head = data[: max(max_bytes, 0)].decode("utf-8", errors="ignore")
    shown = len(head.encode("utf-8"))
    return f"{head}\n[output truncated: {shown} of {len(data)} bytes shown]"


# --- helpers ------------------------------------------------------------------------


def _error(text: str, max_bytes: int) -> ToolOutcome:
    return ToolOutcome(status="error", content=truncate_output(text, max_bytes))


def _raised(e: Exception) -> str:
    message = str(e)
    return f"Error: {type(e).__name__}: {message}" if message else f"Error: {type(e).__name__}"


async def _run_external(
    name: str, tool: ExternalTool, arguments: dict[str, Any], ctx: ToolContext, max_bytes: int
) -> ToolOutcome:
    problem = tool.check(arguments)
    if problem is not None:
        return _error(f"Error: invalid arguments for {name!r}: {problem}", max_bytes)
    try:
        failed, text = await tool(arguments, ctx)
    except Exception as e:
        return _error(_raised(e), max_bytes)
    return ToolOutcome(status="error" if failed else "done", content=truncate_output(text, max_bytes))


def _loop_heartbeat(ctx: ToolContext, beat: Callable[[], None]) -> ToolContext:
    """A ctx whose heartbeat, called from a sync tool's thread, runs on the event loop
    (Temporal's `activity.heartbeat` in an async activity must run there)."""
    loop = asyncio.get_running_loop()

    def threadsafe_beat() -> None:
        loop.call_soon_threadsafe(beat)

    return dataclasses.replace(ctx, heartbeat=threadsafe_beat)


def _known(tools: dict[str, RegisteredTool], enabled: Iterable[str]) -> list[str]:
    return [n for n in dict.fromkeys(enabled) if n in tools]


def _origin(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _render(result: Any) -> str:
    if isinstance(result, str):
        return result
    if result is None:
        return ""
    try:
        return json.dumps(to_jsonable_python(result), ensure_ascii=False)
    except Exception:
        return str(result)


def _describe(error: ValidationError) -> str:
    parts = []
    for err in error.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "; ".join(parts)
