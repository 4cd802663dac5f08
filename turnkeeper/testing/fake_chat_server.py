"""A fake OpenAI server for tests (`turnkeeper.testing.FakeChatServer`).

`FakeChatServer` is a tiny OpenAI Chat Completions-compatible HTTP server
(standard library only) that answers from a script, so the real `openai`
client, its retries and our error classification can be tested offline::

    with FakeChatServer() as server:
        server.script([{"status": 429, "message": "slow down"}, {"text": "hi"}])
        provider = OpenAIChatProvider("fake", base_url=server.base_url, api_key="k")
        ...
        assert len(server.requests) == 2

Script items (each may also carry `"delay": seconds`, slept before answering):

- `{"text": "..."}` and/or `{"tool_calls": [{"name": ..., "arguments": ..., "id"?: ...}]}`:
  a completion. Object arguments are JSON-encoded; a string is sent verbatim
  (so malformed JSON can be tested); a missing id gets a fresh `call_...` id.
- `{"status": 429, "message": "..."}`: an error in OpenAI's shape
  `{"error": {"message", "type", "code"}}`.
- `{"raw": <any JSON>, "status"?: 200}`: that body as is (malformed output).

A request with `"stream": true` gets a completion as Server-Sent Events, as
the API streams it: the text in word-sized chunks, each tool call's id and name
first and its arguments in two pieces, then `[DONE]`. A completion item may
also carry `"chunk_delay": seconds` (slept between chunks) and `"cut_after": n`
(the connection closes after n chunks: a stream that breaks off).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["FakeChatServer", "StreamRecord"]

Item = dict[str, Any]
Responder = Callable[[dict[str, Any]], Item]

COMPLETIONS_PATH = "/v1/chat/completions"

_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


def error_body(status: int, message: str) -> dict[str, Any]:
    kind, code = _ERROR_KINDS.get(
        status, ("server_error" if status >= 500 else "invalid_request_error", None)
    )
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _validate_item(item: object) -> Item:
    if not isinstance(item, dict):
        raise ValueError(f"a FakeChatServer script item must be a dict, got {item!r}")
    keys = set(item) - {"delay", "chunk_delay", "cut_after"}
    for name in ("delay", "chunk_delay"):
        delay = item.get(name, 0)
        if not isinstance(delay, (int, float)) or delay < 0:
            raise ValueError(f"{name!r} must be a non-negative number of seconds: {item!r}")
    cut_after = item.get("cut_after", 0)
    if not isinstance(cut_after, int) or cut_after < 0:
        raise ValueError(f"'cut_after' must be a non-negative whole number of chunks: {item!r}")
    if keys and keys <= {"text", "tool_calls"}:
        if "text" in item and not isinstance(item["text"], str):
            raise ValueError(f"'text' must be a string: {item!r}")
        calls = item.get("tool_calls", [])
        if not isinstance(calls, list) or not all(isinstance(c, dict) and "name" in c for c in calls):
            raise ValueError(f"'tool_calls' must be a list of {{'name', 'arguments', 'id'?}}: {item!r}")
        return item
    if keys and keys <= {"status", "message"} and "status" in keys:
        if not isinstance(item["status"], int) or not 400 <= item["status"] <= 599:
            raise ValueError(f"'status' must be an HTTP error status (400-599): {item!r}")
        return item
    if keys and keys <= {"raw", "status"} and "raw" in keys:
        return item
    raise ValueError(
        "a FakeChatServer script item must be {'text'} and/or {'tool_calls'}, "
        f"{{'status', 'message'}} or {{'raw'}} (each optionally with 'delay'), got {item!r}"
    )


def _calls(item: Item) -> list[dict[str, Any]]:
    return [
        {
            "id": c["id"] if "id" in c else f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {
                "name": c["name"],
                "arguments": (
                    c["arguments"]
                    if isinstance(c.get("arguments"), str)
                    else json.dumps(c.get("arguments", {}))
                ),
            },
        }
        for c in item.get("tool_calls", [])
    ]


def _completion(item: Item, request: dict[str, Any]) -> dict[str, Any]:
    calls = _calls(item)
    message: dict[str, Any] = {"role": "assistant", "content": item.get("text"), "refusal": None}
    if calls:
        message["tool_calls"] = calls
    # A rough token count: the client does not check it, but some callers log it.
    prompt_tokens = len(json.dumps(request.get("messages", []))) // 4
    completion_tokens = len(json.dumps(message)) // 4
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "fake-model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _stream_chunks(item: Item, request: dict[str, Any]) -> list[dict[str, Any]]:
    """A completion as the chunks of a streamed answer."""
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": request.get("model", "fake-model"),
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": piece}) for piece in re.findall(r"\S+\s*|\s+", item.get("text") or "")]
    calls = _calls(item)
    for i, call in enumerate(calls):
        fn = call["function"]
        chunks.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": fn["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        half = len(fn["arguments"]) // 2
        for part in (fn["arguments"][:half], fn["arguments"][half:]):
            chunks.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]}))
    chunks.append(chunk({}, "tool_calls" if calls else "stop"))
    return chunks


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a handler sleeping in a 'delay' must not hold up stop()
    fake: FakeChatServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if urlsplit(self.path).path.rstrip("/") != COMPLETIONS_PATH:
            self._send(
                404, error_body(404, f"FakeChatServer only serves POST {COMPLETIONS_PATH}, not {self.path}")
            )
            return
        try:
            request = json.loads(raw)
        except ValueError:
            self._send(400, error_body(400, "FakeChatServer: the request body is not JSON"))
            return
        status, body = self.server.fake._answer(request)
        if isinstance(body, _Stream):
            self._send_stream(body)
        else:
            self._send(status, body)

    def do_GET(self) -> None:
        self._send(404, error_body(404, f"FakeChatServer only serves POST {COMPLETIONS_PATH}"))

    def _send_stream(self, stream: _Stream) -> None:
        stopping = self.server.fake._stopping
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()  # no length: the stream ends when the connection closes
            for i, chunk in enumerate(stream.chunks):
                if stream.cut_after and i >= stream.cut_after:
                    return
                if i and stream.chunk_delay:
                    stopping.wait(stream.chunk_delay)
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                piece = chunk["choices"][0]["delta"].get("content")
                if piece:
                    stream.record.pieces.append((time.monotonic(), piece))
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:
            pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client gave up (e.g. timed out during a 'delay'): nobody to answer


class _Stream:
    def __init__(
        self, chunks: list[dict[str, Any]], chunk_delay: float, cut_after: int, record: StreamRecord
    ) -> None:
        self.chunks, self.chunk_delay, self.cut_after, self.record = chunks, chunk_delay, cut_after, record


class StreamRecord:
    """A streamed answer as the server sent it: each piece of text and when it was
    written (`time.monotonic()`), for measuring what a client sees later."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.arrived = time.monotonic()
        self.pieces: list[tuple[float, str]] = []


