"""The CLI's plain ways (turnkeeper/cli_views.py and turnkeeper/cli_reads.py;
`list` and `send` over Temporal's HTTP API, turnkeeper/http_api.py) against
what they stand in for: the models, the session store, the SDK. Whatever a
view decodes, it decodes as the model does, and prints the same; whatever it
does not, it leaves to the model (`NotPlain`). What `send` sends is what the
SDK sends."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import typing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from temporalio.api.common.v1 import Payload, SearchAttributes, WorkflowExecution
from temporalio.api.enums.v1 import WorkflowIdConflictPolicy, WorkflowIdReusePolicy
from temporalio.api.workflow.v1 import WorkflowExecutionInfo
from temporalio.api.workflowservice.v1 import SignalWithStartWorkflowExecutionRequest
from temporalio.client import WorkflowExecution as SdkExecution
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.converter import DataConverter, encode_search_attributes

from turnkeeper import cli_reads, cli_views, http_api
from turnkeeper import client as tk
from turnkeeper.cli.output import describe_gate, event_line, event_text, transcript_line
from turnkeeper.cli_reads import Reads
from turnkeeper.cli_views import NotPlain, StateView
from turnkeeper.config import Settings
from turnkeeper.failed_turns import state_of
from turnkeeper.models import (
    TURN_TASK_TIMEOUT,
    ApprovalRequest,
    ChatMessage,
    ChatTurnInput,
    Event,
    ModelReply,
    Reason,
    ToolCall,
    ToolCallView,
    TurnState,
    TurnStatus,
    UserMessage,
)
from turnkeeper.search_attributes import CHAT_ID_ATTR, TURN_STATUS_ATTR
from turnkeeper.store import CorruptRowError, SQLiteStore, TurnUpdate, codec, schema, sqlite

# The strategies below are composed deeply: Hypothesis warns that their repr is long.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

# --- the views are the models' shapes ------------------------------------------------


def test_the_views_have_the_models_fields_and_the_stores_constants() -> None:
    assert tuple(TurnState.model_fields) == cli_views.STATE_FIELDS
    assert tuple(ToolCallView.model_fields) == cli_views.TOOL_CALL_VIEW_FIELDS
    assert tuple(ApprovalRequest.model_fields) == cli_views.APPROVAL_FIELDS
    assert tuple(ChatMessage.model_fields) == cli_views.MESSAGE_FIELDS
    assert tuple(ToolCall.model_fields) == cli_views.TOOL_CALL_FIELDS
    assert typing.get_args(ChatMessage.model_fields["role"].annotation) == cli_views.ROLES
    assert cli_reads.TURN_COLUMNS == codec._TURN_COLUMNS
    assert cli_reads.STORE_SCHEMA_VERSION == schema.SCHEMA_VERSION
    assert cli_reads.BUSY_TIMEOUT_S == sqlite.BUSY_TIMEOUT_S
    assert StateView(chat_id="c").model_dump(mode="json") == TurnState(chat_id="c").model_dump(mode="json")


# JSON values of every kind, and the right ones more often than not.
_ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 3),
    st.floats(allow_nan=False, width=16),
    st.text(max_size=3),
    st.lists(st.integers(0, 2), max_size=2),
    st.just({}),
)


def _maybe(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`good`, but one time in sixteen any JSON value: a whole object is mostly of the right shape."""
    return st.integers(0, 15).flatmap(lambda n: _ANY if n == 0 else good)


def _object(
    fields: dict[str, st.SearchStrategy[Any]], required: tuple[str, ...] = ()
) -> st.SearchStrategy[Any]:
    """Dicts of some of `fields` (always `required`, but now and then not), and now and then an unknown key."""
    keys = st.fixed_dictionaries(
        {k: _maybe(v) for k, v in fields.items() if k in required},
        optional={k: _maybe(v) for k, v in fields.items() if k not in required},
    )
    extra = st.dictionaries(st.sampled_from(["extra", *fields]), _ANY, max_size=1)
    return st.one_of(keys, keys, keys, st.tuples(keys, extra).map(lambda kv: {**kv[0], **kv[1]}), _ANY)


