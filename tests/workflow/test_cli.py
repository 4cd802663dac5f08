"""The `turnkeeper` console script, run as a real process against a real worker."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support import Stack

TURNKEEPER = str(Path(sys.executable).parent / "turnkeeper")


async def tk(
    stack: Stack, *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    proc = await asyncio.create_subprocess_exec(
        TURNKEEPER,
        *args,
        env=stack.env() if env is None else env,
        cwd=stack.dir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(args, proc.returncode, out.decode(), err.decode())


async def test_send_shows_tools_and_prints_the_answer(stack: Stack) -> None:
    stack.script(
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}]},
            {"text": "wrote a.txt"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat()
    r = await tk(stack, "send", chat, "please write a.txt")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["  -> write_file started", "  <- write_file done", "wrote a.txt"]

    status = json.loads((await tk(stack, "status", chat, "--json")).stdout)
    assert status["status"] == "completed" and status["turn"] == 1
    assert status["tool_calls"] == [{"id": "call_0_0", "name": "write_file", "status": "done"}]

    hist = json.loads((await tk(stack, "history", chat, "--json")).stdout)
    assert [m["role"] for m in hist] == ["user", "assistant", "tool", "assistant"]
    assert hist[1]["tool_calls"][0]["id"] == hist[2]["tool_call_id"]

    events = [json.loads(line) for line in (await tk(stack, "events", chat, "--json")).stdout.splitlines()]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "turn_started" and events[-1]["type"] == "turn_end"

    listed = []
    for _ in range(50):  # visibility is eventually consistent
        listed = json.loads((await tk(stack, "list", "--status", "completed", "--json")).stdout)
        if any(r["chat_id"] == chat for r in listed):
            break
        await asyncio.sleep(0.2)
    assert [r["status"] for r in listed if r["chat_id"] == chat] == ["completed"]


async def test_send_retried_with_the_same_message_id_shows_its_turn(stack: Stack) -> None:
    """A retry of a message already committed (same --message-id, e.g. after a lost
    connection) starts no turn; `send` shows the turn that took it instead of waiting."""
    stack.script(
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}]},
            {"text": "wrote a.txt"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat()
    first = await tk(stack, "send", chat, "please write a.txt", "--message-id", "m-1")
    assert first.returncode == 0, first.stderr
    again = await tk(stack, "send", chat, "please write a.txt", "--message-id", "m-1", "--timeout", "20")
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    assert [m.get("content") for m in await stack.history(chat)].count("please write a.txt") == 1


async def test_send_keeps_watching_through_a_store_outage_and_prints_the_answer(stack: Stack) -> None:
    """The message is acknowledged and the turn waits out the outage: `send` says the
    store does not answer and goes on watching, rather than exiting as if it had failed
    (a user would send the message again, and a new id makes it a second message)."""
    stack.script(
        [
            {
                "tool_calls": [
                    {"name": "slow_write", "arguments": {"path": "a.txt", "content": "hi", "seconds": 1.5}}
                ]
            },
            {"text": "wrote a.txt"},
        ]
    )
    stack.env_extra.update(
        {"TURNKEEPER_TOOL_MODULES": "tests.ledger_tools", "TURNKEEPER_TOOLS": "slow_write"}
    )
    await stack.start_worker()
    chat = stack.chat()
    proc = await asyncio.create_subprocess_exec(
        TURNKEEPER,
        "send",
        chat,
        "please write a.txt",
        "--timeout",
        "90",
        env=stack.env(),
        cwd=stack.dir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    first = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert first.decode().strip() == "-> slow_write started"  # `send` is watching the turn
    db, aside = stack.data / "sessions.db", stack.data / "sessions.db.aside"
    db.rename(aside)  # the store is gone while it watches
    try:
        await asyncio.sleep(3)
        assert proc.returncode is None
    finally:
        aside.rename(db)
    rest, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()
    assert rest.decode().splitlines()[-1] == "wrote a.txt"
    assert "the session store does not answer" in err.decode() and "the message is safe" in err.decode()
    assert "the session store answers again" in err.decode()
    assert [m.get("content") for m in await stack.history(chat)].count("please write a.txt") == 1


async def test_send_without_a_worker_says_so(stack: Stack) -> None:
    stack.script([{"text": "later"}])
    chat = stack.chat()
    r = await tk(stack, "send", chat, "hello", "--timeout", "7")
    assert r.returncode == 1
    assert f"no worker is serving task queue {stack.settings().task_queue!r}" in r.stderr
    assert "no answer within 7 s (the message is safe" in r.stderr
    await stack.start_worker()  # and it was safe
    await stack.wait_turn_done(chat, 1)
    assert [m["content"] for m in await stack.history(chat)] == ["hello", "later"]


def _ctrl_c_as_in_a_shell() -> None:
    """The child takes SIGINT as a terminal's Ctrl-C reaches it, whatever this test
    process (its SDK threads, earlier tests) left blocked or ignored."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def test_send_says_the_message_is_saved_while_it_waits_and_when_interrupted(stack: Stack) -> None:
    """No worker takes the turn: within seconds `send` says the message is saved and
    what it waits for; Ctrl-C then stops only the watching (exit 130), says the message
    is saved and how to follow it, and a worker started later takes it once."""
    stack.script([{"text": "later"}])
    chat = stack.chat()
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        TURNKEEPER,
        "send",
        chat,
        "hello",
        "--message-id",
        "m-1",
        "--timeout",
        "120",
        env=stack.env(),
        cwd=stack.dir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_ctrl_c_as_in_a_shell,
    )
    assert proc.stderr is not None
    seen: list[str] = []
    while not any("waiting for a worker" in line for line in seen):
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        assert line, f"stderr ended: {seen}"
        seen.append(line)
    assert (
        time.monotonic() - started < 15
    )  # not a silent wait (2 s after sending; the CLI starts slower on a busy machine)
    assert "turnkeeper: message m-1 is saved; waiting for a worker to take the turn\n" in seen
    proc.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    stderr = "".join(seen) + err.decode()
    assert proc.returncode == 130, stderr
    assert out.decode() == "" and "Traceback" not in stderr
    assert (
        f"interrupted; message m-1 is saved and its turn goes on without this command: follow it with "
        f"`turnkeeper events {chat} --follow` or `turnkeeper status {chat}`"
    ) in stderr
    await stack.start_worker()  # and it was saved
    await stack.wait_turn_done(chat, 1)
    assert [m["content"] for m in await stack.history(chat)] == ["hello", "later"]


