"""Configuration from the environment (worker and CLI only, never workflow code)."""

from __future__ import annotations

import base64
import binascii
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_TOOLS = ("read_file", "write_file", "list_dir")

ENV_VARS: tuple[str, ...] = (
    "TEMPORAL_ADDRESS",
    "TEMPORAL_NAMESPACE",
    "TURNKEEPER_TEMPORAL_HTTP_ADDRESS",
    "TURNKEEPER_TASK_QUEUE",
    "TURNKEEPER_DATA_DIR",
    "TURNKEEPER_DATABASE_URL",
    "TURNKEEPER_MODEL",
    "TURNKEEPER_TOOLS",
    "TURNKEEPER_TOOL_MODULES",
    "TURNKEEPER_CONFIRM_TOOLS",
    "TURNKEEPER_CONTEXT_TOKENS",
    "TURNKEEPER_WORKSPACE",
    "TURNKEEPER_RESUME_WINDOW",
    "TURNKEEPER_RECONCILE_EVERY",
    "TURNKEEPER_MAX_CACHED_WORKFLOWS",
    "TURNKEEPER_WORKFLOW_SANDBOX",
    "TURNKEEPER_STREAM",
    "TURNKEEPER_POLLERS",
    "TURNKEEPER_MAX_MESSAGE_BYTES",
    "TURNKEEPER_MAX_PENDING_BYTES",
    "TURNKEEPER_MAX_TOOL_OUTPUT_BYTES",
    "TURNKEEPER_TOOL_TIMEOUT",
    "TURNKEEPER_EXEC_TIMEOUT",
    "TURNKEEPER_EXEC_SANDBOX",
    "TURNKEEPER_MODEL_TIMEOUT",
    "TURNKEEPER_SHUTDOWN_GRACE",
    "TURNKEEPER_HEARTBEAT_TIMEOUT",
    "TURNKEEPER_DEV_SERVER_PORT",
    "TURNKEEPER_DEV_UI_PORT",
    "TURNKEEPER_DEV_HTTP_PORT",
    "TURNKEEPER_METRICS_ADDRESS",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "TURNKEEPER_ENCRYPTION_KEYS",
    "TURNKEEPER_CODEC_ADDRESS",
    "TURNKEEPER_DEPLOYMENT_NAME",
    "TURNKEEPER_BUILD_ID",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
)
"""Every variable `Settings.from_env` reads (a test keeps the two in step)."""

DEV_SERVER_ENV_VARS: tuple[str, ...] = (
    "TURNKEEPER_DEV_SERVER_PORT",
    "TURNKEEPER_DEV_UI_PORT",
    "TURNKEEPER_DEV_HTTP_PORT",
    "TURNKEEPER_CODEC_ADDRESS",
)
"""Only used by the worker when TEMPORAL_ADDRESS is unset (the embedded dev server and
its UI's codec endpoint); `turnkeeper codec-server` also listens on TURNKEEPER_CODEC_ADDRESS."""

CLI_ONLY_ENV_VARS: tuple[str, ...] = ("TURNKEEPER_TEMPORAL_HTTP_ADDRESS",)
"""Read by the CLI's commands, never by a worker."""

WORKER_ENV_VARS: tuple[str, ...] = ("TURNKEEPER_LOG_LEVEL", "TURNKEEPER_EVENT_LOOP")
"""Read by `worker.py` itself, outside `Settings` (before its event loop exists)."""

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
"""Read by `temporalio.envconfig` when TEMPORAL_ADDRESS is set (Temporal Cloud, TLS)."""


# Temporal refuses a payload over 2 MB: one message, and a chat's pending ones
# together, must stay well under it (JSON escaping can add to a message's size).
MAX_MESSAGE_BYTES_CEILING = 1024 * 1024
MAX_PENDING_BYTES_CEILING = 1536 * 1024


class ConfigError(ValueError):
    """A configuration variable holds a value we cannot use."""


