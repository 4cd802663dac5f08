"""How the CLI prints. `send`'s streamed answer: to a terminal as it comes;
elsewhere whole lines only, each in one write, so that commands run at once never
mix within a line; it stops at a subagent's gate too. `status`: a turn's subagents, one line each, and a subagent's
gate with the commands that decide it in the parent's chat (docs/subagents.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from turnkeeper import cli, recovery
from turnkeeper.cli import follow, read
from turnkeeper.cli.common import EXIT_AWAITING, EXIT_OK
from turnkeeper.cli.follow import _line, _StreamedText
from turnkeeper.cli.output import describe_gate, describe_subagents
from turnkeeper.models import Event, Reason, SubagentView, TurnState, TurnStatus


def test_piped_output_is_written_in_whole_lines(capfd: pytest.CaptureFixture[str]) -> None:
    one, two = _StreamedText(live=False), _StreamedText(live=False)
    one.show(0, 1, "Hello, wor")
    two.show(0, 1, "Another ans")
    _line("  -> write_file started\n")
    one.show(0, 1, "Hello, world.\nSecond li")
    two.finish(0, "Another answer.")
    one.finish(0, "Hello, world.\nSecond line.")
    assert capfd.readouterr().out.splitlines() == [
        "  -> write_file started",
        "Hello, world.",
        "Another answer.",
        "Second line.",
    ]


def test_a_terminal_sees_the_text_as_it_grows(capfd: pytest.CaptureFixture[str]) -> None:
    live = _StreamedText(live=True)
    live.show(0, 1, "Hel")
    assert capfd.readouterr().out == "Hel"
    live.show(0, 1, "Hello")
    live.finish(0, "Hello.")
    assert capfd.readouterr().out == "lo.\n"


# -- status: subagents --------------------------------------------------------------

PARENT = "mychat"
WRITER = "mychat.sub1-0123456789ab"
LISTER = "mychat.sub1-89abcdef0123"


def _sub(chat_id: str, task: str, **fields: Any) -> SubagentView:
    return SubagentView(
        chat_id=chat_id,
        workflow_id=f"chat-{chat_id}",
        tool_call_id=f"call_{chat_id[-2:]}",
        task=task,
        **fields,
    )


def _at_a_subagents_gate(
    child_reason: Reason = Reason.TOOL_STATE_UNKNOWN, can_continue: bool = True
) -> TurnState:
    """The parent as `state` shows it while the subagent it waits for is at a gate."""
    running = TurnState(
        chat_id=PARENT,
        turn=1,
        subagents=[
            _sub(
                WRITER,
                "write k.txt\nslowly",
                mode="wait",
                status=TurnStatus.AWAITING_USER,
                reason=child_reason,
                recovery_id="rec-child",
                can_continue=can_continue,
            ),
            _sub(LISTER, "list the workspace", mode="background"),
        ],
    )
    return recovery.shown(running)


def test_status_lists_each_subagent_on_one_line() -> None:
    state = TurnState(
        chat_id=PARENT,
        turn=2,
        subagents=[
            _sub(
                WRITER,
                "write a.txt: hello",
                mode="wait",
                status=TurnStatus.COMPLETED,
                reason=Reason.COMMITTED,
            ),
            _sub(LISTER, "list\n\tthe \x1b[31mworkspace", mode="background"),
        ],
    )
    assert describe_subagents(state) == [
        "subagents:",
        f"  {WRITER}  wait        completed/committed  write a.txt: hello",
        f"  {LISTER}  background  running              list the [31mworkspace",
        "transcripts: turnkeeper history SUB-CHAT   their turns: turnkeeper status SUB-CHAT",
    ]
    (one,) = state.subagents[:1]
    assert describe_subagents(state.model_copy(update={"subagents": [one]}))[-1] == (
        f"transcript: turnkeeper history {WRITER}   its turn: turnkeeper status {WRITER}"
    )
    assert describe_subagents(TurnState(chat_id=PARENT, turn=1)) == []


def test_a_background_subagent_at_a_gate_is_decided_in_its_own_chat() -> None:
    view = _sub(
        LISTER,
        "list",
        mode="background",
        status=TurnStatus.AWAITING_USER,
        reason=Reason.MODEL_FAILED,
        recovery_id="rec-bg",
    )
    lines = describe_subagents(
        TurnState(chat_id=PARENT, turn=1, status=TurnStatus.COMPLETED, subagents=[view])
    )
    assert f"  {LISTER}  background  awaiting_user/model_failed  list" in lines
    assert (
        f"  {LISTER} waits in its own chat: turnkeeper continue {LISTER} | turnkeeper dismiss {LISTER}"
        in lines
    )


def test_a_subagents_gate_is_decided_in_the_parents_chat() -> None:
    shown = describe_gate(_at_a_subagents_gate())
    assert shown.splitlines() == [
        f"chat {PARENT}, turn 1: awaiting_user (subagent_waiting)",
        f"why: subagent {WRITER} waits for the user: tool_state_unknown",
        f"recovery id: rec-child (the gate of subagent {WRITER}: decide it here, in chat {PARENT})",
        f"  turnkeeper continue {PARENT}   # the subagent goes on from its saved context "
        "(interrupted tools are not run again); this turn waits for its answer",
        f"  turnkeeper dismiss {PARENT}    # close this turn; its subagents are dismissed or stopped",
        f"  turnkeeper status {WRITER}   # the subagent's own turn and gate",
        f"  turnkeeper history {WRITER}  # its transcript",
    ]


def test_a_subagents_gate_without_its_context_or_asking_approval() -> None:
    lost = describe_gate(_at_a_subagents_gate(Reason.CHECKPOINT_INVALID, can_continue=False))
    assert "(continue is not possible: the subagent's saved context is unavailable)" in lost
    assert f"turnkeeper continue {PARENT}" not in lost and f"turnkeeper dismiss {PARENT}" in lost

    asks = describe_gate(_at_a_subagents_gate(Reason.APPROVAL_REQUIRED))
    assert f"turnkeeper continue {PARENT}   # approve: the calls the subagent asks for run, once" in asks
    assert f"turnkeeper dismiss {PARENT}    # deny them: this turn ends, its subagents with it" in asks
    assert f"turnkeeper status {WRITER}" in asks  # where its calls are listed


def _status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], state: TurnState, *argv: str
) -> str:
    """`turnkeeper status` as it prints a state a worker answered (no Temporal here)."""
    monkeypatch.setattr(read, "_run_and_state", lambda _settings, _chat: ("running", state))
    assert cli.run(["status", state.chat_id, *argv]) == cli.EXIT_OK
    return capsys.readouterr().out


def test_status_shows_the_subagents_and_their_gate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _status(monkeypatch, capsys, _at_a_subagents_gate())
    assert f"turnkeeper continue {PARENT}" in out and "recovery id: rec-child" in out
    assert f"  {WRITER}  wait        awaiting_user/tool_state_unknown  write k.txt slowly\n" in out
    assert f"  {LISTER}  background  running                           list the workspace\n" in out
    assert out.endswith("their turns: turnkeeper status SUB-CHAT\n")


def test_status_json_holds_the_subagents(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    printed = json.loads(_status(monkeypatch, capsys, _at_a_subagents_gate(), "--json"))
    assert (printed["status"], printed["reason"], printed["recovery_id"]) == (
        "awaiting_user",
        "subagent_waiting",
        "rec-child",
    )
    assert printed["subagents"] == [
        {
            "chat_id": WRITER,
            "workflow_id": f"chat-{WRITER}",
            "tool_call_id": "call_ab",
            "task": "write k.txt\nslowly",
            "mode": "wait",
            "status": "awaiting_user",
            "reason": "tool_state_unknown",
            "recovery_id": "rec-child",
            "can_continue": True,
        },
        {
            "chat_id": LISTER,
            "workflow_id": f"chat-{LISTER}",
            "tool_call_id": "call_23",
            "task": "list the workspace",
            "mode": "background",
            "status": "running",
            "reason": None,
            "recovery_id": None,
            "can_continue": True,
        },
    ]


class _Log:
    """A session store as `follow_turn` reads it: the chat's events, no draft."""

    def __init__(self, *events: tuple[str, dict[str, Any]]) -> None:
        now = datetime.now(UTC)
        self._events = [
            Event(chat_id=PARENT, seq=i, type=t, payload={"turn": 1, **p}, created_at=now)
            for i, (t, p) in enumerate(events, 1)
        ]

    async def events(self, chat_id: str, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        return [e for e in self._events if e.seq > after_seq][:limit]

    async def draft(self, chat_id: str) -> None:
        return None


def _answers(monkeypatch: pytest.MonkeyPatch, state: TurnState) -> list[str]:
    asked: list[str] = []

    async def query_state(_client: object, chat_id: str) -> TurnState:
        asked.append(chat_id)
        return state

    monkeypatch.setattr(follow, "query_state", query_state)
    return asked


async def _follow(log: _Log, delegating: bool = False) -> int:
    store: Any = log
    return await follow.follow_turn(None, store, PARENT, None, 0, 5.0, "q", turn=1, delegating=delegating)  # type: ignore[arg-type]


async def test_send_stops_at_a_subagents_gate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing in the parent's log says a subagent's gate opened: while a delegate
    call runs, `send` asks the turn's state, and shows the gate as any other."""
    asked = _answers(monkeypatch, _at_a_subagents_gate())
    started = {"tool_call_id": "call_0_0", "name": "delegate"}
    assert await _follow(_Log(("tool_started", started))) == EXIT_AWAITING
    out = capsys.readouterr().out
    assert "  -> delegate started" in out and f"turnkeeper continue {PARENT}" in out
    assert asked == [PARENT]
    # `continue --wait` given at that gate: the turn waits for its subagent still.
    assert await _follow(_Log(), delegating=True) == EXIT_AWAITING


async def test_no_state_is_asked_without_a_running_delegate_call(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = _answers(monkeypatch, _at_a_subagents_gate())
    log = _Log(
        ("tool_started", {"tool_call_id": "c1", "name": "write_file"}),
        ("tool_started", {"tool_call_id": "c2", "name": "delegate"}),
        ("tool_finished", {"tool_call_id": "c2", "name": "delegate", "status": "done"}),
        ("assistant_message", {"step": 2, "text": "done"}),
        ("turn_end", {"status": "completed"}),
    )
    assert await _follow(log) == EXIT_OK
    assert asked == [] and capsys.readouterr().out.endswith("done\n")