_TEXT = st.text(max_size=4)
_STATE = _object(
    {
        "chat_id": _TEXT,
        "turn": st.integers(0, 3),
        "status": st.sampled_from([s.value for s in TurnStatus]),
        "reason": st.one_of(st.none(), st.sampled_from([r.value for r in Reason])),
        "recovery_id": st.one_of(st.none(), _TEXT),
        "can_continue": st.booleans(),
        "attempts": st.integers(0, 3),
        "pending_followups": st.lists(_TEXT, max_size=2),
        "tool_calls": st.lists(
            _object(
                {
                    "id": _TEXT,
                    "name": _TEXT,
                    "status": st.sampled_from(["pending", "done", "error", "bogus"]),
                },
                ("id", "name", "status"),
            ),
            max_size=2,
        ),
        "detail": st.one_of(st.none(), _TEXT),
        "store_unavailable": st.booleans(),
        "approvals": st.lists(
            _object(
                {"id": _TEXT, "name": _TEXT, "arguments": _TEXT, "idempotency_key": _TEXT},
                ("id", "name", "arguments", "idempotency_key"),
            ),
            max_size=2,
        ),
    },
    ("chat_id",),
)


@settings(max_examples=500, deadline=None)
@given(_STATE)
def test_a_state_the_view_reads_is_read_and_printed_as_the_model_does(data: Any) -> None:
    try:
        view = cli_views.state_view(data)
    except NotPlain:
        return  # the model's way: whatever it makes of it
    model = TurnState.model_validate(data)
    assert view.model_dump(mode="json") == model.model_dump(mode="json")
    assert describe_gate(view) == describe_gate(model)


@settings(max_examples=200, deadline=None)
@given(_STATE)
def test_every_state_a_worker_answers_is_read_by_the_view(data: Any) -> None:
    try:
        model = TurnState.model_validate(data)
    except ValidationError:
        return
    answer = json.loads(model.model_dump_json())  # what a worker's converter writes
    assert cli_views.state_view(answer).model_dump(mode="json") == model.model_dump(mode="json")


def test_a_state_the_view_does_not_read_is_the_models() -> None:
    shown = cli_views.turn_state({"chat_id": "c", "turn": 1.0, "can_continue": 0})  # coerced by the model
    assert isinstance(shown, TurnState) and (shown.turn, shown.can_continue) == (1, False)
    assert isinstance(cli_views.turn_state({"chat_id": "c", "turn": 1}), StateView)


_CALL = _object({"id": _TEXT, "name": _TEXT, "arguments": _TEXT}, ("id", "name"))
_MESSAGE = _object(
    {
        "role": st.sampled_from(["user", "assistant", "tool", "system", "robot"]),
        "content": st.one_of(st.none(), _TEXT),
        "tool_calls": st.one_of(st.none(), st.lists(_CALL)),
        "tool_call_id": st.one_of(st.none(), _TEXT),
        "name": st.one_of(st.none(), _TEXT),
    },
    ("role",),
)


@settings(max_examples=500, deadline=None)
@given(st.one_of(_MESSAGE.map(json.dumps), st.just("{broken"), st.just("[]")))
def test_a_transcript_row_the_view_reads_is_printed_as_the_models(body: str) -> None:
    try:
        view = cli_views.message_view(body)
    except NotPlain:
        return
    model = ChatMessage.model_validate(json.loads(body))
    assert json.dumps(view.public()) == json.dumps(model.public())  # the order of the keys too
    assert transcript_line(view) == transcript_line(model)


def test_every_message_the_store_writes_is_read_by_the_view() -> None:
    for message in (
        ChatMessage(role="user", content="hi"),
        ChatMessage(role="assistant", content=""),
        ChatMessage(role="assistant", tool_calls=[ToolCall(id="1", name="w", arguments='{"a": 1}')]),
        ChatMessage(role="tool", content="ok", tool_call_id="1", name="w"),
    ):
        view = cli_views.message_view(codec.message_body(message))
        assert json.dumps(view.public()) == json.dumps(message.public())


_STORE_TIME = st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat(timespec="microseconds"))
_TIME = st.one_of(
    _STORE_TIME,
    _STORE_TIME.map(lambda t: t.replace("T", " ")),
    _STORE_TIME.map(lambda t: t.replace("+00:00", "Z")),
    st.just("2026-13-01T00:00:00.000000+00:00"),
    st.just("yesterday"),
    st.integers(0, 10**9),
)