async def test_events_prints_a_long_log_whole_and_refuses_a_missing_chat(stack: Stack) -> None:
    from turnkeeper.models import NewEvent

    chat = stack.chat("long")
    store = await stack.store()
    await store.append_events(
        chat, [NewEvent(type="session_updated", payload={"scope": "thread", "i": i}) for i in range(2500)]
    )
    printed = await tk(stack, "events", chat, "--json")
    assert printed.returncode == 0, printed.stderr
    assert [json.loads(line)["seq"] for line in printed.stdout.splitlines()] == list(range(1, 2501))

    missing = await tk(stack, "events", stack.chat("none"))
    assert missing.returncode == 1 and "no chat" in missing.stderr

    # A reader that stops early (`| head`) is no error: no traceback, exit 0.
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        f"{TURNKEEPER} events {chat} --json | head -n 1 >/dev/null; exit ${{PIPESTATUS[0]}}",
        env=stack.env(),
        cwd=stack.dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert (proc.returncode, err.decode()) == (0, "")


async def test_history_with_an_unreadable_row_names_it(stack: Stack) -> None:
    import sqlite3

    from turnkeeper.models import UserMessage

    chat = stack.chat("broken")
    store = await stack.store()
    begun = await store.begin_turn(chat, "run-1", ["m1"])
    await store.commit_user_messages(chat, begun.turn or 1, [UserMessage(message_id="m1", text="hi")])
    with sqlite3.connect(stack.settings().sqlite_path) as db:
        db.execute("UPDATE messages SET body = '{broken' WHERE chat_id = ?", (chat,))
    shown = await tk(stack, "history", chat)
    assert shown.returncode == 1
    assert shown.stderr.startswith(f"turnkeeper: session store: chat {chat!r}: message row id=")
    assert "does not decode" in shown.stderr and "Traceback" not in shown.stderr


