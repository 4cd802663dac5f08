"""GET /api/chats/{chat_id}/events: the chat's event log as Server-Sent Events.

Each event is `id:` its seq, `event:` its type, `data:` its payload as JSON. A
client that reconnects sends `Last-Event-ID` (browsers do it by themselves) and
gets what came after it; `?after=SEQ` does the same for a first connection. The
store is polled: a short read of the chat's index every POLL_S.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from turnkeeper.web.backends import ApiError, backends, chat_id_of

log = logging.getLogger("turnkeeper.web")

POLL_S = 0.15
PAGE = 500
# A comment line now and then keeps proxies from closing a quiet stream, and
# finds a client that went away.
KEEPALIVE_S = 15.0
RETRY_MS = 1000
_EVENT_TYPE = re.compile(r"[a-z_]{1,64}")


def _after(request: Request) -> int:
    raw = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    if not raw.isdigit():
        raise ApiError(422, "Last-Event-ID (or ?after=) must be an event's seq, a whole number")
    return int(raw)


def format_event(seq: int, type_: str, payload: dict) -> str:
    # Types come from the store; one that is not a plain name is shown as what it is.
    name = type_ if _EVENT_TYPE.fullmatch(type_) else "corrupt_event"
    return f"id: {seq}\nevent: {name}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def events(request: Request) -> Response:
    chat_id = chat_id_of(request)
    after = _after(request)
    store = await backends(request).store()

    async def stream() -> AsyncIterator[str]:
        nonlocal after
        yield f"retry: {RETRY_MS}\n\n"
        quiet_since = time.monotonic()
        while True:
            try:
                page = await store.events(chat_id, after_seq=after, limit=PAGE)
            except Exception as err:  # noqa: BLE001  the store is back soon, or the client gives up
                log.warning("events of chat %s: %s", chat_id, err)
                page = []
                await asyncio.sleep(1.0)
            for ev in page:
                after = ev.seq
                yield format_event(ev.seq, ev.type, ev.payload)
            if page:
                quiet_since = time.monotonic()
                if len(page) == PAGE:
                    continue  # more already written
            elif time.monotonic() - quiet_since >= KEEPALIVE_S:
                quiet_since = time.monotonic()
                yield ": keepalive\n\n"
            await asyncio.sleep(POLL_S)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
