"""The model activity: commit the new user rows, build the context from the store
(the chat's summary and its latest rows, folding older ones as the budget needs:
activities/context.py), call the provider (streaming its text to the chat's
draft), record the assistant row. The history never passes through the
workflow, so workflow histories stay small."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from turnkeeper import activity_io
from turnkeeper.activities.context import ContextBuilder, context_budget
from turnkeeper.activities.drafts import DraftWriter
from turnkeeper.activities.heartbeat import heartbeating
from turnkeeper.activities.providers import ModelProvider, ProviderError
from turnkeeper.activities.providers.base import well_formed
from turnkeeper.activities.subagent_activities import allowed_tools, instructions
from turnkeeper.activities.tools import ToolRegistry
from turnkeeper.config import Settings
from turnkeeper.store import (
    CorruptRowError,
    SessionStore,
    StoreUnavailable,
    inline_calls,
)
from turnkeeper.telemetry import metrics

T = TypeVar("T")


class ModelCallActivity:
    def __init__(
        self,
        settings: Settings,
        store: SessionStore,
        provider: ModelProvider,
        registry: ToolRegistry,
        begin: Callable[[activity_io.BeginTurnInput], Awaitable[activity_io.BeginTurnResult]] | None = None,
    ) -> None:
        self._begin = begin
        self._settings = settings
        self._store = store
        self._provider = provider
        self._registry = registry
        self._context = ContextBuilder(
            store, provider, context_budget(settings, provider), guard=_unless_shutdown
        )

    @activity.defn(name=activity_io.MODEL_CALL)
    async def model_call(self, inp: activity_io.ModelCallInput) -> activity_io.ModelCallResult:
        with inline_calls():
            return await self._model_call(inp)

    async def _model_call(self, inp: activity_io.ModelCallInput) -> activity_io.ModelCallResult:
        async with heartbeating():
            began: activity_io.BeginTurnResult | None = None
            if inp.begins_turn:
                if self._begin is None:
                    raise ApplicationError(
                        "this worker's model activity cannot number a turn", non_retryable=True
                    )
                # The run's first call numbers its turn: one round trip fewer than a
                # step of its own. Idempotent by the run's id, as every retry needs.
                try:
                    began = await self._begin(
                        activity_io.BeginTurnInput(
                            chat_id=inp.chat_id,
                            run_id=activity.info().workflow_run_id or "",
                            message_ids=[m.message_id for m in inp.new_messages],
                            message_sizes=[len(m.text.encode()) for m in inp.new_messages],
                        )
                    )
                except StoreUnavailable as err:
                    raise ApplicationError(
                        str(err), type=activity_io.STORE_UNAVAILABLE_ERROR, non_retryable=True
                    ) from None
                if began.turn is None:
                    return activity_io.ModelCallResult(reply=None, began=began)
                left_out = set(began.duplicate_ids) | set(began.oversized_ids)
                inp = inp.model_copy(
                    update={
                        "turn": began.turn,
                        "new_messages": [m for m in inp.new_messages if m.message_id not in left_out],
                    }
                )
            # A subagent sees its profile's tools and instructions (docs/tools.md).
            tools = self._registry.specs(allowed_tools(self._settings, inp.subagent))
            told = instructions(self._settings, inp.subagent)
            try:
                prepared = await self._store.prepare_model_call(
                    inp.chat_id, inp.turn, inp.new_messages, answer_lost_calls=inp.answer_lost_calls
                )
                committed = prepared.committed
                if isinstance(prepared.context, CorruptRowError):
                    raise prepared.context
                context = await self._context.build(inp.chat_id, tools, prepared.context, instructions=told)
            except CorruptRowError as err:
                # Retrying reads the same row: the user sees it named, and can Dismiss.
                raise ApplicationError(
                    f"the chat's stored transcript cannot be read: {err}",
                    type=activity_io.CHECKPOINT_INVALID_ERROR,
                    non_retryable=True,
                ) from None
            except StoreUnavailable as err:
                # No answer was asked of the provider yet (a summary made is kept or made
                # again): the workflow waits and calls again.
                raise ApplicationError(
                    str(err), type=activity_io.STORE_UNAVAILABLE_ERROR, non_retryable=True
                ) from None
            except ProviderError as err:
                raise _model_failed(err) from None  # summarising the older rows failed
            started = time.monotonic()
            try:
                if self._settings.stream:
                    async with DraftWriter(self._store, inp.chat_id, inp.turn, inp.step) as draft:
                        reply = await _unless_shutdown(
                            self._provider.complete(
                                context.messages, tools, call_index=context.call_index, on_text=draft
                            )
                        )
                else:
                    reply = await _unless_shutdown(
                        self._provider.complete(context.messages, tools, call_index=context.call_index)
                    )
            except ProviderError as err:
                metrics.model_call_took(activity.metric_meter(), time.monotonic() - started)
                raise _model_failed(err) from None
            metrics.model_call_took(activity.metric_meter(), time.monotonic() - started)
            try:
                reply = await self._context.unique_call_ids(inp.chat_id, well_formed(reply), context)
                await self._store.record_assistant(
                    inp.chat_id, inp.turn, inp.step, reply, final=reply.is_final and inp.closes_turn
                )
            except StoreUnavailable as err:
                # The answer is not lost with the store: the workflow records it once it is back.
                activity.logger.warning("the reply of chat %s is recorded later: %s", inp.chat_id, err)
                return activity_io.ModelCallResult(
                    reply=reply, began=began, committed_ids=committed, recorded=False
                )
            return activity_io.ModelCallResult(reply=reply, began=began, committed_ids=committed)


def _model_failed(err: ProviderError) -> ApplicationError:
    # The provider's own retries are spent: the user decides what happens next.
    kind = "transient" if err.retryable else "permanent"
    return ApplicationError(
        f"model provider failed ({kind}): {err}", type=activity_io.MODEL_FAILED_ERROR, non_retryable=True
    )


async def _unless_shutdown(call: Awaitable[T]) -> T:
    """Run the provider call, abandoning it if the worker shuts down: nothing
    happened outside yet, so the workflow can give the call to the next worker."""
    task = asyncio.ensure_future(call)
    shutdown = asyncio.ensure_future(activity.wait_for_worker_shutdown())
    try:
        await asyncio.wait({task, shutdown}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()  # the activity was cancelled (Stop, Dismiss): so is the provider's request
        raise
    finally:
        shutdown.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ApplicationError(
        "the worker is shutting down; the model call goes to the next worker",
        type=activity_io.WORKER_SHUTDOWN_ERROR,
        non_retryable=True,
    )