async def test_status_of_a_run_with_no_usable_message_yet(stack: Stack) -> None:
    stack.script([{"text": "unused"}])
    await stack.start_worker()
    chat = stack.chat("idle")
    await stack.client.start_workflow(  # a message without an id: refused, the run waits on
        "ChatTurn",
        {"chat_id": chat},
        id=f"chat-{chat}",
        task_queue=stack.task_queue,
        start_signal="user_message",
        start_signal_args=[{"text": "no id"}],
    )
    await stack.wait_state(chat, lambda s: s.chat_id == chat)
    shown = await tk(stack, "status", chat)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"chat {chat}: no turn yet, waiting for its first message"


async def test_commands_that_need_a_worker_say_so_when_none_runs(stack: Stack) -> None:
    """The `state` query needs a worker. Without one: `status` shows the store's record,
    `continue` is refused at once with the reason, and `stop` is sent all the same
    (a signal waits in the run's history) and takes effect when a worker starts."""
    stack.script([{"error": "the provider refused this request"}])
    worker = stack.spawn_worker()
    await stack.wait_serving(worker)
    chat = stack.chat("no-worker")
    assert (await tk(stack, "send", chat, "hello")).returncode == 3
    stack.kill(worker)

    status = await tk(stack, "status", chat)
    assert status.returncode == 0, status.stderr
    assert "awaiting_user (model_failed)" in status.stdout.splitlines()[0]
    assert "no worker answered" in status.stderr and "session store's record" in status.stderr
    refused = await tk(stack, "continue", chat)
    assert refused.returncode == 1 and "no worker answered" in refused.stderr
    assert "Traceback" not in status.stderr + refused.stderr
    stopped = await tk(stack, "stop", chat)
    assert stopped.returncode == 0, stopped.stderr
    assert "the turn stops when one starts" in stopped.stdout

    stack.spawn_worker()
    final = await stack.wait_turn_done(chat, 1, timeout=60)
    assert (final.status.value, final.reason.value) == ("recovered", "stopped")


async def test_send_no_wait_returns_once_durable(stack: Stack) -> None:
    stack.script([{"text": "later"}])
    chat = stack.chat()
    # No worker yet: the message is durable in Temporal all the same.
    r = await tk(stack, "send", chat, "hello", "--no-wait", "--message-id", "m-1")
    assert r.returncode == 0 and "m-1" in r.stdout
    await stack.start_worker()
    await stack.wait_turn_done(chat, 1)
    assert [m["content"] for m in await stack.history(chat)] == ["hello", "later"]


async def test_refusals_and_usage_errors(stack: Stack) -> None:
    stack.script([{"text": "ok"}])
    await stack.start_worker()
    chat = stack.chat()
    assert (await tk(stack, "send", chat, "hi")).returncode == 0

    refused = await tk(stack, "continue", chat)
    assert refused.returncode == 1 and "not waiting for confirmation" in refused.stderr
    assert (await tk(stack, "dismiss", chat)).returncode == 1
    stop = await tk(stack, "stop", chat)
    assert stop.returncode == 1 and "no turn" in stop.stderr

    missing = await tk(stack, "status", "no-such-chat-anywhere")
    assert missing.returncode == 1 and "no chat" in missing.stderr
    assert (await tk(stack, "history", "no-such-chat-anywhere")).returncode == 1

    big = await tk(stack, "send", chat, "x" * 70_000)
    assert big.returncode == 1 and "limit" in big.stderr

    assert (await tk(stack, "frobnicate")).returncode == 2
    assert (await tk(stack, "send", chat)).returncode == 2


