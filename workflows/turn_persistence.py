"""The turn's store calls and announcements, as a mixin of `ChatTurn`.

Persist, then announce: every state change goes to the store's turn row with its
events, then to the search attributes. Every store call waits out an outage
(`store_unavailable` in `state`) instead of failing the run.
"""
from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from turnkeeper import activity_io
    from turnkeeper.models import (
        NewEvent,
        TurnState,
        UserMessage,
    )
    from turnkeeper.search_attributes import CHAT_ID_ATTR, RECOVERY_REASON_ATTR, TURN_STATUS_ATTR
    from turnkeeper.workflows.activity_calls import call_store, end_of_run, error_type, failure_text

STORE_WAIT_FIRST_S = 1.0
STORE_WAIT_MAX_S = 30.0


class TurnPersistence:
    """Needs `_state`, `_events`, `_before_turn` and `_store_wait_s` from the workflow."""

    _state: TurnState
    _events: list[NewEvent]
    _before_turn: bool
    _store_wait_s: float
    _events_numbered: int = 0  # this run's events so far: each one's store key (before RECOVERY_MACHINE_5)
    _machine_5: bool
    _store_calls: int = 0  # store calls made by this run so far
    _woke_at_store_calls: int = -1  # `_store_calls` when a step's wait last ended
    _store_result_last = False  # a store call's result is what last woke the run, as far as it knows
    _machine_9: bool

    async def _store_call(self, activity: str, arg: Any, result_type: Any = None) -> Any:
        """A store local activity that waits out an outage: the turn shows
        `store_unavailable` and goes on, in order, when the store answers again."""
        self._store_calls += 1
        while True:
            try:
                result = await call_store(activity, arg, result_type)
            except (ActivityError, ApplicationError) as err:
                # A local activity's failure arrives as the ApplicationError itself.
                if error_type(err) != activity_io.STORE_UNAVAILABLE_ERROR:
                    raise
                await self._wait_for_store(failure_text(err))
                continue
            self._store_answers()
            self._store_result_last = True
            return result

    async def _wake_on_an_event(self) -> None:
        """Before a run ends or hands on, or judges a store check (machine 10): if a
        store call's result last woke it, wait for an activity's completion, so that
        it acts on an event in its history (patches.RECOVERY_MACHINE_9). Signals may
        have come meanwhile."""
        if self._machine_9 and self._store_result_last:
            await end_of_run()
            self._store_result_last = False

    async def _wait_for_store(self, why: str | None) -> None:
        if not self._state.store_unavailable:
            self._state.store_unavailable = True
            self._store_wait_s = STORE_WAIT_FIRST_S
            workflow.logger.warning("chat %s: the session store is unavailable, the turn waits: %s",
                                    self._state.chat_id, why)
        await asyncio.sleep(self._store_wait_s)
        self._store_wait_s = min(self._store_wait_s * 2, STORE_WAIT_MAX_S)

    def _store_answers(self) -> None:
        if self._state.store_unavailable:
            self._state.store_unavailable = False
            workflow.logger.info("chat %s: the session store answers again", self._state.chat_id)

    async def _persist_state(self) -> bool:
        """Persist, then announce: the store row and its events, then the search
        attributes. False when the store had already ended the turn (its
        completion wins): the state then follows the store."""
        written: activity_io.TurnWriteResult | None = await self._store_call(
            activity_io.UPDATE_TURN, self._turn_update(), activity_io.TurnWriteResult | None)
        self._follow_store(written)
        self._upsert_search_attributes()
        return written is None or written.written

    async def _finish_turn(self, closing_text: str | None = None,
                           commit_messages: list[UserMessage] | None = None) -> None:
        update = self._turn_update()
        update.closing_text = closing_text
        update.commit_messages = commit_messages or []
        written: activity_io.TurnWriteResult | None = await self._store_call(
            activity_io.FINISH_TURN, update, activity_io.TurnWriteResult | None)
        self._follow_store(written)
        self._upsert_search_attributes()

    def _follow_store(self, written: activity_io.TurnWriteResult | None) -> None:
        # None: recorded by a release whose store writes returned nothing.
        if written is not None and not written.written:
            self._state.status = written.status
            self._state.reason = written.reason

    def _turn_update(self) -> activity_io.UpdateTurnInput:
        s = self._state
        return activity_io.UpdateTurnInput(chat_id=s.chat_id, turn=s.turn, status=s.status, reason=s.reason,
                                           recovery_id=s.recovery_id, can_continue=s.can_continue,
                                           attempts=s.attempts, detail=s.detail)

    async def _announce_refusals(self) -> None:
        # Refusals that arrive while one batch is being written go in the next.
        while self._events and self._before_turn:
            await self._flush_events()

    async def _flush_events(self) -> None:
        if not self._events:
            return
        events, self._events = self._events, []
        run_id, first = workflow.info().run_id, self._events_numbered
        self._events_numbered += len(events)
        if self._machine_5:
            keys = [self._content_key(run_id, event) for event in events]
        else:
            keys = [f"{run_id}/{first + i}" for i in range(len(events))]
        await self._store_call(activity_io.APPEND_EVENTS,
                               activity_io.AppendEventsInput(chat_id=self._state.chat_id, events=events, keys=keys))

    def _content_key(self, run_id: str, event: NewEvent) -> str:
        """The event's store key: what it says, and how many times this run said it
        before. A workflow task that timed out (its worker killed) keeps the store
        writes of its local activities; its retry may announce the same refusals in
        another order, or others besides. A key by position then matched another
        event's, and the store dropped that one as written already."""
        digest = hashlib.sha256(event.model_dump_json().encode()).hexdigest()[:32]
        seen = self._event_keys_seen.get(digest, 0)
        self._event_keys_seen[digest] = seen + 1
        return f"{run_id}/{digest}/{seen}"

    def _search_attributes_current(self) -> bool:
        """Our client sets them at start; an operator's signal-with-start does not."""
        current = workflow.info().typed_search_attributes
        return (current.get(CHAT_ID_ATTR) == self._state.chat_id
                and current.get(TURN_STATUS_ATTR) == self._state.status.value)

    def _upsert_search_attributes(self) -> None:
        reason = self._state.reason
        workflow.upsert_search_attributes([
            CHAT_ID_ATTR.value_set(self._state.chat_id),
            TURN_STATUS_ATTR.value_set(self._state.status.value),
            RECOVERY_REASON_ATTR.value_set(reason.value) if reason else RECOVERY_REASON_ATTR.value_unset(),
        ])
