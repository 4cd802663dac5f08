"""Who may call: with TURNKEEPER_WEB_TOKEN set, every /api request needs
`Authorization: Bearer <token>` or the session cookie the page's login sets;
and no other site's page may drive this one through the user's browser."""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections import OrderedDict, deque

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from turnkeeper.web.request_checks import addressed_to_loopback, bearer_matches

SESSION_COOKIE = "turnkeeper_session"


def session_value(token: str) -> str:
    """The cookie's value: derived from the token, so every web process accepts it
    and the token itself never sits in the browser."""
    return hmac.new(token.encode(), b"turnkeeper web session", hashlib.sha256).hexdigest()


def authorized(request: Request, token: str) -> bool:
    if bearer_matches(request.headers.get("authorization", ""), token):
        return True
    cookie = request.cookies.get(SESSION_COOKIE, "")
    return hmac.compare_digest(cookie.encode(), session_value(token).encode())


def unauthorized() -> JSONResponse:
    return JSONResponse(
        {"detail": "a token is required: send Authorization: Bearer <token>, or log in"},
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def _refused(detail: str, status: int = 403) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


class Guard:
    """ASGI middleware in front of the app.

    - A browser's write from another site (its `Origin` is not this server) is
      refused: with no token, any page the user visits could otherwise post to
      a server on the user's own machine.
    - Without a token, only requests addressed to a loopback name are served,
      so a site whose name resolves to 127.0.0.1 (DNS rebinding) reaches nothing.
    - With a token, /api needs it; the page itself, /login and /healthz stay open.
    """

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    def _refusal(self, scope: Scope) -> JSONResponse | None:
        request = Request(scope)
        host = request.headers.get("host", "")
        origin = request.headers.get("origin")
        if scope["method"] not in SAFE_METHODS and origin is not None and origin.partition("://")[2] != host:
            return _refused("a request from another site is refused")
        if self.token is None and not addressed_to_loopback(host):
            return _refused("without TURNKEEPER_WEB_TOKEN only requests to 127.0.0.1 or localhost are served")
        path = scope["path"]
        if (
            self.token is not None
            and (path == "/api" or path.startswith("/api/"))
            and not authorized(request, self.token)
        ):
            return unauthorized()
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


# Failed logins an address may make within the window before /login refuses it (429)
# until the oldest of them is a window old: the token cannot be guessed at speed.
LOGIN_FAILURES = 10
LOGIN_WINDOW_S = 60.0
# The addresses remembered, the least recently seen forgotten first: bounded memory.
LOGIN_ADDRESSES = 10_000


def clock() -> float:
    return time.monotonic()


class LoginLimiter:
    """Failed logins per client address, in memory (each web process its own): at most
    `failures` within `window` seconds; a success forgets the address's failures."""

    def __init__(
        self, failures: int = LOGIN_FAILURES, window: float = LOGIN_WINDOW_S, addresses: int = LOGIN_ADDRESSES
    ) -> None:
        self.failures, self.window, self.addresses = failures, window, addresses
        self._failed: OrderedDict[str, deque[float]] = OrderedDict()  # address -> its recent failures' times

    def retry_after(self, address: str) -> int | None:
        """Seconds until `address` may try again, or None if it may now."""
        times = self._failed.get(address)
        if times is None:
            return None
        now = clock()
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failed[address]
            return None
        if len(times) < self.failures:
            return None
        return max(1, math.ceil(times[0] + self.window - now))

    def failed(self, address: str) -> None:
        times = self._failed.pop(address, None)
        if times is None:
            times = deque(maxlen=self.failures)  # only the last `failures` ever matter
        times.append(clock())
        self._failed[address] = times  # the most recently seen last
        while len(self._failed) > self.addresses:
            self._failed.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._failed.pop(address, None)


async def login(request: Request, token: str | None, body: dict, limiter: LoginLimiter) -> Response:
    if token is None:
        return Response(status_code=204)  # nothing to log in to
    # The body is read: no await from the check to the failure's record, so requests
    # sent at once cannot all pass the check before any of them is counted.
    address = request.client.host if request.client is not None else ""
    wait = limiter.retry_after(address)
    if wait is not None:
        return JSONResponse(
            {"detail": f"too many failed logins from this address: try again in {wait} s"},
            status_code=429,
            headers={"Retry-After": str(wait)},
        )
    given = body.get("token")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), token.encode()):
        limiter.failed(address)
        return JSONResponse({"detail": "wrong token"}, status_code=401)
    limiter.succeeded(address)
    response = Response(status_code=204)
    response.set_cookie(
        SESSION_COOKIE,
        session_value(token),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


def logout() -> Response:
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response