async def test_continue_wait_follows_the_resumed_turn(stack: Stack) -> None:
    from turnkeeper.testing import FakeChatServer

    with FakeChatServer() as server:
        server.script(
            [
                {"status": 400, "message": "refused"},
                {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}]},
                {"status": 400, "message": "refused again"},
                {"text": "wrote a.txt at last"},
            ]
        )
        stack.env_extra.update(
            {"TURNKEEPER_MODEL": "openai:fake", "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "k"}
        )
        await stack.start_worker()
        chat = stack.chat()
        assert (await tk(stack, "send", chat, "write a.txt")).returncode == 3
        resumed = await tk(stack, "continue", chat, "--wait")
        assert resumed.returncode == 3, resumed.stderr  # the resumed turn failed again: it asks again
        lines = resumed.stdout.splitlines()
        assert "resuming (user_confirmed)" in lines[0]
        assert lines[1:3] == ["  -> write_file started", "  <- write_file done"]
        assert "awaiting_user (loop_guard)" in lines[3]
        finished = await tk(stack, "continue", chat, "--wait")
        assert finished.returncode == 0, finished.stderr
        assert finished.stdout.splitlines()[1:] == ["wrote a.txt at last"]


async def test_send_that_ends_at_a_gate_exits_3(stack: Stack) -> None:
    stack.script([{"error": "the provider refused this request"}])
    await stack.start_worker()
    chat = stack.chat()
    r = await tk(stack, "send", chat, "hello")
    assert r.returncode == 3, r.stderr
    assert "model_failed" in r.stdout
    assert f"turnkeeper continue {chat}" in r.stdout and f"turnkeeper dismiss {chat}" in r.stdout

    awaiting = []
    for _ in range(50):  # visibility is eventually consistent
        awaiting = json.loads((await tk(stack, "list", "--awaiting", "--json")).stdout)
        if any(r["chat_id"] == chat for r in awaiting):
            break
        await asyncio.sleep(0.2)
    assert [(r["status"], r["reason"]) for r in awaiting if r["chat_id"] == chat] == [
        ("awaiting_user", "model_failed")
    ]
    status = await tk(stack, "status", chat)
    assert "recovery id:" in status.stdout and "turnkeeper continue" in status.stdout

    dismissed = await tk(stack, "dismiss", chat)
    assert dismissed.returncode == 0, dismissed.stderr
    assert "recovered (dismissed)" in dismissed.stdout
    hist = await stack.history(chat)
    assert [m["role"] for m in hist] == ["user", "assistant"]


async def test_stop_cancels_the_running_turn(stack: Stack) -> None:
    stack.env_extra.update(
        {"TURNKEEPER_TOOL_MODULES": "tests.ledger_tools", "TURNKEEPER_TOOLS": "slow_write"}
    )
    stack.script(
        [
            {
                "tool_calls": [
                    {"name": "slow_write", "arguments": {"path": "s.txt", "content": "s", "seconds": 30}}
                ]
            }
        ]
    )
    await stack.start_worker()
    chat = stack.chat()
    handle = await stack.send(chat, "slow")
    await stack.wait_state(chat, lambda s: bool(s.tool_calls))
    r = await tk(stack, "stop", chat)
    assert r.returncode == 0, r.stderr
    final = await asyncio.wait_for(handle.result(), 30)
    assert (final.status.value, final.reason.value) == ("recovered", "stopped")
    assert not (stack.ws / "s.txt").exists()


async def test_status_of_a_turn_whose_run_ended_without_closing_it(stack: Stack) -> None:
    """A terminated run's last state says `running`; `status` says the run is gone."""
    from turnkeeper.models import ToolCallStatus

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
                    {"name": "slow_write", "arguments": {"path": "s.txt", "content": "x", "seconds": 20}}
                ]
            },
            {"text": "written"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat("ended")
    handle = await stack.send(chat, "write slowly")
    await stack.wait_state(chat, lambda s: [c.status for c in s.tool_calls] == [ToolCallStatus.RUNNING])
    running = await tk(stack, "status", chat)
    assert running.returncode == 0 and "run has ended" not in running.stdout
    await handle.terminate("an operator")
    ended = await tk(stack, "status", chat)
    assert ended.returncode == 0, ended.stderr
    assert "its run has ended (terminated) without closing the turn" in ended.stdout
    assert "running" in ended.stdout.splitlines()[0]


async def test_send_waiting_on_a_turn_a_newer_message_superseded_returns(stack: Stack) -> None:
    """The run of the turn `send` waits on is terminated; the chat's next message
    closes that turn as superseded, and the waiting `send` says so and returns."""
    from turnkeeper.models import ToolCallStatus

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
                    {"name": "slow_write", "arguments": {"path": "s.txt", "content": "x", "seconds": 20}}
                ]
            },
            {"text": "unused: the superseded row is assistant call 1"},
            {"text": "the next turn's answer"},
            {"text": "the chat goes on"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat("superseded")
    waiting = asyncio.create_task(tk(stack, "send", chat, "write slowly"))
    await stack.wait_state(chat, lambda s: [c.status for c in s.tool_calls] == [ToolCallStatus.RUNNING])
    await stack.client.get_workflow_handle(f"chat-{chat}").terminate("an operator")
    assert (await tk(stack, "send", chat, "never mind", "--no-wait")).returncode == 0
    first = await asyncio.wait_for(waiting, 60)
    assert first.returncode == 0, first.stderr
    assert "turn 1 ended: recovered (superseded)" in first.stdout
    later = await tk(stack, "send", chat, "and now?")
    assert later.returncode == 0 and "the chat goes on" in later.stdout, later.stderr


async def test_send_waiting_on_a_turn_whose_recovery_failed_exits_3(stack: Stack) -> None:
    """The reconciler marks the turn `send` waits on failed/recovery_failed: no run
    will ever end it, so `send` shows what the user can do and exits 3."""
    from turnkeeper.models import Reason, ToolCallStatus, TurnStatus
    from turnkeeper.store import TurnUpdate

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
                    {"name": "slow_write", "arguments": {"path": "s.txt", "content": "x", "seconds": 20}}
                ]
            }
        ]
    )
    await stack.start_worker()
    chat = stack.chat("failing")
    waiting = asyncio.create_task(tk(stack, "send", chat, "write slowly"))
    await stack.wait_state(chat, lambda s: [c.status for c in s.tool_calls] == [ToolCallStatus.RUNNING])
    await stack.client.get_workflow_handle(f"chat-{chat}").terminate("an operator")
    store = await stack.store()  # as the reconciler leaves a turn whose recovery raised
    await store.update_turn(
        chat,
        1,
        TurnUpdate(
            status=TurnStatus.FAILED, reason=Reason.RECOVERY_FAILED, recovery_id="rec-1", can_continue=False
        ),
    )
    sent = await asyncio.wait_for(waiting, 60)
    assert sent.returncode == 3, sent.stderr
    assert "turn 1: failed (recovery_failed)" in sent.stdout
    assert f"turnkeeper dismiss {chat}" in sent.stdout


