"""`turnkeeper codec-server`: Temporal's remote codec protocol over HTTP, so the
Temporal UI and `temporal --codec-endpoint` show encrypted payloads decrypted.

    POST /encode, POST /decode   body {"payloads": [{"metadata": {k: base64}, "data": base64}]}
                                 (Payloads in protobuf's JSON form), answered in the same shape;
                                 a body over MAX_BODY_BYTES (4 MiB) is refused with 413

Keys are TURNKEEPER_ENCRYPTION_KEYS, as the workers have them; without keys
payloads pass through, as they are stored. A payload that does not decrypt comes
back as it was, with the reason in its metadata (`decode-error`), so one old
payload does not hide a whole history. The `X-Namespace` header is accepted and
not used: the keys are the same in every namespace.

Who may call: browsers only from TURNKEEPER_CODEC_CORS_ORIGIN (the Temporal UI's
origin; preflights answered); with TURNKEEPER_CODEC_TOKEN set, every call needs
`Authorization: Bearer <token>`; without one, only requests addressed to
127.0.0.1 or localhost are served (a page cannot reach it by DNS rebinding).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from turnkeeper.config import Settings
from turnkeeper.config_values import split_address
from turnkeeper.web.request_checks import BodyTooLarge, addressed_to_loopback, bearer_matches, read_body
from turnkeeper.web.server import is_loopback, run_uvicorn

if TYPE_CHECKING:
    from starlette.types import ASGIApp

# A request carries one event field's payloads (the UI and `temporal` ask field by field), which
# Temporal holds to 2 MB: a third more as base64, with room to spare. Larger bodies get 413 unread.
MAX_BODY_BYTES = 4 * 1024 * 1024
ALLOWED_HEADERS = ("Authorization", "Content-Type", "X-Namespace")
PREFLIGHT_MAX_AGE_S = 600
DECODE_ERROR_METADATA = "decode-error"


def url_of(host: str, port: int) -> str:
    """Where a browser on this machine reaches `host:port` (a wildcard address means here)."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/"


def default_origins(settings: Settings) -> tuple[str, ...]:
    """The embedded dev server's UI, as the browser may name it."""
    return (f"http://localhost:{settings.dev_ui_port}", f"http://127.0.0.1:{settings.dev_ui_port}")


@dataclass(frozen=True)
class CodecConfig:
    host: str = "127.0.0.1"
    port: int = 8081
    origins: tuple[str, ...] = ("http://localhost:8233", "http://127.0.0.1:8233")
    # repr=False: configurations get logged; the token must never be.
    token: str | None = field(default=None, repr=False)
    log_level: str = "info"

    @classmethod
    def from_settings(cls, settings: Settings) -> CodecConfig:
        host, port = split_address(settings.codec_address)
        origins = settings.codec_origins or default_origins(settings)
        return cls(host, port, origins, settings.codec_token, settings.log_level)

    @property
    def url(self) -> str:
        return url_of(self.host, self.port)


