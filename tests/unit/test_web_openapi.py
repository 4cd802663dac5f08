"""/openapi.json describes the state `GET /api/chats/{chat_id}` answers as the
models make it: every field of the turn's state, and of each of its subagents."""

from __future__ import annotations

from typing import Any, get_args

from turnkeeper.models import ApprovalRequest, DecisionRecord, DelegateMode, SubagentView, TurnState
from turnkeeper.statuses import TurnStatus
from turnkeeper.web.openapi import SPEC

SCHEMAS: dict[str, Any] = SPEC["components"]["schemas"]


def test_the_state_is_described_field_by_field() -> None:
    state = SCHEMAS["TurnState"]["properties"]
    assert set(state) == set(TurnState.model_fields)
    assert set(state["approvals"]["items"]["properties"]) == set(ApprovalRequest.model_fields)
    assert set(state["decisions"]["items"]["properties"]) == set(DecisionRecord.model_fields)
    assert state["subagents"]["items"] == {"$ref": "#/components/schemas/Subagent"}


def test_a_subagent_is_described_as_the_state_lists_it() -> None:
    sub = SCHEMAS["Subagent"]["properties"]
    assert set(sub) == set(SubagentView.model_fields)
    assert sub["mode"]["enum"] == list(get_args(DelegateMode))
    assert sub["status"]["enum"] == [s.value for s in TurnStatus]
    assert SCHEMAS["TurnState"]["properties"]["status"]["enum"] == [s.value for s in TurnStatus]