async def test_status_and_dismiss_of_a_turn_whose_recovery_failed(stack: Stack) -> None:
    """No run waits for a decision on a failed/recovery_failed turn: `status` shows it
    from the store, and Dismiss closes it there, once."""
    from turnkeeper.models import (
        DISMISSED_TEXT,
        INTERRUPTED_TOOL_TEXT,
        ModelReply,
        Reason,
        ToolCall,
        TurnStatus,
        UserMessage,
    )
    from turnkeeper.store import TurnUpdate

    stack.script([{"text": "first answer"}])
    await stack.start_worker()
    chat = stack.chat("failed")
    assert (await tk(stack, "send", chat, "hi")).returncode == 0
    # Turn 2 as the reconciler leaves it when its recovery raised: its run long gone.
    store = await stack.store()
    await store.begin_turn(chat, "run-long-gone", ["m2"])
    await store.commit_user_messages(chat, 2, [UserMessage(message_id="m2", text="deploy it")])
    call = ToolCall(id="call-1", name="write_file", arguments='{"path": "a", "content": "x"}')
    await store.record_assistant(chat, 2, 0, ModelReply(tool_calls=[call]), final=False)
    await store.update_turn(
        chat,
        2,
        TurnUpdate(
            status=TurnStatus.FAILED, reason=Reason.RECOVERY_FAILED, recovery_id="rec-1", can_continue=False
        ),
    )

    status = await tk(stack, "status", chat, "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert (shown["turn"], shown["status"], shown["reason"], shown["recovery_id"], shown["can_continue"]) == (
        2,
        "failed",
        "recovery_failed",
        "rec-1",
        False,
    )
    refused = await tk(stack, "continue", chat)
    assert refused.returncode == 1

    dismissed = await tk(stack, "dismiss", chat)
    assert dismissed.returncode == 0, dismissed.stderr
    assert "recovered (dismissed)" in dismissed.stdout
    record = await store.get_turn(chat, 2)
    assert record is not None
    assert (record.status, record.reason, record.recovery_id) == (
        TurnStatus.RECOVERED,
        Reason.DISMISSED,
        "rec-1",
    )
    turn2 = (await store.history(chat))[2:]
    assert [(m.role, m.content if not m.tool_calls else "calls") for m in turn2] == [
        ("user", "deploy it"),
        ("assistant", "calls"),
        ("tool", INTERRUPTED_TOOL_TEXT),
        ("assistant", DISMISSED_TEXT),
    ]
    assert [e.type for e in await store.events(chat)][-3:] == [
        "recovery_state",
        "session_updated",
        "turn_end",
    ]

    again = await tk(stack, "dismiss", chat)
    assert again.returncode == 1 and "not waiting for confirmation" in again.stderr
    assert [m.content for m in await store.history(chat)].count(DISMISSED_TEXT) == 1


