"""A workflow runner around another one, for code that reads every activation
(turnkeeper/worker/catch_up.py, turnkeeper/replay_watch.py): subclasses give
`create_instance` and `activate`; the rest is the wrapped runner's."""

from __future__ import annotations

from typing import Any

from temporalio.worker import WorkflowInstance, WorkflowRunner


class WrappedRunner(WorkflowRunner):
    def __init__(self, runner: WorkflowRunner) -> None:
        self._runner = runner

    def prepare_workflow(self, defn: Any) -> None:
        self._runner.prepare_workflow(defn)

    def set_worker_level_failure_exception_types(self, types: Any) -> None:
        self._runner.set_worker_level_failure_exception_types(types)


class WrappedInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance) -> None:
        self._inner = inner

    def get_serialization_context(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.get_serialization_context(*args, **kwargs)

    def get_external_store_context(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.get_external_store_context(*args, **kwargs)

    def get_info(self) -> Any:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()
