"""The MCP servers file (TURNKEEPER_MCP_SERVERS): the `mcpServers` shape MCP clients
share, plus an optional `turnkeeper` key per server (docs/mcp.md).

Read and checked here, at the worker's start; `${VAR}` references stay as written
until the worker connects (`expand`), so a secret never sits in a setting, a log
line or a workflow history.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from turnkeeper.models import EffectClass

# A server's name starts each of its tools' names (`<server>__<tool>`), which must
# be valid function names for the model.
SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,60}")
DEFAULT_CONNECT_TIMEOUT = 30.0

_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_SERVER_KEYS = {"command", "args", "env", "cwd", "url", "headers", "type", "turnkeeper"}
# Keys other MCP clients write into the same entries; ignored here.
_FOREIGN_KEYS = {"disabled", "description", "timeout", "alwaysAllow", "autoApprove", "transportType"}
_TURNKEEPER_KEYS = {"effect", "approval", "tools", "connect_timeout"}
_TOOL_KEYS = {"effect", "approval", "enabled"}


class McpConfigError(ValueError):
    """The servers file cannot be used; the message names the file and the entry."""


@dataclass(frozen=True)
class ToolPolicy:
    """What the configuration says of a tool, over what its server's annotations say."""

    effect: EffectClass | None = None
    approval: bool | None = None
    enabled: bool = True


@dataclass(frozen=True)
class McpServerConfig:
    """One server entry: a command to start (stdio) or a URL (Streamable HTTP)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    defaults: ToolPolicy = ToolPolicy()
    tools: Mapping[str, ToolPolicy] = field(default_factory=dict)
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def policy(self, tool: str) -> ToolPolicy:
        """The tool's own entry over the server's defaults."""
        own = self.tools.get(tool, ToolPolicy())
        return ToolPolicy(
            effect=own.effect or self.defaults.effect,
            approval=own.approval if own.approval is not None else self.defaults.approval,
            enabled=own.enabled,
        )


def load(path: Path) -> list[McpServerConfig]:
    """The servers of the file at `path`, in its order."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise McpConfigError(f"{path}: cannot read it: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise McpConfigError(f"{path}: not valid JSON: {err}") from None
    try:
        return parse(data)
    except McpConfigError as err:
        raise McpConfigError(f"{path}: {err}") from None


def parse(data: Any) -> list[McpServerConfig]:
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise McpConfigError('expected {"mcpServers": {"<name>": {...}, ...}}')
    return [_server(name, entry) for name, entry in data["mcpServers"].items()]


def expand(value: str, env: Mapping[str, str] | None = None, *, where: str = "a value") -> str:
    """`value` with each `${VAR}` (or `${VAR:-default}`) replaced from `env`
    (the worker's environment); a variable that is unset and has no default is refused."""
    source = os.environ if env is None else env

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in source:
            return source[name]
        if default is not None:
            return default
        raise McpConfigError(f"{where} names ${{{name}}}, which is not set in the worker's environment")

    return _REFERENCE.sub(replace, value)


# --- checking one entry ---------------------------------------------------------------


def _server(name: Any, entry: Any) -> McpServerConfig:
    if not isinstance(name, str) or not SERVER_NAME.fullmatch(name) or "__" in name:
        raise McpConfigError(
            f"server name {name!r}: use 1-60 letters, digits, '_' or '-' without '__' "
            "(tools are named <server>__<tool>)"
        )
    where = f"server {name!r}"
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where}: expected an object")
    unknown = set(entry) - _SERVER_KEYS - _FOREIGN_KEYS
    if unknown:
        raise McpConfigError(f"{where}: unknown keys {sorted(unknown)}")
    kind = entry.get("type")
    if kind is not None and kind not in ("stdio", "http", "streamable-http", "streamableHttp"):
        raise McpConfigError(f"{where}: type {kind!r} is not served; use stdio or Streamable HTTP (url)")
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise McpConfigError(f"{where}: give either a command (stdio) or a url (Streamable HTTP)")
    if command is not None:
        if not _text(command):
            raise McpConfigError(f"{where}: command must be a non-empty string")
        if "headers" in entry:
            raise McpConfigError(f"{where}: headers go with a url, not a command")
    else:
        if not _text(url) or not url.startswith(("http://", "https://", "${")):
            raise McpConfigError(f"{where}: url must be an http:// or https:// address")
        for key in ("args", "env", "cwd"):
            if key in entry:
                raise McpConfigError(f"{where}: {key} go with a command, not a url")
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"{where}: args must be a list of strings")
    cwd = entry.get("cwd")
    if cwd is not None and not _text(cwd):
        raise McpConfigError(f"{where}: cwd must be a non-empty string")
    own = _own(where, entry.get("turnkeeper", {}))
    return McpServerConfig(
        name=name,
        command=command,
        args=tuple(args),
        env=_strings(where, "env", entry.get("env", {})),
        cwd=cwd,
        url=url,
        headers=_strings(where, "headers", entry.get("headers", {})),
        defaults=own["defaults"],
        tools=own["tools"],
        connect_timeout=own["connect_timeout"],
    )


def _own(where: str, own: Any) -> dict[str, Any]:
    """The `turnkeeper` key: server-wide `effect`/`approval`, per-tool entries, `connect_timeout`."""
    where = f"{where}: turnkeeper"
    if not isinstance(own, dict):
        raise McpConfigError(f"{where}: expected an object")
    unknown = set(own) - _TURNKEEPER_KEYS
    if unknown:
        raise McpConfigError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(_TURNKEEPER_KEYS)}")
    timeout = own.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise McpConfigError(f"{where}: connect_timeout must be a number of seconds above 0")
    tools = own.get("tools", {})
    if not isinstance(tools, dict):
        raise McpConfigError(f"{where}: tools must be an object of tool names")
    return {
        "defaults": _policy(where, {k: v for k, v in own.items() if k in ("effect", "approval")}),
        "tools": {
            tool: _policy(f"{where}: tool {tool!r}", entry, per_tool=True) for tool, entry in tools.items()
        },
        "connect_timeout": float(timeout),
    }


def _policy(where: str, entry: Any, per_tool: bool = False) -> ToolPolicy:
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where}: expected an object")
    allowed = _TOOL_KEYS if per_tool else _TOOL_KEYS - {"enabled"}
    unknown = set(entry) - allowed
    if unknown:
        raise McpConfigError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(allowed)}")
    effect = entry.get("effect")
    if effect is not None and effect not in {e.value for e in EffectClass}:
        raise McpConfigError(f"{where}: effect must be read, idempotent or write, got {effect!r}")
    for key in ("approval", "enabled"):
        if key in entry and not isinstance(entry[key], bool):
            raise McpConfigError(f"{where}: {key} must be true or false")
    return ToolPolicy(
        effect=EffectClass(effect) if effect is not None else None,
        approval=entry.get("approval"),
        enabled=entry.get("enabled", True),
    )


def _strings(where: str, key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise McpConfigError(f"{where}: {key} must be an object of strings")
    return dict(value)


def _text(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value.strip())