async def test_status_and_list_read_temporal_over_its_http_api(stack: Stack) -> None:
    """`status` and `list` read Temporal over its HTTP API; with only TEMPORAL_ADDRESS
    (the HTTP port unknown) over gRPC; with nothing listening at the HTTP address they
    refuse in words, exit 1."""
    stack.script(  # each chat's model calls in turn: `waiting` has a second turn, which fails
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}]},
            {"text": "wrote a.txt"},
            {"error": "the provider refused this request"},
        ]
    )
    await stack.start_worker()
    waiting, done = stack.chat("waiting"), stack.chat("done")
    for chat in (waiting, done):
        assert (await tk(stack, "send", chat, "write it")).returncode == 0
    assert (await tk(stack, "send", waiting, "again")).returncode == 3

    shown = await tk(stack, "status", waiting, "--json")
    assert shown.returncode == 0 and not shown.stderr, shown.stderr
    state = json.loads(shown.stdout)
    assert (state["turn"], state["status"], state["reason"]) == (2, "awaiting_user", "model_failed")
    unknown = await tk(stack, "status", stack.chat("never"))
    assert unknown.returncode == 1 and "nothing was ever sent to it" in unknown.stderr

    expected = [(waiting, "awaiting_user", "model_failed"), (done, "completed", None)]
    rows: list[dict[str, object]] = []
    for _ in range(50):  # visibility is eventually consistent
        listed = await tk(stack, "list", "--json")
        assert listed.returncode == 0 and not listed.stderr, listed.stderr
        rows = [row for row in json.loads(listed.stdout) if row["chat_id"] in (waiting, done)]
        if [(r["chat_id"], r["status"], r["reason"]) for r in rows] == expected:
            break
        await asyncio.sleep(0.2)
    assert [(r["chat_id"], r["status"], r["reason"]) for r in rows] == expected
    awaiting = json.loads((await tk(stack, "list", "--awaiting", "--json")).stdout)
    assert waiting in [r["chat_id"] for r in awaiting] and done not in [r["chat_id"] for r in awaiting]
    # Another deployment's queue sees none of them.
    stack.env_extra["TURNKEEPER_TASK_QUEUE"] = f"{stack.task_queue}-other"
    try:
        assert json.loads((await tk(stack, "list", "--json")).stdout) == []
    finally:
        del stack.env_extra["TURNKEEPER_TASK_QUEUE"]
    # A run terminated at its gate keeps TurnStatus=awaiting_user: it is no longer listed.
    await stack.client.get_workflow_handle(f"chat-{waiting}").terminate("an operator")
    for _ in range(50):
        awaiting = json.loads((await tk(stack, "list", "--awaiting", "--json")).stdout)
        if waiting not in [r["chat_id"] for r in awaiting]:
            break
        await asyncio.sleep(0.2)
    assert waiting not in [r["chat_id"] for r in awaiting]

    # With TEMPORAL_ADDRESS alone the HTTP API's port is unknown: they read over gRPC.
    stack.env_extra["TURNKEEPER_TEMPORAL_HTTP_ADDRESS"] = ""
    try:
        over_grpc = await tk(stack, "status", done, "--json")
        assert over_grpc.returncode == 0, over_grpc.stderr
        assert json.loads(over_grpc.stdout)["status"] == "completed"
        listed = json.loads((await tk(stack, "list", "--json")).stdout)
        assert {r["chat_id"] for r in listed} >= {waiting, done}
        assert (await tk(stack, "status", stack.chat("never"))).returncode == 1
    finally:
        del stack.env_extra["TURNKEEPER_TEMPORAL_HTTP_ADDRESS"]
    for address, words in (("127.0.0.1:1", "cannot reach Temporal's HTTP API at 127.0.0.1:1"),):
        stack.env_extra["TURNKEEPER_TEMPORAL_HTTP_ADDRESS"] = address
        try:
            for args in (("status", waiting), ("list",)):
                r = await tk(stack, *args)
                assert r.returncode == 1 and words in r.stderr, (args, address, r.stderr)
                assert "Traceback" not in r.stderr and not r.stdout
        finally:
            del stack.env_extra["TURNKEEPER_TEMPORAL_HTTP_ADDRESS"]


