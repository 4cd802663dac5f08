"""`turnkeeper web`'s API on the real dev server, with a real worker: every
endpoint and the answers it gives."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from tests.pg import pg_schema, url_with_search_path
from tests.support import ROOT, Stack, free_port
from tests.web_support import read_events, request, serving
from turnkeeper import client as tk
from turnkeeper.models import ChatTurnInput, Reason, RecoveryStart, ToolCallStatus, TurnStatus, UserMessage
from turnkeeper.store import TurnUpdate


async def _wait_status(server, chat: str, statuses: tuple[str, ...], timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await request(server, "GET", f"/api/chats/{chat}")
        if last.status == 200 and last.data["turn"] and last.data["status"] in statuses:
            return last.data
        await asyncio.sleep(0.1)
    raise AssertionError(f"chat {chat} never reached {statuses}; last: {last and last.data}")


async def test_send_read_follow_and_list(stack: Stack) -> None:
    stack.script([{"text": "hello back"}])
    await stack.start_worker()
    chat = stack.chat("web")
    with serving(stack.settings()) as web:
        sent = await request(web, "POST", f"/api/chats/{chat}/messages", {"text": "hi", "message_id": "m1"})
        assert (sent.status, sent.data) == (202, {"message_id": "m1"})
        again = await request(web, "POST", f"/api/chats/{chat}/messages", {"text": "hi", "message_id": "m1"})
        assert (again.status, again.data) == (202, {"message_id": "m1"})
        state = await _wait_status(web, chat, ("completed",))
        assert state["chat_id"] == chat and state["turn"] == 1 and state["reason"] is None

        rows = await request(web, "GET", f"/api/chats/{chat}/messages")
        assert rows.status == 200
        assert rows.data == [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello back"},
        ]
        assert rows.data == await stack.history(chat)  # as `history --json` prints it
        seq = int(rows.headers["x-event-seq"])
        assert seq == len(await stack.event_types(chat))

        # The stream from the start, then resumed after the user's message.
        status, events = await read_events(web, f"/api/chats/{chat}/events", "turn_end")
        assert status == 200
        stored = await (await stack.store()).events(chat)
        assert [(e.id, e.type, e.data) for e in events] == [(e.seq, e.type, e.payload) for e in stored]
        user_seq = next(e.id for e in events if e.type == "user_message")
        _, resumed = await read_events(
            web, f"/api/chats/{chat}/events", "turn_end", headers={"Last-Event-ID": str(user_seq)}
        )
        assert [e.id for e in resumed] == [e.id for e in events if e.id > user_seq]
        _, by_query = await read_events(web, f"/api/chats/{chat}/events?after={user_seq}", "turn_end")
        assert [e.id for e in by_query] == [e.id for e in resumed]

        # The same id once more, after its turn ended: still one message, no new turn.
        assert (
            await request(web, "POST", f"/api/chats/{chat}/messages", {"text": "hi", "message_id": "m1"})
        ).status == 202
        await asyncio.sleep(1.0)
        assert [m["content"] for m in await stack.history(chat) if m["role"] == "user"] == ["hi"]
        fresh = await request(web, "POST", f"/api/chats/{chat}/messages", {"text": "no id"})
        assert fresh.status == 202 and fresh.data["message_id"]

        chats = await request(web, "GET", "/api/chats")
        assert chats.status == 200
        mine = [c for c in chats.data if c["chat_id"] == chat]
        assert len(mine) == 1 and set(mine[0]) == {"chat_id", "turn", "status", "reason", "updated_at"}
        stamps = [c["updated_at"] for c in chats.data]
        assert stamps == sorted(stamps, reverse=True)

        health = await request(web, "GET", "/healthz")
        assert (health.status, health.data) == (200, {"temporal": "ok", "store": "ok"})
        spec = await request(web, "GET", "/openapi.json")
        assert spec.status == 200 and "/api/chats/{chat_id}/events" in spec.data["paths"]
        page = await request(web, "GET", f"/chats/{chat}")
        assert page.status == 200 and b'id="message"' in page.body
        assert "script-src 'self'" in page.headers["content-security-policy"]


async def test_a_worker_in_the_web_process_starts_new_turns_eagerly(stack: Stack) -> None:
    """TURNKEEPER_WEB_WORKER=1: the page's process runs the turns too. A message that
    starts a turn is in the run's input (eager start), not a signal; messages sent at
    once to one chat are each committed once, whichever starts the turn."""
    stack.script([{"text": f"answer {i}"} for i in range(6)])
    chat = stack.chat("hosted")
    with serving(stack.settings(), worker=True) as web:
        sent = await request(web, "POST", f"/api/chats/{chat}/messages", {"text": "hi", "message_id": "m1"})
        assert sent.status == 202
        await _wait_status(web, chat, ("completed",))
        history = await stack.client.get_workflow_handle(tk.workflow_id(chat)).fetch_history()
        kinds = [e.event_type for e in history.events]
        assert kinds[0] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
        assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED not in kinds
        started = history.events[0].workflow_execution_started_event_attributes
        assert json.loads(started.input.payloads[0].data)["pending"][0]["message_id"] == "m1"
        assert await stack.history(chat) == [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "answer 0"},
        ]

        sends = [
            request(web, "POST", f"/api/chats/{chat}/messages", {"text": t, "message_id": t})
            for t in ("two", "three", "four")
        ]
        assert [a.status for a in await asyncio.gather(*sends)] == [202, 202, 202]

        async def all_answered() -> bool:
            rows = await stack.history(chat)
            users = [m["content"] for m in rows if m["role"] == "user"]
            return sorted(users) == ["four", "hi", "three", "two"] and rows[-1]["role"] == "assistant"

        deadline = time.monotonic() + 30
        while not await all_answered():
            assert time.monotonic() < deadline, await stack.history(chat)
            await asyncio.sleep(0.2)
        health = await request(web, "GET", "/healthz")
        assert (health.status, health.data) == (200, {"temporal": "ok", "store": "ok"})


async def test_malformed_requests_are_refused(stack: Stack) -> None:
    stack.env_extra["TURNKEEPER_MAX_MESSAGE_BYTES"] = "100"
    await stack.start_worker()
    with serving(stack.settings()) as web:
        for bad in ("a" * 129, "a%20b", "a%2Fb", "%C3%BC", "a;b"):
            for method, suffix in (
                ("GET", ""),
                ("GET", "/messages"),
                ("POST", "/messages"),
                ("POST", "/continue"),
                ("POST", "/dismiss"),
                ("POST", "/stop"),
                ("GET", "/events"),
            ):
                answer = await request(
                    web, method, f"/api/chats/{bad}{suffix}", {"text": "x", "recovery_id": "r"}
                )
                assert answer.status == 422, (bad, method, suffix, answer.status, answer.body)
                assert "chat id" in answer.data["detail"]
        ok_id = "A-z_0.9:" + "x" * 120
        assert len(ok_id) == 128
        assert (await request(web, "GET", f"/api/chats/{ok_id}")).status == 404  # valid, unknown

        path = f"/api/chats/{stack.chat('bad')}/messages"
        for body in (
            b"not json",
            b"[1, 2]",
            b'{"message_id": "m"}',
            b'{"text": 5}',
            b'{"text": "  "}',
            b'{"text": "x", "message_id": ""}',
            b'{"text": "x", "message_id": 7}',
            json.dumps({"text": "x", "message_id": "m" * 201}).encode(),
            # JSON escapes what no payload (a lone surrogate) or PostgreSQL row (NUL) can carry.
            b'{"text": "\\ud800"}',
            b'{"text": "x", "message_id": "\\udfff"}',
            b'{"text": "x", "message_id": "a\\u0000b"}',
        ):
            answer = await request(web, "POST", path, raw=body, headers={"Content-Type": "application/json"})
            assert answer.status == 422, (body, answer.status, answer.body)
            assert answer.data["detail"] and "internal error" not in answer.data["detail"]
        too_long = await request(web, "POST", path, {"text": "x" * 101})
        assert too_long.status == 413 and "TURNKEEPER_MAX_MESSAGE_BYTES" in too_long.data["detail"]
        assert (await request(web, "POST", path, {"text": "é" * 51})).status == 413  # bytes, not characters
        huge = await request(web, "POST", path, raw=b" " * 10_000)
        assert huge.status == 413
        assert (await request(web, "POST", path, {"text": "x" * 100})).status == 202

        wrong = await request(web, "DELETE", f"/api/chats/{stack.chat()}/messages")
        assert (wrong.status, wrong.data) == (405, {"detail": "Method Not Allowed"})
        assert (await request(web, "GET", "/api/nothing")).data == {"detail": "Not Found"}

        unknown = stack.chat("nobody")
        for method, suffix, body in (
            ("GET", "", None),
            ("POST", "/continue", {"recovery_id": "r"}),
            ("POST", "/dismiss", {"recovery_id": "r"}),
            ("POST", "/stop", {}),
        ):
            answer = await request(web, method, f"/api/chats/{unknown}{suffix}", body)
            assert answer.status == 404, (suffix, answer.status, answer.body)
        assert (await request(web, "GET", f"/api/chats/{unknown}/messages")).data == []
        for body in ({}, {"recovery_id": ""}, {"recovery_id": 3}, {"recovery_id": "\ud800"}):
            for decision in ("continue", "dismiss"):
                answer = await request(web, "POST", f"/api/chats/{unknown}/{decision}", body)
                assert answer.status == 422, (body, answer.status, answer.body)
        status, _ = await read_events(
            web, f"/api/chats/{unknown}/events", "never", headers={"Last-Event-ID": "x1"}
        )
        assert status == 422


async def test_continue_dismiss_and_stop(stack: Stack) -> None:
    stack.script([{"error": "the provider said no"}])
    await stack.start_worker()
    with serving(stack.settings()) as web:
        chat = stack.chat("gate")
        await request(web, "POST", f"/api/chats/{chat}/messages", {"text": "hi"})
        gate = await _wait_status(web, chat, ("awaiting_user",))
        assert gate["reason"] == "model_failed" and gate["can_continue"]
        assert "the provider said no" in gate["detail"]
        base = f"/api/chats/{chat}"

        stale = await request(web, "POST", f"{base}/continue", {"recovery_id": "not-the-id"})
        assert stale.status == 409 and "stale" in stale.data["detail"]
        resumed = await request(web, "POST", f"{base}/continue", {"recovery_id": gate["recovery_id"]})
        assert resumed.status == 200
        assert (resumed.data["status"], resumed.data["reason"], resumed.data["attempts"]) == (
            "resuming",
            "user_confirmed",
            1,
        )
        again = await _wait_status(web, chat, ("awaiting_user",))  # the model fails again
        assert again["recovery_id"] == gate["recovery_id"]
        dismissed = await request(web, "POST", f"{base}/dismiss", {"recovery_id": gate["recovery_id"]})
        assert dismissed.status == 200
        assert (dismissed.data["status"], dismissed.data["reason"]) == ("recovered", "dismissed")
        late = await request(web, "POST", f"{base}/continue", {"recovery_id": gate["recovery_id"]})
        assert late.status == 409 and "not waiting for confirmation" in late.data["detail"]
        ended = await request(web, "POST", f"{base}/stop", {})
        assert ended.status == 409 and "is running" in ended.data["detail"]

        # A gate whose context is gone: Continue refused in the validator's words.
        lost = stack.chat("lost")
        store = await stack.store()
        await store.begin_turn(lost, "lost-run", ["m1"])
        await store.commit_user_messages(lost, 1, [UserMessage(message_id="m1", text="lost")])
        await stack.client.start_workflow(
            "ChatTurn",
            ChatTurnInput(
                chat_id=lost,
                recovery=RecoveryStart(turn=1, reason=Reason.CHECKPOINT_UNKNOWN, can_continue=False),
            ),
            id=tk.workflow_id(lost),
            task_queue=stack.task_queue,
        )
        waiting = await _wait_status(web, lost, ("awaiting_user",))
        assert not waiting["can_continue"]
        refused = await request(
            web, "POST", f"/api/chats/{lost}/continue", {"recovery_id": waiting["recovery_id"]}
        )
        assert refused.status == 409 and "context is unavailable" in refused.data["detail"]

        # A turn whose recovery failed, its runs gone: decided in the store.
        failed = stack.chat("failed")
        await store.begin_turn(failed, "run-long-gone", ["m1"])
        await store.commit_user_messages(failed, 1, [UserMessage(message_id="m1", text="deploy it")])
        await store.update_turn(
            failed,
            1,
            TurnUpdate(
                status=TurnStatus.FAILED,
                reason=Reason.RECOVERY_FAILED,
                recovery_id="rec-1",
                can_continue=False,
            ),
        )
        base = f"/api/chats/{failed}"
        shown = await request(web, "GET", base)
        assert (shown.status, shown.data["status"], shown.data["reason"]) == (
            200,
            "failed",
            "recovery_failed",
        )
        refused = await request(web, "POST", f"{base}/continue", {"recovery_id": "rec-1"})
        assert refused.status == 409 and "context is unavailable" in refused.data["detail"]
        stale = await request(web, "POST", f"{base}/dismiss", {"recovery_id": "rec-0"})
        assert stale.status == 409 and "stale" in stale.data["detail"]
        closed = await request(web, "POST", f"{base}/dismiss", {"recovery_id": "rec-1"})
        assert closed.status == 200
        assert (closed.data["status"], closed.data["reason"]) == ("recovered", "dismissed")
        twice = await request(web, "POST", f"{base}/dismiss", {"recovery_id": "rec-1"})
        assert twice.status == 409 and "not waiting for confirmation" in twice.data["detail"]


async def test_stop_while_a_tool_runs(stack: Stack) -> None:
    stack.env_extra.update(
        {
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
            "TURNKEEPER_TOOLS": "slow_write",
            "TK_LEDGER": str(stack.dir / "ledger.txt"),
        }
    )
    stack.script(
        [
            {
                "tool_calls": [
                    {"name": "slow_write", "arguments": {"path": "s.txt", "content": "x", "seconds": 30}}
                ]
            }
        ]
    )
    await stack.start_worker()
    slow = stack.chat("slow")
    with serving(stack.settings()) as web:
        await request(web, "POST", f"/api/chats/{slow}/messages", {"text": "write slowly"})
        await stack.wait_state(slow, lambda s: [c.status for c in s.tool_calls] == [ToolCallStatus.RUNNING])
        stopping = await request(web, "POST", f"/api/chats/{slow}/stop", {})
        assert (stopping.status, stopping.data) == (202, {})
        # The status says `stopped` at once; the tool shows interrupted once it has stopped.
        stopped = await _wait_status(web, slow, ("recovered",))
        assert stopped["reason"] == "stopped"
        await stack.wait_state(
            slow, lambda s: [c.status for c in s.tool_calls] == [ToolCallStatus.INTERRUPTED]
        )
        again = await request(web, "POST", f"/api/chats/{slow}/stop", {})
        assert again.status == 409 and "is running" in again.data["detail"]


async def test_token_guards_the_api(stack: Stack) -> None:
    stack.script([{"text": "ok"}])
    await stack.start_worker()
    chat = stack.chat("tok")
    with serving(stack.settings(), token="s3cret") as web:
        for method, path in (
            ("GET", "/api/chats"),
            ("GET", f"/api/chats/{chat}"),
            ("POST", f"/api/chats/{chat}/messages"),
            ("GET", f"/api/chats/{chat}/events"),
            ("POST", f"/api/chats/{chat}/continue"),
            ("POST", f"/api/chats/{chat}/stop"),
            ("GET", f"/api/chats/{chat}/messages"),
            ("POST", f"/api/chats/{chat}/dismiss"),
        ):
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": "s3cret"},
                {"Cookie": "turnkeeper_session=s3cret"},
            ):
                answer = await request(web, method, path, {"text": "x"}, headers=headers)
                assert answer.status == 401, (method, path, headers, answer.status)
                assert answer.headers["www-authenticate"] == "Bearer"
        assert (
            await request(web, "GET", "/api/chats", headers={"Authorization": "Bearer s3cret"})
        ).status == 200
        # Open without it: the page (its login form), its assets, the health check and the description.
        for path in ("/", f"/chats/{chat}", "/static/app.js", "/healthz", "/openapi.json"):
            assert (await request(web, "GET", path)).status == 200, path

        assert (await request(web, "POST", "/login", {"token": "wrong"})).status == 401
        login = await request(web, "POST", "/login", {"token": "s3cret"})
        assert login.status == 204
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert "s3cret" not in cookie
        session = {"Cookie": cookie.split(";", 1)[0]}
        sent = await request(web, "POST", f"/api/chats/{chat}/messages", {"text": "hi"}, headers=session)
        assert sent.status == 202
        await stack.wait_turn_done(chat, 1)
        rows = await request(web, "GET", f"/api/chats/{chat}/messages", headers=session)
        assert [m["content"] for m in rows.data] == ["hi", "ok"]


async def test_other_sites_cannot_drive_it(stack: Stack) -> None:
    await stack.start_worker()
    chat = stack.chat("site")
    path = f"/api/chats/{chat}/messages"
    with serving(stack.settings()) as web:
        evil = await request(web, "POST", path, {"text": "x"}, headers={"Origin": "http://evil.example"})
        assert evil.status == 403 and "another site" in evil.data["detail"]
        assert (
            await request(web, "POST", f"/api/chats/{chat}/stop", headers={"Origin": "null"})
        ).status == 403
        plain = await request(web, "POST", path, raw=b'{"text": "x"}', headers={"Content-Type": "text/plain"})
        assert plain.status == 415
        # A name that resolves here, as a rebinding site's would: nothing is served without a token.
        for where in ("/api/chats", "/", "/healthz"):
            rebound = await request(web, "GET", where, headers={"Host": f"evil.example:{web.port}"})
            assert rebound.status == 403, where
        for host in (f"localhost:{web.port}", f"127.0.0.1:{web.port}"):
            assert (await request(web, "GET", "/api/chats", headers={"Host": host})).status == 200
        own = await request(web, "POST", path, {"text": "x"}, headers={"Origin": web.url})
        assert own.status == 202
    with serving(stack.settings(), token="t0ken") as web:
        named = await request(
            web, "GET", "/api/chats", headers={"Host": "chat.example.org", "Authorization": "Bearer t0ken"}
        )
        assert named.status == 200


async def test_health_when_temporal_is_gone(stack: Stack) -> None:
    with serving(stack.settings(TEMPORAL_ADDRESS="127.0.0.1:9")) as web:
        health = await request(web, "GET", "/healthz")
        assert health.status == 503 and health.data["store"] == "ok" and health.data["temporal"] != "ok"
        sent = await request(web, "POST", f"/api/chats/{stack.chat()}/messages", {"text": "hi"})
        assert sent.status == 503 and "cannot reach Temporal" in sent.data["detail"]


async def test_the_command_refuses_an_open_address_without_a_token(stack: Stack) -> None:
    cmd = [str(Path(sys.executable).parent / "turnkeeper")]
    env = stack.env(TURNKEEPER_WEB_ADDRESS="0.0.0.0:8765")
    refused = subprocess.run([*cmd, "web"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "without a token" in refused.stderr and "TURNKEEPER_WEB_TOKEN" in refused.stderr

    port = free_port()
    proc = subprocess.Popen(
        [*cmd, "web"],
        env=stack.env(TURNKEEPER_WEB_ADDRESS=f"127.0.0.1:{port}"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert first.strip() == f"turnkeeper web: http://127.0.0.1:{port}/ (no token: this machine only)"
        deadline = time.monotonic() + 30
        while True:
            try:
                assert (await request(port, "GET", "/healthz")).status == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "turnkeeper web never answered"
                await asyncio.sleep(0.1)
    finally:
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0


@pytest.mark.postgres
async def test_on_a_postgresql_store(stack: Stack) -> None:
    async with pg_schema(create=True) as schema:
        stack.env_extra["TURNKEEPER_DATABASE_URL"] = url_with_search_path(schema)
        stack.script([{"text": "from postgres"}])
        await stack.start_worker()
        chat = stack.chat("pg")
        with serving(stack.settings()) as web:
            assert (await request(web, "GET", "/healthz")).data == {"temporal": "ok", "store": "ok"}
            assert (await request(web, "POST", f"/api/chats/{chat}/messages", {"text": "hi"})).status == 202
            _, events = await read_events(web, f"/api/chats/{chat}/events", "turn_end")
            logged = [e for e in events if e.type != "assistant_delta"]  # deltas are not in the log: no id
            assert [e.id for e in logged] == list(range(1, len(logged) + 1))
            assert "assistant_message" in [e.type for e in logged]
            rows = await request(web, "GET", f"/api/chats/{chat}/messages")
            assert [m["content"] for m in rows.data] == ["hi", "from postgres"]
            assert [c["chat_id"] for c in (await request(web, "GET", "/api/chats")).data] == [chat]
        await stack.close()


async def test_the_answer_streams_as_deltas_before_it_is_recorded(stack: Stack) -> None:
    """While the model streams, `assistant_delta` events carry its text (no `id:`,
    so they are not in the log); the pieces add up to the recorded answer, and
    neither the transcript nor the workflow history holds them."""
    from turnkeeper.testing import FakeChatServer

    words = "one two three four five six seven eight"
    with FakeChatServer([{"text": words, "chunk_delay": 0.15}]) as server:
        stack.env_extra.update(
            {
                "TURNKEEPER_MODEL": "openai:fake",
                "OPENAI_BASE_URL": server.base_url,
                "OPENAI_API_KEY": "test-key",
            }
        )
        await stack.start_worker()
        chat = stack.chat("stream")
        with serving(stack.settings()) as web:
            reading = asyncio.create_task(read_events(web, f"/api/chats/{chat}/events", "turn_end"))
            await asyncio.sleep(0.3)  # the stream is open before the message
            sent = await request(web, "POST", f"/api/chats/{chat}/messages", {"text": "count"})
            assert sent.status == 202
            status, events = await reading
        assert server.requests[0].get("stream") is True
    assert status == 200
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "assistant_delta"]
    assert len(deltas) >= 3, types  # one piece per write, written at most every 50 ms
    assert all(e.id is None for e in deltas) and all(e.id is not None for e in events if e not in deltas)
    assert types.index("assistant_delta") < types.index("assistant_message")
    text = ""
    for d in deltas:
        assert (d.data["turn"], d.data["step"], d.data["attempt"]) == (1, 0, 1)
        assert d.data["offset"] == len(text)
        text += d.data["text"]
    assert text == words
    assert "assistant_delta" not in [e.type for e in await (await stack.store()).events(chat)]
    # The answer travels once, in the model call's result (the reconciler restores an
    # answer from there); its pieces add nothing to the history.
    history = await stack.client.get_workflow_handle(f"chat-{chat}").fetch_history()
    carrying = [EventType.Name(e.event_type) for e in history.events if b"four" in e.SerializeToString()]
    assert carrying == ["EVENT_TYPE_ACTIVITY_TASK_COMPLETED"], carrying


def test_a_stream_sends_each_attempt_from_its_start_and_drops_the_dead_one() -> None:
    """What one event stream makes of the drafts it is handed: pieces after what it
    sent; a newer attempt (the call run again) from offset 0; an older attempt, or
    a draft read before its step's reply was recorded, not at all."""
    from turnkeeper.store import Draft
    from turnkeeper.web.sse import _Deltas

    def draft(attempt: int, text: str, step: int = 0, recorded: bool = False) -> Draft:
        return Draft(chat_id="c", turn=1, step=step, attempt=attempt, text=text, version=1, recorded=recorded)

    def payload(line: str | None) -> dict | None:
        return None if line is None else json.loads(line.split("data: ", 1)[1])

    deltas = _Deltas()
    assert payload(deltas.next(draft(1, "Hel"))) == {
        "turn": 1,
        "step": 0,
        "attempt": 1,
        "text": "Hel",
        "offset": 0,
    }
    assert payload(deltas.next(draft(1, "Hello"))) == {
        "turn": 1,
        "step": 0,
        "attempt": 1,
        "text": "lo",
        "offset": 3,
    }
    assert deltas.next(draft(1, "Hello")) is None  # nothing new
    assert payload(deltas.next(draft(2, "Hi")))["offset"] == 0  # the call ran again
    assert deltas.next(draft(1, "Hello world")) is None  # the dead attempt
    assert deltas.next(draft(2, "Hi", recorded=True)) is None
    deltas.recorded({"turn": 1, "step": 0, "text": "Hi there"})
    assert deltas.next(draft(2, "Hi there")) is None  # read before the reply was recorded
    assert payload(deltas.next(draft(3, "Again")))["attempt"] == 3  # run once more after it
    assert payload(deltas.next(draft(1, "Next", step=1)))["text"] == "Next"
    assert "id:" not in (deltas.next(draft(1, "Next step", step=1)) or "")


