"""`ChatTurn`s that running turns fail on (tests/replay/test_replay_command.py):
one that no recorded turn replays on, what a deploy without a `workflow.patched`
gate would ship, and one whose workflow task fails on a message that comes
after what the history holds."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue

from turnkeeper.models import ChatTurnInput, TurnState
from turnkeeper.workflows.chat_turn import ChatTurn


@workflow.defn(name="ChatTurn")
class IncompatibleChatTurn:
    @workflow.run
    async def run(self, input: Any) -> None:
        # A timer first, where every recorded turn begins with its store call.
        await workflow.sleep(timedelta(minutes=1))


@workflow.defn(name="ChatTurn")
class MessageFailingChatTurn(ChatTurn):
    """The real turn, but a message that reaches it from now on (not one its history
    holds) fails the workflow task: a deploy whose handler cannot take what clients send."""

    @workflow.signal(name="user_message")
    def user_message(self, payload: RawValue = None) -> None:  # type: ignore[assignment]
        if not workflow.unsafe.is_replaying():
            raise RuntimeError("this code cannot take the message")
        super().user_message(payload)

    @workflow.run
    async def run(self, input: ChatTurnInput) -> TurnState:
        return await super().run(input)
