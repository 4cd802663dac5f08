"""Configuration from the environment (worker and CLI only, never workflow code).

`Settings` is the one model of it: each field names its variable, how its value is
read and its default, and the docstring under it is its meaning in
docs/configuration.md (`python -m turnkeeper.config` writes that table;
tests/unit/test_docs.py fails while the two differ). Standard library only: every
CLI command reads it, and `turnkeeper status` answers within 0.2 s, of which
importing pydantic-settings alone would take most."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from turnkeeper.config_values import (
    _PORT,
    BUILD_ID,
    DEPLOYMENT_NAME,
    EncryptionKey,
    SubagentProfile,
    _address,
    _context_tokens,
    _http_address,
    _keys,
    _matching,
    _names,
    _one_of,
    _origins,
    _pollers,
    _profiles,
    _switch,
    _whole,
)

DEFAULT_TOOLS = ("read_file", "write_file", "list_dir")

# Temporal refuses a payload over 2 MB: one message, and a chat's pending ones
# together, must stay well under it (JSON escaping can add to a message's size).
MAX_MESSAGE_BYTES_CEILING = 1024 * 1024
MAX_PENDING_BYTES_CEILING = 1536 * 1024
# `auto`: exec commands run in bubblewrap's sandbox, and a worker with exec enabled
# refuses to start without it; `off`: as the worker's user, only the directory set.
EXEC_SANDBOX_MODES = ("auto", "off")
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


class ConfigError(ValueError):
    """A configuration variable holds a value we cannot use."""


def import_from_working_directory() -> None:
    """Let the worker and the CLI import modules from the current directory
    (`TURNKEEPER_TOOL_MODULES=mytools` beside `mytools.py`), as `python -m` does.
    Last on the path, so a file there never shadows an installed package."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)


def _var(
    name: str, default: Any, parse: Callable[[str], Any] = str, shown: str | None = None, secret: bool = False
) -> Any:
    """The field read from variable `name` by `parse`. Its row in docs/configuration.md
    shows `shown`, or else the default; a secret is never shown (repr, errors)."""
    return field(default=default, repr=not secret, metadata={"env": name, "parse": parse, "shown": shown})


