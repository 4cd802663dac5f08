"""`POST /login` limits failed logins per client address: the token cannot be
guessed at speed. The ASGI app called directly (no server, no Temporal)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from turnkeeper.config import Settings
from turnkeeper.web import auth
from turnkeeper.web.app import create_app
from turnkeeper.web.server import WebConfig

TOKEN = "s3cret"


async def post_login(app: Any, token: str, address: str) -> tuple[int, dict[str, str]]:
    body = json.dumps({"token": token}).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/login",
        "raw_path": b"/login",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"turnkeeper.example:8000"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": (address, 50000),
        "server": ("turnkeeper.example", 8000),
    }
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    t = [1000.0]
    monkeypatch.setattr(auth, "clock", lambda: t[0], raising=False)
    return t


async def test_ten_failures_refuse_the_address_until_the_window_passes(now: list[float]) -> None:
    app = create_app(Settings.from_env({}), WebConfig(token=TOKEN))
    for _ in range(auth.LOGIN_FAILURES):
        assert (await post_login(app, "wrong", "10.0.0.1"))[0] == 401
        now[0] += 1.0
    status, headers = await post_login(app, TOKEN, "10.0.0.1")  # the right token, all the same
    assert status == 429
    assert headers["retry-after"] == "50"  # the first failure, at 1000, is a window old at 1060
    assert "set-cookie" not in headers
    assert (await post_login(app, TOKEN, "10.0.0.2"))[0] == 204  # another address is unaffected

    now[0] = 1000.0 + auth.LOGIN_WINDOW_S - 0.5
    assert (await post_login(app, TOKEN, "10.0.0.1"))[0] == 429
    now[0] = 1000.0 + auth.LOGIN_WINDOW_S  # the first failure has left the window: one try
    assert (await post_login(app, "wrong", "10.0.0.1"))[0] == 401
    assert (await post_login(app, TOKEN, "10.0.0.1"))[0] == 429
    now[0] += auth.LOGIN_WINDOW_S
    status, headers = await post_login(app, TOKEN, "10.0.0.1")
    assert status == 204 and headers["set-cookie"].startswith(f"{auth.SESSION_COOKIE}=")


async def test_a_success_forgets_the_failures(now: list[float]) -> None:
    app = create_app(Settings.from_env({}), WebConfig(token=TOKEN))
    for _ in range(auth.LOGIN_FAILURES - 1):
        assert (await post_login(app, "wrong", "10.0.0.1"))[0] == 401
    assert (await post_login(app, TOKEN, "10.0.0.1"))[0] == 204
    for _ in range(auth.LOGIN_FAILURES):
        assert (await post_login(app, "wrong", "10.0.0.1"))[0] == 401
    assert (await post_login(app, "wrong", "10.0.0.1"))[0] == 429


def test_the_addresses_remembered_are_bounded(now: list[float]) -> None:
    limiter = auth.LoginLimiter(failures=2, window=60, addresses=3)
    for address in ("a", "b", "c"):
        limiter.failed(address)
        limiter.failed(address)
    limiter.failed("a")  # seen again: the least recently seen is now b
    limiter.failed("d")
    assert limiter.retry_after("b") is None  # forgotten
    assert limiter.retry_after("a") == 60 and limiter.retry_after("c") == 60
    assert len(limiter._failed) == 3
    assert max(len(times) for times in limiter._failed.values()) == 2
