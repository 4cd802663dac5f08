"""Tools served by MCP servers (TURNKEEPER_MCP_SERVERS), beside the built-in ones.

The worker connects to each configured server when it starts and registers its
tools as `<server>__<tool>` in a registry of its own; a call of one is then an
ordinary tool activity (activities/tool_call.py): its start is written to the
store before the request is sent, it is never retried, it heartbeats, and a
worker killed mid-call leaves the `tool_state_unknown` gate like any tool's.
A server that goes away is connected again at its next call. docs/mcp.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Final, cast

import anyio
import jsonschema
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError

from turnkeeper.mcp_config import McpServerConfig, expand
from turnkeeper.models import EffectClass

from .mcp_results import render
from .registry import ToolRegistry
from .schema import ToolContext, external_tool

log = logging.getLogger("turnkeeper.mcp")

# The call's idempotency key ("<chat_id>/<turn>/<tool_call_id>") in the request's
# `_meta`, for a server that can recognise a duplicate on its side.
IDEMPOTENCY_KEY_META: Final = "turnkeeper/idempotencyKey"
# How the worker names itself to a server.
CLIENT_INFO = types.Implementation(name="turnkeeper", version=metadata.version("turnkeeper"))
# A stdio server gets its stdin closed, then 2 s, then SIGTERM and 2 s more (the SDK's steps).
CLOSE_TIMEOUT = 10.0
_LIST_PAGES = 100  # a server whose listing never ends cannot hang the start
_ARGUMENT_ERRORS = 5


@dataclass(frozen=True)
class McpTools:
    """The worker's MCP servers, and its registry: the built-ins and their tools."""

    servers: tuple[McpServer, ...]
    registry: ToolRegistry
    names: tuple[str, ...]

    @classmethod
    async def start(cls, configs: Sequence[McpServerConfig], builtins: ToolRegistry) -> McpTools:
        """Connect to every server at once; one that fails is logged and left out."""
        registry = builtins.copy()
        servers = tuple(McpServer(c) for c in configs)
        listed = await asyncio.gather(*(s.connect() for s in servers), return_exceptions=True)
        names: list[str] = []
        for server, tools in zip(servers, listed, strict=True):
            if isinstance(tools, BaseException):
                if not isinstance(tools, Exception):
                    raise tools
                log.error(
                    "MCP server %r (%s) did not start; its tools are not served: %s",
                    server.name,
                    server.config.transport,
                    reason(tools),
                )
                continue
            served = register(server, tools, registry)
            names.extend(served)
            log.info("MCP server %r: %d tools served: %s", server.name, len(served), ", ".join(served))
        return cls(servers, registry, tuple(names))

    async def aclose(self) -> None:
        await asyncio.gather(*(s.aclose() for s in self.servers))


def register(server: McpServer, tools: Sequence[types.Tool], registry: ToolRegistry) -> list[str]:
    """Add the server's tools to `registry`; each one that cannot be served is refused in words."""
    served: list[str] = []
    for tool in tools:
        policy = server.config.policy(tool.name)
        if not policy.enabled:
            continue
        name = f"{server.name}__{tool.name}"
        hints = tool.annotations
        try:
            registry.add(
                external_tool(
                    McpTool(server, tool),
                    name=name,
                    description=tool.description or tool.title or "",
                    parameters=_parameters(tool.input_schema),
                    effect=policy.effect or effect_of(hints),
                    confirm=policy.approval if policy.approval is not None else asks_first(hints),
                )
            )
        except (ValueError, jsonschema.SchemaError) as err:
            log.warning("MCP server %r: tool %r is not served: %s", server.name, tool.name, _first_line(err))
            continue
        served.append(name)
    unknown = sorted(set(server.config.tools) - {t.name for t in tools})
    if unknown:
        log.warning("MCP server %r has no tools %s, which its configuration names", server.name, unknown)
    return served