@dataclass(frozen=True)
class Settings:
    """`Settings(...)` holds what it is given and the defaults; `Settings.from_env()`
    reads the environment. The string under a field is its meaning in docs/configuration.md."""

    temporal_address: str | None = _var(
        "TEMPORAL_ADDRESS",
        None,
        shown="unset: the address of the `temporal.toml` profile in use (as for the `temporal` CLI), "
        "else the embedded dev server, which the worker starts or reuses on its port",
    )
    """Temporal frontend (`host:port`), for every process"""
    namespace: str = _var("TEMPORAL_NAMESPACE", "default")
    """Temporal namespace"""
    # Read with the standard library: importing the SDK alone takes longer than the whole command should.
    temporal_http_address: str | None = _var(
        "TURNKEEPER_TEMPORAL_HTTP_ADDRESS",
        None,
        _http_address,
        shown="the embedded server's; with `TEMPORAL_ADDRESS`, none (`status` and `list` then use gRPC)",
    )
    """Temporal's HTTP API, which `turnkeeper status` and `list` read instead of loading the
    SDK: `host:port`, or `https://host[:port]` (Temporal Cloud: `https://<namespace>.<account>.tmprl.cloud`,
    with `TEMPORAL_API_KEY`, or with `TEMPORAL_TLS_CLIENT_CERT_PATH` and `TEMPORAL_TLS_CLIENT_KEY_PATH`
    for mTLS; `TEMPORAL_TLS_SERVER_CA_CERT_PATH` for a private CA). CLI only"""
    task_queue: str = _var("TURNKEEPER_TASK_QUEUE", "turnkeeper")
    """task queue, the same for every worker and client"""
    data_dir: Path = _var("TURNKEEPER_DATA_DIR", Path(".turnkeeper"), Path, "`./.turnkeeper`")
    """local state: the SQLite store, the dev server's database and log"""
    database_url: str | None = _var("TURNKEEPER_DATABASE_URL", None, shown="`sessions.db` in the data dir")
    """session store: `sqlite:///path/to/sessions.db`, or `postgresql://user:password@host:5432/db`
    (also `postgres://`, with asyncpg parameters such as `?sslmode=require`) shared by all
    workers and the CLI; the schema is created or migrated at start; errors and logs show only
    scheme, host and database"""
    model: str = _var("TURNKEEPER_MODEL", "demo")
    """`demo` (offline), `scripted:<file.json>` (below), `openai:<model>`"""
    openai_base_url: str | None = _var("OPENAI_BASE_URL", None, shown="OpenAI")
    """any OpenAI-compatible server (vLLM, Ollama, llama.cpp); read by the model activity only,
    never written to a history"""
    openai_api_key: str | None = _var("OPENAI_API_KEY", None, secret=True)
    """the provider's key, likewise"""
    tools: tuple[str, ...] = _var(
        "TURNKEEPER_TOOLS", DEFAULT_TOOLS, _names, "`read_file,write_file,list_dir` (`exec` only when listed)"
    )
    """enabled tools"""
    tool_modules: tuple[str, ...] = _var("TURNKEEPER_TOOL_MODULES", (), _names)
    """modules whose `@tool` functions are registered ([tools.md](tools.md))"""
    confirm_tools: tuple[str, ...] = _var("TURNKEEPER_CONFIRM_TOOLS", (), _names)
    """tools whose calls wait for the user's approval, besides those registered `confirm=True`
    ([tools.md](tools.md))"""
    mcp_servers: Path | None = _var("TURNKEEPER_MCP_SERVERS", None, Path, "unset: none")
    """a JSON file of MCP servers (`{"mcpServers": {...}}`, the shape MCP clients share): the worker
    serves their tools beside the built-in ones, as `<server>__<tool>` ([mcp.md](mcp.md))"""
    subagent_max_depth: int = _var("TURNKEEPER_SUBAGENT_MAX_DEPTH", 2, _whole(1))
    """how deep subagents nest, with `delegate` in `TURNKEEPER_TOOLS`: `1` lets a chat's turn
    delegate and its subagents not ([tools.md](tools.md), "Delegating to subagents")"""
    subagent_max_fanout: int = _var("TURNKEEPER_SUBAGENT_MAX_FANOUT", 4, _whole(1))
    """`delegate` calls one model reply may start; the others are refused in words"""
    subagent_profiles: tuple[SubagentProfile, ...] = _var(
        "TURNKEEPER_SUBAGENT_PROFILES", (), _profiles, "unset: none (a subagent sees the worker's tools)"
    )
    """kinds of subagent a `delegate` call may name, as JSON: `{"<name>": {"instructions": "...",
    "tools": ["read_file", ...], "model": "..."}}`; the instructions come first in the subagent's
    calls, and it may use only the listed tools the worker enables; `model` is accepted and not yet
    used (a worker has one model provider)"""
    context_tokens: int = _var("TURNKEEPER_CONTEXT_TOKENS", 0, _context_tokens)
    """tokens of context a model call sends at most, at least 512 ([architecture.md](architecture.md),
    "Long chats"); `0`: the model's window less 4,096 for its answer"""
    workspace: Path = _var("TURNKEEPER_WORKSPACE", Path("workspace"), Path, "`./workspace`")
    """the only directory the file and exec tools may touch"""
    exec_sandbox: str = _var("TURNKEEPER_EXEC_SANDBOX", "auto", _one_of(*EXEC_SANDBOX_MODES))
    """how `exec` runs commands: `auto`, in a bubblewrap sandbox (a worker with `exec` enabled
    refuses to start without a working `bwrap`); `off`, as the worker's user with only the
    working directory set ([tools.md](tools.md))"""
    exec_timeout: int = _var("TURNKEEPER_EXEC_TIMEOUT", 60, _whole(1))
    """seconds an `exec` command may run"""
    tool_timeout: int = _var("TURNKEEPER_TOOL_TIMEOUT", 600, _whole(1))
    """seconds a tool call may run (set on each step by the worker)"""
    model_timeout: int = _var("TURNKEEPER_MODEL_TIMEOUT", 300, _whole(1))
    """seconds a model call may run (set on each step by the worker)"""
    heartbeat_timeout: int = _var("TURNKEEPER_HEARTBEAT_TIMEOUT", 2, _whole(1))
    """seconds without a heartbeat before a model or tool call counts as lost; beats go every
    third of it ([recovery.md](recovery.md), "A dead worker is noticed in seconds")"""
    resume_window: int = _var("TURNKEEPER_RESUME_WINDOW", 60, _whole(1))
    """seconds a step may wait for a worker before the turn asks its user"""
    shutdown_grace: int = _var("TURNKEEPER_SHUTDOWN_GRACE", 30, _whole(0))
    """seconds running tools get to finish on SIGTERM"""
    reconcile_every: int = _var("TURNKEEPER_RECONCILE_EVERY", 60, _whole(1))
    """seconds between reconcile passes (schedule `turnkeeper-reconcile`)"""
    max_message_bytes: int = _var(
        "TURNKEEPER_MAX_MESSAGE_BYTES", 64 * 1024, _whole(1, MAX_MESSAGE_BYTES_CEILING)
    )
    """largest accepted user message, at most 1 MiB"""
    # Well under Temporal's 2 MB payload limit, so no batch of them can make a task fail for its size.
    max_pending_bytes: int = _var(
        "TURNKEEPER_MAX_PENDING_BYTES", 1024 * 1024, _whole(1024, MAX_PENDING_BYTES_CEILING)
    )
    """a chat's messages not yet committed, together (as JSON, at most 1.5 MiB); a message over
    it is refused"""
    max_tool_output_bytes: int = _var("TURNKEEPER_MAX_TOOL_OUTPUT_BYTES", 16 * 1024, _whole(256))
    """tool output cap; a note says what was cut"""
    max_cached_workflows: int = _var("TURNKEEPER_MAX_CACHED_WORKFLOWS", 200, _whole(1))
    """turns a worker keeps cached; turns waiting for their user beyond it are evicted and cost
    the worker no memory"""
    stream: bool = _var("TURNKEEPER_STREAM", True, _switch)
    """model calls stream their text (`on`/`off`): the page and `turnkeeper send` show the answer
    growing, from the store's draft row ([web.md](web.md))"""
    # Off by default: the sandbox re-imports the workflow module for every run and wraps
    # every payload, adding about a third to the worker's CPU per turn.
    workflow_sandbox: bool = _var("TURNKEEPER_WORKFLOW_SANDBOX", False, _switch)
    """run workflow code in Temporal's sandbox (`on`/`off`), on the SDK's threads with its
    deadlock detection; off, activations run on the worker's event loop
    ([performance.md](performance.md)); the tests' in-process workers run with it on"""
    # None: worker.main.poller_behaviors; a number: at most that many polls per task type.
    max_pollers: int | None = _var("TURNKEEPER_POLLERS", None, _pollers, "`auto`")
    """`auto`: 50 workflow-task polls waiting (40 on the worker's sticky queue), activity polls
    scaled on the server's hints (Temporal Server 1.28 or later); a number (at least 2): a fixed
    maximum for both"""
    event_loop: str = _var("TURNKEEPER_EVENT_LOOP", "auto", _one_of(*EVENT_LOOPS))
    """the worker's event loop: `auto` (uvloop where installed), `uvloop`, `asyncio`"""
    log_level: str = _var("TURNKEEPER_LOG_LEVEL", "info", _one_of(*LOG_LEVELS, warn="warning"))
    """the log level of the worker and of `turnkeeper web`"""
    deployment_name: str | None = _var(
        "TURNKEEPER_DEPLOYMENT_NAME",
        None,
        _matching(DEPLOYMENT_NAME, "1-255 characters without `.` or spaces"),
        "unset: unversioned",
    )
    """with `TURNKEEPER_BUILD_ID`: the worker is that Worker Deployment Version and its runs are
    pinned to it; 1–255 characters, no `.` or spaces; one without the other stops the worker
    ([operations.md](operations.md), "Shipping a change to workflow code")"""
    build_id: str | None = _var(
        "TURNKEEPER_BUILD_ID", None, _matching(BUILD_ID, "1-255 characters without spaces")
    )
    """the build id of that version, 1–255 characters without spaces"""
    dev_server_port: int = _var("TURNKEEPER_DEV_SERVER_PORT", 7233, _PORT)
    """the embedded dev server's gRPC port (only without `TEMPORAL_ADDRESS`)"""
    dev_ui_port: int = _var("TURNKEEPER_DEV_UI_PORT", 8233, _PORT)
    """its Web UI's port"""
    dev_http_port: int = _var("TURNKEEPER_DEV_HTTP_PORT", 7243, _PORT)
    """its HTTP API's port"""
    web_address: str = _var("TURNKEEPER_WEB_ADDRESS", "127.0.0.1:8000", _address)
    """where `turnkeeper web` listens (`host:port` or `[ipv6]:port`)"""
    web_token: str | None = _var("TURNKEEPER_WEB_TOKEN", None, secret=True)
    """the token every `/api` call of `turnkeeper web` needs; without one it listens on loopback
    only ([web.md](web.md))"""
    web_worker: bool = _var("TURNKEEPER_WEB_WORKER", False, _switch, "`0`")
    """`1`: `turnkeeper web` also runs a worker on its own client and starts new turns with eager
    workflow start"""
    metrics_address: str | None = _var("TURNKEEPER_METRICS_ADDRESS", None, _address, "unset: off")
    """Prometheus text at `/metrics` on the worker (`host:port`; [operations.md](operations.md),
    "Metrics")"""
    otlp_endpoint: str | None = _var("OTEL_EXPORTER_OTLP_ENDPOINT", None, shown="unset: off")
    """OpenTelemetry traces over OTLP/HTTP from the worker, the CLI and `turnkeeper web`; needs
    `pip install 'turnkeeper[otel]'` ([operations.md](operations.md), "Traces")"""
    encryption_keys: tuple[EncryptionKey, ...] = _var(
        "TURNKEEPER_ENCRYPTION_KEYS", (), _keys, "unset: plaintext", secret=True
    )
    """`keyid:base64-32-byte-key[,…]`: every payload is encrypted with AES-256-GCM under the
    first key; all listed keys decrypt ([operations.md](operations.md), "Encryption")"""
    codec_address: str = _var("TURNKEEPER_CODEC_ADDRESS", "127.0.0.1:8081", _address)
    """where `turnkeeper codec-server` listens; the embedded dev server's UI is pointed at it when
    keys are set"""
    codec_token: str | None = _var("TURNKEEPER_CODEC_TOKEN", None, secret=True)
    """the bearer token every codec call but a CORS preflight needs; without one the codec server
    serves only requests addressed to `127.0.0.1` or `localhost`"""
    # Empty: the embedded dev server's UI (payloads.codec_server.default_origins).
    codec_origins: tuple[str, ...] = _var(
        "TURNKEEPER_CODEC_CORS_ORIGIN",
        (),
        _origins,
        "`http://localhost:8233,http://127.0.0.1:8233` (the port follows `TURNKEEPER_DEV_UI_PORT`)",
    )
    """the origins (comma-separated, `scheme://host[:port]`, no wildcard) whose pages may call the
    codec server"""

    def __post_init__(self) -> None:
        for name in ("data_dir", "workspace"):
            object.__setattr__(self, name, Path(getattr(self, name)).expanduser().absolute())

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings from os.environ, or from `env` as if it were the environment. An empty
        variable is an unset one, as in the shell; but `TURNKEEPER_TOOLS=` enables no tool."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        problems: list[str] = []
        for f in fields(cls):
            name = f.metadata["env"]
            raw = (env.get(name) or "").strip()
            if raw or (name == "TURNKEEPER_TOOLS" and name in env):
                try:
                    values[f.name] = f.metadata["parse"](raw)
                except ValueError as err:
                    problems.append(_in_words(name, raw, str(err), shown=f.repr))
        if problems:
            raise ConfigError("; ".join(problems))
        if "temporal_address" not in values:
            # As the `temporal` CLI does: a profile of temporal.toml names the server.
            from turnkeeper.temporal_profile import ProfileError, temporal_profile

            try:
                profile = temporal_profile(env)
            except ProfileError as err:
                raise ConfigError(str(err)) from None
            if profile.get("address"):
                values["temporal_address"] = str(profile["address"])
                if "namespace" not in values and profile.get("namespace"):
                    values["namespace"] = str(profile["namespace"])
        return cls(**values)

    def worker_deployment(self) -> tuple[str, str] | None:
        """(deployment name, build id) of a versioned worker; None: unversioned.
        One without the other is refused when the worker starts."""
        if self.deployment_name is None and self.build_id is None:
            return None
        if self.deployment_name is None or self.build_id is None:
            given, missing = (
                ("TURNKEEPER_DEPLOYMENT_NAME", "TURNKEEPER_BUILD_ID")
                if self.build_id is None
                else ("TURNKEEPER_BUILD_ID", "TURNKEEPER_DEPLOYMENT_NAME")
            )
            raise ConfigError(
                f"{given} is set but {missing} is not: a versioned worker needs both "
                "(both unset: unversioned)"
            )
        return self.deployment_name, self.build_id

    def provider_env(self) -> dict[str, str]:
        """What model providers read, passed explicitly rather than via os.environ."""
        env = {"OPENAI_BASE_URL": self.openai_base_url, "OPENAI_API_KEY": self.openai_api_key}
        return {k: v for k, v in env.items() if v}

    @property
    def http_api_address(self) -> str | None:
        """Where Temporal's HTTP API answers, if we know: the configured address,
        else the embedded dev server's when TEMPORAL_ADDRESS is unset."""
        if self.temporal_http_address:
            return self.temporal_http_address
        return None if self.temporal_address else f"127.0.0.1:{self.dev_http_port}"

    def subagent_profile(self, name: str) -> SubagentProfile | None:
        return next((p for p in self.subagent_profiles if p.name == name), None)

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "sessions.db"


