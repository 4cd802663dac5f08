"""The store's tables, one definition for SQLite and PostgreSQL: each backend fills
in its own column types, and both get the same indexes."""

from __future__ import annotations

from collections.abc import Mapping

from turnkeeper.models import OPEN_STATUSES, SUPERSEDABLE_STATUSES, TurnStatus
from turnkeeper.store.base import StoreError

# 1: the first layout. 2: the drafts table (streaming answers), `summaries` and
# the `messages_chat_row` index (a model call reads a chat's summary and the rows
# after it). Every statement below is IF NOT EXISTS, so running them brings any
# older version up to date.
SCHEMA_VERSION = 2


# Constants, not parameters: the partial index `turns_open` matches this predicate,
# and a planner can only use it when the query's text implies it.
def _status_in(statuses: frozenset[TurnStatus]) -> str:
    return "status IN ({})".format(", ".join(f"'{v}'" for v in sorted(s.value for s in statuses)))


OPEN_SQL = _status_in(OPEN_STATUSES)
SUPERSEDABLE_SQL = _status_in(SUPERSEDABLE_STATUSES)

# One statement per item: SQLite's executescript() would commit the open transaction.
_TABLES: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS meta (
        key   {text} PRIMARY KEY,
        value {text} NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS turns (
        chat_id      {text}      NOT NULL,
        turn         {integer}   NOT NULL,
        run_id       {text},
        status       {text}      NOT NULL,
        reason       {text},
        recovery_id  {text},
        can_continue {boolean}   NOT NULL DEFAULT {true},
        attempts     {integer}   NOT NULL DEFAULT 0,
        started_at   {timestamp} NOT NULL,
        updated_at   {timestamp} NOT NULL,
        -- the turn begin_turn closed as superseded, so a retried begin_turn answers the same
        closed_turn  {integer},
        -- set once `turn_end` was written: it is announced once per turn
        ended        {boolean}   NOT NULL DEFAULT {false},
        PRIMARY KEY (chat_id, turn)
    )
    """,
    """
    CREATE INDEX IF NOT EXISTS turns_open ON turns (updated_at, chat_id, turn) WHERE {open_sql}
    """,
    """
    CREATE INDEX IF NOT EXISTS turns_status ON turns (status)
    """,
    """
    CREATE INDEX IF NOT EXISTS turns_run ON turns (chat_id, run_id)
    """,
    """
    CREATE TABLE IF NOT EXISTS messages (
        id           {row_id},  -- transcript order
        chat_id      {text}    NOT NULL,
        turn         {integer} NOT NULL,
        role         {text}    NOT NULL,
        message_id   {text},     -- user rows: the client's idempotency key
        step         {integer},  -- assistant rows of a model call; NULL for superseded/closing rows
        tool_call_id {text},     -- tool rows
        body         {text}    NOT NULL  -- ChatMessage as JSON
    )
    """,
    """
    CREATE INDEX IF NOT EXISTS messages_chat_turn ON messages (chat_id, turn)
    """,
    """
    CREATE UNIQUE INDEX IF NOT EXISTS messages_user
        ON messages (chat_id, message_id) WHERE message_id IS NOT NULL
    """,
    """
    CREATE UNIQUE INDEX IF NOT EXISTS messages_step
        ON messages (chat_id, turn, step) WHERE step IS NOT NULL
    """,
    """
    CREATE UNIQUE INDEX IF NOT EXISTS messages_tool
        ON messages (chat_id, tool_call_id) WHERE tool_call_id IS NOT NULL
    """,
    """
    CREATE TABLE IF NOT EXISTS events (
        chat_id    {text}      NOT NULL,
        seq        {bigint}    NOT NULL,
        type       {text}      NOT NULL,
        payload    {text}      NOT NULL,  -- JSON object
        created_at {timestamp} NOT NULL,
        PRIMARY KEY (chat_id, seq)
    )
    """,
    # Events a workflow appended, by the key it gave each: a workflow task retried
    # after a failure runs its store calls again, and adds no event twice.
    """
    CREATE TABLE IF NOT EXISTS event_keys (
        chat_id   {text} NOT NULL,
        event_key {text} NOT NULL,
        PRIMARY KEY (chat_id, event_key)
    )
    """,
    # The answer a model call is streaming, one row per chat: overwritten as the
    # text grows, emptied once the reply is recorded or the turn ends (never
    # deleted: readers ask for versions above the highest they saw). Not the
    # transcript: what clients show until the `assistant_message` event comes.
    """
    CREATE TABLE IF NOT EXISTS drafts (
        chat_id    {text}      PRIMARY KEY,
        turn       {integer}   NOT NULL,
        step       {integer}   NOT NULL,
        attempt    {integer}   NOT NULL,
        text       {text}      NOT NULL,
        -- grows with every write of any chat's draft: readers ask for what is newer
        version    {bigint}    NOT NULL,
        -- the step's reply is recorded: kept (empty) so that a re-run counts on from it
        recorded   {boolean}   NOT NULL DEFAULT {false},
        updated_at {timestamp} NOT NULL
    )
    """,
    """
    CREATE INDEX IF NOT EXISTS drafts_version ON drafts (version)
    """,
    # Version 2. A model call reads the rows after a summary: by (chat_id, id).
    """
    CREATE INDEX IF NOT EXISTS messages_chat_row ON messages (chat_id, id)
    """,
    # What the model made of a chat's older rows (id <= upto_id), for later model
    # calls; `history` never reads it.
    """
    CREATE TABLE IF NOT EXISTS summaries (
        chat_id        {text}      NOT NULL,
        upto_id        {bigint}    NOT NULL,
        text           {text}      NOT NULL,
        tokens         {integer}   NOT NULL,
        assistant_rows {integer}   NOT NULL,
        created_at     {timestamp} NOT NULL,
        PRIMARY KEY (chat_id, upto_id)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS tool_runs (
        idempotency_key {text}      PRIMARY KEY,
        chat_id         {text}      NOT NULL,
        turn            {integer}   NOT NULL,
        tool_call_id    {text}      NOT NULL,
        started_at      {timestamp} NOT NULL
    )
    """,
)


def schema(types: Mapping[str, str]) -> tuple[str, ...]:
    """The CREATE statements with a backend's column types: `text`, `integer`,
    `bigint`, `boolean` with its `true` and `false`, `timestamp`, and `row_id`
    (an ever-growing integer primary key)."""
    return tuple(statement.format_map({**types, "open_sql": OPEN_SQL}) for statement in _TABLES)


def stored_version(where: str, raw: str | None) -> int | None:
    """The schema version a database records (None: none yet); a newer one than
    this code knows is refused, so an old worker never writes a newer layout."""
    try:
        version = None if raw is None else int(raw)
    except ValueError:
        raise StoreError(f"{where} has an unreadable schema version {raw!r}") from None
    if version is not None and version > SCHEMA_VERSION:
        raise StoreError(
            f"{where} has schema version {version}, newer than this turnkeeper "
            f"understands ({SCHEMA_VERSION}); upgrade turnkeeper"
        )
    return version
