"""Model providers behind one small interface (`ModelProvider.complete`)."""
from activities.providers.base import (
    ModelProvider,
    PermanentProviderError,
    ProviderError,
    RetryableProviderError,
    load_provider,
)
from activities.providers.demo import DemoProvider
from activities.providers.openai_chat import OpenAIChatProvider
from activities.providers.scripted import ScriptedProvider

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
