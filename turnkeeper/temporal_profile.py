"""The profile of Temporal's own config file (`temporal.toml`) that the `temporal`
CLI would use: where turnkeeper finds the server when TEMPORAL_ADDRESS is unset."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ProfileError(ValueError):
    """The profile asked for cannot be read (turnkeeper.config reports it as a ConfigError)."""


def temporal_profile(env: Mapping[str, str]) -> dict[str, Any]:
    """The profile `temporal` would use (TEMPORAL_PROFILE, else `default`) of its config
    file (TEMPORAL_CONFIG_FILE, else temporal.toml in the user's config directory); empty
    when there is none. Read with the standard library: the SDK's loader costs the CLI
    its start-up time; the SDK reads the same profile's TLS and API key when it connects."""
    import tomllib

    named = (env.get("TEMPORAL_PROFILE") or "").strip()
    path = Path(env.get("TEMPORAL_CONFIG_FILE") or "").expanduser()
    if not str(path) or str(path) == ".":
        base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
        path = Path(base) / "temporalio" / "temporal.toml"
    try:
        profiles = tomllib.loads(path.read_text()).get("profile", {})
    except FileNotFoundError:
        if named:
            raise ProfileError(f"TEMPORAL_PROFILE={named}: there is no config file {path}") from None
        return {}
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ProfileError(f"Temporal config file {path}: {err}") from None
    profile = profiles.get(named or "default")
    if profile is None and named:
        raise ProfileError(f"TEMPORAL_PROFILE={named}: {path} has no [profile.{named}]")
    return profile if isinstance(profile, dict) else {}
