"""`turnkeeper web` for tests: the real app under uvicorn on a thread of its own
(its own event loop, as in its own process), and a small HTTP client."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn

from turnkeeper.config import Settings
from turnkeeper.web.app import create_app
from turnkeeper.web.server import WebConfig

# anyio imports its file helpers on first use, and pytest rewrites anyio's modules
# as it imports them (anyio ships a pytest plugin): done first in the server's
# thread, that parse can race the main thread's and fail on CPython 3.11
# ("AST constructor recursion depth mismatch"). Import them here, once.
anyio.open_file  # noqa: B018


class WebServer:
    def __init__(self, settings: Settings, token: str | None = None, worker: bool = False) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = WebConfig(host="127.0.0.1", port=self.port, token=token, worker=worker)
        self._server = uvicorn.Server(
            uvicorn.Config(create_app(settings, config), log_level="warning", timeout_graceful_shutdown=1)
        )
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[self._sock])),
            name=f"web-{self.port}",
            daemon=True,
        )

    def start(self) -> WebServer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise AssertionError("the web server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


@contextlib.contextmanager
def serving(settings: Settings, token: str | None = None, worker: bool = False) -> Iterator[WebServer]:
    server = WebServer(settings, token, worker).start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    data: Any = field(default=None)


def _request(port: int, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        res = conn.getresponse()
        raw = res.read()
        data = None
        if res.getheader("content-type", "").startswith("application/json") and raw:
            data = json.loads(raw)
        return Answer(res.status, {k.lower(): v for k, v in res.getheaders()}, raw, data)
    finally:
        conn.close()


async def request(
    server: WebServer | int,
    method: str,
    path: str,
    json_body: Any = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """One request to `server` (or to a port on 127.0.0.1)."""
    port = server if isinstance(server, int) else server.port
    headers = dict(headers or {})
    body = raw
    if json_body is not None:
        body = json.dumps(json_body).encode()
        headers.setdefault("Content-Type", "application/json")
    return await asyncio.to_thread(_request, port, method, path, body, headers)


@dataclass
class SseEvent:
    id: int | None  # None: a transient event (`assistant_delta`), not in the log
    type: str
    data: Any
    at: float = 0.0  # time.monotonic() when it was read


def _read_events(
    port: int, path: str, headers: dict[str, str], until_type: str, timeout: float
) -> tuple[int, list[SseEvent]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    events: list[SseEvent] = []
    try:
        conn.request("GET", path, headers=headers)
        res = conn.getresponse()
        if res.status != 200:
            return res.status, events
        fields: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = res.fp.readline().decode().rstrip("\n")
            if line:
                if not line.startswith(":"):
                    name, _, value = line.partition(": ")
                    fields[name] = value
                continue
            if "event" in fields:
                seq = int(fields["id"]) if "id" in fields else None
                events.append(SseEvent(seq, fields["event"], json.loads(fields["data"]), time.monotonic()))
                if fields["event"] == until_type:
                    return res.status, events
            fields = {}
        raise AssertionError(f"no {until_type} event within {timeout} s; got {[e.type for e in events]}")
    finally:
        conn.close()


async def read_events(
    server: WebServer,
    path: str,
    until_type: str,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> tuple[int, list[SseEvent]]:
    """The stream's events up to the first of type `until_type`."""
    return await asyncio.to_thread(_read_events, server.port, path, dict(headers or {}), until_type, timeout)
