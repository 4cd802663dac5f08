"""turnkeeper/subagents.py: the delegate tool's arguments, its bounds in words, the ids it derives,
and the delegating turn's bookkeeping of its subagents."""

from __future__ import annotations

import pytest

from turnkeeper import subagents
from turnkeeper.activity_io import SubagentLimits
from turnkeeper.chat_ids import valid_chat_id
from turnkeeper.models import Reason, SubagentLink, SubagentView, ToolCall, TurnState, TurnStatus

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


# -- the delegating turn's bookkeeping -----------------------------------------------


def _link(mode: str = "wait", call_id: str = "d1") -> SubagentLink:
    parent = TurnState(chat_id="p", turn=3)
    return subagents.link_of(parent, "chat-p", call_id, 1, _args(mode=mode, task="sum the numbers"))


def _view(chat_id: str, status: TurnStatus, recovery_id: str | None = None) -> SubagentView:
    return SubagentView(
        mode="wait",
        chat_id=chat_id,
        workflow_id=f"chat-{chat_id}",
        tool_call_id="d",
        task="t",
        status=status,
        recovery_id=recovery_id,
    )


def test_a_delegate_calls_link_and_first_view_follow_from_the_call() -> None:
    link = _link(mode="background")
    assert (link.parent_chat_id, link.parent_workflow_id, link.parent_turn, link.tool_call_id) == (
        "p",
        "chat-p",
        3,
        "d1",
    )
    assert (link.depth, link.mode, link.profile, link.task) == (1, "background", None, "sum the numbers")
    view = subagents.first_view(link)
    assert view.chat_id == subagents.sub_chat_id("p", 3, "d1") and view.workflow_id == f"chat-{view.chat_id}"
    assert (view.tool_call_id, view.mode, view.status) == ("d1", "background", TurnStatus.RUNNING)


def test_the_childs_input_carries_the_task_as_its_first_message() -> None:
    link = _link()
    child = subagents.child_input("p.sub3-x", link)
    assert (child.chat_id, child.parent) == ("p.sub3-x", link)
    [task] = child.pending
    assert (task.message_id, task.text, task.sender) == ("delegated:d1", "sum the numbers", "delegate")


def test_a_delegate_call_ending_in_words_is_an_error_the_loop_records() -> None:
    call = ToolCall(id="d1", name="delegate", arguments="{}")
    result = subagents.error_result(call, "Error: no")
    assert (result.tool_call_id, result.name, result.status, result.content) == (
        "d1",
        "delegate",
        "error",
        "Error: no",
    )
    assert result.recorded is False


def test_the_result_record_says_how_the_subagent_ended_or_that_it_runs_on() -> None:
    parent, call = TurnState(chat_id="p", turn=3), ToolCall(id="d1", name="delegate", arguments="{}")
    ended = TurnState(chat_id="s", turn=1, status=TurnStatus.FAILED, reason=Reason.TOOL_STATE_UNKNOWN)
    waited = subagents.result_record(parent, call, "s", ended, background=False)
    assert (waited.chat_id, waited.turn, waited.call, waited.sub_chat_id) == ("p", 3, call, "s")
    assert (waited.sub_turn, waited.sub_status, waited.sub_reason, waited.background) == (
        1,
        TurnStatus.FAILED,
        Reason.TOOL_STATE_UNKNOWN,
        False,
    )
    started = subagents.result_record(parent, call, "s", None, background=True)
    assert (started.sub_turn, started.sub_status, started.sub_reason, started.background) == (
        0,
        TurnStatus.RUNNING,
        None,
        True,
    )


def test_news_reaches_only_its_subagents_view_while_it_runs_or_waits() -> None:
    views = [
        _view("a", TurnStatus.RUNNING),
        _view("b", TurnStatus.RUNNING),
        _view("a", TurnStatus.RECOVERED),  # dismissed: late news changes nothing
    ]
    news = _view("a", TurnStatus.AWAITING_USER, "r1")
    news.reason, news.can_continue = Reason.TOOL_STATE_UNKNOWN, False
    subagents.take_news(views, news)
    assert (views[0].status, views[0].reason, views[0].recovery_id, views[0].can_continue) == (
        TurnStatus.AWAITING_USER,
        Reason.TOOL_STATE_UNKNOWN,
        "r1",
        False,
    )
    assert (views[1].status, views[2].status) == (TurnStatus.RUNNING, TurnStatus.RECOVERED)
    subagents.take_news(views, _view("a", TurnStatus.RESUMING, "r1"))
    assert views[0].status == TurnStatus.RESUMING


def test_a_decision_goes_to_the_waiting_subagents_at_its_gate() -> None:
    views = [
        _view("a", TurnStatus.AWAITING_USER, "r1"),
        _view("b", TurnStatus.AWAITING_USER, "r2"),
        _view("c", TurnStatus.RESUMING, "r1"),
    ]
    background = _view("d", TurnStatus.AWAITING_USER, "r1")
    background.mode = "background"
    views.append(background)
    assert subagents.decide(views, "continue", "r1") == [views[0]]
    assert [v.status for v in views] == [
        TurnStatus.RESUMING,
        TurnStatus.AWAITING_USER,
        TurnStatus.RESUMING,
        TurnStatus.AWAITING_USER,
    ]
    assert subagents.decide(views, "dismiss", "r2") == [views[1]] and views[1].status == TurnStatus.RECOVERED
    assert subagents.decide(views, "dismiss", "r2") == []


def test_a_gate_event_only_when_what_the_user_sees_changed() -> None:
    before = TurnState(chat_id="p", turn=2)
    assert subagents.gate_event(before, before.model_copy()) is None
    after = before.model_copy(
        update={
            "status": TurnStatus.AWAITING_USER,
            "reason": Reason.SUBAGENT_WAITING,
            "recovery_id": "r1",
            "detail": "subagent s waits for the user: waiting",
        }
    )
    event = subagents.gate_event(before, after)
    assert event is not None and event.type == "recovery_state"
    assert event.payload == {
        "turn": 2,
        "status": "awaiting_user",
        "reason": "subagent_waiting",
        "recovery_id": "r1",
        "can_continue": after.can_continue,
        "attempts": after.attempts,
        "detail": "subagent s waits for the user: waiting",
    }
    gone = subagents.gate_event(after, before)
    assert gone is not None and gone.payload["status"] == "running" and gone.payload["reason"] is None


def test_only_a_background_subagents_ended_turn_reports_to_its_parent() -> None:
    ended = TurnState(chat_id="p.sub3-x", turn=1, status=TurnStatus.COMPLETED)
    link = _link(mode="background")
    report = subagents.report(ended, link)
    assert report is not None
    assert (report.sub_chat_id, report.sub_turn, report.sub_status, report.sub_reason, report.parent) == (
        "p.sub3-x",
        1,
        TurnStatus.COMPLETED,
        None,
        link,
    )
    assert subagents.report(ended, None) is None
    assert subagents.report(ended, _link(mode="wait")) is None
    assert subagents.report(TurnState(chat_id="p.sub3-x"), link) is None  # no turn taken
