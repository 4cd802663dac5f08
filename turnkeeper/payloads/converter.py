"""The payload converter of every data converter of ours: pydantic's, built once per
process.

The SDK builds a new data converter, and with it a new payload converter, for every
workflow activation: nine in a one-tool turn. Each build cost 40-50 µs on a busy
worker and started with an empty type-adapter cache, so every payload of the
activation built its adapter again. Ours holds no per-run state and takes no
serialization context, so one instance serves every run, activity and client.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import SerializationContext


class SharedPayloadConverter(PydanticPayloadConverter):
    """`PydanticPayloadConverter`; constructing it returns the process's one instance."""

    _instance: ClassVar[SharedPayloadConverter | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __new__(cls, *args: Any, **kwargs: Any) -> SharedPayloadConverter:
        if args or kwargs:
            raise TypeError("SharedPayloadConverter takes no options: it is shared as it is")
        with cls._lock:
            if cls._instance is None:
                instance = super().__new__(cls)
                PydanticPayloadConverter.__init__(instance)
                cls._instance = instance
            return cls._instance

    def __init__(self) -> None:
        pass  # built once, in __new__; Python calls __init__ again on every construction

    def with_context(self, context: SerializationContext) -> SharedPayloadConverter:
        # None of its converters reads a context; the SDK's default would build a new
        # instance for one that did.
        return self
