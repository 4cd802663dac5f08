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

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner

from turnkeeper.runner_wrap import WrappedInstance, WrappedRunner


class FailureWatch(WrappedRunner):
    """`runner`, noting by run id the first activation whose workflow code failed."""

    def __init__(self, runner: WorkflowRunner) -> None:
        super().__init__(runner)
        self.failures: dict[str, str] = {}

    def next_task_failure(self, run_id: str) -> str | None:
        """Why the run's workflow code failed, for a replay that reported nothing."""
        failed = self.failures.get(run_id)
        return None if failed is None else f"its next workflow task fails: {failed}"

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _WatchedInstance(self._runner.create_instance(det), self.failures)


class _WatchedInstance(WrappedInstance):
    def __init__(self, inner: WorkflowInstance, failures: dict[str, str]) -> None:
        super().__init__(inner)
        self._failures = failures

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        completion = self._inner.activate(act)
        if completion.HasField("failed"):
            self._failures.setdefault(act.run_id, completion.failed.failure.message)
        return completion
