"""Temporal's HTTP API with the standard library: how `turnkeeper status` and
`turnkeeper list` read Temporal, their only way to it.

`import temporalio.client` alone takes longer than those commands may take in
all (docs/performance.md, "The CLI"), so they ask the frontend's HTTP API:
describe the run, query `state`, list the runs. Answers are the worker's
payloads, byte for byte: plain JSON, or with TURNKEEPER_ENCRYPTION_KEYS set
sealed by the same codec as everywhere (turnkeeper.payloads.encryption,
imported only to open such a payload). The commands that write (send, the
decisions, replay) use the SDK's client instead, and read through it too.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import ssl
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    from turnkeeper.config_values import EncryptionKey

# gRPC status codes as the API's error bodies carry them.
DEADLINE_EXCEEDED, NOT_FOUND, FAILED_PRECONDITION = 4, 5, 9
JSON_PLAIN = b"json/plain"


class Unreachable(Exception):
    """Nothing answered at the address, or not as Temporal's HTTP API would."""


class ApiError(Exception):
    """The server answered with an error (`code` is its gRPC status code)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class NoAnswer(Exception):
    """The server took the request but nothing answered in time (no worker polls)."""


@dataclass(frozen=True)
class Execution:
    """A run as the list of runs gives it."""

    id: str
    run_id: str
    start_time: datetime
    search_attributes: dict[str, list[Any]]
    """Those asked for that the run has, each a list of values."""


# RFC 3339 as the API writes a protobuf Timestamp: UTC, 0 to 9 digits of fraction.
_TIMESTAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z")


def _timestamp(raw: object) -> datetime:
    """As the SDK reads a Timestamp: UTC, whole microseconds, the nanoseconds cut."""
    match = _TIMESTAMP.fullmatch(raw) if isinstance(raw, str) else None
    if match is None:
        raise Unreachable(f"not a timestamp: {raw!r}")
    year, month, day, hour, minute, second, fraction = match.groups()
    try:
        return datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int((fraction or "").ljust(9, "0")[:6]),
            tzinfo=UTC,
        )
    except ValueError:
        raise Unreachable(f"not a timestamp: {raw!r}") from None


def _execution(raw: Any, names: tuple[str, ...]) -> Execution:
    try:
        indexed = (raw.get("searchAttributes") or {}).get("indexedFields") or {}
        attributes = {}
        for name in names:
            if name in indexed:
                value = json.loads(_plain(indexed[name]))
                attributes[name] = value if isinstance(value, list) else [value]
        return Execution(
            id=raw["execution"]["workflowId"],
            run_id=raw["execution"]["runId"],
            start_time=_timestamp(raw.get("startTime")),
            search_attributes=attributes,
        )
    except (KeyError, TypeError, AttributeError, ValueError):
        raise Unreachable("a listed run is not of the expected shape") from None


def _plain(payload: dict[str, Any]) -> bytes:
    """A `json/plain` payload's bytes (search attributes are never encrypted)."""
    if base64.b64decode(payload["metadata"]["encoding"]) != JSON_PLAIN:
        raise ValueError("not json/plain")
    return base64.b64decode(payload.get("data", ""))


def _opened(payload: dict[str, Any], keys: Sequence[EncryptionKey]) -> bytes:
    """A payload's JSON: plain, or opened by the codec every client of ours uses, which
    raises its DecryptionError for a key not held here (or none held at all)."""
    try:
        metadata = {k: base64.b64decode(v) for k, v in payload["metadata"].items()}
        data = base64.b64decode(payload.get("data", ""))
    except (KeyError, TypeError, AttributeError, ValueError):
        raise Unreachable("the query's answer is not a payload") from None
    if metadata.get("encoding") != JSON_PLAIN:
        from temporalio.api.common.v1 import Payload

        from turnkeeper.payloads.encryption import payload_codec

        opened = payload_codec(keys).decrypt(Payload(metadata=metadata, data=data))
        metadata, data = dict(opened.metadata), opened.data
    if metadata.get("encoding") != JSON_PLAIN:
        raise Unreachable(f"the query's answer is {metadata.get('encoding', b'')!r}, not json/plain")
    return data