def _row(**columns: Any) -> sqlite3.Row:
    db = sqlite3.connect(":memory:")
    db.row_factory = sqlite3.Row
    names = ", ".join(f"? AS {name}" for name in columns)
    return db.execute(f"SELECT {names}", tuple(columns.values())).fetchone()


@settings(max_examples=300, deadline=None)
@given(
    st.text(max_size=3),
    st.one_of(st.integers(1, 5), st.just("7")),
    st.sampled_from(["turn_end", "x"]),
    st.one_of(st.dictionaries(_TEXT, _ANY, max_size=2).map(json.dumps), st.just("[1]"), st.just("{nope")),
    _TIME,
)
def test_an_event_row_the_view_reads_is_printed_as_the_models(
    chat: str, seq: Any, type_: str, payload: str, created_at: Any
) -> None:
    row = _row(chat_id=chat, seq=seq, type=type_, payload=payload, created_at=created_at)
    try:
        view = cli_views.event_view(row)
    except NotPlain:
        return
    model = codec.decode_event(row)
    assert model.type != codec.CORRUPT_EVENT
    assert (event_line(view), event_text(view)) == (event_line(model), event_text(model))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([s.value for s in TurnStatus] + ["bogus"]),
    st.one_of(st.none(), st.sampled_from([r.value for r in Reason] + ["bogus"])),
    st.one_of(st.sampled_from([0, 1]), st.integers(2, 3), st.just("1")),
    st.one_of(st.integers(0, 3), st.just("2")),
    _TIME,
    _TIME,
)
def test_a_turn_row_the_view_reads_is_the_state_the_model_shows(
    status: str, reason: str | None, can_continue: Any, attempts: Any, started: Any, updated: Any
) -> None:
    row = _row(
        chat_id="c",
        turn=2,
        run_id="r",
        status=status,
        reason=reason,
        recovery_id="g",
        can_continue=can_continue,
        attempts=attempts,
        started_at=started,
        updated_at=updated,
    )
    try:
        view = cli_views.turn_row_state(row)
    except NotPlain:
        return
    model = state_of(codec.decode_turn(row))
    assert view.model_dump(mode="json") == model.model_dump(mode="json")


# --- Reads: the SQLite file, else the store ------------------------------------------------
# Plain functions: Reads runs the store on an event loop of its own, as the CLI does.


async def _write_a_chat(path: Path) -> None:
    store = SQLiteStore(path)
    await store.open()
    try:
        await _a_chat(store)
    finally:
        await store.close()


async def _a_chat(store: SQLiteStore) -> None:
    begun = await store.begin_turn("c", "run-1", ["m1"])
    assert begun.turn == 1
    await store.commit_user_messages("c", 1, [UserMessage(message_id="m1", text="hi")])
    call = ToolCall(id="call-1", name="write_file", arguments='{"path": "a"}')
    await store.record_assistant("c", 1, 0, ModelReply(text="on it", tool_calls=[call]), final=False)
    await store.record_tool_result("c", 1, "call-1", "write_file", "ok", status="done")
    await store.record_assistant("c", 1, 1, ModelReply(text="done"), final=True)
    await store.update_turn(
        "c",
        1,
        TurnUpdate(
            status=TurnStatus.FAILED, reason=Reason.RECOVERY_FAILED, recovery_id="rec-1", can_continue=False
        ),
    )


async def _store_reads(path: Path) -> tuple[list[ChatMessage], list[Event], TurnState | None]:
    store = SQLiteStore(path)
    await store.open()
    try:
        record = await store.get_turn("c")
        return (
            await store.history("c"),
            await store.events("c", after_seq=1, limit=3),
            None if record is None else state_of(record),
        )
    finally:
        await store.close()


def _printed(rows: list[Any]) -> list[str]:
    return [transcript_line(r) if hasattr(r, "role") else event_line(r) for r in rows]


def test_reads_of_the_sqlite_file_are_the_stores(tmp_path: Path) -> None:
    settings_ = Settings(data_dir=tmp_path)
    asyncio.run(_write_a_chat(settings_.sqlite_path))
    reads = Reads(settings_)
    try:
        assert reads._db is not None  # read with the views, not through the store
        history, events, state = (
            reads.history("c"),
            reads.events("c", after_seq=1, limit=3),
            reads.turn_state("c"),
        )
        assert (reads.history("none"), reads.events("none"), reads.turn_state("none")) == ([], [], None)
        assert reads._store is None
    finally:
        reads.close()
    stored_history, stored_events, stored_state = asyncio.run(_store_reads(settings_.sqlite_path))
    assert all(isinstance(r, cli_views.MessageView) for r in history)
    assert _printed(history) == _printed(stored_history)
    assert [m.public() for m in history] == [m.public() for m in stored_history]
    assert _printed(events) == _printed(stored_events) and len(events) == 3
    assert isinstance(state, StateView) and stored_state is not None
    assert state.model_dump(mode="json") == stored_state.model_dump(mode="json")


