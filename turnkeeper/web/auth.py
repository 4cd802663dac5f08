"""Who may call: with TURNKEEPER_WEB_TOKEN set, every /api request needs
`Authorization: Bearer <token>` or the session cookie the page's login sets;
and no other site's page may drive this one through the user's browser."""
from __future__ import annotations

import hashlib
import hmac

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
    return JSONResponse({"detail": "a token is required: send Authorization: Bearer <token>, or log in"},
                        status_code=401, headers={"WWW-Authenticate": "Bearer"})


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
        if scope["method"] not in SAFE_METHODS and origin is not None:
            if origin.partition("://")[2] != host:
                return _refused("a request from another site is refused")
        if self.token is None and not addressed_to_loopback(host):
            return _refused("without TURNKEEPER_WEB_TOKEN only requests to 127.0.0.1 or localhost are served")
        path = scope["path"]
        if self.token is not None and (path == "/api" or path.startswith("/api/")) \
                and not authorized(request, self.token):
            return unauthorized()
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def login(request: Request, token: str | None, body: dict) -> Response:
    if token is None:
        return Response(status_code=204)  # nothing to log in to
    given = body.get("token")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), token.encode()):
        return JSONResponse({"detail": "wrong token"}, status_code=401)
    response = Response(status_code=204)
    response.set_cookie(SESSION_COOKIE, session_value(token), httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/")
    return response


def logout() -> Response:
    response = Response(status_code=204)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response