class TemporalHttp:
    def __init__(
        self,
        address: str,
        namespace: str,
        *,
        keys: Sequence[EncryptionKey] = (),
        timeout: float = 10.0,
        connect_timeout: float = 0.5,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`address`: `host:port`, or `https://host[:port]`; over TLS `env`'s (os.environ's)
        TEMPORAL_API_KEY and TEMPORAL_TLS_* variables apply, as the SDK reads them."""
        self._tls = address.startswith("https://")
        rest = address.removeprefix("https://").removeprefix("http://").rstrip("/")
        host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "443" if self._tls else "")
        if not host or not port.isdigit():
            raise Unreachable(f"not a host:port address: {address!r}")
        self.address = f"{host}:{port}"
        self._host, self._port = host, int(port)
        self._env = os.environ if env is None else env
        self._auth: dict[str, str] = {}
        if api_key := (self._env.get("TEMPORAL_API_KEY") or "").strip():
            self._auth = {"Authorization": f"Bearer {api_key}", "temporal-namespace": namespace}
        self._prefix = f"/api/v1/namespaces/{quote(namespace, safe='')}"
        self._keys = keys
        self._timeout, self._connect_timeout = timeout, connect_timeout
        self._conn: http.client.HTTPConnection | None = None

    def describe_status(self, workflow_id: str) -> str:
        """The latest run's status, lower case: running, completed, failed, ..."""
        body = self._call("GET", f"/workflows/{quote(workflow_id, safe='')}")
        try:
            status = body["workflowExecutionInfo"]["status"]
        except (KeyError, TypeError):
            raise Unreachable("the run's description has no status") from None
        return str(status).removeprefix("WORKFLOW_EXECUTION_STATUS_").lower()

    def query(self, workflow_id: str, query_type: str) -> bytes:
        """The query's answer: the JSON the worker's converter wrote."""
        # Without the API's payload shorthand: the payload itself, metadata and all.
        body = self._call(
            "POST",
            f"/workflows/{quote(workflow_id, safe='')}/query/{quote(query_type, safe='')}"
            "?noPayloadShorthand=true",
            {"query": {}},
        )
        try:
            (payload,) = body["queryResult"]["payloads"]
        except (KeyError, TypeError, ValueError):
            raise Unreachable("the query's answer is not one payload") from None
        return _opened(payload, self._keys)

    def list_workflows(
        self, query: str, names: tuple[str, ...], page_size: int = 1000
    ) -> Iterator[Execution]:
        """The runs `query` selects, page by page, with the search attributes in `names`."""
        token = ""
        while True:
            path = f"/workflows?query={quote(query, safe='')}&pageSize={page_size}"
            if token:
                path += f"&nextPageToken={quote(token, safe='')}"
            body = self._call("GET", path)
            executions = body.get("executions") or []
            if not isinstance(executions, list):
                raise Unreachable("the list of runs is not a list")
            for raw in executions:
                yield _execution(raw, names)
            token = body.get("nextPageToken") or ""
            if not isinstance(token, str):
                raise Unreachable("the next page token is not a string")
            if not token:
                return

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _call(self, method: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        conn = self._connection()
        data = json.dumps(payload).encode() if payload is not None else None
        try:
            conn.request(
                method,
                self._prefix + path,
                body=data,
                headers={"Content-Type": "application/json", "Accept": "application/json", **self._auth},
            )
            response = conn.getresponse()
            raw = response.read()
        except TimeoutError:
            self.close()
            raise NoAnswer(f"no answer within {self._timeout:g} s") from None
        except (OSError, http.client.HTTPException) as err:
            self.close()
            raise Unreachable(str(err)) from None
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise Unreachable(f"not JSON (HTTP {response.status})") from None
        if response.status >= 400:
            if not isinstance(body, dict) or not isinstance(body.get("code"), int):
                raise Unreachable(f"HTTP {response.status}")
            raise ApiError(body["code"], str(body.get("message", "")))
        if not isinstance(body, dict):
            raise Unreachable("unexpected answer shape")
        return body

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            conn = (
                http.client.HTTPSConnection(
                    self._host, self._port, timeout=self._connect_timeout, context=self._tls_context()
                )
                if self._tls
                else http.client.HTTPConnection(self._host, self._port, timeout=self._connect_timeout)
            )
            try:
                conn.connect()
            except OSError as err:
                raise Unreachable(str(err)) from None
            # Connected: from now on wait as long as a query may take.
            assert conn.sock is not None
            conn.sock.settimeout(self._timeout)
            self._conn = conn
        return self._conn

    def _tls_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self._env.get("TEMPORAL_TLS_SERVER_CA_CERT_PATH") or None)
        cert, key = (
            self._env.get("TEMPORAL_TLS_CLIENT_CERT_PATH"),
            self._env.get("TEMPORAL_TLS_CLIENT_KEY_PATH"),
        )
        if cert and key:  # mTLS
            try:
                context.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as err:
                raise Unreachable(f"TEMPORAL_TLS_CLIENT_CERT_PATH / _KEY_PATH: {err}") from None
        return context
