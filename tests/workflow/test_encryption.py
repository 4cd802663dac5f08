"""Payload encryption (TURNKEEPER_ENCRYPTION_KEYS) and `turnkeeper codec-server`:
the keys' configuration, the codec, the codec server over HTTP, and turns on a
dev server of this module's own (its SQLite file is read back): nothing a user,
a model or a tool said reaches Temporal, its database or the worker's log in
plain text, the codec server shows all of it, and a key that is no longer listed
is named in words while the turn waits for it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError

from tests.support import Stack, free_port, until
from tests.web_support import request, serving
from turnkeeper import client as tk
from turnkeeper.activities.reconcile import history_read
from turnkeeper.activities.reconcile.run_sweep import readable as _readable
from turnkeeper.config import ConfigError, Settings
from turnkeeper.models import Reason, TurnState, TurnStatus
from turnkeeper.payloads.encryption import (
    ENCODING,
    KEY_ID_METADATA,
    DecryptionError,
    EncryptionCodec,
    PlaintextCodec,
    data_converter,
)
from turnkeeper.reconcile_io import RECONCILE_WORKFLOW, ReconcileSummary
from turnkeeper.worker.dev_server import (
    codec_endpoint,
    ensure_dev_server,
    is_healthy,
    start_dev_command,
    stop_dev_server,
    temporal_binary,
)
from turnkeeper.worker.main import run_worker

TURNKEEPER = str(Path(sys.executable).parent / "turnkeeper")
KEY_1, KEY_2 = (base64.b64encode(secrets.token_bytes(32)).decode() for _ in range(2))
KEYS_1 = f"k1:{KEY_1}"
KEYS_2 = f"k2:{KEY_2}"
KEYS_2_1 = f"k2:{KEY_2},k1:{KEY_1}"  # k2 encrypts; k1 still decrypts


def keys(raw: str) -> Settings:
    return Settings.from_env({"TURNKEEPER_ENCRYPTION_KEYS": raw})


def json_payload(value: Any) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(value).encode())


# -- configuration ---------------------------------------------------------------------------


def test_the_first_key_encrypts_and_every_key_decrypts() -> None:
    settings = keys(f" {KEYS_2_1} ")
    assert [k.key_id for k in settings.encryption_keys] == ["k2", "k1"]
    assert settings.encryption_keys[1].secret == base64.b64decode(KEY_1)
    assert Settings.from_env({}).encryption_keys == ()
    # Settings get logged: neither the keys nor their bytes show.
    assert KEY_1 not in repr(settings) and repr(base64.b64decode(KEY_1)) not in repr(settings)
    assert KEY_1 not in repr(settings.encryption_keys)
    # A URL-safe base64 key is the same key.
    urlsafe = base64.urlsafe_b64encode(base64.b64decode(KEY_1)).decode()
    assert keys(f"k1:{urlsafe}").encryption_keys == keys(KEYS_1).encryption_keys


SHORT = base64.b64encode(b"x" * 16).decode()


BAD_KEYS = [
    (f"k1:{KEY_1[:-3]}!!", "key 'k1' is not valid base64"),
    (f"k1:{SHORT}", "key 'k1' is 16 bytes; AES-256 needs 32"),
    (f"k1:{KEY_1},k1:{KEY_2}", "key id 'k1' is listed twice"),
    (KEY_1, "entry 1 is not keyid:base64-key"),
    (f"k1:{KEY_1},:{KEY_2}", "entry 2 is not keyid:base64-key"),
    (f"k 1:{KEY_1}", "entry 1: a key id is 1-64 characters"),
]


# Named by the message, not the random keys: every xdist process collects the same ids.
@pytest.mark.parametrize("raw, message", BAD_KEYS, ids=[message for _, message in BAD_KEYS])
def test_a_bad_key_is_refused_without_showing_it(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"TURNKEEPER_ENCRYPTION_KEYS: {message}") as caught:
        keys(raw)
    for secret in (KEY_1, KEY_2, KEY_1[:-3], SHORT):
        assert secret not in str(caught.value)


# -- the codec -------------------------------------------------------------------------------


async def test_payloads_round_trip_and_plain_ones_pass_through() -> None:
    codec = EncryptionCodec(keys(KEYS_1).encryption_keys)
    plain = json_payload({"text": "hello"})
    [sealed] = await codec.encode([plain])
    assert sealed.metadata["encoding"] == ENCODING and sealed.metadata[KEY_ID_METADATA] == b"k1"
    assert b"hello" not in sealed.SerializeToString() and b"json/plain" not in sealed.SerializeToString()
    assert await codec.decode([sealed]) == [plain]
    # A fresh nonce each time: the same payload never seals the same way twice.
    assert (await codec.encode([plain]))[0].data != sealed.data
    # Written before encryption was on: read as it is.
    assert await codec.decode([plain]) == [plain]
    # Through the data converter every client uses.
    converter = data_converter(keys(KEYS_1).encryption_keys)
    assert await converter.decode(await converter.encode([{"a": [1, "two"]}]), [dict]) == [{"a": [1, "two"]}]


async def test_rotation_old_key_decrypts_new_key_encrypts() -> None:
    before = EncryptionCodec(keys(KEYS_1).encryption_keys)
    during = EncryptionCodec(keys(KEYS_2_1).encryption_keys)
    after = EncryptionCodec(keys(KEYS_2).encryption_keys)
    old = await before.encode([json_payload("old")])
    new = await during.encode([json_payload("new")])
    assert new[0].metadata[KEY_ID_METADATA] == b"k2"
    assert await during.decode(old + new) == [json_payload("old"), json_payload("new")]
    assert await after.decode(new) == [json_payload("new")]
    with pytest.raises(
        DecryptionError,
        match="encrypted under key id 'k1', which TURNKEEPER_ENCRYPTION_KEYS "
        r"does not list here \(it lists 'k2'\)",
    ):
        await after.decode(old)


async def test_a_tampered_payload_is_refused() -> None:
    codec = EncryptionCodec(keys(KEYS_2_1).encryption_keys)
    [sealed] = await codec.encode([json_payload("a")])
    flipped = Payload()
    flipped.CopyFrom(sealed)
    flipped.data = sealed.data[:-1] + bytes([sealed.data[-1] ^ 1])
    relabelled = Payload()
    relabelled.CopyFrom(sealed)
    relabelled.metadata[KEY_ID_METADATA] = b"k1"  # another listed key: the seal does not open
    for bad in (flipped, relabelled):
        with pytest.raises(DecryptionError, match="fails its integrity check: it was altered"):
            await codec.decode([bad])
    cut = Payload(metadata=sealed.metadata, data=sealed.data[:20])
    with pytest.raises(DecryptionError, match="too short"):
        await codec.decode([cut])


async def test_without_keys_an_encrypted_payload_is_refused_in_words() -> None:
    sealed = await EncryptionCodec(keys(KEYS_1).encryption_keys).encode([json_payload("x")])
    with pytest.raises(
        DecryptionError, match="encrypted under key id 'k1', but TURNKEEPER_ENCRYPTION_KEYS is unset here"
    ):
        await PlaintextCodec().decode(sealed)
    assert await PlaintextCodec().encode([json_payload("x")]) == [json_payload("x")]


async def test_failure_messages_travel_encrypted() -> None:
    converter = data_converter(keys(KEYS_1).encryption_keys)
    failure = Failure()
    await converter.encode_failure(
        ApplicationError("the model said SECRET-ERROR", type="ModelFailed"), failure
    )
    assert b"SECRET-ERROR" not in failure.SerializeToString()
    assert (
        failure.message == "Encoded failure" and failure.encoded_attributes.metadata["encoding"] == ENCODING
    )
    decoded = await converter.decode_failure(failure)
    assert isinstance(decoded, ApplicationError) and decoded.message == "the model said SECRET-ERROR"
    # A key missing on a worker is said in plain words: a query's failure reaches the client as its message.
    missing = Failure()
    await converter.encode_failure(DecryptionError("it is encrypted under key id 'k0'"), missing)
    assert missing.message == "cannot decrypt a payload: it is encrypted under key id 'k0'"
    # Without keys failures stay as they were.
    assert data_converter(()).failure_converter_class.__name__ == "DefaultFailureConverter"


def test_cryptography_is_imported_only_when_keys_are_set() -> None:
    probe = (
        "import sys; from turnkeeper import client; from turnkeeper.config import Settings; "
        "client.data_converter(Settings.from_env()); print('cryptography' in sys.modules)"
    )
    for raw, expected in (("", "False"), (KEYS_1, "True")):
        env = {**os.environ, "TURNKEEPER_ENCRYPTION_KEYS": raw}
        out = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.stdout.strip() == expected, out.stderr


# -- the codec server over HTTP --------------------------------------------------------------


class CodecServer:
    def __init__(
        self, tmp: Path, keys_raw: str, token: str | None = None, port: int | None = None, **env: str
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.log = tmp / f"codec-{self.port}.log"
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("TURNKEEPER_", "TEMPORAL_"))}
        environment.update(
            {
                "TURNKEEPER_ENCRYPTION_KEYS": keys_raw,
                "TURNKEEPER_CODEC_ADDRESS": f"127.0.0.1:{self.port}",
                **env,
            }
        )
        if token:
            environment["TURNKEEPER_CODEC_TOKEN"] = token
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [TURNKEEPER, "codec-server"],
                env=environment,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait(self) -> CodecServer:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            time.sleep(0.1)
        self.stop()  # not left running by a test that fails here
        raise AssertionError(f"the codec server did not listen on {self.port}: {self.log.read_text()}")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def call(
        self, path: str, body: Any = None, *, method: str = "POST", token: str | None = None, **headers: str
    ) -> tuple[int, dict[str, str], Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        request.add_header("X-Namespace", "default")
        if token or self.token:
            request.add_header("Authorization", f"Bearer {token or self.token}")
        for name, value in headers.items():
            request.add_header(name.replace("_", "-"), value)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                raw, status, got = response.read(), response.status, dict(response.headers)
        except urllib.error.HTTPError as err:
            raw, status, got = err.read(), err.code, dict(err.headers)
        answered = {k.lower(): v for k, v in got.items()}
        # JSON but for the preflights' answers, Starlette's plain text.
        return (
            status,
            answered,
            json.loads(raw) if answered.get("content-type") == "application/json" else raw,
        )


@pytest.fixture(scope="module")
def codec_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CodecServer, CodecServer]]:
    """(with a token, without one)."""
    tmp = tmp_path_factory.mktemp("codec")
    servers = (CodecServer(tmp, KEYS_2_1, token="codec-token"), CodecServer(tmp, KEYS_2_1))
    try:
        for s in servers:
            s.wait()
        yield servers
    finally:
        for s in servers:
            s.stop()


def wire(payload: Payload) -> dict[str, Any]:
    """A payload as the remote codec protocol carries it: protobuf JSON, bytes in base64."""
    return {
        "metadata": {k: base64.b64encode(v).decode() for k, v in payload.metadata.items()},
        "data": base64.b64encode(payload.data).decode(),
    }


def unwire(item: dict[str, Any]) -> Payload:
    return Payload(
        metadata={k: base64.b64decode(v) for k, v in item.get("metadata", {}).items()},
        data=base64.b64decode(item.get("data", "")),
    )


async def test_the_codec_server_encodes_and_decodes(codec_servers: tuple[CodecServer, CodecServer]) -> None:
    server, _ = codec_servers
    plain = [json_payload({"text": "over http"}), json_payload([1, 2])]
    status, _, body = server.call("/encode", {"payloads": [wire(p) for p in plain]})
    assert status == 200
    sealed = [unwire(p) for p in body["payloads"]]
    assert [p.metadata[KEY_ID_METADATA] for p in sealed] == [b"k2", b"k2"]
    assert await EncryptionCodec(keys(KEYS_2).encryption_keys).decode(sealed) == plain  # what workers read
    # An old key's payload, a plain one and one under an unknown key, in one batch.
    old = await EncryptionCodec(keys(KEYS_1).encryption_keys).encode([json_payload("old")])
    unknown = await EncryptionCodec(keys(f"k9:{KEY_1}").encryption_keys).encode([json_payload("lost")])
    batch = sealed + old + [json_payload("plain")] + unknown
    status, _, body = server.call("/decode", {"payloads": [wire(p) for p in batch]})
    assert status == 200
    decoded = [unwire(p) for p in body["payloads"]]
    assert decoded[:4] == plain + [json_payload("old"), json_payload("plain")]
    # The one it cannot open comes back as it was, with the reason beside it.
    assert decoded[4].data == unknown[0].data
    assert b"key id 'k9'" in decoded[4].metadata["decode-error"]
    assert server.call("/decode", {"payloads": []})[2] == {"payloads": []}
    for bad in ({"payloads": "x"}, {"payloads": [{"data": 5}]}, [1]):
        status, _, body = server.call("/decode", bad)
        assert status == 400 and body["detail"], bad


def test_the_codec_server_answers_cors_for_the_ui_origin_only(
    codec_servers: tuple[CodecServer, CodecServer],
) -> None:
    for server in codec_servers:
        # The embedded dev server's UI, by either name: a preflight needs no token.
        for origin in ("http://localhost:8233", "http://127.0.0.1:8233"):
            status, headers, _ = server.call(
                "/decode",
                method="OPTIONS",
                token="",
                Origin=origin,
                Access_Control_Request_Method="POST",
                Access_Control_Request_Headers="authorization,content-type,x-namespace",
            )
            assert status == 200
            assert headers["access-control-allow-origin"] == origin
            allowed = {h.strip().lower() for h in headers["access-control-allow-headers"].split(",")}
            assert {"authorization", "content-type", "x-namespace"} <= allowed
            assert "POST" in headers["access-control-allow-methods"]
            status, headers, _ = server.call("/decode", {"payloads": []}, Origin=origin)
            assert status == 200 and headers["access-control-allow-origin"] == origin
        for origin in ("http://evil.example", "http://localhost:8234", "null"):
            status, headers, _ = server.call(
                "/decode", method="OPTIONS", Origin=origin, Access_Control_Request_Method="POST"
            )
            assert status == 400 and "access-control-allow-origin" not in headers  # Starlette's refusal
            status, headers, _ = server.call("/decode", {"payloads": []}, Origin=origin)
            assert status == 403 and "access-control-allow-origin" not in headers


def test_the_codec_server_needs_its_token(
    codec_servers: tuple[CodecServer, CodecServer], tmp_path: Path
) -> None:
    with_token, without = codec_servers
    empty = {"payloads": []}
    assert with_token.call("/decode", empty)[0] == 200
    status, headers, body = with_token.call("/decode", empty, token="wrong")
    assert status == 401 and headers["www-authenticate"] == "Bearer" and "token is required" in body["detail"]
    # No Authorization at all (the UI without the token) : refused, with CORS so the page can say why.
    with_token.token = None
    try:
        status, headers, _ = with_token.call("/encode", empty, Origin="http://localhost:8233")
        assert status == 401 and headers["access-control-allow-origin"] == "http://localhost:8233"
        # With a token the name the server was reached by does not matter.
        assert with_token.call("/decode", empty, token="codec-token", Host="codec.internal")[0] == 200
    finally:
        with_token.token = "codec-token"
    # Without a token: this machine's names only (no DNS rebinding from a page).
    assert without.call("/decode", empty, Host=f"localhost:{without.port}")[0] == 200
    assert without.call("/decode", empty, Host=f"codec.example:{without.port}")[0] == 403


def test_the_codec_server_refuses_a_body_over_its_limit_before_it_arrives(
    codec_servers: tuple[CodecServer, CodecServer],
) -> None:
    """A 5 MB body is refused (413) on its Content-Length: only the head is sent, and
    the answer comes without waiting for the body. Calls of a normal size still work."""
    server, _ = codec_servers
    over = 5 * 1024 * 1024
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            f"POST /decode HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"Authorization: Bearer {server.token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {over}\r\n\r\n".encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            got = sock.recv(65536)
            assert got, answer
            answer += got
    assert answer.startswith(b"HTTP/1.1 413 "), answer

    plain = [json_payload({"text": "still served"})]
    status, _, body = server.call("/encode", {"payloads": [wire(p) for p in plain]})
    assert status == 200
    status, _, body = server.call("/decode", body)
    assert status == 200 and [unwire(p) for p in body["payloads"]] == plain


async def test_the_codec_server_stops_reading_a_chunked_body_past_its_limit() -> None:
    """A body with no length (chunked) is counted as it arrives: refused (413) once it
    passes the limit, the rest never read. The ASGI app called directly."""
    from turnkeeper.payloads.codec_server import MAX_BODY_BYTES, CodecConfig, create_app

    app = create_app(Settings.from_env({"TURNKEEPER_ENCRYPTION_KEYS": KEYS_1}), CodecConfig())
    chunk, total = b"x" * 65536, 5 * 1024 * 1024
    pulled = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": chunk, "more_body": pulled * len(chunk) < total}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/decode",
        "raw_path": b"/decode",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:8081"),
            (b"content-type", b"application/json"),
            (b"transfer-encoding", b"chunked"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8081),
    }
    await app(scope, receive, send)
    assert next(m for m in sent if m["type"] == "http.response.start")["status"] == 413
    assert pulled * len(chunk) <= MAX_BODY_BYTES + len(chunk) < total


def test_the_codec_server_refuses_a_wildcard_origin(tmp_path: Path) -> None:
    server = CodecServer(tmp_path, KEYS_1, TURNKEEPER_CODEC_CORS_ORIGIN="*")
    try:
        assert server.proc.wait(timeout=30) == 2
    finally:
        server.stop()
    assert "TURNKEEPER_CODEC_CORS_ORIGIN must list origins" in server.log.read_text()


async def test_the_embedded_dev_servers_ui_decodes_through_the_codec_server(tmp_path: Path) -> None:
    """With keys set, the dev server a worker starts tells its UI's page to ask
    `turnkeeper codec-server` (at TURNKEEPER_CODEC_ADDRESS) for every payload."""
    assert codec_endpoint(Settings()) is None  # no keys: the UI shows payloads as stored
    assert codec_endpoint(keys(KEYS_1)) == "http://127.0.0.1:8081"
    wildcard = Settings.from_env(
        {"TURNKEEPER_ENCRYPTION_KEYS": KEYS_1, "TURNKEEPER_CODEC_ADDRESS": "0.0.0.0:9"}
    )
    assert codec_endpoint(wildcard) == "http://127.0.0.1:9"  # as the browser on this machine reaches it
    ui_port, codec_port = free_port(), free_port()
    settings = Settings.from_env(
        {
            "TURNKEEPER_ENCRYPTION_KEYS": KEYS_1,
            "TURNKEEPER_DATA_DIR": str(tmp_path),
            "TURNKEEPER_DEV_SERVER_PORT": str(free_port()),
            "TURNKEEPER_DEV_UI_PORT": str(ui_port),
            "TURNKEEPER_CODEC_ADDRESS": f"localhost:{codec_port}",
        }
    )
    try:
        await ensure_dev_server(settings)
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/api/v1/settings", timeout=10) as response:
            ui = json.loads(response.read())
    finally:
        stop_dev_server(settings)
    assert ui["Codec"]["Endpoint"] == f"http://localhost:{codec_port}"


# -- turns on a dev server of our own --------------------------------------------------------


class Server:
    def __init__(self, root: Path) -> None:
        self.dir = root
        self.db = root / "temporal.db"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.http_address = f"127.0.0.1:{free_port()}"  # `turnkeeper status` reads it
        self.log = root / "temporal-server.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                start_dev_command(
                    self.port,
                    self.db,
                    log_level="warn",
                    http_port=int(self.http_address.rpartition(":")[2]),
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def stored_bytes(self) -> bytes:
        """The server's SQLite database as it is on disk, with its WAL."""
        return b"".join(p.read_bytes() for p in sorted(self.dir.glob("temporal.db*")))

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    s = Server(tmp_path_factory.mktemp("temporal"))
    try:
        deadline = time.monotonic() + 60
        while not await is_healthy(s.address):
            assert s.proc.poll() is None and time.monotonic() < deadline, s.log.read_text()
            await asyncio.sleep(0.3)
        yield s
    finally:
        s.stop()


