"""turnkeeper/subagents.py: the delegate tool's arguments, its bounds in words, the ids it derives."""

from __future__ import annotations

import pytest

from turnkeeper import subagents
from turnkeeper.activity_io import SubagentLimits
from turnkeeper.chat_ids import valid_chat_id
from turnkeeper.models import Reason, SubagentLink, TurnState, TurnStatus

LIMITS = SubagentLimits(max_depth=2, max_fanout=3, profiles=["reader"])


def _args(**kw: object) -> subagents.DelegateArgs:
    return subagents.DelegateArgs.model_validate({"task": "t", **kw})


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        ("not json", "delegate arguments are not JSON"),
        ("{}", "delegate task: Field required"),
        ('{"task": ""}', "delegate task: String should have at least 1 character"),
        ('{"task": "t", "mode": "later"}', "delegate mode: Input should be 'wait' or 'background'"),
        ('{"task": "t", "colour": "red"}', "delegate colour: Extra inputs are not permitted"),
    ],
)
def test_malformed_arguments_are_refused_in_words(arguments: str, words: str) -> None:
    with pytest.raises(subagents.DelegateRefused, match=words):
        subagents.parse_args(arguments)


def test_arguments_default_to_waiting_without_a_profile() -> None:
    args = subagents.parse_args('{"task": "sum the numbers"}')
    assert (args.task, args.mode, args.profile) == ("sum the numbers", "wait", None)


def test_the_bounds_refuse_in_words_and_allow_within_them() -> None:
    assert subagents.refusal(LIMITS, depth=2, nth_in_step=3, args=_args(profile="reader")) is None
    assert "nest at most 2 deep" in str(subagents.refusal(LIMITS, 3, 1, _args()))
    assert "at most 3 delegate calls" in str(subagents.refusal(LIMITS, 1, 4, _args()))
    assert "no subagent profile 'writer' (profiles: reader)" in str(
        subagents.refusal(LIMITS, 1, 1, _args(profile="writer"))
    )


def test_a_sub_chat_id_is_the_same_for_the_same_call_and_always_a_valid_chat_id() -> None:
    longest = "c" * 128
    first = subagents.sub_chat_id(longest, 12, "call_1")
    assert first == subagents.sub_chat_id(longest, 12, "call_1") and valid_chat_id(first)
    assert first != subagents.sub_chat_id(longest, 12, "call_2")
    assert first != subagents.sub_chat_id(longest, 13, "call_1")
    assert subagents.sub_chat_id("chat", 1, "x").startswith("chat.sub1-")


def test_a_subagents_view_for_its_parent() -> None:
    link = SubagentLink(
        parent_chat_id="p", parent_workflow_id="chat-p", parent_turn=1, tool_call_id="d1", task="x" * 500
    )
    state = TurnState(chat_id="p.sub1-abc", status=TurnStatus.AWAITING_USER, reason=Reason.TOOL_STATE_UNKNOWN)
    state.recovery_id = "r1"
    view = subagents.view_of(state, link, "chat-p.sub1-abc")
    assert (view.status, view.reason, view.recovery_id, view.mode) == (
        state.status,
        state.reason,
        "r1",
        "wait",
    )
    assert len(view.task) == subagents.TASK_SHOWN and view.task.endswith("...")
    assert subagents.report_message_id("p.sub1-abc", 2) == "subagent:p.sub1-abc:2"
