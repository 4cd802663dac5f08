"""Following a turn from the command line (`send`, `continue --wait`): its tools
as they run, its answer as it streams, then whole; the gate if it waits again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from turnkeeper.cli.common import EXIT_AWAITING, EXIT_OK, Refused, query_state
from turnkeeper.cli.output import describe_gate
from turnkeeper.statuses import Reason, TurnStatus

if TYPE_CHECKING:
    from temporalio.client import Client

    from turnkeeper.models import TurnState
    from turnkeeper.store import SessionStore

POLL_S = 0.1
STORE_RETRY_S = 1.0  # how often to look again while the store does not answer
# A turn normally shows its message within a second; after this long, `send`
# checks whether any worker serves the queue and says so if none does.
NO_WORKER_CHECK_S = 5.0
# A worker takes a message within a second; once it has not for this long, `send`
# says the message is saved and what it waits for (a worker killed seconds ago
# still counts as polling for a while, so the check above stays quiet then).
WAITING_NOTE_S = 2.0
# A subagent's gate is written to its own chat's log, not to the log of the turn
# that waits for it: while a `delegate` call of the followed turn runs, its state
# is asked this often, to see such a gate (docs/subagents.md).
SUBAGENT_CHECK_S = 1.0


async def follow_turn(
    client: Client,
    store: SessionStore,
    chat_id: str,
    message_id: str | None,
    after: int,
    timeout: float,
    task_queue: str,
    turn: int | None = None,
    delegating: bool = False,
) -> int:
    """Show the turn that takes our message (or `turn`): its tools as they run,
    its answer as it streams (and whole once recorded); exit 3 if it waits for
    its user again, a subagent's gate included. `delegating`: the turn already
    waits for a subagent (Continue given at that subagent's gate)."""
    from turnkeeper.store.base import StoreUnavailable  # loaded with `store` already
    from turnkeeper.subagents import DELEGATE_TOOL

    delegate_calls: set[object] = set()  # the followed turn's delegate calls not yet finished
    check_subagents_at = 0.0

    answer: str | None = None
    final_step: object = None
    streamed = _StreamedText()
    deadline = time.monotonic() + timeout
    outage = False
    check_worker_at = time.monotonic() + NO_WORKER_CHECK_S
    waiting_note_at: float | None = time.monotonic() + WAITING_NOTE_S if message_id is not None else None
    while time.monotonic() < deadline:
        if turn is None and time.monotonic() >= check_worker_at:
            check_worker_at = deadline  # once
            if await _no_worker_polls(client, task_queue):
                print(
                    f"turnkeeper: no worker is serving task queue {task_queue!r}; the message is safe "
                    "and waits for one (start it with `turnkeeper worker`)",
                    file=sys.stderr,
                    flush=True,
                )
        try:
            events = await store.events(chat_id, after_seq=after)
        except StoreUnavailable as err:
            # The message is acknowledged: the turn waits the outage out, and so do we.
            if not outage:
                streamed.end_line()
                _say_the_store_is_out(err)
                outage = True
            await asyncio.sleep(STORE_RETRY_S)
            continue
        if outage:
            _say_the_store_is_back()
            outage = False
        for ev in events:
            after = ev.seq
            p = ev.payload
            ours = message_id is not None and p.get("message_id") == message_id
            if ev.type == "message_rejected" and ours:
                raise Refused(f"message refused: {p.get('reason')}")
            if ev.type == "user_message" and ours:
                turn = p.get("turn")
            if turn is None or p.get("turn") != turn:
                continue
            if ev.type == "tool_started":
                streamed.end_line()
                _line(f"  -> {p.get('name')} started\n")
                if p.get("name") == DELEGATE_TOOL:
                    delegate_calls.add(p.get("tool_call_id"))
            elif ev.type in ("tool_finished", "tool_interrupted"):
                delegate_calls.discard(p.get("tool_call_id"))
                streamed.end_line()
                _line(f"  <- {p.get('name')} {p.get('status', 'interrupted')}\n")
            elif ev.type == "assistant_message" and not p.get("tool_calls"):
                answer = p.get("text")
                final_step = p.get("step")
            elif ev.type == "assistant_message":
                streamed.recorded(p.get("step"), p.get("text"))
            elif ev.type == "recovery_state" and p.get("status") == TurnStatus.AWAITING_USER.value:
                streamed.end_line()
                print(describe_gate(await query_state(client, chat_id)))
                return EXIT_AWAITING
            elif ev.type == "recovery_state" and p.get("status") == TurnStatus.FAILED.value:
                # Its recovery failed: no run holds the turn, only Dismiss or a new message closes it.
                streamed.end_line()
                from turnkeeper.failed_turns import state_of

                record = await store.get_turn(chat_id, turn)
                print(
                    describe_gate(state_of(record)) if record else f"turn {turn} failed ({p.get('reason')})"
                )
                return EXIT_AWAITING
            elif ev.type == "turn_end":
                if answer is not None:
                    streamed.finish(final_step, answer)
                else:
                    streamed.end_line()
                    print(f"turn {turn} ended: {p.get('status')} ({p.get('reason')})")
                return EXIT_OK
        if (delegate_calls or delegating) and time.monotonic() >= check_subagents_at:
            check_subagents_at = time.monotonic() + SUBAGENT_CHECK_S
            gate = await _subagent_gate(client, chat_id)
            if gate is not None:
                streamed.end_line()
                print(describe_gate(gate))
                return EXIT_AWAITING
        if turn is None and waiting_note_at is not None and time.monotonic() >= waiting_note_at:
            waiting_note_at = None  # once
            assert message_id is not None
            await _say_waiting(store, chat_id, message_id)
        if turn is not None and answer is None:
            with contextlib.suppress(Exception):  # a view: the recorded answer comes all the same
                draft = await store.draft(chat_id)
                if draft is not None and draft.turn == turn:
                    streamed.show(draft.step, draft.attempt, draft.text)
        await asyncio.sleep(POLL_S)
    raise Refused(
        f"no answer within {timeout:.0f} s (the message is safe; the turn goes on): "
        f"see `turnkeeper status {chat_id}`"
    )


async def _subagent_gate(client: Client, chat_id: str) -> TurnState | None:
    """The turn's state if it shows a subagent's gate (`subagent_waiting`), else None."""
    try:
        state = await query_state(client, chat_id)
    except Exception:  # no worker answers now, say: the log is followed all the same
        return None
    if state.status == TurnStatus.AWAITING_USER and state.reason == Reason.SUBAGENT_WAITING:
        return state
    return None


async def _say_waiting(store: SessionStore, chat_id: str, message_id: str) -> None:
    """The message is durable in its run's history, yet no turn has taken it yet."""
    running: int | None = None
    with contextlib.suppress(Exception):  # only the words depend on it
        latest = await store.get_turn(chat_id)
        if latest is not None and latest.status == TurnStatus.RUNNING:
            running = latest.turn
    waits_for = (
        f"waiting for turn {running} to take it at its next model call"
        if running is not None
        else "waiting for a worker to take the turn"
    )
    print(f"turnkeeper: message {message_id} is saved; {waits_for}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def saved_if_interrupted(chat_id: str, message_id: str) -> Iterator[None]:
    """Around following a message already sent: Ctrl-C (KeyboardInterrupt, or the
    main task cancelled by asyncio.run's SIGINT handler) stops only the watching.
    Says so, and how to go on following, then lets the interrupt through (exit 130)."""
    try:
        yield
    except (KeyboardInterrupt, asyncio.CancelledError):
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        lead = "\n" if sys.stderr.isatty() else ""  # past the terminal's ^C
        print(
            f"{lead}turnkeeper: interrupted; message {message_id} is saved and its turn goes on without this "
            f"command: follow it with `turnkeeper events {chat_id} --follow` or "
            f"`turnkeeper status {chat_id}`",
            file=sys.stderr,
            flush=True,
        )
        raise


def _say_the_store_is_out(err: Exception) -> None:
    print(
        f"turnkeeper: the session store does not answer ({err}); the message is safe and "
        "the turn waits for the store: still watching",
        file=sys.stderr,
        flush=True,
    )


def _say_the_store_is_back() -> None:
    print("turnkeeper: the session store answers again", file=sys.stderr, flush=True)


class _StreamedText:
    """The answer as `send` prints it while it streams: each step's text as it
    grows; a step run again (its call was lost) starts over on a new line. To a
    terminal the text goes as it comes; elsewhere (a pipe, a file other commands
    write to as well) only whole lines, each in one write, so that output of
    commands run at once never mixes within a line."""

    def __init__(self, live: bool | None = None) -> None:
        self._key: tuple[int, int] | None = None  # (step, attempt) being printed
        self._shown = ""
        self._mid_line = False
        self._live = sys.stdout.isatty() if live is None else live
        self._pending = ""  # the unfinished line, when not live

    def show(self, step: int, attempt: int, text: str) -> None:
        if self._key is not None and self._key[0] == step and attempt < self._key[1]:
            return  # an older attempt's draft
        if self._key != (step, attempt):
            if self._key is not None and self._key[0] == step and self._shown:
                self.end_line()
                _line("  (the model call was run again; its answer starts over)\n")
            self._key, self._shown = (step, attempt), ""
        if text.startswith(self._shown) and len(text) > len(self._shown):
            self._write(text[len(self._shown) :])
            self._shown, self._mid_line = text, True

    def recorded(self, step: object, text: object) -> None:
        """A step that asked for tools is recorded: its text (if any) is complete."""
        if (
            self._key is not None
            and self._key[0] == step
            and isinstance(text, str)
            and text.startswith(self._shown)
        ):
            self._write(text[len(self._shown) :])
        self.end_line()
        self._key, self._shown = None, ""

    def finish(self, step: object, answer: str) -> None:
        if self._key is not None and self._key[0] == step and answer.startswith(self._shown):
            self._write(answer[len(self._shown) :])
        else:
            self.end_line()
            self._write(answer)
        self._mid_line = True
        self.end_line()

    def end_line(self) -> None:
        if self._mid_line:
            self._write("\n")
            self._mid_line = False

    def _write(self, piece: str) -> None:
        if self._live:
            sys.stdout.write(piece)
            sys.stdout.flush()
            return
        self._pending += piece
        done, newline, self._pending = self._pending.rpartition("\n")
        if newline:
            _line(done + newline)


def _line(text: str) -> None:
    """Whole lines in one write (a pipe or an appended file keeps each one whole)."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # stdout replaced (--json leaves it out)
        sys.stdout.write(text)
        return
    data = text.encode()
    while data:
        data = data[os.write(fd, data) :]


async def _no_worker_polls(client: Client, task_queue: str) -> bool:
    """True when the server has seen no worker poll the queue lately (False if it cannot tell)."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
    from temporalio.service import RPCError

    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    try:
        return not (await client.workflow_service.describe_task_queue(request)).pollers
    except RPCError:
        return False
