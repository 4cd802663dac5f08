"""The recovery machine, model-based: Hypothesis drives `turnkeeper.recovery`
through random sequences of every input (as the workflow, the reconciler and the
CLI apply them) and checks the invariants after each step. No Temporal here; the
same cells run on a real server in tests/workflow/test_recovery_cells.py."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from turnkeeper import recovery, recovery_table
from turnkeeper.models import OPEN_STATUSES, Reason, SubagentView, TurnState, TurnStatus
from turnkeeper.recovery import Effect, Input, decide

GATE_REASONS = [
    Reason.RESTART_REQUIRES_CONFIRMATION,
    Reason.TOOL_STATE_UNKNOWN,
    Reason.MODEL_FAILED,
    Reason.INTERRUPTED_WITH_SAVED_CONTEXT,
    Reason.INTERRUPTED_WITHOUT_CHECKPOINT,
    Reason.CHECKPOINT_INVALID,
    Reason.CHECKPOINT_UNKNOWN,
]
TERMINAL = {TurnStatus.COMPLETED, TurnStatus.RECOVERED}
RECOVERED_REASONS = {
    Reason.ANSWER_RESTORED,
    Reason.CONTINUED,
    Reason.COMMITTED,
    Reason.DISMISSED,
    Reason.STOPPED,
    Reason.SUPERSEDED,
}
# The statuses Dismiss with the current id must always be accepted in.
DISMISSABLE = {TurnStatus.AWAITING_USER, TurnStatus.RESUMING, TurnStatus.FAILED}
ENDINGS = {
    Effect.DISMISS,
    Effect.CANCEL_AND_DISMISS,
    Effect.DENY,
    Effect.STOP,
    Effect.SUPERSEDE,
    Effect.JUDGE,
}


class Chat(RuleBasedStateMachine):
    """One chat: its current turn's state, and what every earlier turn ended as."""

    def __init__(self) -> None:
        super().__init__()
        self.state = TurnState(chat_id="c", turn=1)
        self.ids_drawn = 0
        self.first_id: str | None = None  # the turn's first recovery id
        self.attempts_seen = 0
        self.ended: dict[int, tuple[TurnStatus, Reason | None]] = {}
        # Tool calls that must be approved first: waiting, run (once), or never run.
        self.calls_made = 0
        self.waiting: list[str] = []
        self.before_approval: TurnStatus | None = None
        self.ran: list[str] = []
        self.approved: set[str] = set()
        self.not_run: set[str] = set()
        self.children = 0
        self.forwarded = 0

    # -- helpers -------------------------------------------------------------
    def _new_id(self) -> str:
        self.ids_drawn += 1
        return f"rec-{self.ids_drawn}"

    def _at_approval(self) -> bool:
        return self.state.status == TurnStatus.AWAITING_USER and self.state.reason == Reason.APPROVAL_REQUIRED

    def _drop_waiting(self) -> None:
        """The turn ended, or its run was judged by the reconciler: waiting calls never run."""
        self.not_run.update(self.waiting)
        self.waiting = []
        self.before_approval = None
        for view in self.state.subagents:  # a run that ends asks its children to stop (close policy)
            if view.status in (TurnStatus.RUNNING, TurnStatus.AWAITING_USER, TurnStatus.RESUMING):
                view.status = TurnStatus.RECOVERED

    def _next_turn(self) -> None:
        assert self.state.status not in OPEN_STATUSES
        self.ended[self.state.turn] = (self.state.status, self.state.reason)
        self.state = TurnState(chat_id="c", turn=self.state.turn + 1)
        self.first_id = None
        self.attempts_seen = 0

    def _waiting_children(self) -> list[SubagentView]:
        return [v for v in self.state.subagents if v.status == TurnStatus.AWAITING_USER]

    def _apply(self, outcome: recovery.Outcome) -> None:
        ending = recovery.ending_of(outcome.effect)
        if outcome.effect == Effect.FORWARD:  # the child takes the Continue; the turn waits on
            before = (self.state.status, self.state.reason)
            shown_id = recovery.shown(self.state).recovery_id
            for view in self._waiting_children():
                if view.recovery_id == shown_id:
                    view.status = TurnStatus.RESUMING
            assert (self.state.status, self.state.reason) == before
            self.forwarded += 1
        elif outcome.effect == Effect.RESUME:
            recovery.accept_continue(self.state)
        elif outcome.effect == Effect.APPROVE:
            recovery.accept_continue(self.state)
            assert self.state.status == self.before_approval  # the turn goes on as it was
            self.approved.update(self.waiting)
            self.ran.extend(self.waiting)  # once each
            self.waiting = []
            self.before_approval = None
        elif ending is not None:
            self._drop_waiting()  # Dismiss dismisses the waiting children too, the rest stop
            recovery.end_recovered(self.state, ending)
            if outcome.effect == Effect.SUPERSEDE:
                self._next_turn()

    # -- inputs ----------------------------------------------------------------
    @rule()
    def user_message(self) -> None:
        outcome = decide(recovery.shown(self.state).status, Input.USER_MESSAGE)
        if outcome.effect == Effect.NEXT_TURN:
            if self.state.status == TurnStatus.FAILED:  # begin_turn closes it first
                recovery.end_recovered(self.state, Reason.SUPERSEDED)
            self._next_turn()
        else:
            self._apply(outcome)

    @rule(action=st.sampled_from(["continue", "dismiss"]), stale=st.booleans())
    def decision(self, action: str, stale: bool) -> None:
        before = self.state.model_copy(deep=True)
        shown = recovery.shown(self.state)  # judged as the user sees the turn
        given = "not-the-id" if stale else shown.recovery_id
        why = recovery.refusal(shown, action, given)  # type: ignore[arg-type]
        outcome = decide(
            shown.status,
            Input(action),
            can_continue=shown.can_continue,
            reason=shown.reason,
            id_matches=bool(shown.recovery_id) and given == shown.recovery_id,
        )
        assert (why is None) == outcome.accepted
        if not outcome.accepted:
            assert self.state == before
            return
        self._apply(outcome)

    @rule(free=st.integers(0, 2), held=st.integers(1, 2))
    def model_asks_for_approval(self, free: int, held: int) -> None:
        """The model's answer names tools that must be approved first (and maybe others)."""
        if decide(self.state.status, Input.APPROVAL_NEEDED).effect != Effect.ASK_APPROVAL:
            return
        self.calls_made += free
        self.ran.extend(f"free-{self.calls_made - i}" for i in range(free))  # they need no approval
        self.before_approval = self.state.status
        self.waiting = [f"call-{self.calls_made + i}" for i in range(held)]
        self.calls_made += held
        attempts = self.state.attempts
        recovery.open_gate(self.state, Reason.APPROVAL_REQUIRED, self._new_id())
        assert (self.state.status, self.state.reason) == (TurnStatus.AWAITING_USER, Reason.APPROVAL_REQUIRED)
        assert self.state.can_continue and self.state.attempts == attempts

    @rule(can_continue=st.booleans())
    def a_waiting_subagent_opens_a_gate(self, can_continue: bool) -> None:
        """A subagent this turn waits for loses a step: its gate shows in this chat."""
        if self.state.status not in (TurnStatus.RUNNING, TurnStatus.RESUMING):
            return
        self.children += 1
        self.state.subagents.append(
            SubagentView(
                chat_id=f"c.sub-{self.children}",
                workflow_id=f"chat-c.sub-{self.children}",
                tool_call_id=f"d{self.children}",
                task="t",
                mode="wait",
                status=TurnStatus.AWAITING_USER,
                reason=Reason.TOOL_STATE_UNKNOWN,
                recovery_id=f"child-{self.children}",
                can_continue=can_continue,
            )
        )

    @rule()
    def a_subagent_answers(self) -> None:
        for view in self.state.subagents:
            if view.status == TurnStatus.RESUMING:
                view.status = TurnStatus.COMPLETED

    @rule()
    def stop(self) -> None:
        self._apply(decide(self.state.status, Input.STOP))

    @rule(reason=st.sampled_from(GATE_REASONS), can_continue=st.booleans())
    def step_lost(self, reason: Reason, can_continue: bool) -> None:
        if decide(self.state.status, Input.STEP_LOST).effect == Effect.OPEN_GATE:
            recovery.open_gate(self.state, reason, self._new_id(), can_continue)

    @precondition(
        lambda self: (
            self.state.status in (TurnStatus.RUNNING, TurnStatus.RESUMING)
            and not any(
                v.status in (TurnStatus.AWAITING_USER, TurnStatus.RESUMING) for v in self.state.subagents
            )
        )
    )
    @rule()
    def model_answers(self) -> None:
        recovery.finish(self.state)

    @rule(
        verdict=st.sampled_from(GATE_REASONS + [Reason.ANSWER_RESTORED, Reason.COMMITTED]),
        can_continue=st.booleans(),
    )
    def run_ends_abnormally(self, verdict: Reason, can_continue: bool) -> None:
        """The reconciler's pass over a dead run: a gate again, or a closing verdict."""
        if decide(self.state.status, Input.RUN_ENDED).effect != Effect.JUDGE:
            return
        self._drop_waiting()  # a dead run's waiting calls were never scheduled
        if verdict in (Reason.ANSWER_RESTORED, Reason.COMMITTED):
            recovery.end_recovered(self.state, verdict)
        else:
            recovery.open_gate(self.state, verdict, self._new_id(), can_continue)

    @rule()
    def recovering_fails(self) -> None:
        if decide(self.state.status, Input.RUN_ENDED).effect == Effect.JUDGE:
            self._drop_waiting()
            if not self.state.recovery_id:
                self.state.recovery_id = self._new_id()
            recovery.mark_failed(self.state)

    @rule(input=st.sampled_from([Input.SHUTDOWN, Input.RECONCILE, Input.STORE_OUTAGE]))
    def nothing_changes(self, input: Input) -> None:
        before = self.state.model_copy()
        effect = decide(self.state.status, input).effect
        assert effect in (Effect.RESCHEDULE, Effect.WAIT_FOR_STORE, Effect.NOTHING)
        assert self.state == before

    # -- invariants ------------------------------------------------------------
    @invariant()
    def recovery_id_is_kept_until_the_turn_ends(self) -> None:
        if self.first_id is None:
            self.first_id = self.state.recovery_id
        assert self.state.recovery_id == self.first_id

    @invariant()
    def attempts_never_decrease(self) -> None:
        assert self.state.attempts >= self.attempts_seen
        self.attempts_seen = self.state.attempts

    @invariant()
    def dismiss_with_the_current_id_is_accepted_in_every_open_status(self) -> None:
        if self.state.status in DISMISSABLE:
            assert recovery.refusal(self.state, "dismiss", self.state.recovery_id) is None

    @invariant()
    def every_status_has_a_way_out(self) -> None:
        if self.state.status in OPEN_STATUSES | {TurnStatus.FAILED}:
            ways = {
                decide(
                    self.state.status, i, can_continue=self.state.can_continue, reason=self.state.reason
                ).effect
                for i in Input
            }
            assert ways & ENDINGS, self.state.status
        # and a closed chat always takes its next message
        if self.state.status in TERMINAL | {TurnStatus.FAILED}:
            assert decide(self.state.status, Input.USER_MESSAGE).effect == Effect.NEXT_TURN

    @invariant()
    def statuses_are_well_formed(self) -> None:
        s = self.state
        if s.status == TurnStatus.AWAITING_USER:
            assert s.recovery_id and s.reason in GATE_REASONS + [Reason.LOOP_GUARD, Reason.APPROVAL_REQUIRED]
        if s.reason == Reason.APPROVAL_REQUIRED:
            assert s.status == TurnStatus.AWAITING_USER and s.can_continue and self.waiting
        if s.status == TurnStatus.RESUMING:
            assert s.reason == Reason.USER_CONFIRMED and s.attempts >= 1 and s.recovery_id
        if s.status == TurnStatus.COMPLETED:
            assert s.reason is None
        if s.status == TurnStatus.RECOVERED:
            assert s.reason in RECOVERED_REASONS
        if s.status == TurnStatus.FAILED:
            assert not s.can_continue

    @invariant()
    def a_tool_that_asks_first_runs_only_once_approved(self) -> None:
        held = [c for c in self.ran if c.startswith("call-")]
        assert set(held) <= self.approved
        assert len(held) == len(set(held))  # once
        assert not self.approved & self.not_run
        if self.waiting:  # waiting holds nothing but a gate that can say yes
            assert self._at_approval()
            assert recovery.refusal(self.state, "continue", self.state.recovery_id) is None
            assert recovery.refusal(self.state, "dismiss", self.state.recovery_id) is None

    @invariant()
    def a_waiting_subagent_shows_as_the_turns_gate(self) -> None:
        shown = recovery.shown(self.state)
        waiting = self._waiting_children()
        if self.state.status in (TurnStatus.RUNNING, TurnStatus.RESUMING) and waiting:
            assert (shown.status, shown.reason) == (TurnStatus.AWAITING_USER, Reason.SUBAGENT_WAITING)
            assert shown.recovery_id == waiting[0].recovery_id  # the first to ask, first
            assert recovery.refusal(shown, "dismiss", shown.recovery_id) is None
            for child in waiting:  # each is the turn's gate, named though not shown
                named = recovery.shown(self.state, child.recovery_id)
                assert named.recovery_id == child.recovery_id
                assert recovery.refusal(named, "dismiss", child.recovery_id) is None
        else:
            assert shown == self.state
        if self.state.status not in OPEN_STATUSES:
            assert not waiting  # a closed turn leaves no child at a gate

    @invariant()
    def terminal_statuses_stay_terminal(self) -> None:
        for status, _ in self.ended.values():
            assert status in TERMINAL


