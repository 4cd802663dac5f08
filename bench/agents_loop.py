"""The comparison for bench/turn_latency.py: the same turn (model -> write_file
-> model) as Temporal's own OpenAI Agents integration runs it, with a scripted
model and one activity tool that is never retried.

In its own module so the workflow sandbox can import it. Needs the optional
`temporalio[openai-agents]` package (`pip install -e '.[bench]'`).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from agents import Agent, Runner
    from temporalio.openai_agents import workflow as agents_workflow


@activity.defn(name="agents.write_file")
async def write_file(path: str, content: str) -> str:
    """Write a file."""
    Path(path).write_text(content)
    return f"wrote {len(content)} bytes to {path}"


@workflow.defn(name="AgentsTurn")
class AgentsTurn:
    @workflow.run
    async def run(self, text: str) -> str:
        agent = Agent(
            name="bench",
            instructions="Write the file, then say done.",
            tools=[
                agents_workflow.activity_as_tool(
                    write_file,
                    start_to_close_timeout=timedelta(seconds=300),
                    heartbeat_timeout=timedelta(seconds=3),
                    retry_policy=RetryPolicy(maximum_attempts=1),
                )
            ],
        )
        result = await Runner.run(agent, text)
        return str(result.final_output)
