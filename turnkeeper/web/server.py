"""Where `turnkeeper web` listens, whether it may, and running an app under uvicorn.

`turnkeeper codec-server` reads its log level and runs under uvicorn the same
way (`uvicorn_log_level`, `run_uvicorn`). Nothing here imports the web app:
turnkeeper.web.main builds and serves it."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from turnkeeper.config import ConfigError

if TYPE_CHECKING:
    from starlette.types import ASGIApp

DEFAULT_ADDRESS = "127.0.0.1:8000"
# The limit on a request's head (line and headers) that uvicorn's h11 protocol applies;
# bodies are bounded per endpoint.
MAX_HEAD_BYTES = 16 * 1024
# Open event streams are cut at shutdown after this long, so Ctrl-C never hangs.
SHUTDOWN_GRACE_S = 2
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


@dataclass(frozen=True)
class WebConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    # repr=False: configurations get logged; the token must never be.
    token: str | None = field(default=None, repr=False)
    log_level: str = "info"
    # TURNKEEPER_WEB_WORKER: the process runs a worker too, on the same client and
    # event loop, and starts a chat's new turn eagerly (its first workflow task
    # comes back in the start call's reply instead of through the task queue).
    worker: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WebConfig:
        env = os.environ if env is None else env
        host, port = parse_address(env.get("TURNKEEPER_WEB_ADDRESS") or DEFAULT_ADDRESS)
        return cls(
            host=host,
            port=port,
            token=env.get("TURNKEEPER_WEB_TOKEN") or None,
            log_level=uvicorn_log_level(env),
            worker=web_worker(env),
        )

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"


def parse_address(
    raw: str, name: str = "TURNKEEPER_WEB_ADDRESS", example: str = DEFAULT_ADDRESS
) -> tuple[str, int]:
    """`host:port` or `[ipv6]:port`."""
    host, sep, port = raw.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{name} must be host:port (e.g. {example}), got {raw!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def web_worker(env: Mapping[str, str]) -> bool:
    raw = (env.get("TURNKEEPER_WEB_WORKER") or "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"TURNKEEPER_WEB_WORKER must be 1 or 0 (true or false), got {raw!r}")


def uvicorn_log_level(env: Mapping[str, str]) -> str:
    """TURNKEEPER_LOG_LEVEL for uvicorn (`turnkeeper web`, `turnkeeper codec-server`)."""
    level = (env.get("TURNKEEPER_LOG_LEVEL") or "info").strip().lower()
    level = {"warn": "warning"}.get(level, level)  # as Python's logging takes it for the worker
    if level not in LOG_LEVELS:
        raise ConfigError(f"TURNKEEPER_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    return level


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name may resolve to anything


def check_exposure(config: WebConfig) -> None:
    """Without a token the API is open to whoever reaches it: only this machine may."""
    if config.token is None and not is_loopback(config.host):
        raise ConfigError(
            f"refusing to listen on {config.host}:{config.port} without a token: anyone who reaches it "
            "could read and drive every chat. Set TURNKEEPER_WEB_TOKEN, or listen on 127.0.0.1"
        )


def run_uvicorn(app: ASGIApp, host: str, port: int, log_level: str) -> None:
    """Serve `app` until Ctrl-C (`turnkeeper web`, `turnkeeper codec-server`)."""
    import uvicorn

    # One line per request only when debugging: the page polls, and shares a terminal with `make worker`.
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=log_level == "debug",
        server_header=False,
        http="h11",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
    )
