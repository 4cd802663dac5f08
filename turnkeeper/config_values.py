"""How one configuration variable's text becomes a value: the parsers `Settings`
fields name (turnkeeper/config.py), and the values they make. Each raises
ValueError in words; the settings report it with the variable's name."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# The SDK needs two workflow-task polls at least (one for the sticky queue).
MIN_FIXED_POLLERS = 2
# Below this a summary, its instruction and a turn hardly fit: a value that small is a mistake.
MIN_CONTEXT_TOKENS = 512
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class EncryptionKey:
    key_id: str
    # repr=False: settings get logged; key material must never be.
    secret: bytes = field(repr=False)


KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
KEY_BYTES = 32  # AES-256
NEW_KEY_HINT = "make one with: openssl rand -base64 32"
# Temporal writes a deployment version as `<deployment name>.<build id>`.
DEPLOYMENT_NAME = re.compile(r"[^.\s]{1,255}")
BUILD_ID = re.compile(r"\S{1,255}")


# -- how a value is read: from its stripped text, or ValueError("must be <what is accepted>") ----


def _whole(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError("must be a whole number") from None
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be at most {maximum}")
        return value

    return parse


def _switch(raw: str) -> bool:
    if raw.lower() not in _TRUE + _FALSE:
        raise ValueError(f"must be one of {', '.join(_TRUE + _FALSE)}")
    return raw.lower() in _TRUE


def _one_of(*choices: str, **aliases: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = aliases.get(raw.lower(), raw.lower())
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return parse


def _names(raw: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in raw.split(",") if x.strip())


def split_address(raw: str) -> tuple[str, int]:
    """`host:port` or `[ipv6]:port`."""
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("must be host:port (e.g. 127.0.0.1:8000 or [::1]:8000)")
    return (host[1:-1] if host.startswith("[") and host.endswith("]") else host), int(port)


def _address(raw: str) -> str:
    split_address(raw)
    return raw


def _http_address(raw: str) -> str:
    if raw.startswith("https://"):
        host = raw.removeprefix("https://").rstrip("/")
        if host and "/" not in host and (":" not in host or split_address(host)):
            return raw
        raise ValueError("must be https://host or https://host:port")
    split_address(raw.removeprefix("http://").rstrip("/"))
    return raw


def _matching(pattern: re.Pattern[str], rule: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if not pattern.fullmatch(raw):
            raise ValueError(f"must be {rule}")
        return raw

    return parse


def _pollers(raw: str) -> int | None:
    """None (`auto`) or a fixed maximum of polls per task type."""
    if raw.lower() == "auto":
        return None
    if not raw.isdigit():
        raise ValueError("must be `auto` or a whole number")
    return _whole(MIN_FIXED_POLLERS)(raw)


def _context_tokens(raw: str) -> int:
    value = _whole(0)(raw)
    if 0 < value < MIN_CONTEXT_TOKENS:
        raise ValueError(f"must be 0 (the model's window) or at least {MIN_CONTEXT_TOKENS}")
    return value


def _keys(raw: str) -> tuple[EncryptionKey, ...]:
    """`keyid:base64key[,...]`; the first encrypts, all decrypt. Errors name the
    entry and its key id, never the key material."""
    keys: list[EncryptionKey] = []
    for n, entry in enumerate(raw.split(","), start=1):
        if not entry.strip():
            continue  # a trailing comma
        key_id, sep, encoded = (part.strip() for part in entry.strip().partition(":"))
        if not sep or not key_id or not encoded:
            raise ValueError(f"entry {n} is not keyid:base64-key (entries are separated by commas)")
        if not KEY_ID.fullmatch(key_id):
            raise ValueError(f"entry {n}: a key id is 1-64 characters of A-Z a-z 0-9 . _ -")
        try:
            # Standard or URL-safe alphabet, padding required.
            secret = base64.b64decode(encoded.replace("-", "+").replace("_", "/"), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"key {key_id!r} is not valid base64; {NEW_KEY_HINT}") from None
        if len(secret) != KEY_BYTES:
            raise ValueError(
                f"key {key_id!r} is {len(secret)} bytes; AES-256 needs {KEY_BYTES} ({NEW_KEY_HINT})"
            )
        if any(k.key_id == key_id for k in keys):
            raise ValueError(f"key id {key_id!r} is listed twice")
        keys.append(EncryptionKey(key_id, secret))
    return tuple(keys)


def _origins(raw: str) -> tuple[str, ...]:
    origins = []
    for entry in filter(None, (x.strip() for x in raw.split(","))):
        parts = urlsplit(entry)
        if (
            entry == "*"
            or parts.scheme not in ("http", "https")
            or not parts.netloc
            or parts.path.strip("/")
            or parts.query
            or parts.fragment
        ):
            raise ValueError(
                "must list origins such as http://localhost:8233 "
                "(scheme://host[:port], comma-separated; no wildcard)"
            )
        origins.append(f"{parts.scheme}://{parts.netloc}".lower())
    if not origins:
        raise ValueError("must list one origin at least")
    return tuple(origins)


@dataclass(frozen=True)
class SubagentProfile:
    """A kind of subagent a `delegate` call may name: what it is told first and which
    tools it may use (those the worker enables among them: docs/tools.md)."""

    name: str
    instructions: str
    tools: tuple[str, ...]
    model: str | None = None
    """Accepted, not used yet: a worker has one model provider."""


PROFILE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_PROFILE_KEYS = ("instructions", "tools", "model")
PROFILES_SHAPE = '{"<name>": {"instructions": "...", "tools": ["read_file", ...], "model": "..."}}'


def _profiles(raw: str) -> tuple[SubagentProfile, ...]:
    """A JSON object, name -> {"instructions": str, "tools": [str], "model"?: str}.
    Errors say where and never start with `must`, so the value is not echoed: it can be long."""
    import json  # only when the variable is set

    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err.msg} at character {err.pos}); expected {PROFILES_SHAPE}") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object of profiles, {PROFILES_SHAPE}")
    profiles = []
    for name, spec in data.items():
        where = f"profile {name!r}"
        if not PROFILE_NAME.fullmatch(name):
            raise ValueError(f"{where}: a profile name is 1-64 characters of A-Z a-z 0-9 . _ -")
        if not isinstance(spec, dict):
            raise ValueError(f'{where} is not an object like {{"instructions": "...", "tools": [...]}}')
        unknown = sorted(set(spec) - set(_PROFILE_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; known: {', '.join(_PROFILE_KEYS)}")
        instructions, tools, model = spec.get("instructions"), spec.get("tools"), spec.get("model")
        if not isinstance(instructions, str):
            raise ValueError(f"{where}: 'instructions' must be a string")
        if not isinstance(tools, list) or not all(isinstance(t, str) and t.strip() for t in tools):
            raise ValueError(f"{where}: 'tools' must be a list of tool names")
        if model is not None and not (isinstance(model, str) and model.strip()):
            raise ValueError(f"{where}: 'model' must be a non-empty string")
        names = tuple(dict.fromkeys(t.strip() for t in tools))
        profiles.append(SubagentProfile(name, instructions, names, model))
    return tuple(profiles)


_PORT = _whole(1, 65535)