class FakeChatServer:
    """An OpenAI Chat Completions-compatible server answering from a script.

    `requests` holds every JSON body received on POST /v1/chat/completions, in
    order. When the script is empty, `responder(request)` (if set) computes the
    item to answer with; otherwise the server answers 500 with a clear message.
    """

    def __init__(self, items: Iterable[Item] = (), *, responder: Responder | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.streams: list[StreamRecord] = []
        """The streamed answers, in the order asked for."""
        self.responder = responder
        self._script: deque[Item] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.script(items)

    # --- lifecycle ------------------------------------------------------------

    def start(self) -> FakeChatServer:
        if self._server is not None:
            return self
        self._stopping.clear()
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="FakeChatServer", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stopping.set()  # wakes handlers sleeping in a 'delay'
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> FakeChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("FakeChatServer is not running; call start() or use it as a context manager")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # --- the script -------------------------------------------------------------

    def script(self, items: Iterable[Item]) -> None:
        """Queue answers, after any still pending. Raises ValueError on a bad item."""
        checked = [_validate_item(item) for item in items]
        with self._lock:
            self._script.extend(checked)

    @property
    def pending(self) -> int:
        """Scripted answers not yet used."""
        with self._lock:
            return len(self._script)

    def _answer(self, request: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(request)
            number = len(self.requests)
            item = self._script.popleft() if self._script else None
        if item is None and self.responder is not None:
            try:
                item = _validate_item(self.responder(request))
            except Exception as e:
                return 500, error_body(500, f"FakeChatServer: responder failed: {type(e).__name__}: {e}")
        if item is None:
            return 500, error_body(
                500, f"FakeChatServer: the script is exhausted (request {number} has no scripted answer)"
            )
        if item.get("delay"):
            self._stopping.wait(float(item["delay"]))
        if "raw" in item:
            return int(item.get("status", 200)), item["raw"]
        if "status" in item:
            status = int(item["status"])
            return status, error_body(status, str(item.get("message", f"error {status}")))
        if request.get("stream"):
            record = StreamRecord(request)
            with self._lock:
                self.streams.append(record)
            return 200, _Stream(
                _stream_chunks(item, request),
                float(item.get("chunk_delay", 0)),
                int(item.get("cut_after", 0)),
                record,
            )
        return 200, _completion(item, request)