class Guard:
    """ASGI middleware inside Starlette's CORSMiddleware, which answers preflights (they carry
    no token) and adds CORS headers for the configured origins, to these refusals too, so the
    UI may read why. Refused here: a page from another origin (in any method: the page must not
    even cause a call), a call without the token, and on a tokenless server a request by another
    name than this machine's (a page cannot reach it by DNS rebinding)."""

    def __init__(self, app: ASGIApp, config: CodecConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        refused = self._refusal(scope) if scope["type"] == "http" else None
        await (self.app if refused is None else refused)(scope, receive, send)

    def _refusal(self, scope: Any) -> Any:
        from starlette.datastructures import Headers
        from starlette.responses import JSONResponse

        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in self.config.origins:
            # No CORS headers: the browser keeps the answer from the page.
            detail = f"origin {origin!r} is not allowed (TURNKEEPER_CODEC_CORS_ORIGIN)"
            return JSONResponse({"detail": detail}, status_code=403)
        if self.config.token is None and not addressed_to_loopback(headers.get("host", "")):
            detail = "without TURNKEEPER_CODEC_TOKEN only requests to 127.0.0.1 or localhost are served"
            return JSONResponse({"detail": detail}, status_code=403)
        if self.config.token is not None and not bearer_matches(
            headers.get("authorization", ""), self.config.token
        ):
            detail = "a token is required: send Authorization: Bearer <token>"
            return JSONResponse({"detail": detail}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return None


class BadRequest(Exception):
    status = 400


class TooLarge(BadRequest):
    status = 413


async def _read_payloads(request: Any) -> Any:
    from google.protobuf.json_format import ParseDict, ParseError
    from temporalio.api.common.v1 import Payloads

    try:
        # Refused on its Content-Length, or as soon as a chunked body passes the limit.
        body = await read_body(request, MAX_BODY_BYTES)
    except BodyTooLarge as err:
        raise TooLarge(str(err)) from None
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("the body is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("payloads", []), list):
        raise BadRequest('the body must be {"payloads": [...]}')
    try:
        # Only the payloads: whatever else a caller adds is not ours to read.
        return ParseDict({"payloads": data.get("payloads", [])}, Payloads())
    except ParseError as err:
        # Its words name a field and the problem, not the data.
        raise BadRequest(f"not Temporal payloads: {str(err).splitlines()[0][:200]}") from None


def create_app(settings: Settings, config: CodecConfig) -> ASGIApp:
    from google.protobuf.json_format import MessageToDict
    from starlette.applications import Starlette
    from starlette.middleware.cors import CORSMiddleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
    from temporalio.api.common.v1 import Payloads

    from turnkeeper.payloads.encryption import DecryptionError, payload_codec

    codec = payload_codec(settings.encryption_keys)

    def answer(payloads: list[Any]) -> Response:
        return JSONResponse(MessageToDict(Payloads(payloads=payloads)) or {"payloads": []})

    async def encode(request: Request) -> Response:
        try:
            payloads = await _read_payloads(request)
        except BadRequest as err:
            return JSONResponse({"detail": str(err)}, status_code=err.status)
        return answer([codec.encrypt(p) for p in payloads.payloads])

    async def decode(request: Request) -> Response:
        try:
            payloads = await _read_payloads(request)
        except BadRequest as err:
            return JSONResponse({"detail": str(err)}, status_code=err.status)
        out = []
        for p in payloads.payloads:
            try:
                out.append(codec.decrypt(p))
            except DecryptionError as err:
                p.metadata[DECODE_ERROR_METADATA] = str(err).encode()
                out.append(p)
        return answer(out)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"encrypts_with": codec.key_id, "decrypts": list(codec.key_ids)})

    routes = [
        Route("/encode", encode, methods=["POST"]),
        Route("/decode", decode, methods=["POST"]),
        Route("/healthz", healthz),
    ]
    return CORSMiddleware(
        Guard(Starlette(routes=routes), config),
        allow_origins=config.origins,
        allow_methods=["POST"],
        allow_headers=ALLOWED_HEADERS,
        allow_credentials=True,
        max_age=PREFLIGHT_MAX_AGE_S,
    )


def serve(settings: Settings, config: CodecConfig) -> int:
    app = create_app(settings, config)
    keys = [k.key_id for k in settings.encryption_keys]
    what = (
        f"encrypts with {keys[0]!r}, decrypts {', '.join(map(repr, keys))}"
        if keys
        else "TURNKEEPER_ENCRYPTION_KEYS is unset: payloads pass through as stored"
    )
    guard = "a token is required" if config.token else "no token: requests to 127.0.0.1 or localhost only"
    print(
        f"turnkeeper codec-server: {config.url} ({what}; {guard}; CORS for {', '.join(config.origins)})",
        flush=True,
    )
    if config.token is None and not is_loopback(config.host):
        print(
            f"turnkeeper codec-server: warning: listening on {config.host}:{config.port} without "
            "TURNKEEPER_CODEC_TOKEN: whoever reaches that port can decrypt what they read from Temporal; "
            "publish it on loopback only, or set a token",
            file=sys.stderr,
            flush=True,
        )
    run_uvicorn(app, config.host, config.port, config.log_level)
    return 0
