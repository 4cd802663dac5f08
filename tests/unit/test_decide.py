"""`turnkeeper.client.decide`: which server answers are asked again, and which are not."""
from __future__ import annotations

from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from turnkeeper import client as tk
from turnkeeper.models import TurnState, TurnStatus


class _Handle:
    def __init__(self, answers: list[Any]) -> None:
        self.answers, self.calls = answers, 0

    async def execute_update(self, *args: Any, **kwargs: Any) -> TurnState:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class _Client:
    def __init__(self, handle: _Handle) -> None:
        self.handle = handle

    def get_workflow_handle(self, workflow_id: str) -> _Handle:
        return self.handle


def _rpc(message: str) -> RPCError:
    return RPCError(message, RPCStatusCode.NOT_FOUND, b"")


@pytest.mark.parametrize("message", ["unexpected workflow task failure",
                                     "workflow update was aborted by closing workflow"])
async def test_an_update_the_run_never_took_is_asked_again(message: str) -> None:
    """The task that carried it failed, or the run closed before a task took it:
    asked again, it reaches the run that holds the chat now."""
    state = TurnState(chat_id="c", status=TurnStatus.RECOVERED)
    handle = _Handle([_rpc(message), state])
    assert await tk.decide(_Client(handle), "c", "dismiss_turn", "r1") == state  # type: ignore[arg-type]
    assert handle.calls == 2


async def test_other_server_answers_are_not_asked_again() -> None:
    handle = _Handle([_rpc("workflow execution already completed")])
    with pytest.raises(RPCError, match="already completed"):
        await tk.decide(_Client(handle), "c", "dismiss_turn", "r1")  # type: ignore[arg-type]
    assert handle.calls == 1
