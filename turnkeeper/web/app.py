"""The ASGI app: routes, the token gate, error answers and the page's headers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from turnkeeper.config import Settings
from turnkeeper.web import api, auth, sse
from turnkeeper.web.backends import ApiError, Backends, backends, read_json
from turnkeeper.web.openapi import SPEC
from turnkeeper.web.server import WebConfig

if TYPE_CHECKING:
    from turnkeeper.store import SessionStore

log = logging.getLogger("turnkeeper.web")

STATIC = Path(__file__).parent / "static"
HEALTH_TIMEOUT_S = 3.0
# The page runs only its own script and styles: markup that slipped into a
# message could not run even if it were ever rendered as markup.
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
COMMON_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]


class CommonHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + COMMON_HEADERS
            await send(message)

        await self.app(scope, receive, send_with_headers if scope["type"] == "http" else send)


async def page(request: Request) -> Response:
    return FileResponse(
        STATIC / "index.html", headers={"Content-Security-Policy": PAGE_POLICY, "Cache-Control": "no-cache"}
    )


async def openapi(request: Request) -> Response:
    return JSONResponse(SPEC)


async def healthz(request: Request) -> Response:
    parts: dict[str, str] = {}
    try:
        client = await backends(request).client()
        healthy = await client.service_client.check_health(timeout=timedelta(seconds=HEALTH_TIMEOUT_S))
        parts["temporal"] = "ok" if healthy else "not serving"
    except Exception as err:
        parts["temporal"] = getattr(err, "detail", None) or str(err) or type(err).__name__
    try:
        store = await backends(request).store()
        await asyncio.wait_for(_store_writable(store), HEALTH_TIMEOUT_S)
        parts["store"] = "ok"
    except Exception as err:
        parts["store"] = str(err) or type(err).__name__
    healthy = all(v == "ok" for v in parts.values())
    return JSONResponse(parts, status_code=200 if healthy else 503)


async def _store_writable(store: SessionStore) -> None:
    """Whether a write goes through now (the backends' `check_writable`), not a
    read: a read-only store still answers reads, and turns wait on it all the same."""
    check = getattr(store, "check_writable", None)
    await (check() if check is not None else store.list_chats(limit=1))


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)  # no such path, or not with this method
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


async def _unexpected(request: Request, exc: Exception) -> Response:
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError

    from turnkeeper.payloads.encryption import DecryptionError, names_decryption_error
    from turnkeeper.store.base import CorruptRowError, StoreError, StoreUnavailable

    # A key missing here or on the worker (TURNKEEPER_ENCRYPTION_KEYS): the words name its id, no content.
    if isinstance(exc, DecryptionError):
        return JSONResponse({"detail": f"the web process: {exc}"}, status_code=503)
    if isinstance(exc, WorkflowQueryFailedError) and names_decryption_error(exc.message):
        return JSONResponse(
            {"detail": f"the worker cannot read the run's history: {exc.message}"}, status_code=503
        )
    if isinstance(exc, RPCError):
        return JSONResponse({"detail": f"Temporal: {exc.message}"}, status_code=503)
    if isinstance(exc, StoreUnavailable):
        return JSONResponse({"detail": f"the session store does not answer: {exc}"}, status_code=503)
    if isinstance(exc, (CorruptRowError, StoreError)):
        return JSONResponse({"detail": f"session store: {exc}"}, status_code=500)
    log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
    return JSONResponse({"detail": f"internal error: {type(exc).__name__}"}, status_code=500)


def create_app(settings: Settings, config: WebConfig) -> ASGIApp:
    login_limiter = auth.LoginLimiter()

    async def login(request: Request) -> Response:
        return await auth.login(request, config.token, await read_json(request), login_limiter)

    async def logout(request: Request) -> Response:
        return auth.logout()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.backends = Backends(settings)
        hosted = None
        if config.worker:
            from turnkeeper.web.hosted_worker import HostedWorker

            hosted = HostedWorker(settings, app.state.backends)
            await hosted.start()
        try:
            yield
        finally:
            if hosted is not None:
                await hosted.stop()
            await app.state.backends.close()

    chat = "/api/chats/{chat_id:path}"
    # The routes with a suffix come first: a path parameter would take "x/messages" too.
    routes = [
        Route("/", page),
        Route("/chats/{chat_id:path}", page),
        Route("/openapi.json", openapi),
        Route("/healthz", healthz),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/api/chats", api.list_chats),
        Route(f"{chat}/messages", api.history, methods=["GET"]),
        Route(f"{chat}/messages", api.send_message, methods=["POST"]),
        Route(f"{chat}/continue", api.continue_turn, methods=["POST"]),
        Route(f"{chat}/dismiss", api.dismiss_turn, methods=["POST"]),
        Route(f"{chat}/stop", api.stop, methods=["POST"]),
        Route(f"{chat}/events", sse.events),
        Route(chat, api.get_state),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected},
    )
    return CommonHeaders(auth.Guard(app, config.token))
