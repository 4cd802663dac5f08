"""GET /api/chats/{chat_id}/events: the chat's event log as Server-Sent Events.

Each event is `id:` its seq, `event:` its type, `data:` its payload as JSON. A
client that reconnects sends `Last-Event-ID` (browsers do it by themselves) and
gets what came after it; `?after=SEQ` does the same for a first connection. The
store is read when it says the chat's log grew (PostgreSQL's LISTEN/NOTIFY),
or, without that, polled: a short read of the chat's index every 150 ms.

Between them, while a model call streams, `assistant_delta` events without an
`id:` (they are not in the log, so a reconnect resumes where the log was):
`{turn, step, attempt, text, offset}`, `text` the piece after the first
`offset` characters of that attempt's answer. A new stream first gets the
whole text so far (offset 0); the `assistant_message` of that step ends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from turnkeeper.web.backends import ApiError, backends, chat_id_of

if TYPE_CHECKING:
    from turnkeeper.store import Draft

log = logging.getLogger("turnkeeper.web")

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


def format_delta(draft: Draft, offset: int) -> str:
    payload = {
        "turn": draft.turn,
        "step": draft.step,
        "attempt": draft.attempt,
        "text": draft.text[offset:],
        "offset": offset,
    }
    return f"event: assistant_delta\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


class _Deltas:
    """What one stream has sent of the chat's drafts."""

    def __init__(self) -> None:
        self._attempt: tuple[int, int, int] | None = None
        self._sent = 0
        self._recorded: dict[tuple[int, int], int] = {}  # (turn, step) -> attempt when recorded

    def recorded(self, payload: dict) -> None:
        turn, step = payload.get("turn"), payload.get("step")
        if isinstance(turn, int) and isinstance(step, int):
            # A step whose text this stream never saw was (at least) attempt 1.
            current = self._attempt[2] if self._attempt and self._attempt[:2] == (turn, step) else 1
            self._recorded[(turn, step)] = current

    def next(self, draft: Draft | None) -> str | None:
        if draft is None or draft.recorded:
            return None
        if draft.attempt <= self._recorded.get((draft.turn, draft.step), -1):
            return None  # read before its reply was recorded: old news (a re-run counts on)
        key = (draft.turn, draft.step, draft.attempt)
        if self._attempt is not None and self._attempt[:2] == key[:2] and key[2] < self._attempt[2]:
            return None  # a dead attempt's draft, read late
        if key != self._attempt:
            self._attempt, self._sent = key, 0
        if len(draft.text) <= self._sent:
            return None
        line, self._sent = format_delta(draft, self._sent), len(draft.text)
        return line


async def events(request: Request) -> Response:
    chat_id = chat_id_of(request)
    after = _after(request)
    store = await backends(request).store()
    feed = backends(request).feed

    async def stream() -> AsyncIterator[str]:
        nonlocal after
        yield f"retry: {RETRY_MS}\n\n"
        slot = feed.subscribe(chat_id)
        deltas = _Deltas()
        try:
            first = await store.draft(chat_id)
        except Exception as err:
            log.warning("draft of chat %s: %s", chat_id, err)
            first = None
        quiet_since = time.monotonic()
        try:
            while True:
                try:
                    page = await store.events(chat_id, after_seq=after, limit=PAGE)
                except Exception as err:
                    log.warning("events of chat %s: %s", chat_id, err)
                    page = []
                    await asyncio.sleep(1.0)
                for ev in page:
                    after = ev.seq
                    if ev.type == "assistant_message":
                        deltas.recorded(ev.payload)
                    yield format_event(ev.seq, ev.type, ev.payload)
                if first is not None:
                    line, first = deltas.next(first), None
                    if line:
                        yield line
                if page:
                    quiet_since = time.monotonic()
                    if len(page) == PAGE:
                        continue  # more already written
                elif time.monotonic() - quiet_since >= KEEPALIVE_S:
                    quiet_since = time.monotonic()
                    yield ": keepalive\n\n"
                # Deltas as they come, until the log grew or it is time to look anyway.
                deadline = time.monotonic() + feed.events_poll_s()
                while (left := deadline - time.monotonic()) > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(slot.changed.wait(), left)
                    due, slot.events_due = slot.events_due, False
                    line = deltas.next(slot.take())
                    if line:
                        quiet_since = time.monotonic()
                        yield line
                    if due:
                        break
        finally:
            feed.unsubscribe(chat_id, slot)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
