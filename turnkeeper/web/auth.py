"""The token gate: with TURNKEEPER_WEB_TOKEN set, every /api request needs
`Authorization: Bearer <token>` or the session cookie the page's login sets."""
from __future__ import annotations

import hashlib
import hmac

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

SESSION_COOKIE = "turnkeeper_session"


def session_value(token: str) -> str:
    """The cookie's value: derived from the token, so every web process accepts it
    and the token itself never sits in the browser."""
    return hmac.new(token.encode(), b"turnkeeper web session", hashlib.sha256).hexdigest()


def authorized(request: Request, token: str) -> bool:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
        return True
    cookie = request.cookies.get(SESSION_COOKIE, "")
    return hmac.compare_digest(cookie.encode(), session_value(token).encode())


def unauthorized() -> JSONResponse:
    return JSONResponse({"detail": "a token is required: send Authorization: Bearer <token>, or log in"},
                        status_code=401, headers={"WWW-Authenticate": "Bearer"})


class TokenGate:
    """ASGI middleware in front of /api (the page itself, /login and /healthz stay open)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.token is not None and scope["type"] == "http"
                and (scope["path"] == "/api" or scope["path"].startswith("/api/"))
                and not authorized(Request(scope), self.token)):
            await unauthorized()(scope, receive, send)
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
