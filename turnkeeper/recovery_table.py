"""The recovery machine as the docs show it: one row per input, one column per
status, each cell in words (docs/recovery.md embeds it; a test keeps it current)."""

from __future__ import annotations

from turnkeeper.models import Reason, TurnStatus
from turnkeeper.recovery import Effect, Input, decide

# What each effect means, in the words of the table in docs/recovery.md.
EFFECT_TEXT: dict[Effect, str] = {
    Effect.JOIN: "joins the turn at its next model call",
    Effect.NEXT_TURN: "starts the next turn (a failed turn is closed `superseded` first)",
    Effect.SUPERSEDE: "cancels what runs, ends `recovered/superseded`; the message starts the next turn",
    Effect.RESUME: "`resuming/user_confirmed`, attempts + 1; the turn goes on",
    Effect.DISMISS: "ends `recovered/dismissed`; pending follow-ups become user rows, no model work",
    Effect.CANCEL_AND_DISMISS: "cancels the continuation like Stop, ends `recovered/dismissed`",
    Effect.STOP: "ends `recovered/stopped`: completed results kept, running tools interrupted",
    Effect.OPEN_GATE: "`awaiting_user` with the step's reason (`loop_guard` after a Continue)",
    Effect.RESCHEDULE: "a model call goes to the next worker; a running tool may finish in the grace",
    Effect.JUDGE: "the reconciler judges what the run left: a gate, `answer_restored` or `committed`",
    Effect.WAIT_FOR_STORE: "waits, `store_unavailable` in `state`, and goes on when the store returns",
    Effect.ASK_APPROVAL: (
        "`awaiting_user/approval_required`: the calls that need no approval run first, then "
        "the turn waits for the rest"
    ),
    Effect.APPROVE: (
        "the waiting calls run, once; the turn goes on as it was (`running`, or `resuming` after a Continue)"
    ),
    Effect.DENY: (
        "each waiting call gets `denied by the user`, no tool runs; ends `recovered/dismissed`, "
        "pending follow-ups become user rows, no model work"
    ),
    Effect.FORWARD: (
        "the subagent waiting at the gate takes the Continue; the turn goes on waiting for its answer"
    ),
    Effect.REFUSE: "refused, nothing changes",
    Effect.NOTHING: "nothing",
}


STATUSES: tuple[TurnStatus, ...] = (
    TurnStatus.RUNNING,
    TurnStatus.AWAITING_USER,
    TurnStatus.RESUMING,
    TurnStatus.COMPLETED,
    TurnStatus.RECOVERED,
    TurnStatus.FAILED,
)
# The table's columns: every status; the approval gate and a subagent's gate beside the other gates.
COLUMNS: tuple[tuple[TurnStatus, Reason | None], ...] = (
    (TurnStatus.RUNNING, None),
    (TurnStatus.AWAITING_USER, None),
    (TurnStatus.AWAITING_USER, Reason.APPROVAL_REQUIRED),
    (TurnStatus.AWAITING_USER, Reason.SUBAGENT_WAITING),
    (TurnStatus.RESUMING, None),
    (TurnStatus.COMPLETED, None),
    (TurnStatus.RECOVERED, None),
    (TurnStatus.FAILED, None),
)


def table() -> str:
    """The whole machine as a Markdown table: one row per input, one column per status."""

    def cell(status: TurnStatus, reason: Reason | None, input: Input) -> str:
        outcome = decide(status, input, can_continue=status != TurnStatus.FAILED, reason=reason)
        if outcome.effect == Effect.REFUSE:
            return f"refused: `{outcome.refusal}`"
        return EFFECT_TEXT[outcome.effect]

    def header(status: TurnStatus, reason: Reason | None) -> str:
        return f"`{status.value}`" + (f" (`{reason.value}`)" if reason else "")

    lines = [
        "| input | " + " | ".join(header(s, r) for s, r in COLUMNS) + " |",
        "| --- |" + " --- |" * len(COLUMNS),
    ]
    for input in Input:
        lines.append(f"| `{input.value}` | " + " | ".join(cell(s, r, input) for s, r in COLUMNS) + " |")
    lines.append("")
    lines.append(
        "Continue or Dismiss with any other id than the turn's current one: refused, `stale`. "
        "Continue where `can_continue` is false: refused, `context is unavailable`."
    )
    return "\n".join(lines)
