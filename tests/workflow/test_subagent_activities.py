"""REPORT_TO_PARENT (activities/subagent_activities.py) on the session's dev server:
a background subagent's answer reaches its parent's chat as a `user_message` by
signal-with-start, with the worker's own client; one message id per sub-turn, so a
retry is the same message, which the chat takes once. The activity ends once the
parent's chat holds the message; without a word from it, its attempt fails retryably."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from tests.support import Stack, until_async
from turnkeeper import activity_io
from turnkeeper import client as tk
from turnkeeper.activities.subagent_activities import REPORT_NOT_JUDGED, SubagentActivities, report_text
from turnkeeper.models import ModelReply, Reason, SubagentLink, TurnStatus, UserMessage
from turnkeeper.subagents import SUBAGENT_SENDER, report_message_id


def report(
    parent: str, sub: str, status: TurnStatus, reason: Reason | None = None
) -> activity_io.ReportToParentInput:
    return activity_io.ReportToParentInput(
        sub_chat_id=sub,
        sub_turn=1,
        sub_status=status,
        sub_reason=reason,
        parent=SubagentLink(
            parent_chat_id=parent,
            parent_workflow_id=tk.workflow_id(parent),
            parent_turn=1,
            tool_call_id="call_0_0",
            mode="background",
            task="count the files",
        ),
    )


async def answered_sub_chat(stack: Stack, sub: str, answer: str) -> None:
    store = await stack.store()
    await store.begin_turn(sub, "sub-run", ["task"])
    await store.commit_user_messages(sub, 1, [UserMessage(message_id="task", text="count the files")])
    await store.record_assistant(sub, 1, 0, ModelReply(text=answer), final=True)


async def signalled(stack: Stack, parent: str) -> list[UserMessage]:
    """The `user_message` signals the parent's run took, decoded as its worker would."""
    history = await stack.client.get_workflow_handle(tk.workflow_id(parent)).fetch_history()
    converter = stack.client.data_converter
    out: list[UserMessage] = []
    for event in history.events:
        attrs = event.workflow_execution_signaled_event_attributes
        if (
            event.HasField("workflow_execution_signaled_event_attributes")
            and attrs.signal_name == "user_message"
        ):
            (message,) = await converter.decode(attrs.input.payloads, [UserMessage])
            out.append(message)
    return out


async def unjudged(
    env: ActivityEnvironment, acts: SubagentActivities, inp: activity_io.ReportToParentInput
) -> None:
    """No worker serves the queue: the report is sent, and no run says whether it took it
    within the attempt's time (ActivityEnvironment's: 1 s)."""
    with pytest.raises(ApplicationError) as failed:
        await env.run(acts.report_to_parent, inp)
    assert failed.value.type == REPORT_NOT_JUDGED and not failed.value.non_retryable


async def test_a_report_is_one_message_in_the_parents_chat_however_often_it_is_sent(stack: Stack) -> None:
    """No worker serves the queue: the run holds the signals as sent."""
    parent, sub = stack.chat("parent"), stack.chat("parent.sub1")
    await answered_sub_chat(stack, sub, "There are 3 files.")
    acts = SubagentActivities(stack.settings(), await stack.store())
    env = ActivityEnvironment(client=stack.client)
    inp = report(parent, sub, TurnStatus.COMPLETED)
    await unjudged(env, acts, inp)
    await unjudged(env, acts, inp)  # a retry
    try:
        sent = await signalled(stack, parent)
        assert len(sent) == 2 and sent[0] == sent[1]  # the same message: the run takes it once
        assert sent[0] == UserMessage(
            message_id=report_message_id(sub, 1),
            text=f"Subagent (chat {sub}, task: count the files) answered:\nThere are 3 files.",
            sender=SUBAGENT_SENDER,
        )
    finally:
        await stack.client.get_workflow_handle(tk.workflow_id(parent)).terminate("test over")


async def test_a_long_report_is_cut_to_fit_and_one_that_did_not_answer_says_how_it_ended(
    stack: Stack,
) -> None:
    parent, sub = stack.chat("parent"), stack.chat("parent.sub1")
    await answered_sub_chat(stack, sub, "x" * 5000)
    settings = stack.settings(TURNKEEPER_MAX_MESSAGE_BYTES="1000")
    acts = SubagentActivities(settings, await stack.store())
    env = ActivityEnvironment(client=stack.client)
    await unjudged(env, acts, report(parent, sub, TurnStatus.COMPLETED))
    stopped = report(parent, sub, TurnStatus.RECOVERED, Reason.STOPPED).model_copy(update={"sub_turn": 2})
    await unjudged(env, acts, stopped)
    try:
        long, ended = await signalled(stack, parent)
        whole = len(report_text(sub, "count the files", True, "x" * 5000).encode())
        assert len(long.text.encode()) <= 1000
        assert long.text.endswith(f"[cut to fit a message: {whole} bytes in all]")
        assert ended.message_id == report_message_id(sub, 2) != long.message_id
        assert ended.text == (
            f"Subagent (chat {sub}, task: count the files) ended without an answer:\n"
            f"Error: the subagent's turn ended recovered/stopped; its transcript is in chat {sub}"
        )
    finally:
        await stack.client.get_workflow_handle(tk.workflow_id(parent)).terminate("test over")


async def test_the_parents_chat_takes_a_report_sent_twice_once(stack: Stack) -> None:
    """With a worker and the demo model: one user row, and the demo's acknowledgement."""
    stack.env_extra["TURNKEEPER_MODEL"] = "demo"
    await stack.start_worker()
    parent, sub = stack.chat("parent"), stack.chat("parent.sub1")
    await answered_sub_chat(stack, sub, "There are 3 files.")
    acts = SubagentActivities(stack.settings(), await stack.store())
    env = ActivityEnvironment(client=stack.client)
    env.info = dataclasses.replace(env.info, start_to_close_timeout=timedelta(seconds=30))  # the workflow's
    inp = report(parent, sub, TurnStatus.COMPLETED)
    await env.run(acts.report_to_parent, inp)  # returns once the chat holds it
    await stack.wait_turn_done(parent, 1)
    run_id = (await stack.client.get_workflow_handle(tk.workflow_id(parent)).describe()).run_id
    await env.run(acts.report_to_parent, inp)  # a retry after the chat committed it: nothing is sent
    handle = stack.client.get_workflow_handle(tk.workflow_id(parent))
    assert (await handle.describe()).run_id == run_id
    # An attempt lost after its send sent it too: a run that takes nothing.
    (sent,) = await signalled(stack, parent)
    await tk.send_message(stack.client, stack.settings(), parent, sent)

    async def closed() -> bool:
        return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING

    await until_async(closed, 20, "the retry's run closed")
    history = await stack.history(parent)
    assert [m["role"] for m in history] == ["user", "assistant"]
    assert history[1]["content"] == f"A subagent reported back (chat {sub}): There are 3 files."
    events = [e for e in await (await stack.store()).events(parent) if e.type == "user_message"]
    assert [e.payload["sender"] for e in events] == [SUBAGENT_SENDER]
