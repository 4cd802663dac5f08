"""Which model provider TURNKEEPER_MODEL names: `load_provider`.

Above the providers (they import `base`, never this module), so choosing one
makes no import cycle.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from turnkeeper.activities.providers.base import ModelProvider
from turnkeeper.activities.providers.demo import DemoProvider
from turnkeeper.activities.providers.scripted import ScriptedProvider, load_script

ACCEPTED_SPECS = "'demo', 'scripted:<path to a JSON file>' or 'openai:<model>'"


def load_provider(spec: str, *, env: Mapping[str, str] | None = None) -> ModelProvider:
    """Build the provider named by `spec` (the TURNKEEPER_MODEL value).

    `demo`, `scripted:<path>` (the file is read and validated once, now) or
    `openai:<model>` (OPENAI_BASE_URL and OPENAI_API_KEY come from `env`).
    """
    # The OpenAI provider is imported in its branch: `import openai` takes about a
    # third of a worker's start, which a worker on `demo` or a script, restarted
    # after a crash, need not wait for.
    env = os.environ if env is None else env
    spec = (spec or "").strip()
    kind, sep, arg = spec.partition(":")
    arg = arg.strip()
    if spec == "demo":
        return DemoProvider()
    if sep and kind == "scripted":
        if not arg:
            raise ValueError(f"model spec {spec!r} is missing the script path; expected {ACCEPTED_SPECS}")
        return ScriptedProvider(load_script(arg))
    if sep and kind == "openai":
        if not arg:
            raise ValueError(f"model spec {spec!r} is missing the model name; expected {ACCEPTED_SPECS}")
        from turnkeeper.activities.providers.openai_chat import OpenAIChatProvider

        return OpenAIChatProvider(
            arg,
            base_url=env.get("OPENAI_BASE_URL") or None,
            api_key=env.get("OPENAI_API_KEY") or None,
        )
    raise ValueError(f"unknown model spec {spec!r}; expected {ACCEPTED_SPECS}")