def test_a_row_the_views_do_not_read_goes_through_the_store(tmp_path: Path) -> None:
    settings_ = Settings(data_dir=tmp_path)
    asyncio.run(_write_a_chat(settings_.sqlite_path))
    with sqlite3.connect(settings_.sqlite_path) as db:
        db.execute("UPDATE events SET payload = '[1]' WHERE seq = 2")  # a corrupt_event, in the store's words
        db.execute(
            "UPDATE turns SET started_at = '2026-01-02 03:04:05'"
        )  # the model reads it; the view does not
    reads = Reads(settings_)
    try:
        events = reads.events("c")
        assert reads._db is None and reads._store is not None  # the store's way from here on
        assert [e.type for e in events][:2] == ["turn_started", codec.CORRUPT_EVENT]
        assert events[1].payload["type"] == "user_message"
        assert isinstance(events[0], Event)
        state = reads.turn_state("c")
        assert isinstance(state, TurnState) and (state.status, state.recovery_id) == (
            TurnStatus.FAILED,
            "rec-1",
        )
    finally:
        reads.close()
    with sqlite3.connect(settings_.sqlite_path) as db:
        db.execute("UPDATE messages SET body = '{broken' WHERE role = 'tool'")
    reads = Reads(settings_)
    try:
        with pytest.raises(CorruptRowError, match="does not decode"):
            reads.history("c")
    finally:
        reads.close()


def test_reads_never_create_nor_migrate_the_file_themselves(tmp_path: Path) -> None:
    settings_ = Settings(data_dir=tmp_path / "new")
    reads = Reads(settings_)
    assert reads._db is None  # no file: the store creates it, as it did
    try:
        assert reads.history("c") == []
    finally:
        reads.close()
    assert settings_.sqlite_path.exists()
    with sqlite3.connect(settings_.sqlite_path) as db:
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    reads = Reads(settings_)
    assert reads._db is None  # another version: the store's way (it migrates)
    reads.close()
    other = Settings(database_url="postgresql://u:p@127.0.0.1:1/db")
    assert cli_reads._sqlite_file(other) is None
    assert cli_reads._sqlite_file(Settings(database_url=f"sqlite:///{tmp_path}/x.db")) == tmp_path / "x.db"


# --- `list` over the HTTP API: decoded as the SDK decodes the gRPC answer ----------------------


def _keyword(value: Any) -> Payload:
    return Payload(metadata={"encoding": b"json/plain", "type": b"Keyword"}, data=json.dumps(value).encode())


@pytest.mark.parametrize("nanos", [0, 1_000, 123_456_000, 123_456_789, 999_999_999, 500_000_000])
@pytest.mark.parametrize(
    "attributes",
    [
        {"ChatId": _keyword("c1"), "TurnStatus": _keyword("completed")},
        {"ChatId": _keyword(["c1"]), "RecoveryReason": _keyword([]), "TurnStatus": _keyword("awaiting_user")},
        {},
    ],
)
def test_a_listed_run_over_http_is_the_sdks(nanos: int, attributes: dict[str, Payload]) -> None:
    info = WorkflowExecutionInfo(
        execution=WorkflowExecution(workflow_id="chat-c1", run_id="r-1"),
        search_attributes=SearchAttributes(indexed_fields=attributes),
    )
    info.start_time.FromDatetime(datetime(2026, 12, 2, 0, 50, 11, tzinfo=UTC))
    info.start_time.nanos = nanos
    sdk = SdkExecution._from_raw_info(info, "default", DataConverter.default)
    names = ("ChatId", "TurnStatus", "RecoveryReason")
    # The HTTP API's JSON is the protobuf message's JSON mapping.
    ours = http_api._execution(json_format.MessageToDict(info), names)
    assert (ours.id, ours.run_id, ours.start_time) == (sdk.id, sdk.run_id, sdk.start_time)
    assert ours.start_time.isoformat() == sdk.start_time.isoformat()
    assert ours.search_attributes == {k: v for k, v in sdk.search_attributes.items() if k in names}


