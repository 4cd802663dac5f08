"""What the web process talks to (Temporal and the session store), connected on
first use, so the page starts before the worker's dev server does; and the
errors its handlers answer with."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from turnkeeper import client as tk
from turnkeeper.chat_ids import CHAT_ID_RULE, valid_chat_id
from turnkeeper.config import Settings
from turnkeeper.telemetry import exporters as telemetry
from turnkeeper.web.feed import ChatFeed
from turnkeeper.web.request_checks import BodyTooLarge, read_body

if TYPE_CHECKING:
    from temporalio.client import Client

    from turnkeeper.store import SessionStore

# Continue, Dismiss, Stop and the login carry a few short fields.
SMALL_BODY_BYTES = 4096
CONNECT_TIMEOUT_S = 10.0


class ApiError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class Backends:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client: Client | None = None
        self._store: SessionStore | None = None
        # Apart: a Temporal that does not answer must not hold up the store's readers.
        self._client_lock = asyncio.Lock()
        self._store_lock = asyncio.Lock()
        self.feed = ChatFeed(self.store)
        # A worker runs in this process on the same client: new turns start eagerly.
        self.eager = False

    def adopt_client(self, client: Client, *, eager: bool) -> None:
        """Use `client` (the hosted worker's) instead of connecting one."""
        self._client = telemetry.traced(client, self.settings, "turnkeeper-web")
        self.eager = eager

    async def client(self) -> Client:
        if self._client is None:
            async with self._client_lock:
                if self._client is None:
                    try:
                        client = await asyncio.wait_for(tk.connect(self.settings), CONNECT_TIMEOUT_S)
                    except Exception as err:
                        where = self.settings.temporal_address or f"127.0.0.1:{self.settings.dev_server_port}"
                        why = (
                            tk.why_unreachable(err) if str(err) else f"no answer in {CONNECT_TIMEOUT_S:.0f} s"
                        )
                        raise ApiError(
                            503, f"cannot reach Temporal at {where} ({why}); is the worker running?"
                        ) from None
                    # Turns sent from the page are traced from here (OTEL_EXPORTER_OTLP_ENDPOINT).
                    self._client = telemetry.traced(client, self.settings, "turnkeeper-web")
        return self._client

    async def store(self) -> SessionStore:
        if self._store is None:
            async with self._store_lock:
                if self._store is None:
                    from turnkeeper.store import open_store

                    store = open_store(self.settings)
                    await store.open()
                    self._store = store
        return self._store

    async def close(self) -> None:
        await self.feed.close()
        if self._store is not None:
            await self._store.close()
            self._store = None


def backends(request: Request) -> Backends:
    return request.app.state.backends


def chat_id_of(request: Request) -> str:
    chat_id = request.path_params["chat_id"]
    if not valid_chat_id(chat_id):
        raise ApiError(422, CHAT_ID_RULE)
    return chat_id


async def read_json(request: Request, limit: int = SMALL_BODY_BYTES) -> dict[str, Any]:
    """The body as a JSON object, refused (413) before reading past `limit` bytes."""
    try:
        body = await read_body(request, limit)
    except BodyTooLarge as err:
        raise ApiError(413, str(err)) from None
    if not body.strip():
        return {}
    # A form or plain-text post is what another site's page can send without asking: JSON only.
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        raise ApiError(415, "send the body as JSON (Content-Type: application/json)")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise ApiError(422, "the body is not JSON") from None
    if not isinstance(data, dict):
        raise ApiError(422, "the body must be a JSON object")
    return data