async def connect(server: Server, keys_raw: str) -> Client:
    return await tk.connect(
        Settings.from_env({"TEMPORAL_ADDRESS": server.address, "TURNKEEPER_ENCRYPTION_KEYS": keys_raw})
    )


@pytest.fixture
async def encrypted(server: Server, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Stack]:
    s = Stack(
        await connect(server, KEYS_1),
        server.address,
        tmp_path,
        name=request.node.name,
        http_address=server.http_address,
    )
    s.env_extra.update({"TURNKEEPER_ENCRYPTION_KEYS": KEYS_1, "TURNKEEPER_RECONCILE_EVERY": "3600"})
    try:
        yield s
    finally:
        await s.close()


def canaries() -> dict[str, str]:
    return {
        part: f"CANARY-{part}-{uuid.uuid4().hex[:12]}"
        for part in ("prompt", "arguments", "output", "answer", "error")
    }


def found_in_json(text: str, needle: str) -> bool:
    """In the text, or in any base64 string in it (how JSON carries payload bytes)."""
    if needle in text:
        return True

    def strings(node: Any) -> Iterator[str]:
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for value in node.values():
                yield from strings(value)
        elif isinstance(node, list):
            for value in node:
                yield from strings(value)

    for s in strings(json.loads(text)):
        with contextlib.suppress(ValueError):
            if needle.encode() in base64.b64decode(s, validate=True):
                return True
    return False