def test_a_listed_run_the_http_way_cannot_read_goes_the_grpc_way() -> None:
    good = {"execution": {"workflowId": "w", "runId": "r"}, "startTime": "2026-12-02T00:50:11Z"}
    assert http_api._execution(good, ()).start_time == datetime(2026, 12, 2, 0, 50, 11, tzinfo=UTC)
    for bad in (
        {**good, "startTime": "2026-12-02T00:50:11+01:00"},
        {"execution": {}},
        {
            **good,
            "searchAttributes": {"indexedFields": {"ChatId": {"metadata": {"encoding": "YmluYXJ5L251bGw="}}}},
        },
    ):
        with pytest.raises(http_api.Unavailable):
            http_api._execution(bad, ("ChatId",))


# --- `send` over the HTTP API: the request the SDK makes ---------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=8), st.text(min_size=1, max_size=8), st.text(max_size=40))
def test_send_over_http_sends_the_bytes_the_sdk_sends(chat_id: str, message_id: str, text: str) -> None:
    try:
        (chat_id + message_id + text).encode()
    except UnicodeEncodeError:
        return  # lone surrogates: `send` refuses them before any request, either way
    settings_ = Settings(task_queue="q")
    raw = tk.signal_with_start_request(settings_, chat_id, message_id, text)
    request = json_format.ParseDict(raw, SignalWithStartWorkflowExecutionRequest())  # a valid request
    converter = tk.data_converter(settings_).payload_converter
    assert list(request.input.payloads) == converter.to_payloads([ChatTurnInput(chat_id=chat_id)])
    assert list(request.signal_input.payloads) == converter.to_payloads(
        [UserMessage(message_id=message_id, text=text)]
    )
    expected = SearchAttributes()
    encode_search_attributes(
        TypedSearchAttributes(
            [SearchAttributePair(CHAT_ID_ATTR, chat_id), SearchAttributePair(TURN_STATUS_ATTR, "running")]
        ),
        expected,
    )
    assert request.search_attributes == expected
    assert (request.workflow_type.name, request.task_queue.name) == (tk.WORKFLOW_TYPE, "q")
    assert request.workflow_task_timeout.ToTimedelta() == TURN_TASK_TIMEOUT
    assert request.workflow_id_reuse_policy == WorkflowIdReusePolicy.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE
    assert (
        request.workflow_id_conflict_policy
        == WorkflowIdConflictPolicy.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING
    )
    assert request.identity and request.request_id
    # What only the SDK's client fills (a header, a memo, a delay...) stays empty, as without
    # interceptors; namespace, workflow id and signal name travel in the URL.
    assert not request.HasField("header") and not request.HasField("memo")
    assert set(raw) == {
        "workflowType",
        "taskQueue",
        "input",
        "workflowTaskTimeout",
        "identity",
        "requestId",
        "workflowIdReusePolicy",
        "workflowIdConflictPolicy",
        "searchAttributes",
        "signalInput",
        "userMetadata",
    }
    assert request.user_metadata.summary == converter.to_payload(tk.run_summary(chat_id))
    assert request.user_metadata.details == converter.to_payload(tk.RUN_DETAILS)


def test_the_message_ids_send_sends_plainly_are_those_the_model_takes() -> None:
    for length in (0, 1, 200, 201):
        plain = length in tk.MESSAGE_ID_LENGTHS
        try:
            UserMessage(message_id="m" * length, text="")
        except ValidationError:
            assert not plain
        else:
            assert plain


def test_follow_from_over_the_sqlite_file_is_the_stores(tmp_path: Path) -> None:
    settings_ = Settings(data_dir=tmp_path)
    asyncio.run(_write_a_chat(settings_.sqlite_path))

    async def stored(*args: Any) -> int:
        store = SQLiteStore(settings_.sqlite_path)
        await store.open()
        try:
            return await store.follow_from(*args)
        finally:
            await store.close()

    for args in (("c", "m1"), ("c", "unknown"), ("c", None), ("none", "m1"), ("none", None)):
        reads = Reads(settings_)
        try:
            assert reads.follow_from(*args) == asyncio.run(stored(*args)), args
            assert reads.plain
        finally:
            reads.close()
