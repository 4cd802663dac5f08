"""Where `turnkeeper web` listens, whether it may, and running an app under uvicorn.

`turnkeeper codec-server` runs under uvicorn the same way (`run_uvicorn`). Nothing
here imports the web app: turnkeeper.web.main builds and serves it."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from turnkeeper.config import ConfigError, Settings
from turnkeeper.config_values import split_address

if TYPE_CHECKING:
    from starlette.types import ASGIApp

# The limit on a request's head (line and headers) that uvicorn's h11 protocol applies;
# bodies are bounded per endpoint.
MAX_HEAD_BYTES = 16 * 1024
# Open event streams are cut at shutdown after this long, so Ctrl-C never hangs.
SHUTDOWN_GRACE_S = 2


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
    def from_settings(cls, settings: Settings) -> WebConfig:
        host, port = split_address(settings.web_address)
        return cls(host, port, settings.web_token, settings.log_level, settings.web_worker)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"


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