@pytest.mark.postgres
async def test_on_postgresql_new_events_are_pushed_to_the_stream(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a PostgreSQL store the stream is woken by LISTEN/NOTIFY when another
    process writes the chat's log: with both polls set to 30 s, events written
    by a store of their own still arrive at once."""
    from turnkeeper.models import NewEvent
    from turnkeeper.store.postgres import PostgresStore
    from turnkeeper.web import feed

    monkeypatch.setattr(feed, "EVENTS_POLL_S", 30.0)
    monkeypatch.setattr(feed, "PUSHED_POLL_S", 30.0)
    async with pg_schema(create=True) as schema:
        url = url_with_search_path(schema)
        stack.env_extra["TURNKEEPER_DATABASE_URL"] = url
        chat = stack.chat("push")
        writer = PostgresStore(url)
        await writer.open()
        try:
            with serving(stack.settings()) as web:
                reading = asyncio.create_task(read_events(web, f"/api/chats/{chat}/events", "turn_end"))
                await asyncio.sleep(1.0)  # the stream is open, its feed listening
                written = []
                for kind in ("session_updated", "session_updated", "turn_end"):
                    written.append(time.monotonic())
                    await writer.append_events(chat, [NewEvent(type=kind, payload={"turn": 1})])
                    await asyncio.sleep(0.3)
                status, events = await reading
        finally:
            await writer.close()
    assert status == 200 and [e.type for e in events] == ["session_updated", "session_updated", "turn_end"]
    delays = [e.at - t for e, t in zip(events, written, strict=True)]
    assert max(delays) < 2.0, delays  # a poll would have waited 30 s
