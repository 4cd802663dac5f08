"""How the CLI's short commands read the session store without pydantic or the
store's package: a SQLite store's file, read with the standard library into
the plain views of turnkeeper.cli_views.

The store's package imports the models, and importing them takes longer than
`turnkeeper status` may take in all. So `status`, `history`, `events` and
`send` read the file themselves when they can; whatever the views do not
decode exactly as the models would (`NotPlain`), or a store of another schema
version or kind, they read the models' way instead, through the store, so
that they print the same either way.

`Reads` needs no event loop either (importing asyncio alone is a tenth of such
a command's time): it runs one only when it falls back to the store.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turnkeeper.cli_views import (
    EventView,
    MessageView,
    NotPlain,
    StateView,
    _int,  # the views' strict decoding, for follow_from's own reads
    _str,
    event_view,
    message_view,
    turn_row_state,
)
from turnkeeper.config import Settings

if TYPE_CHECKING:
    import asyncio

    from turnkeeper.models import ChatMessage, Event, TurnState
    from turnkeeper.store import SessionStore

# turnkeeper/store/schema.py's SCHEMA_VERSION (that module imports the models; a
# test keeps the two equal): a file of another version is read through the store.
STORE_SCHEMA_VERSION = 2
# The store's own wait for a lock (turnkeeper/store/sqlite.py, BUSY_TIMEOUT_S).
BUSY_TIMEOUT_S = 1.0
_SQLITE_PREFIX = "sqlite:///"
# The `turns` columns cli_views.turn_row_state decodes (turnkeeper/store/codec.py's, a test keeps them equal).
TURN_COLUMNS = (
    "chat_id",
    "turn",
    "run_id",
    "status",
    "reason",
    "recovery_id",
    "can_continue",
    "attempts",
    "started_at",
    "updated_at",
)


def _sqlite_file(settings: Settings) -> Path | None:
    """The SQLite store's file, as activities/store.open_store picks it; None for another store."""
    url = settings.database_url
    if url is None:
        return settings.sqlite_path
    if url.startswith(_SQLITE_PREFIX) and len(url) > len(_SQLITE_PREFIX):
        return Path(url[len(_SQLITE_PREFIX) :])
    return None


def _connect(settings: Settings) -> sqlite3.Connection | None:
    """The store's file opened for reading, if it exists at the store's schema version.
    Never created nor migrated here: the store does that, when it opens it."""
    path = _sqlite_file(settings)
    if path is None:
        return None
    try:
        db = sqlite3.connect(
            f"{path.absolute().as_uri()}?mode=rw", uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None
        )
    except (sqlite3.Error, ValueError):
        return None
    try:
        version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.Error:
        version = None
    if version is None or version[0] != str(STORE_SCHEMA_VERSION):
        db.close()
        return None
    db.row_factory = sqlite3.Row
    return db


class Reads:
    """The store reads of `status`, `history`, `events` and `send`, without an event loop:
    from the SQLite file with the views above when they can, else through the
    session store (its models, its errors), run on an event loop of its own that
    lasts until `close`."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._db = _connect(settings)
        self._store: SessionStore | None = None
        self._runner: asyncio.Runner | None = None

    def _rows(self, sql: str, *args: Any) -> list[sqlite3.Row] | None:
        if self._db is None:
            return None
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error:  # locked, say: the store waits and reports it its way
            return None

    def _store_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`await store.<method>(...)`, the store opened at the first call."""
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._runner is None:
            import asyncio

            from turnkeeper.cli.common import open_session_store

            runner = asyncio.Runner()
            try:
                self._store = runner.run(open_session_store(self._settings))
            except BaseException:
                runner.close()
                raise
            self._runner = runner
        assert self._store is not None
        return self._runner.run(getattr(self._store, method)(*args, **kwargs))

    def turn_state(self, chat_id: str) -> StateView | TurnState | None:
        """The chat's latest turn as failed_turns.state_of shows it; None if it has none."""
        rows = self._rows(
            f"SELECT {', '.join(TURN_COLUMNS)} FROM turns WHERE chat_id = ? ORDER BY turn DESC LIMIT 1",
            chat_id,
        )
        if rows is not None:
            try:
                return turn_row_state(rows[0]) if rows else None
            except NotPlain:
                pass
        from turnkeeper.failed_turns import state_of

        record = self._store_call("get_turn", chat_id)
        return None if record is None else state_of(record)

    def history(self, chat_id: str) -> list[MessageView] | list[ChatMessage]:
        rows = self._rows("SELECT id, body FROM messages WHERE chat_id = ? ORDER BY id", chat_id)
        if rows is not None:
            try:
                return [message_view(r["body"]) for r in rows]
            except NotPlain:
                pass
        return self._store_call("history", chat_id)

    def events(self, chat_id: str, after_seq: int = 0, limit: int = 1000) -> list[EventView] | list[Event]:
        rows = self._rows(
            "SELECT chat_id, seq, type, payload, created_at FROM events"
            " WHERE chat_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            chat_id,
            after_seq,
            limit,
        )
        if rows is not None:
            try:
                return [event_view(r) for r in rows]
            except NotPlain:
                pass
        return self._store_call("events", chat_id, after_seq=after_seq, limit=limit)

    @property
    def plain(self) -> bool:
        """Whether these reads go to the SQLite file themselves (so far), not through the store."""
        return self._db is not None

    def follow_from(self, chat_id: str, message_id: str | None = None) -> int:
        """SessionStore.follow_from: its three reads, in one read transaction as the store makes them."""
        if self._db is not None:
            try:
                return self._follow_from(self._db, chat_id, message_id)
            except (sqlite3.Error, NotPlain):
                pass
        return self._store_call("follow_from", chat_id, message_id)

    @staticmethod
    def _follow_from(db: sqlite3.Connection, chat_id: str, message_id: str | None) -> int:
        db.execute("BEGIN")
        try:
            if (
                message_id is not None
                and db.execute(
                    "SELECT 1 FROM messages WHERE chat_id = ? AND message_id = ?", (chat_id, message_id)
                ).fetchone()
            ):
                # turnkeeper/store/codec.py's seq_before_message
                for row in db.execute(
                    "SELECT seq, payload FROM events WHERE chat_id = ? AND type = 'user_message'"
                    " ORDER BY seq",
                    (chat_id,),
                ).fetchall():
                    try:
                        payload = json.loads(_str(row["payload"]))
                    except NotPlain:
                        raise
                    except ValueError:
                        continue
                    if isinstance(payload, dict) and payload.get("message_id") == message_id:
                        return _int(row["seq"]) - 1
            return _int(
                db.execute(
                    "SELECT COALESCE(MAX(seq), 0) FROM events WHERE chat_id = ?", (chat_id,)
                ).fetchone()[0]
            )
        finally:
            db.execute("COMMIT")

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        runner, store, self._runner, self._store = self._runner, self._store, None, None
        if runner is not None:
            try:
                if store is not None:
                    runner.run(store.close())
            finally:
                runner.close()