Chat.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestRecoveryMachine = Chat.TestCase


@pytest.mark.parametrize("status", list(TurnStatus))
def test_every_cell_has_exactly_one_outcome(status: TurnStatus) -> None:
    for input in Input:
        for id_matches in (True, False):
            for can_continue in (True, False):
                for reason in (None, Reason.APPROVAL_REQUIRED):
                    outcome = decide(
                        status, input, id_matches=id_matches, can_continue=can_continue, reason=reason
                    )
                    assert isinstance(outcome.effect, Effect)
                    assert (outcome.refusal is not None) == (outcome.effect == Effect.REFUSE)


def test_the_docs_show_the_table() -> None:
    """docs/recovery.md shows the table; tests/unit/test_docs.py keeps it there alone."""
    from tests.support import ROOT

    page = "docs/recovery.md"
    text = (ROOT / page).read_text()
    assert recovery_table.table() in text, (
        f"{page}'s recovery table is out of date: paste turnkeeper.recovery_table.table()"
    )


def test_the_inbox_keeps_its_pending_bytes_as_messages_move() -> None:
    from turnkeeper.inbox import Inbox, chunks, wire_size
    from turnkeeper.models import UserMessage

    inbox = Inbox()
    messages = [UserMessage(message_id=f"m{i}", text="x" * (i * 1000)) for i in range(1, 6)]
    for m in messages:
        assert inbox.offer(m)
    assert not inbox.offer(messages[0])  # a retry
    total = sum(map(wire_size, messages))
    assert inbox.pending_bytes() == total
    inbox.in_flight = inbox.take()
    assert inbox.pending_bytes() == total and inbox.ids() == [m.message_id for m in messages]
    inbox.in_flight = inbox.in_flight[2:]
    assert inbox.pending_bytes() == total - wire_size(messages[0]) - wire_size(messages[1])
    inbox.return_in_flight()
    inbox.drop({"m3"})
    assert inbox.ids() == ["m4", "m5"] and inbox.pending_bytes() == wire_size(messages[3]) + wire_size(
        messages[4]
    )
    parts = chunks(messages, limit=6000)
    assert [m for part in parts for m in part] == messages
    assert all(sum(map(wire_size, p)) <= 6000 or len(p) == 1 for p in parts)