def _int(env: dict[str, str], name: str, default: int, minimum: int = 0, maximum: int | None = None) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {value}")
    return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _bool(env: dict[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(f"{name} must be one of {', '.join(_TRUE + _FALSE)}, got {raw!r}")


# The SDK needs two workflow-task polls at least (one for the sticky queue).
MIN_FIXED_POLLERS = 2


def _pollers(env: dict[str, str], name: str) -> int | None:
    """None (`auto`, the default) or a fixed maximum of polls per task type."""
    raw = env.get(name, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if not raw.isdigit():
        raise ConfigError(f"{name} must be `auto` or a whole number, got {raw!r}")
    return _int(env, name, 0, minimum=MIN_FIXED_POLLERS)


def _address(env: dict[str, str], name: str) -> str | None:
    """None (unset) or `host:port` with a port number."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{name} must be host:port (e.g. 0.0.0.0:9464), got {raw!r}")
    return raw


def _choice(env: dict[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of `choices`; unset: the first."""
    raw = env.get(name, "").strip().lower() or choices[0]
    if raw not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


# `auto`: exec commands run in bubblewrap's sandbox, and a worker with exec enabled
# refuses to start without it; `off`: as the worker's user, only the directory set.
EXEC_SANDBOX_MODES = ("auto", "off")


EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def event_loop_choice(env: Mapping[str, str]) -> str:
    """TURNKEEPER_EVENT_LOOP: `auto` (uvloop where it is installed), `uvloop` or `asyncio`."""
    raw = env.get("TURNKEEPER_EVENT_LOOP", "").strip().lower() or "auto"
    if raw not in EVENT_LOOPS:
        raise ConfigError(f"TURNKEEPER_EVENT_LOOP must be one of {', '.join(EVENT_LOOPS)}, got {raw!r}")
    return raw


def import_from_working_directory() -> None:
    """Let the worker and the CLI import modules from the current directory
    (`TURNKEEPER_TOOL_MODULES=mytools` beside `mytools.py`), as `python -m` does.
    Last on the path, so a file there never shadows an installed package."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)


# Below this a summary, its instruction and a turn hardly fit: a value that small is a mistake.
MIN_CONTEXT_TOKENS = 512


def _context_tokens(value: int) -> int:
    if 0 < value < MIN_CONTEXT_TOKENS:
        raise ConfigError(
            f"TURNKEEPER_CONTEXT_TOKENS must be 0 (the model's window) or at least "
            f"{MIN_CONTEXT_TOKENS}, got {value}"
        )
    return value


@dataclass(frozen=True)
class EncryptionKey:
    key_id: str
    # repr=False: settings get logged; key material must never be.
    secret: bytes = field(repr=False)


KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
KEY_BYTES = 32  # AES-256
NEW_KEY_HINT = "make one with: openssl rand -base64 32"


def _keys(env: dict[str, str], name: str) -> tuple[EncryptionKey, ...]:
    """`keyid:base64key[,...]`; the first encrypts, all decrypt. Errors name the
    entry and its key id, never the key material."""
    raw = env.get(name, "").strip()
    if not raw:
        return ()
    keys: list[EncryptionKey] = []
    for n, entry in enumerate(raw.split(","), start=1):
        if not entry.strip():
            continue  # a trailing comma
        key_id, sep, encoded = (part.strip() for part in entry.strip().partition(":"))
        if not sep or not key_id or not encoded:
            raise ConfigError(f"{name}: entry {n} is not keyid:base64-key (entries are separated by commas)")
        if not KEY_ID.fullmatch(key_id):
            raise ConfigError(f"{name}: entry {n}: a key id is 1-64 characters of A-Z a-z 0-9 . _ -")
        try:
            # Standard or URL-safe alphabet, padding required.
            secret = base64.b64decode(encoded.replace("-", "+").replace("_", "/"), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{name}: key {key_id!r} is not valid base64; {NEW_KEY_HINT}") from None
        if len(secret) != KEY_BYTES:
            raise ConfigError(
                f"{name}: key {key_id!r} is {len(secret)} bytes; AES-256 needs {KEY_BYTES} ({NEW_KEY_HINT})"
            )
        if any(k.key_id == key_id for k in keys):
            raise ConfigError(f"{name}: key id {key_id!r} is listed twice")
        keys.append(EncryptionKey(key_id, secret))
    return tuple(keys)


# Temporal writes a deployment version as `<deployment name>.<build id>`.
DEPLOYMENT_NAME = re.compile(r"[^.\s]{1,255}")
BUILD_ID = re.compile(r"\S{1,255}")


def _matching(raw: str | None, name: str, pattern: re.Pattern[str], rule: str) -> str | None:
    """None (unset) or a value that matches `pattern` whole."""
    value = (raw or "").strip()
    if not value:
        return None
    if not pattern.fullmatch(value):
        raise ConfigError(f"{name} must be {rule}, got {value!r}")
    return value


def _list(env: dict[str, str], name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    raw = env.get(name)
    if raw is None:
        return default
    return tuple(x.strip() for x in raw.split(",") if x.strip())


@dataclass(frozen=True)
class Settings:
    temporal_address: str | None = None
    namespace: str = "default"
    task_queue: str = "turnkeeper"
    data_dir: Path = Path(".turnkeeper")
    database_url: str | None = None
    model: str = "demo"
    tools: tuple[str, ...] = DEFAULT_TOOLS
    tool_modules: tuple[str, ...] = ()
    # Tools whose calls wait for the user's approval, besides those registered `confirm=True`.
    confirm_tools: tuple[str, ...] = ()
    # Tokens of context a model call may send; 0: the model's window less the answer's room.
    context_tokens: int = 0
    workspace: Path = Path("workspace")
    resume_window: int = 60
    reconcile_every: int = 60
    max_message_bytes: int = 64 * 1024
    # A chat's messages not yet committed, together: well under Temporal's 2 MB
    # payload limit, so no batch of them can make a task fail for its size.
    max_pending_bytes: int = 1024 * 1024
    max_tool_output_bytes: int = 16 * 1024
    tool_timeout: int = 600
    exec_timeout: int = 60
    # One of EXEC_SANDBOX_MODES (activities/tools/sandbox.py).
    exec_sandbox: str = "auto"
    model_timeout: int = 300
    shutdown_grace: int = 30
    heartbeat_timeout: int = 2
    # Turns kept in the worker's workflow cache. A turn waiting for its user is
    # evicted when newer ones need the room, and costs the worker nothing then.
    max_cached_workflows: int = 200
    # Off by default: the sandbox re-imports the workflow module for every run and
    # wraps every payload, adding about a third to the worker's CPU per turn. The test
    # suite turns it on, so a non-deterministic call in workflow code still fails CI.
    workflow_sandbox: bool = False
    # Model calls stream their text to the store's draft row as it comes, for the
    # page and `send`; off: one answer per call, as before streaming.
    stream: bool = True
    # None: 50 workflow-task polls, activity polls scaled on the server's hints
    # (worker.poller_behaviors); a number: at most that many polls per task type,
    # as workers for a server before 1.28 need.
    max_pollers: int | None = None
    dev_server_port: int = 7233
    dev_ui_port: int = 8233
    # Temporal's HTTP API (the frontend's `httpPort`): `turnkeeper status` asks it
    # with the standard library instead of importing the SDK, which alone takes
    # longer than the whole command should. Unset with TEMPORAL_ADDRESS: gRPC.
    temporal_http_address: str | None = None
    dev_http_port: int = 7243
    # host:port where the worker serves Prometheus text at /metrics; None: off.
    metrics_address: str | None = None
    # OTLP/HTTP collector for traces; None: off.
    otlp_endpoint: str | None = None
    # Empty: payloads in plain text. The first key encrypts, every key decrypts.
    encryption_keys: tuple[EncryptionKey, ...] = field(default=(), repr=False)
    # `turnkeeper codec-server`, and the embedded dev server's UI's codec endpoint.
    codec_address: str = "127.0.0.1:8081"
    # Worker Deployment Versioning (`worker_deployment`): both set, the worker is the
    # version `<deployment_name>.<build_id>` and `ChatTurn` runs are pinned to it;
    # both unset, the worker is unversioned.
    deployment_name: str | None = None
    build_id: str | None = None
    openai_base_url: str | None = None
    # repr=False: settings get logged; the key must never be.
    openai_api_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        data_dir = Path(env.get("TURNKEEPER_DATA_DIR") or ".turnkeeper").expanduser()
        workspace = Path(env.get("TURNKEEPER_WORKSPACE") or "workspace").expanduser()
        return cls(
            temporal_address=env.get("TEMPORAL_ADDRESS") or None,
            namespace=env.get("TEMPORAL_NAMESPACE") or "default",
            task_queue=env.get("TURNKEEPER_TASK_QUEUE") or "turnkeeper",
            data_dir=data_dir.absolute(),
            database_url=env.get("TURNKEEPER_DATABASE_URL") or None,
            model=env.get("TURNKEEPER_MODEL") or "demo",
            tools=_list(env, "TURNKEEPER_TOOLS", DEFAULT_TOOLS),
            tool_modules=_list(env, "TURNKEEPER_TOOL_MODULES", ()),
            confirm_tools=_list(env, "TURNKEEPER_CONFIRM_TOOLS", ()),
            context_tokens=_context_tokens(_int(env, "TURNKEEPER_CONTEXT_TOKENS", 0, minimum=0)),
            workspace=workspace.absolute(),
            resume_window=_int(env, "TURNKEEPER_RESUME_WINDOW", 60, minimum=1),
            reconcile_every=_int(env, "TURNKEEPER_RECONCILE_EVERY", 60, minimum=1),
            max_message_bytes=_int(
                env, "TURNKEEPER_MAX_MESSAGE_BYTES", 64 * 1024, minimum=1, maximum=MAX_MESSAGE_BYTES_CEILING
            ),
            max_pending_bytes=_int(
                env,
                "TURNKEEPER_MAX_PENDING_BYTES",
                1024 * 1024,
                minimum=1024,
                maximum=MAX_PENDING_BYTES_CEILING,
            ),
            max_tool_output_bytes=_int(env, "TURNKEEPER_MAX_TOOL_OUTPUT_BYTES", 16 * 1024, minimum=256),
            tool_timeout=_int(env, "TURNKEEPER_TOOL_TIMEOUT", 600, minimum=1),
            exec_timeout=_int(env, "TURNKEEPER_EXEC_TIMEOUT", 60, minimum=1),
            exec_sandbox=_choice(env, "TURNKEEPER_EXEC_SANDBOX", EXEC_SANDBOX_MODES),
            model_timeout=_int(env, "TURNKEEPER_MODEL_TIMEOUT", 300, minimum=1),
            shutdown_grace=_int(env, "TURNKEEPER_SHUTDOWN_GRACE", 30, minimum=0),
            heartbeat_timeout=_int(env, "TURNKEEPER_HEARTBEAT_TIMEOUT", 2, minimum=1),
            max_cached_workflows=_int(env, "TURNKEEPER_MAX_CACHED_WORKFLOWS", 200, minimum=1),
            workflow_sandbox=_bool(env, "TURNKEEPER_WORKFLOW_SANDBOX", False),
            stream=_bool(env, "TURNKEEPER_STREAM", True),
            max_pollers=_pollers(env, "TURNKEEPER_POLLERS"),
            dev_server_port=_int(env, "TURNKEEPER_DEV_SERVER_PORT", 7233, minimum=1),
            dev_ui_port=_int(env, "TURNKEEPER_DEV_UI_PORT", 8233, minimum=1),
            temporal_http_address=env.get("TURNKEEPER_TEMPORAL_HTTP_ADDRESS") or None,
            dev_http_port=_int(env, "TURNKEEPER_DEV_HTTP_PORT", 7243, minimum=1),
            metrics_address=_address(env, "TURNKEEPER_METRICS_ADDRESS"),
            otlp_endpoint=env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or None,
            encryption_keys=_keys(env, "TURNKEEPER_ENCRYPTION_KEYS"),
            codec_address=(env.get("TURNKEEPER_CODEC_ADDRESS") or "").strip() or "127.0.0.1:8081",
            deployment_name=_matching(
                env.get("TURNKEEPER_DEPLOYMENT_NAME"),
                "TURNKEEPER_DEPLOYMENT_NAME",
                DEPLOYMENT_NAME,
                "1-255 characters without `.` or spaces",
            ),
            build_id=_matching(
                env.get("TURNKEEPER_BUILD_ID"),
                "TURNKEEPER_BUILD_ID",
                BUILD_ID,
                "1-255 characters without spaces",
            ),
            openai_base_url=env.get("OPENAI_BASE_URL") or None,
            openai_api_key=env.get("OPENAI_API_KEY") or None,
        )

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

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "sessions.db"
