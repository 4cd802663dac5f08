"""A `ChatTurn` that no recorded turn replays on: what a deploy without a
`workflow.patched` gate would ship (tests/replay/test_replay_command.py)."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow


@workflow.defn(name="ChatTurn")
class IncompatibleChatTurn:
    @workflow.run
    async def run(self, input: Any) -> None:
        # A timer first, where every recorded turn begins with its store call.
        await workflow.sleep(timedelta(minutes=1))
