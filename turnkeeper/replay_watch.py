"""A workflow runner for replays that notes each run whose workflow code failed.

The SDK's `Replayer` reports a failure in a workflow task that the history
completed. Past the history's last completed task lie the events a worker of
this code would take next (a signal sent meanwhile, a step's result): the
replay runs that task too, but a failure there is only logged, and the
replayer's own eviction at the history's end hides it. A running turn whose
next task fails on the new code is a turn the deploy would wedge. Used by
`turnkeeper replay`, the recorded-history replay test and the chaos check.
"""

from __future__ import annotations

from typing import Any

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner


class FailureWatch(WorkflowRunner):
    """`runner`, noting by run id the first activation whose workflow code failed."""

    def __init__(self, runner: WorkflowRunner) -> None:
        self._runner = runner
        self.failures: dict[str, str] = {}

    def next_task_failure(self, run_id: str) -> str | None:
        """Why the run's workflow code failed, for a replay that reported nothing."""
        failed = self.failures.get(run_id)
        return None if failed is None else f"its next workflow task fails: {failed}"

    def prepare_workflow(self, defn: Any) -> None:
        self._runner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _WatchedInstance(self._runner.create_instance(det), self.failures)

    def set_worker_level_failure_exception_types(self, types: Any) -> None:
        self._runner.set_worker_level_failure_exception_types(types)


class _WatchedInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance, failures: dict[str, str]) -> None:
        self._inner = inner
        self._failures = failures

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        completion = self._inner.activate(act)
        if completion.HasField("failed"):
            self._failures.setdefault(act.run_id, completion.failed.failure.message)
        return completion

    # The rest as the wrapped instance answers it.
    def get_serialization_context(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.get_serialization_context(*args, **kwargs)

    def get_external_store_context(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.get_external_store_context(*args, **kwargs)

    def get_info(self) -> Any:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()