def effect_of(hints: types.ToolAnnotations | None) -> EffectClass:
    """`readOnlyHint` -> read, `idempotentHint` -> idempotent, anything else -> write."""
    if hints is not None and hints.read_only_hint:
        return EffectClass.READ
    if hints is not None and hints.idempotent_hint:
        return EffectClass.IDEMPOTENT
    return EffectClass.WRITE


def asks_first(hints: types.ToolAnnotations | None) -> bool:
    """A tool that says it is destructive waits for the user's approval."""
    return hints is not None and not hints.read_only_hint and hints.destructive_hint is True


class McpTool:
    """One tool of one server, as the registry calls it."""

    def __init__(self, server: McpServer, tool: types.Tool) -> None:
        self._server = server
        self._name = tool.name
        schema = tool.input_schema
        kind = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        kind.check_schema(schema)  # SchemaError: the tool is refused at start, not at its first call
        self._validator = kind(schema)

    def check(self, arguments: dict[str, Any]) -> str | None:
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(map(str, e.absolute_path)))
        if not errors:
            return None
        shown = [
            f"{'.'.join(map(str, e.absolute_path))}: {e.message}" if e.absolute_path else e.message
            for e in errors[:_ARGUMENT_ERRORS]
        ]
        more = len(errors) - len(shown)
        return "; ".join(shown) + (f" (and {more} more)" if more else "")

    async def __call__(self, arguments: dict[str, Any], ctx: ToolContext) -> tuple[bool, str]:
        return await self._server.call(self._name, arguments, ctx)


class McpServer:
    """One configured server: a live connection, opened again after it went away."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self._live: _Connection | None = None
        self._lock = asyncio.Lock()

    @property
    def name(self) -> str:
        return self.config.name

    async def connect(self) -> list[types.Tool]:
        """Open a connection (closing a dead one) and list the server's tools."""
        if self._live is not None:
            await self._live.close()
            self._live = None
        live = _Connection(self.config)
        try:
            tools = await live.opened()
        except BaseException:
            await live.close()
            raise
        self._live = live
        return tools

    async def call(self, tool: str, arguments: dict[str, Any], ctx: ToolContext) -> tuple[bool, str]:
        """(whether the call failed, what the model reads). Cancelling it sends the
        server the protocol's cancel notification (the SDK does, for a request it sent)."""
        try:
            client = await self._client()
        except Exception as err:
            return (
                True,
                f"Error: MCP server {self.name!r} is not available ({reason(err)}); the call was not sent.",
            )
        try:
            result = await client.call_tool(
                tool,
                arguments,
                progress_callback=_progress_beats(ctx),
                # An open map (`extra_items`), which mypy does not read yet: as the SDK, a cast.
                meta=cast(types.RequestParamsMeta, {IDEMPOTENCY_KEY_META: ctx.idempotency_key}),
            )
        except MCPError as err:
            if err.code == types.CONNECTION_CLOSED:
                return True, (
                    f"Error: MCP server {self.name!r} went away during the call; the tool may have acted. "
                    "Check its effect before calling it again."
                )
            return True, f"Error: MCP server {self.name!r} refused the call: {err.message} (code {err.code})"
        return result.is_error, render(result)

    async def _client(self) -> Client:
        async with self._lock:
            if self._live is None or self._live.ended.is_set():
                await self.connect()
                log.info("MCP server %r connected again", self.name)
            assert self._live is not None
            return self._live.client

    async def aclose(self) -> None:
        if self._live is not None:
            await self._live.close()


