"""How long a run's history may grow before its turn goes on in a fresh run.

A worker that has not cached a turn (it restarted, or another worker held the
turn) replays the whole history inside one workflow task, and that task must
finish within TURN_TASK_TIMEOUT. If it cannot, it times out, and so does every
retry: the turn never moves again. A cold replay costs 0.3-0.5 ms an event on
a 2-core machine (bench/cold_replay.py: a 300-step turn in one run, 3,616
events, 1.8 s; 950 refused signals at a gate, 0.33 s), so runs hand themselves
on long before that: a running turn between two steps, a gate while it waits
(continue-as-new, same turn). Signals that arrive during one long step are
bounded by the server's per-run signal limit (`history.maximumSignalsPerExecution`,
set on the servers we ship).
"""
from __future__ import annotations

from temporalio import workflow

# About 0.45 s of cold replay on an idle 2-core machine (bench/cold_replay.py):
# under load, still well inside the 2 s task timeout.
RUN_HISTORY_EVENTS = 1_000


def history_long(limit: int | None = None) -> bool:
    """Past `limit` events (RUN_HISTORY_EVENTS when None), or the server suggests it."""
    info = workflow.info()
    bound = RUN_HISTORY_EVENTS if limit is None else limit
    return info.is_continue_as_new_suggested() or info.get_current_history_length() > bound
