"""The CLI's Temporal HTTP client over TLS, as Temporal Cloud serves the API: the
server's certificate checked against TEMPORAL_TLS_SERVER_CA_CERT_PATH, the API key
sent as a bearer token."""

from __future__ import annotations

import datetime
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from turnkeeper.cli.temporal_http import TemporalHttp, Unreachable
from turnkeeper.config import ConfigError, Settings


def _certificate(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "server.pem", tmp / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@pytest.fixture
def https_api(tmp_path: Path) -> Iterator[tuple[str, Path, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
            ok = self.headers.get("Authorization") == "Bearer the-key"
            body = (
                {"workflowExecutionInfo": {"status": "WORKFLOW_EXECUTION_STATUS_RUNNING"}}
                if ok
                else {"code": 16, "message": "Request unauthorized."}
            )
            data = json.dumps(body).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    cert, key = _certificate(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://localhost:{server.server_address[1]}", cert, seen
    finally:
        server.shutdown()


def test_https_with_an_api_key(https_api: tuple[str, Path, list[dict[str, str]]]) -> None:
    address, ca, seen = https_api
    env = {"TEMPORAL_API_KEY": "the-key", "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(ca)}
    api = TemporalHttp(address, "ns.acct", env=env)
    try:
        assert api.describe_status("chat-a") == "running"
    finally:
        api.close()
    assert seen[0]["path"] == "/api/v1/namespaces/ns.acct/workflows/chat-a"
    assert seen[0]["temporal-namespace"] == "ns.acct"
    # A server whose certificate nobody vouches for is refused, the key never sent.
    api = TemporalHttp(address, "ns.acct", env={"TEMPORAL_API_KEY": "the-key"})
    with pytest.raises(Unreachable, match="CERTIFICATE_VERIFY_FAILED"):
        api.describe_status("chat-a")
    assert len(seen) == 1


def test_the_address_takes_https() -> None:
    assert Settings.from_env({"TURNKEEPER_TEMPORAL_HTTP_ADDRESS": "https://ns.acct.tmprl.cloud"})
    assert TemporalHttp("https://ns.acct.tmprl.cloud", "ns").address == "ns.acct.tmprl.cloud:443"
    with pytest.raises(ConfigError, match="TURNKEEPER_TEMPORAL_HTTP_ADDRESS"):
        Settings.from_env({"TURNKEEPER_TEMPORAL_HTTP_ADDRESS": "https://host/path"})
