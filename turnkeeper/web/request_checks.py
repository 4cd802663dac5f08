"""What both HTTP servers (`turnkeeper web` and `turnkeeper codec-server`) check
of a request before they serve it: the host it was addressed to, the bearer
token, and a body read no further than its limit.

Plain functions over header values and the body's stream: nothing here imports
starlette, as the worker imports the codec server's module.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from turnkeeper.web.server import is_loopback

if TYPE_CHECKING:
    from starlette.requests import Request


class BodyTooLarge(Exception):
    """The body is over its limit: refused without reading the rest."""


def addressed_to_loopback(host_header: str) -> bool:
    """Whether the request's Host header names this machine. A tokenless server
    serves no page that reached it by another name (DNS rebinding)."""
    return is_loopback(_host_name(host_header))


def _host_name(host_header: str) -> str:
    """`example.org:8000` -> `example.org`, `[::1]:8000` -> `::1`."""
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rpartition(":")[0] if host_header.count(":") == 1 else host_header


def bearer_matches(authorization: str, token: str) -> bool:
    """`Authorization: Bearer <token>` with this token, compared in constant time."""
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


async def read_body(request: Request, limit: int) -> bytes:
    """The body; `BodyTooLarge` when its declared length is over `limit` bytes, or
    as soon as what arrives is."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"the request body is over {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(f"the request body is over {limit} bytes")
    return bytes(body)