class _Connection:
    """One session, held open by a task of its own (the SDK's transports are entered
    and left in one task) until the server's side ends or `close` is called."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.ended = asyncio.Event()
        self._closing = False
        self._ready: asyncio.Future[tuple[Client, list[types.Tool]]] = (
            asyncio.get_running_loop().create_future()
        )
        self._ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # read by `opened`
        self._task = asyncio.create_task(self._hold(), name=f"MCP server {config.name}")

    @property
    def client(self) -> Client:
        return self._ready.result()[0]

    async def opened(self) -> list[types.Tool]:
        return (await asyncio.shield(self._ready))[1]

    async def close(self) -> None:
        if not self.ended.is_set():  # else the server went first, and `_hold` says so
            self._closing = True
            self.ended.set()
        _, pending = await asyncio.wait({self._task}, timeout=CLOSE_TIMEOUT)
        for task in pending:
            task.cancel()

    async def _hold(self) -> None:
        timeout = self.config.connect_timeout
        why = ""
        try:
            # The deadline covers the handshake and the listing, then is lifted.
            with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
                async with Client(
                    _transport(self.config, self.ended), cache=None, client_info=CLIENT_INFO
                ) as client:
                    tools = await _list_tools(client)
                    scope.deadline = math.inf
                    self._ready.set_result((client, tools))
                    await self.ended.wait()
            if scope.cancelled_caught and not self._ready.done():
                raise TimeoutError(f"no answer to the handshake and the tool listing within {timeout:g} s")
        except Exception as err:
            if not self._ready.done():
                self._ready.set_exception(err)  # the one who opened it reports it
                return
            why = f" ({reason(err)})"
        finally:
            self.ended.set()
            if not self._ready.done():
                self._ready.set_exception(ConnectionError("closed before it was open"))
        if not self._closing:
            log.warning(
                "MCP server %r went away%s; it is connected again at its next call", self.config.name, why
            )


@contextlib.asynccontextmanager
async def _transport(config: McpServerConfig, ended: asyncio.Event) -> AsyncIterator[Any]:
    """The server's streams; `ended` is set once its side ends (a stdio server that
    exits, an HTTP connection that breaks), so the next call connects again instead
    of sending into a closed connection."""
    async with contextlib.AsyncExitStack() as stack:
        if config.command is not None:
            read, write = await stack.enter_async_context(stdio_client(_stdio_parameters(config)))
        else:
            url = expand(config.url or "", where=f"MCP server {config.name!r}: url")
            headers = {
                k: expand(v, where=f"MCP server {config.name!r}: header {k}")
                for k, v in config.headers.items()
            }
            http = await stack.enter_async_context(create_mcp_http_client(headers=headers))
            read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
        relay_in, relay_out = anyio.create_memory_object_stream[Any](0)

        async def relay() -> None:
            try:
                async with relay_in:
                    async for item in read:
                        await relay_in.send(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            finally:
                ended.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            try:
                yield relay_out, write
            finally:
                tg.cancel_scope.cancel()


def _stdio_parameters(config: McpServerConfig) -> StdioServerParameters:
    where = f"MCP server {config.name!r}"
    return StdioServerParameters(
        command=expand(config.command or "", where=f"{where}: command"),
        args=[expand(a, where=f"{where}: args") for a in config.args],
        env={k: expand(v, where=f"{where}: env {k}") for k, v in config.env.items()} or None,
        cwd=expand(config.cwd, where=f"{where}: cwd") if config.cwd else None,
    )


async def _list_tools(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _progress_beats(ctx: ToolContext) -> ProgressFnT | None:
    """The server's progress notifications as heartbeat details. The SDK calls back
    from its reader's task, outside the activity's context: the beat runs in a copy of it."""
    beat = ctx.heartbeat
    if beat is None:
        return None
    activity_context = contextvars.copy_context()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        details: dict[str, Any] = {"progress": progress}
        if total is not None:
            details["total"] = total
        if message:
            details["message"] = message
        activity_context.run(beat, details)

    return on_progress


def reason(err: BaseException) -> str:
    """A failure to connect, in a line: the first of a group, the missing command."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    if isinstance(err, MCPError) and err.code == types.CONNECTION_CLOSED:
        return "the connection closed (a stdio server's own words are on the worker's stderr)"
    if isinstance(err, FileNotFoundError):
        return f"no such command or directory: {err.filename or err}"
    text = _first_line(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """The server's input schema as the model sees it: always an object with properties."""
    out = {k: v for k, v in schema.items() if k != "$schema"}
    out.setdefault("type", "object")
    out.setdefault("properties", {})
    return out


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""