async def temporal_show(server: Server, workflow_id: str, run_id: str, *options: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        temporal_binary(),
        "workflow",
        "show",
        "--workflow-id",
        workflow_id,
        "--run-id",
        run_id,
        "--address",
        server.address,
        "--output",
        "json",
        *options,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def runs_of(client: Client, chat: str) -> list[str]:
    return [wf.run_id async for wf in client.list_workflows(f"WorkflowId='{tk.workflow_id(chat)}'")]


async def test_no_canary_reaches_temporal_or_the_log_in_plain_text(encrypted: Stack, server: Server) -> None:
    """A turn whose prompt, tool arguments, tool output, answer and a model error each
    carry a canary: none is in the raw history (fetched, or shown by the `temporal`
    CLI), in a search attribute, a workflow or activity id, the server's SQLite file
    or the worker's log; through the codec server, `temporal workflow show` shows each."""
    stack = encrypted
    canary = canaries()
    (stack.ws / "secret.txt").write_text(f"the file says {canary['output']}")
    stack.script(
        [
            {
                "tool_calls": [
                    {
                        "name": "write_file",
                        "arguments": {"path": "notes.txt", "content": canary["arguments"]},
                    },
                    {"name": "read_file", "arguments": {"path": "secret.txt"}},
                ]
            },
            {"text": f"done: {canary['answer']}"},
            {"error": f"the provider refused: {canary['error']}"},
            {"text": "control answered"},  # after Dismiss's closing row
        ]
    )
    worker = stack.spawn_worker()
    await stack.wait_serving(worker)
    chat = stack.chat("canary")
    first = await (await stack.send(chat, f"please {canary['prompt']}")).result()
    assert first.status == TurnStatus.COMPLETED
    await stack.send(chat, "and once more")
    gate = await stack.wait_state(chat, lambda s: s.turn == 2 and s.status == TurnStatus.AWAITING_USER)
    assert gate.reason == Reason.MODEL_FAILED and canary["error"] in (gate.detail or "")  # read with the key
    assert (stack.ws / "notes.txt").read_text() == canary["arguments"]
    dismissed = await stack.decide(chat, "dismiss", gate.recovery_id)
    assert dismissed.status == TurnStatus.RECOVERED
    # A control: a message from a client without keys is stored as sent (and the worker reads it).
    control = f"CANARY-control-{uuid.uuid4().hex[:12]}"
    plain_client = await Client.connect(server.address, data_converter=tk.data_converter(Settings()))
    await tk.send_message(plain_client, stack.settings(), chat, tk.new_message(control, stack.settings()))
    await stack.wait_turn_done(chat, 3)
    assert [m.get("content") for m in await stack.history(chat)][-2:] == [control, "control answered"]

    workflow_id = tk.workflow_id(chat)
    runs = await runs_of(stack.client, chat)
    assert len(runs) == 3
    raw: list[bytes] = []
    shown: list[str] = []
    ids: list[str] = [workflow_id]
    for run_id in runs:
        handle = stack.client.get_workflow_handle(workflow_id, run_id=run_id)
        history = await handle.fetch_history()  # as stored: nothing decoded
        raw += [e.SerializeToString() for e in history.events]
        ids += [
            e.activity_task_scheduled_event_attributes.activity_id
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
        ]
        shown.append(await temporal_show(server, workflow_id, run_id))
        described = await handle.describe()
        ids += [str(v) for values in described.search_attributes.values() for v in values]
    assert len(ids) > 8
    history_bytes = b"".join(raw)
    assert ENCODING in history_bytes
    assert control.encode() in history_bytes and any(found_in_json(s, control) for s in shown)
    assert control.encode() in server.stored_bytes()  # the checks below can see plain text
    worker_log = stack.logs[worker.pid].read_text(errors="replace")
    assert "payloads encrypted under key 'k1'" in worker_log and "Completing activity as failed" in worker_log
    for part, needle in canary.items():
        assert needle.encode() not in history_bytes, f"{part} in the raw history"
        assert not any(found_in_json(s, needle) for s in shown), f"{part} in `temporal workflow show`"
        assert not any(needle in i for i in ids), f"{part} in an id or a search attribute"
        assert needle.encode() not in server.stored_bytes(), f"{part} in the server's database"
        assert needle not in worker_log, f"{part} in the worker's log"
        assert needle not in server.log.read_text(errors="replace"), f"{part} in the server's log"

    codec = CodecServer(stack.dir, KEYS_1, token="show-token")
    try:
        codec.wait()
        decoded = [
            await temporal_show(
                server,
                workflow_id,
                run_id,
                "--codec-endpoint",
                codec.url,
                "--codec-auth",
                "Bearer show-token",
            )
            for run_id in runs
        ]
    finally:
        codec.stop()
    for part, needle in canary.items():
        assert any(found_in_json(s, needle) for s in decoded), f"{part} not shown through the codec server"
        assert needle not in codec.log.read_text(errors="replace"), f"{part} in the codec server's log"


async def _status(stack: Stack, chat: str, keys_raw: str) -> subprocess.CompletedProcess[str]:
    proc = await asyncio.create_subprocess_exec(
        TURNKEEPER,
        "status",
        chat,
        env=stack.env(TURNKEEPER_ENCRYPTION_KEYS=keys_raw),
        cwd=stack.dir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(["status", chat], proc.returncode, out.decode(), err.decode())


class InProcessWorker:
    """`run_worker` in this process, with a client of the given keys, until stopped."""

    def __init__(self, stack: Stack, server: Server, keys_raw: str) -> None:
        self.stack, self.server, self.keys_raw = stack, server, keys_raw
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.client: Client | None = None

    async def __aenter__(self) -> InProcessWorker:
        self.client = await connect(self.server, self.keys_raw)
        settings = self.stack.settings(
            TURNKEEPER_ENCRYPTION_KEYS=self.keys_raw, TURNKEEPER_WORKFLOW_SANDBOX="on"
        )
        self.task = asyncio.create_task(
            run_worker(
                settings,
                client=self.client,
                stop=self.stop,
                reconcile_schedule_id=f"reconcile-{uuid.uuid4().hex[:8]}",
            )
        )
        await asyncio.sleep(0.3)
        if self.task.done():
            self.task.result()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 30)


async def test_a_key_no_longer_listed_is_named_and_the_turn_waits_for_it(
    encrypted: Stack, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Workers lose key k1 while a turn written under it waits at its gate: its
    workflow task fails on every try with one log line naming k1 (no traceback),
    the run stays open, `status` and the web API say why (`status` showing the
    store's record), and once a worker holds k1 again the turn goes on with the
    message sent meanwhile."""
    stack = encrypted
    stack.script([{"error": "the provider is down"}, {"text": "back again"}])
    chat = stack.chat("rotated")
    async with InProcessWorker(stack, server, KEYS_1):
        await stack.send(chat, "hello")
        await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
        # A command without any key cannot read the answer, and says so.
        bare = await _status(stack, chat, "")
        assert bare.returncode == 0, bare.stderr
        assert "but TURNKEEPER_ENCRYPTION_KEYS is unset here" in bare.stderr
        assert "showing the session store's record" in bare.stderr and "awaiting_user" in bare.stdout

    caplog.set_level(logging.INFO, logger="temporalio.worker._workflow")
    async with InProcessWorker(stack, server, KEYS_2) as rotated:
        assert rotated.client is not None
        r = await _status(stack, chat, KEYS_2)
        assert r.returncode == 0, r.stderr
        assert (
            "the worker cannot read the run's history: cannot decrypt a payload: it is encrypted under "
            "key id 'k1', which TURNKEEPER_ENCRYPTION_KEYS does not list here (it lists 'k2')" in r.stderr
        )
        assert "awaiting_user (model_failed)" in r.stdout and "Traceback" not in r.stderr
        with serving(stack.settings(TURNKEEPER_ENCRYPTION_KEYS=KEYS_2)) as web:  # the web API says so too
            answer = await request(web, "GET", f"/api/chats/{chat}")
        assert answer.status == 503 and "the worker cannot read the run's history" in answer.data["detail"]
        assert "key id 'k1'" in answer.data["detail"]
        # A follow-up sent now is durable; the run cannot take it until k1 is back.
        await tk.send_message(
            rotated.client, stack.settings(), chat, tk.new_message("are you there?", stack.settings())
        )
        await until(
            lambda: sum("key id 'k1'" in r.getMessage() for r in caplog.records) >= 2,
            30,
            "the workflow task failed twice on k1",
        )
        described = await rotated.client.get_workflow_handle(tk.workflow_id(chat)).describe()
        assert described.status == WorkflowExecutionStatus.RUNNING  # not failed: it waits for the key
    lines = [r for r in caplog.records if "key id 'k1'" in r.getMessage()]
    assert all(r.exc_info is None and r.exc_text is None for r in lines)
    assert "the task is retried until a worker holds that key" in lines[0].getMessage()

    # The reconciler's reading of the run: with k1 it sees the messages; without, it names k1.
    async def fetched() -> list[Any]:
        return list((await stack.client.get_workflow_handle(tk.workflow_id(chat)).fetch_history()).events)

    readable = await _readable(await fetched(), await connect(server, KEYS_2_1))
    assert [m.text for m in history_read.acknowledged(readable)] == ["hello", "are you there?"]
    verdict = history_read.judge_history(await _readable(await fetched(), await connect(server, KEYS_2)), [])
    assert verdict.reason == Reason.CHECKPOINT_UNKNOWN and "key id 'k1'" in verdict.detail

    stack.client = await connect(server, KEYS_2_1)  # reads what k2 now seals
    async with InProcessWorker(stack, server, KEYS_2_1):  # k1 is back (k2 encrypts)
        started = time.monotonic()
        await stack.wait_turn_done(chat, 2, timeout=90)
        print(f"resumed {time.monotonic() - started:.1f} s after k1 came back")
    history_rows = [m["content"] for m in await stack.history(chat)]
    assert history_rows[-2:] == ["are you there?", "back again"]


async def test_a_pass_reads_an_encrypted_run(encrypted: Stack, server: Server) -> None:
    """The reconciler judges a terminated run by its history, decrypted: the same
    verdict as in plain text (not `checkpoint_unknown`), and the follow-up only
    that history held is handed on."""
    stack = encrypted
    stack.env_extra.update(
        {
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
            "TURNKEEPER_TOOLS": "slow_write",
            "TURNKEEPER_SHUTDOWN_GRACE": "1",
        }
    )
    stack.script(
        [
            {
                "tool_calls": [
                    {"name": "slow_write", "arguments": {"path": "k.txt", "content": "x", "seconds": 30}}
                ]
            }
        ]
    )
    chat = stack.chat("reconciled")
    async with InProcessWorker(stack, server, KEYS_1):
        handle = await stack.send(chat, "slow tool please")
        await until(lambda: (stack.ws / "ledger.txt").exists(), 30, "the tool started")
        await stack.send(chat, "and then?", message_id="later")
        await stack.wait_state(chat, lambda s: s.pending_followups == ["later"])
        await handle.terminate(reason="test")
        summary = await stack.client.execute_workflow(
            RECONCILE_WORKFLOW,
            id=f"reconcile-{uuid.uuid4().hex[:8]}",
            task_queue=stack.task_queue,
            result_type=ReconcileSummary,
        )
        assert summary.outcomes == {Reason.TOOL_STATE_UNKNOWN: 1}, summary
        state: TurnState = await stack.wait_state(chat, lambda s: s.status == TurnStatus.AWAITING_USER)
        assert (state.reason, state.pending_followups) == (Reason.TOOL_STATE_UNKNOWN, ["later"])
