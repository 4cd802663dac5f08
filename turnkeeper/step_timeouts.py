"""How long a turn's steps may take: the worker's to say, set as each step is scheduled.

A model or tool call's timeouts (how long it may run, how soon its worker's death
is noticed, how long it may wait for a worker: TURNKEEPER_MODEL_TIMEOUT,
TURNKEEPER_TOOL_TIMEOUT, TURNKEEPER_HEARTBEAT_TIMEOUT, TURNKEEPER_RESUME_WINDOW)
are options of the command that schedules it and nothing the workflow decides
on (a store write's heartbeat timeout is the worker's too): a replay matches commands by their kind and order, never by their timeouts.
So the worker's own settings fill them in here, from the first step of a run on,
instead of reaching the workflow as an activity result a step later. A worker
without this interceptor schedules steps with the defaults.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.worker import (
    Interceptor,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.workflow import ActivityHandle

from turnkeeper import activity_io
from turnkeeper.config import Settings


class StepTimeouts(Interceptor):
    def __init__(self, settings: Settings) -> None:
        resume = timedelta(seconds=settings.resume_window)
        heartbeat = timedelta(seconds=settings.heartbeat_timeout)
        self._heartbeat = heartbeat
        self._timeouts = {
            activity_io.MODEL_CALL: (timedelta(seconds=settings.model_timeout), resume, heartbeat),
            activity_io.TOOL_CALL: (timedelta(seconds=settings.tool_timeout), resume, heartbeat),
        }

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        timeouts, heartbeat = self._timeouts, self._heartbeat

        class _Outbound(WorkflowOutboundInterceptor):
            def start_activity(self, input: StartActivityInput) -> ActivityHandle[Any]:
                known = timeouts.get(input.activity)
                if known is not None:
                    input.start_to_close_timeout, input.schedule_to_start_timeout, input.heartbeat_timeout = (
                        known
                    )
                elif input.heartbeat_timeout is not None:  # a store write: its worker's death noticed as soon
                    input.heartbeat_timeout = heartbeat
                return super().start_activity(input)

        class _Inbound(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(_Outbound(outbound))

        return _Inbound
