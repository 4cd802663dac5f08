"""turnkeeper.testing's TurnkeeperTestEnv on the session's dev server (its example with
a server of its own is docs/examples/test_my_tool.py)."""

from __future__ import annotations

import pytest
from temporalio.testing import WorkflowEnvironment

from turnkeeper.activities.tools import ToolContext, tool
from turnkeeper.config import ConfigError
from turnkeeper.models import Reason, TurnStatus
from turnkeeper.testing import FakeChatServer, ScriptedProvider, TurnkeeperTestEnv

deployed: list[str] = []


@tool(confirm=True)
async def kit_deploy(service: str, ctx: ToolContext) -> str:
    """Deploy a service."""
    deployed.append(service)
    return f"{service} deployed"


def _call(name: str, **arguments: object) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


async def test_an_approval_waits_for_the_user_and_continue_runs_the_tool_once(
    temporal_env: WorkflowEnvironment,
) -> None:
    deployed.clear()
    model = ScriptedProvider([_call("kit_deploy", service="web"), {"text": "web is deployed"}])
    async with TurnkeeperTestEnv(tools=[kit_deploy], model=model, temporal=temporal_env) as env:
        waiting = await env.send("kit-approve", "deploy web")
        assert (waiting.state.status, waiting.state.reason) == (
            TurnStatus.AWAITING_USER,
            Reason.APPROVAL_REQUIRED,
        )
        assert [a.name for a in waiting.state.approvals] == ["kit_deploy"] and deployed == []
        done = await env.decide("kit-approve", "continue")
        events = [e.type for e in await env.events("kit-approve")]
    assert done.state.status == TurnStatus.COMPLETED and done.reply == "web is deployed"
    assert deployed == ["web"] and events.count("tool_started") == 1


async def test_plain_functions_built_in_tools_by_name_and_a_second_turn(
    temporal_env: WorkflowEnvironment,
) -> None:
    def shout(text: str) -> str:
        return text.upper()

    model = ScriptedProvider(
        [
            _call("shout", text="hi"),
            _call("write_file", path="out.txt", content="HI"),
            {"text": "done"},
            {"text": "still here"},  # the next turn: the script goes on where the chat is
        ]
    )
    async with TurnkeeperTestEnv(tools=[shout, "write_file"], model=model, temporal=temporal_env) as env:
        first = await env.send("kit-plain", "shout and write")
        assert (env.workspace / "out.txt").read_text() == "HI"
        second = await env.send("kit-plain", "anyone?")
    assert [r["content"] for r in first.transcript if r["role"] == "tool"] == [
        "HI",
        "wrote 2 bytes to out.txt",
    ]
    assert (first.reply, first.state.turn) == ("done", 1)
    assert (second.reply, second.state.turn, len(second.transcript)) == ("still here", 2, 8)


async def test_what_the_worker_refuses_is_raised_at_enter(temporal_env: WorkflowEnvironment) -> None:
    with pytest.raises(ValueError, match="no tool is registered as 'nope'"):
        TurnkeeperTestEnv(tools=["nope"])
    with pytest.raises(ConfigError, match="TURNKEEPER_BUILD_ID"):
        async with TurnkeeperTestEnv(env={"TURNKEEPER_DEPLOYMENT_NAME": "kit"}, temporal=temporal_env):
            pass


async def test_a_model_spec_against_the_fake_openai_server(temporal_env: WorkflowEnvironment) -> None:
    with FakeChatServer() as server:
        server.script([{"status": 429, "message": "slow down"}, {"text": "hello from the fake"}])
        async with TurnkeeperTestEnv(
            model="openai:fake",
            env={"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "k"},
            temporal=temporal_env,
        ) as env:
            turn = await env.send("kit-openai", "hi")
    assert turn.reply == "hello from the fake" and len(server.requests) == 2


async def test_a_chat_left_waiting_does_not_hold_the_next_env(temporal_env: WorkflowEnvironment) -> None:
    model = ScriptedProvider([_call("kit_deploy", service="api")])
    async with TurnkeeperTestEnv(tools=[kit_deploy], model=model, temporal=temporal_env) as env:
        assert (await env.send("kit-left", "deploy api")).state.status == TurnStatus.AWAITING_USER
    async with TurnkeeperTestEnv(model=ScriptedProvider([{"text": "fresh"}]), temporal=temporal_env) as env:
        turn = await env.send("kit-left", "hello")
    assert (turn.reply, turn.state.turn) == ("fresh", 1)
