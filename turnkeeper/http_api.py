"""Temporal's HTTP API, for the CLI's reads that must start fast.

`import temporalio` alone (its protobuf modules and the Rust bridge) takes
longer than `turnkeeper status` may take in all, so `status` and `list` ask the
frontend's HTTP API with the standard library: describe the run, query `state`,
list the runs; and `send` signals-with-start there. The answers are the same as
over gRPC: the payload is the worker's JSON, byte for byte. Anything this cannot
do (no HTTP address known, the port closed, an encrypted payload) raises
`Unavailable`, and the caller goes the gRPC way.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

# gRPC status codes as the API's error bodies carry them.
NOT_FOUND, FAILED_PRECONDITION, DEADLINE_EXCEEDED = 5, 9, 4


class Unavailable(Exception):
    """No answer from the HTTP API: use gRPC instead."""


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
    """A run as the list of runs gives it: the attributes of the SDK's
    `WorkflowExecution` that `turnkeeper list` reads, decoded as the SDK does."""

    id: str
    run_id: str
    start_time: datetime
    search_attributes: dict[str, list[Any]]
    """Those asked for that the run has, each a list of values (`WorkflowExecution.search_attributes`)."""


# RFC 3339 as the API writes a protobuf Timestamp: UTC, 0 to 9 digits of fraction.
_TIMESTAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z")


def _timestamp(raw: Any) -> datetime:
    """As the SDK reads a Timestamp (`ToDatetime`, UTC): whole microseconds, the nanoseconds cut."""
    match = _TIMESTAMP.fullmatch(raw) if isinstance(raw, str) else None
    if match is None:
        raise Unavailable(f"not a timestamp: {raw!r}")
    *parts, fraction = match.groups()
    try:
        return datetime(*map(int, parts), int((fraction or "").ljust(9, "0")[:6]), tzinfo=UTC)
    except ValueError:
        raise Unavailable(f"not a timestamp: {raw!r}") from None


def _execution(raw: Any, names: tuple[str, ...]) -> Execution:
    try:
        indexed = (raw.get("searchAttributes") or {}).get("indexedFields") or {}
        attributes = {}
        for name in names:
            if name not in indexed:
                continue
            payload = indexed[name]
            if base64.b64decode(payload["metadata"]["encoding"]) != b"json/plain":
                raise Unavailable(f"search attribute {name} is not json/plain")
            value = json.loads(base64.b64decode(payload.get("data", "")))
            attributes[name] = value if isinstance(value, list) else [value]
        return Execution(
            id=raw["execution"]["workflowId"],
            run_id=raw["execution"]["runId"],
            start_time=_timestamp(raw.get("startTime")),
            search_attributes=attributes,
        )
    except (KeyError, TypeError, AttributeError, ValueError):
        raise Unavailable("a listed run is not of the expected shape") from None


def json_payload(data: bytes, search_attribute_type: str | None = None) -> dict[str, Any]:
    """A `json/plain` payload as the API's JSON carries it (bytes in base64), with
    its search attribute type (e.g. `Keyword`) if it is the value of one."""
    metadata = {"encoding": base64.b64encode(b"json/plain").decode()}
    if search_attribute_type is not None:
        metadata["type"] = base64.b64encode(search_attribute_type.encode()).decode()
    return {"metadata": metadata, "data": base64.b64encode(data).decode()}


class TemporalHttp:
    def __init__(
        self, address: str, namespace: str, *, timeout: float = 10.0, connect_timeout: float = 0.5
    ) -> None:
        host, _, port = address.removeprefix("http://").rstrip("/").rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"not a host:port address: {address!r}")
        self._host, self._port = host, int(port)
        self._prefix = f"/api/v1/namespaces/{quote(namespace, safe='')}"
        self._timeout, self._connect_timeout = timeout, connect_timeout
        self._conn: http.client.HTTPConnection | None = None

    def describe_status(self, workflow_id: str) -> str:
        """The latest run's status, lower case: running, completed, failed, ..."""
        body = self._call("GET", f"/workflows/{quote(workflow_id, safe='')}")
        status = body["workflowExecutionInfo"]["status"]
        return str(status).removeprefix("WORKFLOW_EXECUTION_STATUS_").lower()

    def query(self, workflow_id: str, query_type: str) -> Any:
        # Without the API's payload shorthand: the shorthand turns an empty list into
        # null; the payload itself is the bytes the worker's converter wrote.
        body = self._call(
            "POST",
            f"/workflows/{quote(workflow_id, safe='')}/query/{quote(query_type, safe='')}"
            "?noPayloadShorthand=true",
            {"query": {}},
        )
        try:
            (payload,) = body["queryResult"]["payloads"]
            encoding = base64.b64decode(payload["metadata"]["encoding"])
            data = base64.b64decode(payload.get("data", ""))
        except (KeyError, TypeError, ValueError):
            raise Unavailable("the query's answer is not one payload") from None
        if encoding != b"json/plain":
            # Say, an encrypted payload: only the SDK's converter decodes it.
            raise Unavailable(f"the query's answer is {encoding.decode(errors='replace')}, not json/plain")
        return json.loads(data)

    def list_workflows(
        self, query: str, names: tuple[str, ...], page_size: int = 1000
    ) -> Iterator[Execution]:
        """The runs `query` selects, page by page as the SDK's `list_workflows` reads
        them, with the search attributes in `names`."""
        token = ""
        while True:
            path = f"/workflows?query={quote(query, safe='')}&pageSize={page_size}"
            if token:
                path += f"&nextPageToken={quote(token, safe='')}"
            body = self._call("GET", path)
            executions = body.get("executions") or []
            if not isinstance(executions, list):
                raise Unavailable("the list of runs is not a list")
            for raw in executions:
                yield _execution(raw, names)
            token = body.get("nextPageToken") or ""
            if not isinstance(token, str):
                raise Unavailable("the next page token is not a string")
            if not token:
                return

    def signal_with_start(self, workflow_id: str, signal: str, request: dict[str, Any]) -> str:
        """SignalWithStartWorkflowExecution (`request` in the API's JSON); the run's id."""
        body = self._call(
            "POST",
            f"/workflows/{quote(workflow_id, safe='')}/signal-with-start/{quote(signal, safe='')}",
            request,
        )
        run_id = body.get("runId")
        if not isinstance(run_id, str) or not run_id:
            raise Unavailable("no run id in the answer")
        return run_id

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
                headers={"Content-Type": "application/json", "Accept": "application/json"},
            )
            response = conn.getresponse()
            raw = response.read()
        except TimeoutError:
            self.close()
            raise NoAnswer(f"no answer within {self._timeout:g} s") from None
        except (OSError, http.client.HTTPException) as err:
            self.close()
            raise Unavailable(f"Temporal's HTTP API at {self._host}:{self._port}: {err}") from None
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise Unavailable(f"not JSON from {self._host}:{self._port} (HTTP {response.status})") from None
        if response.status >= 400:
            if not isinstance(body, dict) or not isinstance(body.get("code"), int):
                raise Unavailable(f"HTTP {response.status} from {self._host}:{self._port}")
            raise ApiError(body["code"], str(body.get("message", "")))
        if not isinstance(body, dict):
            raise Unavailable("unexpected answer shape")
        return body

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self._connect_timeout)
            try:
                conn.connect()
            except OSError as err:
                raise Unavailable(f"Temporal's HTTP API at {self._host}:{self._port}: {err}") from None
            # Connected: from now on wait as long as a query may take.
            assert conn.sock is not None
            conn.sock.settimeout(self._timeout)
            self._conn = conn
        return self._conn
