"""What `status` and `list` read when Temporal's HTTP API has no known address
(TEMPORAL_ADDRESS set, TURNKEEPER_TEMPORAL_HTTP_ADDRESS not: a server's HTTP port
cannot be told from its gRPC address): the same three reads as
turnkeeper.cli.temporal_http, over the SDK's client, with the same errors. Which
one a command uses follows from the configuration alone, never from a failure."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from turnkeeper import client as tk
from turnkeeper.cli.temporal_http import ApiError, Execution, Unreachable
from turnkeeper.config import Settings

if TYPE_CHECKING:
    from temporalio.client import Client

UNKNOWN = 2  # gRPC's code for an error without one of its own (a failed query)


class TemporalGrpc:
    def __init__(self, settings: Settings, timeout: float) -> None:
        self.address = settings.temporal_address or ""
        self._timeout = timedelta(seconds=timeout)
        self._loop = asyncio.new_event_loop()
        try:
            self._client: Client = self._loop.run_until_complete(tk.connect(settings))
        except Exception as err:
            self._loop.close()
            raise Unreachable(tk.why_unreachable(err)) from None

    def describe_status(self, workflow_id: str) -> str:
        handle = self._client.get_workflow_handle(workflow_id)
        described = self._run(handle.describe(rpc_timeout=self._timeout))
        assert described.status is not None
        return described.status.name.lower()

    def query(self, workflow_id: str, query_type: str) -> bytes:
        from turnkeeper.models import TurnState

        handle = self._client.get_workflow_handle(workflow_id)
        state = self._run(handle.query(query_type, result_type=TurnState, rpc_timeout=self._timeout))
        return state.model_dump_json().encode()

    def list_workflows(self, query: str, names: tuple[str, ...]) -> Iterator[Execution]:
        async def listed() -> list[Execution]:
            return [
                Execution(
                    id=wf.id,
                    run_id=wf.run_id,
                    start_time=wf.start_time,
                    search_attributes={n: list(v) for n, v in wf.search_attributes.items() if n in names},
                )
                async for wf in self._client.list_workflows(query, rpc_timeout=self._timeout)
            ]

        yield from self._run(listed())

    def close(self) -> None:
        self._loop.close()

    def _run(self, call: Any) -> Any:
        from temporalio.client import WorkflowQueryFailedError
        from temporalio.service import RPCError

        try:
            return self._loop.run_until_complete(call)
        except RPCError as err:
            raise ApiError(int(err.status), err.message) from None
        except WorkflowQueryFailedError as err:
            raise ApiError(UNKNOWN, err.message) from None
