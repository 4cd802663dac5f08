"""The session store: the committed transcript, per-chat event log and turns."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from turnkeeper.store.base import (
    INTERRUPTED_TOOL_TEXT,
    INTERRUPTED_TURN_TEXT,
    SUPERSEDED_TEXT,
    BeginTurn,
    ContextRows,
    CorruptRowError,
    Draft,
    PreparedCall,
    SessionStore,
    StoredRow,
    StoreError,
    StoreUnavailable,
    Summary,
    TranscriptRow,
    TurnUpdate,
    inline_calls,
)
from turnkeeper.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from turnkeeper.config import Settings
    from turnkeeper.store.postgres import PostgresStore

__all__ = [
    "INTERRUPTED_TOOL_TEXT",
    "INTERRUPTED_TURN_TEXT",
    "SUPERSEDED_TEXT",
    "BeginTurn",
    "ContextRows",
    "CorruptRowError",
    "Draft",
    "PostgresStore",
    "PreparedCall",
    "SQLiteStore",
    "SessionStore",
    "StoreError",
    "StoreUnavailable",
    "StoredRow",
    "Summary",
    "TranscriptRow",
    "TurnUpdate",
    "inline_calls",
    "open_store",
]

_SQLITE_PREFIX = "sqlite:///"


def __getattr__(name: str) -> object:
    # PostgresStore imports asyncpg: only when asked for, so that a SQLite store
    # (and the CLI's short commands) never pays for it.
    if name == "PostgresStore":
        from turnkeeper.store.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_store(settings: Settings) -> SessionStore:
    """The store `settings` selects, not yet opened (call `await store.open()`).

    No `database_url`: SQLite at `settings.sqlite_path`. `sqlite:///PATH`: SQLite
    at PATH (`sqlite:////abs/path` for an absolute one). `postgresql://user:pass@host:port/db`
    (or `postgres://`, `postgresql+asyncpg://`): PostgreSQL, for workers on several
    machines; query parameters are asyncpg's (`?sslmode=require`, ...).
    """
    url = settings.database_url
    if url is None:
        return SQLiteStore(settings.sqlite_path)
    if url.startswith(_SQLITE_PREFIX):
        path = url[len(_SQLITE_PREFIX) :]
        if not path:
            raise StoreError(
                f"TURNKEEPER_DATABASE_URL {url!r} names no file; use sqlite:///path/to/sessions.db"
            )
        return SQLiteStore(Path(path))
    # Name only the scheme: the rest of a server URL may hold a password.
    scheme, sep, rest = url.partition("://")
    if sep and scheme.split("+", 1)[0] in ("postgresql", "postgres"):  # also postgresql+driver://
        from turnkeeper.store.postgres import PostgresStore

        return PostgresStore(f"postgresql://{rest}")  # asyncpg knows no +driver suffix
    shown = f"scheme {scheme!r}" if sep else "a value without a scheme"
    raise StoreError(
        f"TURNKEEPER_DATABASE_URL has {shown}; supported: sqlite:///path, "
        "postgresql://user:password@host:port/database"
    )
