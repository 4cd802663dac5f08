"""What the worker's logs may say once payloads are encrypted.

The SDK logs a failed activity or workflow task with its exception, and an
exception's message can quote what a user, a model or a tool said (a provider's
error, a tool's output). With encryption on, those records keep the exception's
type and traceback and withhold its message: the message itself is in the
history, encrypted, and readable through the codec server.

A payload the worker cannot decrypt (its key is no longer listed) fails the
workflow task again at every retry: one line naming the key, not a traceback
each time.
"""

from __future__ import annotations

import logging
import traceback

from turnkeeper.payloads.encryption import DecryptionError

# The SDK's loggers that log exceptions raised by workflow and activity code or by the codec.
SDK_LOGGERS = (
    "temporalio.activity",
    "temporalio.workflow",
    "temporalio.worker._activity",
    "temporalio.worker._workflow",
    "temporalio.worker._workflow_instance",
    "temporalio.worker._worker",
)
WITHHELD = "(message withheld: payloads are encrypted; read it through the codec server)"


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes, innermost first, as tracebacks print them."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return chain[::-1]


def redacted_traceback(exc: BaseException) -> str:
    parts: list[str] = []
    for n, link in enumerate(_chain(exc)):
        if n:
            parts.append("\nwhich led to:\n\n")
        parts.append("Traceback (most recent call last):\n")
        parts.extend(traceback.format_list(traceback.extract_tb(link.__traceback__)))
        # Our own DecryptionError names a key id only: its message stays.
        message = str(link) if isinstance(link, DecryptionError) else WITHHELD
        parts.append(f"{type(link).__module__}.{type(link).__qualname__}: {message}\n")
    return "".join(parts).rstrip("\n")


class WorkerLogFilter(logging.Filter):
    def __init__(self, encrypted: bool) -> None:
        super().__init__("turnkeeper.telemetry.logs")
        self.encrypted = encrypted

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if isinstance(record.exc_info, tuple) else None
        if exc is None:
            return True
        undecryptable = next((e for e in _chain(exc) if isinstance(e, DecryptionError)), None)
        if undecryptable is not None:
            record.msg = (
                f"{record.getMessage()}: {undecryptable}; the task is retried until a worker holds that key"
            )
            record.args = None
            record.exc_info = record.exc_text = None
        elif self.encrypted:
            record.exc_text = redacted_traceback(exc)
            record.exc_info = None
        return True


def install(encrypted: bool) -> None:
    """Idempotent: a process that starts several workers filters each record once."""
    for name in SDK_LOGGERS:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, WorkerLogFilter)]:
            logger.removeFilter(old)
        logger.addFilter(WorkerLogFilter(encrypted))