ENV_VARS: tuple[str, ...] = tuple(f.metadata["env"] for f in fields(Settings))
"""Every variable `Settings.from_env` reads."""

DEV_SERVER_ENV_VARS: tuple[str, ...] = (
    "TURNKEEPER_DEV_SERVER_PORT",
    "TURNKEEPER_DEV_UI_PORT",
    "TURNKEEPER_DEV_HTTP_PORT",
    "TURNKEEPER_CODEC_ADDRESS",
)
"""Only used by the worker when TEMPORAL_ADDRESS is unset (the embedded dev server and
its UI's codec endpoint); `turnkeeper codec-server` also listens on TURNKEEPER_CODEC_ADDRESS."""

CLI_ONLY_ENV_VARS: tuple[str, ...] = (
    "TURNKEEPER_TEMPORAL_HTTP_ADDRESS",
    "TURNKEEPER_WEB_ADDRESS",
    "TURNKEEPER_WEB_TOKEN",
    "TURNKEEPER_WEB_WORKER",
    "TURNKEEPER_CODEC_TOKEN",
    "TURNKEEPER_CODEC_CORS_ORIGIN",
)
"""Read by the CLI's commands (`web` and `codec-server` among them), never by a worker."""

TEMPORAL_CONNECTION_ENV_VARS: tuple[str, ...] = (
    "TEMPORAL_PROFILE",
    "TEMPORAL_CONFIG_FILE",
    "TEMPORAL_API_KEY",
    "TEMPORAL_TLS",
    "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "TEMPORAL_TLS_CLIENT_CERT_DATA",
    "TEMPORAL_TLS_CLIENT_KEY_PATH",
    "TEMPORAL_TLS_CLIENT_KEY_DATA",
    "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
    "TEMPORAL_TLS_SERVER_CA_CERT_DATA",
    "TEMPORAL_TLS_SERVER_NAME",
    "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION",
)
"""Read by `temporalio.envconfig` when TEMPORAL_ADDRESS is set (Temporal Cloud, TLS), not by `Settings`."""


def _in_words(name: str, raw: str, problem: str, shown: bool) -> str:
    """`NAME must be ..., got 'value'`: what is wrong and what is accepted, in one line."""
    if not problem.startswith("must"):
        return f"{name}: {problem}"  # the parser named the part (an entry, a key id) itself
    return f"{name} {problem}, got {raw!r}" if shown else f"{name} {problem}"