async def test_send_waits_for_approval_and_continue_approves(stack: Stack) -> None:
    """A tool that asks first: `send` ends at the gate (exit 3) listing the call,
    `status` lists it, `continue --wait` approves and follows the turn to its answer."""
    stack.env_extra["TURNKEEPER_CONFIRM_TOOLS"] = "write_file"
    stack.script(
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}]},
            {"text": "wrote a.txt"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat()
    sent = await tk(stack, "send", chat, "please write a.txt")
    assert sent.returncode == 3, sent.stderr
    assert f"chat {chat}, turn 1: awaiting_user (approval_required)" in sent.stdout
    assert 'write_file {"path": "a.txt", "content": "hi"}' in sent.stdout
    assert f"turnkeeper continue {chat}   # approve" in sent.stdout
    assert not (stack.ws / "a.txt").exists()
    status = await tk(stack, "status", chat)
    assert (
        f"[key {chat}/1/call_0_0]" in status.stdout and "tool write_file [call_0_0]: pending" in status.stdout
    )

    approved = await tk(stack, "continue", chat, "--wait")
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.splitlines()[-3:] == [
        "  -> write_file started",
        "  <- write_file done",
        "wrote a.txt",
    ]
    assert (stack.ws / "a.txt").read_text() == "hi"


async def test_a_temporal_toml_profile_names_the_server(stack: Stack) -> None:
    """Without TEMPORAL_ADDRESS, the profile of Temporal's config file names the server
    and the namespace, as for the `temporal` CLI (TEMPORAL_PROFILE picks one)."""
    stack.script([{"text": "hello from the profile's server"}])
    await stack.start_worker()
    config = stack.dir / "temporal.toml"
    config.write_text(
        f'[profile.default]\naddress = "127.0.0.1:1"\n\n'
        f'[profile.tests]\naddress = "{stack.address}"\nnamespace = "default"\n'
    )
    env = {k: v for k, v in stack.env().items() if k != "TEMPORAL_ADDRESS"}
    env["TEMPORAL_CONFIG_FILE"] = str(config)

    sent = await tk(stack, "send", stack.chat("profile"), "hi", env={**env, "TEMPORAL_PROFILE": "tests"})
    assert sent.returncode == 0, sent.stderr
    assert "hello from the profile's server" in sent.stdout
    missing = await tk(stack, "send", stack.chat("profile"), "hi", env={**env, "TEMPORAL_PROFILE": "nowhere"})
    assert missing.returncode == 2 and "has no [profile.nowhere]" in missing.stderr


async def test_every_command_speaks_json(stack: Stack) -> None:
    """--json on every command: its result as JSON, or one object naming the error."""
    stack.env_extra["TURNKEEPER_CONFIRM_TOOLS"] = "write_file"
    stack.script(
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "j.txt", "content": "j"}}]},
            {"text": "wrote j.txt"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat("json")
    sent = await tk(stack, "send", chat, "write j", "--json")
    assert sent.returncode == 3, sent.stderr
    waiting = json.loads(sent.stdout)
    assert (waiting["status"], waiting["reason"]) == ("awaiting_user", "approval_required")
    approved = await tk(stack, "continue", chat, "--wait", "--json")
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["status"] == "completed"
    refused = await tk(stack, "stop", chat, "--json")
    assert refused.returncode == 1 and json.loads(refused.stdout) == {
        "error": f"no turn of chat {chat!r} is running",
        "exit_code": 1,
    }
    queued = json.loads((await tk(stack, "send", chat, "later", "--no-wait", "--json")).stdout)
    assert queued["chat_id"] == chat and queued["sent"] is True
