"""Model providers behind one small interface (`ModelProvider.complete`)."""
from turnkeeper.activities.providers.base import (
    ModelProvider,
    PermanentProviderError,
    ProviderError,
    RetryableProviderError,
    load_provider,
)
from turnkeeper.activities.providers.demo import DemoProvider
from turnkeeper.activities.providers.openai_chat import OpenAIChatProvider
from turnkeeper.activities.providers.scripted import ScriptedProvider

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
