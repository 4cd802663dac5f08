"""`ChatTurn`: one run per chat turn, workflow id `chat-<chat_id>`.

The handlers only append what they receive; `workflows/turn_loop.py` takes it,
in history order, and decides. Continue, Dismiss and Stop are signals: a client
that needs the answer passes a `request_id` and reads it back from `state`
(`decisions`), as turnkeeper.client.decide does. There are no updates: a cold
worker can run an update's handler before an activity result that the history
applied first (tests/replay/test_sdk_update_order.py).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    # Passed through: re-importing pydantic models in every run's sandbox is slow.
    from turnkeeper.models import ChatTurnInput, TurnState
    from turnkeeper.workflows.inputs import Signal
    from turnkeeper.workflows.turn_loop import Turn


@workflow.defn(name="ChatTurn")
class ChatTurn:
    @workflow.init
    def __init__(self, input: ChatTurnInput) -> None:
        self._turn = Turn(input)

    # Raw payloads: a malformed one is refused in words, never dropped by the converter.
    @workflow.signal(
        name="user_message",
        description=(
            'A message to the chat: {"message_id", "text", "sender"?}. The same message_id twice is one message.'
        ),
    )
    def user_message(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        self._turn.inputs.append(Signal("user_message", payload))

    @workflow.signal(
        name="continue",
        description=(
            'Continue the waiting turn (Approve at an approval gate): {"recovery_id", "request_id"?}.'
        ),
    )
    def continue_signal(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        self._turn.inputs.append(Signal("continue", payload))

    @workflow.signal(
        name="dismiss",
        description=(
            'Dismiss the waiting or resuming turn (Deny at an approval gate): {"recovery_id", "request_id"?}.'
        ),
    )
    def dismiss_signal(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        self._turn.inputs.append(Signal("dismiss", payload))

    @workflow.signal(
        name="stop",
        description=(
            'Stop the running turn: completed results kept, running tools interrupted. {} or {"request_id"}.'
        ),
    )
    def stop(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        self._turn.inputs.append(Signal("stop", payload))

    @workflow.signal(
        name="subagent",
        description="Sent by a subagent's run this turn waits for: its gate opened or closed.",
    )
    def subagent(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        self._turn.inputs.append(Signal("subagent", payload))

    @workflow.query(
        name="state",
        description=(
            "The turn: status, reason, recovery_id, can_continue, pending follow-ups, tool calls, decisions."
        ),
    )
    def state(self) -> TurnState:
        return self._turn.query()

    @workflow.run
    async def run(self, input: ChatTurnInput) -> TurnState:
        if not input.chat_id.strip():
            raise ApplicationError("chat_id must not be empty", non_retryable=True)
        return await self._turn.run(input)
