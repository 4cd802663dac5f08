"""Model providers behind one small interface (`ModelProvider.complete`).

`OpenAIChatProvider` is imported on first use: its module imports `openai`, about
a third of a worker's start, which a worker on another model never needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnkeeper.activities.providers.base import (
    ModelProvider,
    PermanentProviderError,
    ProviderError,
    RetryableProviderError,
)
from turnkeeper.activities.providers.demo import DemoProvider
from turnkeeper.activities.providers.loading import load_provider
from turnkeeper.activities.providers.scripted import ScriptedProvider

if TYPE_CHECKING:
    from turnkeeper.activities.providers.openai_chat import OpenAIChatProvider

__all__ = [
    "DemoProvider",
    "ModelProvider",
    "OpenAIChatProvider",
    "PermanentProviderError",
    "ProviderError",
    "RetryableProviderError",
    "ScriptedProvider",
    "load_provider",
]


def __getattr__(name: str) -> object:
    if name == "OpenAIChatProvider":
        from turnkeeper.activities.providers.openai_chat import OpenAIChatProvider

        return OpenAIChatProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
