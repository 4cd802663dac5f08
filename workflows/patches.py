"""Patch ids: behaviour that running turns recorded without must replay as it was.

Each id goes with `workflow.patched`; a run recorded before the id existed takes
the earlier behaviour. Removing an id fails the replay of the recorded histories
that ran without it (the subfolders of tests/histories).
"""
from __future__ import annotations

# A signal whose payload does not decode is refused in words (earlier runs dropped it unseen).
REFUSE_UNDECODABLE = "refuse-undecodable-user-message"
# A run that waits for its first message announces refusals at once, not at its idle timeout.
ANNOUNCE_IDLE_REFUSALS = "announce-refusals-while-idle"
# A newer message supersedes a gate only if the store does not hold it already.
SUPERSEDE_CHECKS_STORE = "supersede-checks-store"
# One patch for the complete recovery machine: the recovery id kept until the turn
# ends, Dismiss while resuming, updates answered within a bound, the bounded inbox
# and its chunked commits, the configured limit for a run's first message, long
# gates handed on. Asked once, in the run's first activation: a patch first asked
# later (after a local activity) can land in another workflow task on replay than
# it did live. Runs that have it take the earlier patches' behaviour as given
# and never ask for those.
COMPLETE_MACHINE = "complete-recovery-machine"
# Asked in the first activation, like COMPLETE_MACHINE. Runs that have it:
# - answer updates with the state their decision leads to in the task that takes
#   them, not once the gate has written it (a store outage holds the turn, never
#   the user's answer);
# - act on what signals leave (refusals to announce, Stop, a newer message) only
#   while they wait for a step or a decision, never on the way from one store call
#   to the next: the SDK can hand a local activity's result to the workflow
#   together with a signal that came later, and a replay then sees the two apart.
WAIT_POINTS = "act-at-wait-points"
# Asked in the first activation too. Runs that have it judge a Continue or Dismiss
# sent as a signal where the turn waits (a step, a gate), not as it arrives: a
# `state` answer can show a gate before any workflow task has taken the loss that
# opens it, and a replay then hands that loss and the user's signal over in one
# activation, the signal first. Judged at the gate, it meets the gate either way.
SIGNALS_AT_WAIT_POINTS = "signal-decisions-at-wait-points"
# What new runs ask instead of the three above, in their first activation: one
# marker that means all three. Each marker a run records comes with an upsert of
# the TemporalChangeVersion search attribute, three of them in every turn's first
# workflow task; runs recorded with the three replay as they ran.
RECOVERY_MACHINE = "recovery-machine-2"
# `Reconcile` runs that have it delete earlier quiet passes (an activity after the
# pass) and set `ReconcileOutcome` as they end. Asked in the first activation.
QUIET_PASSES = "reconcile-quiet-passes"
# Asked in the first activation too. Runs that have it hold the model's calls of a
# tool that asks first (`confirm`, TURNKEEPER_CONFIRM_TOOLS) at an approval gate
# (`approval_required`) before their activities are scheduled; earlier runs never
# knew such tools (their tool activity refuses an unapproved call of one instead).
APPROVALS = "tools-ask-first"
# What new runs ask instead of RECOVERY_MACHINE and APPROVALS: one marker (one
# TemporalChangeVersion upsert) for both. Runs recorded with either replay as they ran.
RECOVERY_MACHINE_3 = "recovery-machine-3"
# What new runs ask instead of RECOVERY_MACHINE_3: one marker for all of the above,
# and a Continue whose store write finds the turn already closed ends the turn as
# the store has it. A workflow task that the server discards (a signal arrived
# while it ran: UnhandledCommand) keeps its local activities' writes: a Dismiss
# taken in such a task is in the store, and the retried task may meet a Continue
# first. Runs recorded with RECOVERY_MACHINE_3 went on with the Continue.
RECOVERY_MACHINE_4 = "recovery-machine-4"
# What new runs ask instead of RECOVERY_MACHINE_4: one marker for all of the above,
# and no run's history grows too long to replay within the workflow task timeout
# (workflows/history_bound.py): a running turn hands itself on between steps, and a
# gate at that bound instead of GATE_HISTORY_EVENTS. Its runs also key the events they
# announce by what they say, not by their position in the run (TurnPersistence._content_key).
RECOVERY_MACHINE_5 = "recovery-machine-5"
# What new runs ask instead of RECOVERY_MACHINE_5: one marker for all of the above,
# and a Stop that reaches the run while the store numbers its turn (`begin_turn`, or
# the reconciler's run adopting one) stops that turn. Earlier runs ignored such a
# Stop when it came before the store call's result and took it when it came after;
# the SDK can hand a replay the two in the other order (chaos seed 525).
RECOVERY_MACHINE_6 = "recovery-machine-6"
# What new runs ask instead of RECOVERY_MACHINE_6: one marker for all of the above,
# and a gate's store check of superseding messages judges only the ids it sent;
# messages that came meanwhile are judged at the gate's next wait, as they are
# when the check's answer comes first. The SDK hands a local activity's result to
# a live run before or after the signals that came meanwhile, and a replay can do
# the other (chaos seed 538). Its runs also announce refusals made while their
# last events were being written, before they end or hand on (chaos seed 539:
# two follow-ups over the pending bound were refused during a store outage and
# never announced). ("recovery-machine-7" was tried and reverted, never released.)
RECOVERY_MACHINE_8 = "recovery-machine-8"
# What new runs ask instead of RECOVERY_MACHINE_8: one marker for all of the above,
# and a run whose last wake-up was a store call's result does not end (or hand on)
# in it: it ends after an activity's completion (`end_of_run`), a history event. The
# SDK can hand a store call's result to a live run one workflow task after the task
# that recorded it (a `state` query arriving as the call finishes does it); a signal
# that reaches the server in that later task makes the server refuse the run's end,
# and the retried task replays the result in the earlier task: the run ended there,
# before the signal, and the message it carried was never handed on. For the same
# reason such a run reads nothing signals left (refusals to announce, decisions) until
# that event has woken it: the live run may have applied signals that its replay
# applies only after the store call's result (chaos seed 561).
RECOVERY_MACHINE_9 = "recovery-machine-9"
# What new runs ask instead of RECOVERY_MACHINE_9: one marker for all of the above,
# and a store check of superseding messages (`held_messages`), or refusals written at a
# gate, is followed by `end_of_run` before the run decides anything on it. Live, the
# SDK can hand the check's result over a task late, together with the step's own end
# (a timeout after a killed worker, say); the replay, which takes the result first,
# then cancelled a step that the live run had found finished, a command its history
# lacks, and every retry of the task failed (chaos seed 562). Its runs also judge a
# store check only for the ids its recorded answer names: a `state` query's replay on
# a worker without the run cached can run the check before a later message, and the
# worker then records that answer (chaos seed 567).
RECOVERY_MACHINE_10 = "recovery-machine-10"
# What new runs ask instead of RECOVERY_MACHINE_10: one marker for all of the above,
# and a step started while a Stop, Dismiss or newer message waits to be judged takes
# no messages: they stay waiting, for the next turn (or Dismiss's user rows). A
# worker that replays a run can get a step's end and a newer message in one
# activation, the message first, where the live run took the step's end first and
# started the next model call without it. When that call then finished anyway (its
# answer racing the cancel), the replay counted the message as committed by the
# call, and a run replayed on another worker ended without handing it on (chaos
# seed 582). Taking nothing into such a step, live and replay agree.
RECOVERY_MACHINE_11 = "recovery-machine-11"
