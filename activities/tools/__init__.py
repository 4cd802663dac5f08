"""The tool layer: `@tool` functions, their registry, and the built-in tools."""

from __future__ import annotations

# Imported for its side effect: registers the built-ins into the default registry
# (`default_registry()` counts on it).
from . import builtin as _builtin  # noqa: F401  (after registry: builtin imports it)
from .registry import (
    ToolLoadError,
    ToolOutcome,
    ToolRegistry,
    default_registry,
    load_tool_modules,
    tool,
)
from .schema import ToolContext
from .workspace import WorkspaceEscape, resolve_in_workspace

__all__ = [
    "ToolContext",
    "ToolLoadError",
    "ToolOutcome",
    "ToolRegistry",
    "WorkspaceEscape",
    "default_registry",
    "load_tool_modules",
    "resolve_in_workspace",
    "tool",
]
