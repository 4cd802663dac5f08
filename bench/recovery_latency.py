"""Recovery latency of turnkeeper with real worker processes: how fast a killed
worker's turn shows up as waiting for its user, and how fast a stopped worker's
model call finishes on another worker.

    .venv/bin/python bench/recovery_latency.py [--quick] [--json]

  SIGKILL   one worker runs `slow_write` (30 s) for a fresh chat; a second worker
            is started and polling; the first worker's process group is
            SIGKILLed. Measured from the kill until the real `temporal workflow
            list --query "TurnStatus='awaiting_user' AND ChatId='<chat>'"` lists
            the chat (polled every 100 ms), and until the `state` query answers
            awaiting_user. Each gate is then dismissed (`turnkeeper.client.decide`).
  SIGTERM   one worker's model call hangs (FakeChatServer answers after 30 s); a
            second worker is started and polling; the first worker is SIGTERMed.
            Measured from SIGTERM until the turn's workflow result arrives (the
            second worker makes the call again and the fake answers at once).

Workers are `python worker.py` processes (each in its own session / process
group) against a Temporal dev server started here on a free port with an on-disk
SQLite file. Every repetition uses a fresh chat, and the worker that survived a
repetition is the victim of the next one, so exactly one worker runs when a
message is sent. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter

from bench._common import (
    ROOT,
    dev_server,
    event_s,
    near_median,
    print_timeline,
    progress,
    run_and_exit,
    timeline,
)
from turnkeeper import client as tk
from turnkeeper.activities.heartbeat import beat_interval
from turnkeeper.config import Settings
from turnkeeper.models import Reason, TurnState, TurnStatus
from turnkeeper.reconcile_io import SCHEDULE_ID
from turnkeeper.testing import FakeChatServer
from turnkeeper.worker.dev_server import temporal_binary
from turnkeeper.worker.main import heartbeat_throttle

TOOL_SECONDS = 30  # slow_write: far longer than any measurement
MODEL_DELAY_S = 30  # the fake model's first answer: likewise
POLL_S = 0.1  # visibility (CLI) and state-query polling period
WAIT_TIMEOUT_S = 60.0  # any single wait in a repetition
WORKER_READY_TIMEOUT_S = 60.0
CLI_TIMEOUT_S = 10.0

# The goals from the issues (SIGKILL: 3 s at first, 2.5 s since the latency work).
GOAL_SIGKILL_S = 2.5
GOAL_SIGTERM_S = 1.0

# One partition per task queue (the server's default is 4): DescribeTaskQueue lists only the
# root partition's pollers, and could miss a new worker's activity poll for a whole long poll
# (~50 s), by which time the step it was started for has ended.
ONE_PARTITION = {"matching.numTaskqueueReadPartitions": 1, "matching.numTaskqueueWritePartitions": 1}

# The heartbeat timeout of model and tool activities when TURNKEEPER_HEARTBEAT_TIMEOUT
# is unset (activities/heartbeat.py beats every quarter of it).
PROJECT_HEARTBEAT_TIMEOUT_S = Settings().heartbeat_timeout


@dataclass(frozen=True)
class Plan:
    repetitions: int


FULL = Plan(repetitions=7)
QUICK = Plan(repetitions=3)


# -- worker processes ----------------------------------------------------------------------


@dataclass
class WorkerProc:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


class Workers:
    """`python worker.py` processes for one measurement: own task queue and data dir."""

    def __init__(self, client: Client, address: str, tmp: Path, name: str, env_extra: dict[str, str]) -> None:
        self.client = client
        self.dir = tmp / name
        self.dir.mkdir()
        (self.dir / "ws").mkdir()
        self.name = name
        self.task_queue = f"bench-{name}-{uuid.uuid4().hex[:8]}"
        self.procs: list[WorkerProc] = []
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("TURNKEEPER_", "TEMPORAL_", "OPENAI_"))
        }
        env.update(
            {
                "TEMPORAL_ADDRESS": address,
                "TURNKEEPER_TASK_QUEUE": self.task_queue,
                "TURNKEEPER_DATA_DIR": str(self.dir / "data"),
                "TURNKEEPER_WORKSPACE": str(self.dir / "ws"),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(env_extra)
        self.env = env
        self.settings = Settings.from_env(env)

    def spawn(self) -> WorkerProc:
        name = f"{self.name}-worker{len(self.procs)}"
        log_path = self.dir / f"{name}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "worker.py"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        w = WorkerProc(name, proc, log_path)
        self.procs.append(w)
        return w

    async def ready(self, w: WorkerProc) -> None:
        """Until the worker polls both the workflow and the activity task queue."""
        identity = f"{w.pid}@"
        deadline = time.monotonic() + WORKER_READY_TIMEOUT_S
        while True:
            if w.proc.poll() is not None:
                raise RuntimeError(f"{w.name} exited with {w.proc.returncode}:\n{tail(w.log)}")
            polling = 0
            for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
                resp = await self.client.workflow_service.describe_task_queue(
                    DescribeTaskQueueRequest(
                        namespace=self.client.namespace,
                        task_queue=TaskQueue(name=self.task_queue),
                        task_queue_type=kind,
                    )
                )
                polling += any(p.identity.startswith(identity) for p in resp.pollers)
            if polling == 2:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{w.name} is not polling after {WORKER_READY_TIMEOUT_S:.0f} s:\n{tail(w.log)}"
                )
            await asyncio.sleep(0.1)

    async def start(self) -> WorkerProc:
        w = self.spawn()
        await self.ready(w)
        return w

    @staticmethod
    def signal(w: WorkerProc, sig: int) -> None:
        os.killpg(w.pid, sig)

    def alive(self) -> list[WorkerProc]:
        return [w for w in self.procs if w.proc.poll() is None]

    def close(self) -> None:
        """SIGKILL every process group still running; never raises."""
        for w in self.procs:
            if w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(w.pid, signal.SIGKILL)
        for w in self.procs:
            with contextlib.suppress(Exception):
                w.proc.wait(timeout=30)

    def dump_logs(self) -> None:
        for w in self.procs:
            print(f"--- {w.name} (pid {w.pid}, exit {w.proc.poll()}) ---\n{tail(w.log)}", file=sys.stderr)


def tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


async def pause_reconcile_schedule(client: Client) -> None:
    """The workers create the reconcile schedule at start-up; a pass during a
    measurement would only add noise, so it is paused (workers leave an existing one)."""
    with contextlib.suppress(Exception):
        await client.get_schedule_handle(SCHEDULE_ID).pause(note="paused by bench/recovery_latency.py")


# -- helpers ----------------------------------------------------------------------------------


async def until(pred: Callable[[], bool], what: str, timeout: float = WAIT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not reached in {timeout:.0f} s")
        await asyncio.sleep(0.02)


def check_alone(workers: Workers, victim: WorkerProc) -> None:
    """Exactly one worker runs when the message is sent, so the victim runs the step."""
    alive = workers.alive()
    if alive != [victim]:
        raise RuntimeError(f"expected only {victim.name} running, found {[w.name for w in alive]}")


def ledger_started(ledger: Path, chat_id: str) -> bool:
    try:
        return any(line.startswith(f"start {chat_id}/") for line in ledger.read_text().splitlines())
    except OSError:
        return False


def first_event(history: WorkflowHistory, kind: int, after: float = 0.0) -> Any | None:
    return next((e for e in history.events if e.event_type == kind and event_s(e) >= after), None)


# -- measurement 1: SIGKILL -> awaiting_user visible ------------------------------------------


@dataclass
class KillRecord:
    chat_id: str
    run_id: str
    visible_s: float  # kill -> `temporal workflow list` lists it (CLI returned)
    query_s: float  # kill -> `state` query answered awaiting_user
    heartbeat_age_s: float | None  # kill - last heartbeat the server recorded (or the start, if none)
    tool_age_s: float | None  # kill - the tool activity's start
    beats: bool  # a heartbeat had reached the server before the kill
    timed_out_s: float | None  # kill -> ACTIVITY_TASK_TIMED_OUT (server clock)
    gate_task_started_s: float | None  # kill -> the gate's WORKFLOW_TASK_STARTED
    gate_written_s: float | None  # kill -> UPSERT_WORKFLOW_SEARCH_ATTRIBUTES of the gate
    cli_calls: int
    cli_call_ms: float  # mean duration of one `temporal workflow list`
    reason: str
    timeline: list[dict[str, Any]] = field(default_factory=list)


async def poll_visibility(address: str, chat_id: str, env: dict[str, str]) -> tuple[float, int, float]:
    """Run the temporal CLI every POLL_S until it lists the chat's workflow.
    Returns (perf_counter when it did, number of calls, mean call duration)."""
    query = f"TurnStatus='{TurnStatus.AWAITING_USER.value}' AND ChatId='{chat_id}'"
    cmd = [
        temporal_binary(),
        "workflow",
        "list",
        "--query",
        query,
        "-o",
        "json",
        "--address",
        address,
        "--namespace",
        "default",
    ]
    want = tk.workflow_id(chat_id)
    calls, spent = 0, 0.0
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while time.monotonic() < deadline:
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError("`temporal workflow list` hung") from None
        done = time.perf_counter()
        calls += 1
        spent += done - started
        if proc.returncode != 0:
            raise RuntimeError(f"`temporal workflow list` failed ({proc.returncode}): {err.decode()[-400:]}")
        if want in out.decode():
            listed = (
                json.loads(out)
                if out.strip().startswith(b"[")
                else [json.loads(line) for line in out.decode().splitlines() if line.strip()]
            )
            if any(w.get("execution", {}).get("workflowId") == want for w in listed):
                return done, calls, spent / calls * 1000
        await asyncio.sleep(max(0.0, POLL_S - (done - started)))
    raise RuntimeError(f"chat {chat_id} not listed as awaiting_user within {WAIT_TIMEOUT_S:.0f} s")


async def poll_state(client: Client, chat_id: str) -> tuple[float, TurnState]:
    """Send a `state` query every POLL_S (each may wait while no worker can answer it)
    until one answers awaiting_user; (perf_counter of that answer, the state)."""
    found: asyncio.Future[tuple[float, TurnState]] = asyncio.get_running_loop().create_future()

    async def one() -> None:
        with contextlib.suppress(Exception):
            state = await asyncio.wait_for(tk.query_state(client, chat_id), 15)
            now = time.perf_counter()
            if state.status == TurnStatus.AWAITING_USER and not found.done():
                found.set_result((now, state))

    tasks: list[asyncio.Task[None]] = []
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    try:
        while not found.done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"chat {chat_id}: state query never answered awaiting_user")
            tasks.append(asyncio.create_task(one()))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(found), POLL_S)
        return found.result()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def last_heartbeat(client: Client, chat_id: str) -> tuple[float | None, float | None]:
    """The running tool activity as the server sees it: (its start, its last heartbeat or
    None when none arrived yet), wall-clock seconds."""
    desc = await client.get_workflow_handle(tk.workflow_id(chat_id)).describe()
    for act in desc.raw_description.pending_activities:
        started = act.last_started_time.ToNanoseconds() / 1e9 if act.HasField("last_started_time") else None
        beat = act.last_heartbeat_time.ToNanoseconds() / 1e9 if act.HasField("last_heartbeat_time") else None
        return started, beat
    return None, None


async def after_a_beat(client: Client, chat_id: str, beat_every: float, beats: int, phase: float) -> None:
    """Return `phase` of a beat cycle after the `beats`-th heartbeat the server records
    from now: phase 0 is just after a beat, near 1 just before the next. Waiting for
    1, 2 or 3 beats also varies where the kill falls in the server's timer chain,
    which re-arms no sooner than 1 s after it fired (bench/README.md)."""
    _, seen = await last_heartbeat(client, chat_id)
    while beats:
        _, beat = await last_heartbeat(client, chat_id)
        if beat is not None and beat != seen:
            seen, beats = beat, beats - 1
        else:
            await asyncio.sleep(0.02)
    assert seen is not None
    await asyncio.sleep(max(0.0, seen + phase * beat_every - time.time()))


async def measure_sigkill(
    client: Client,
    address: str,
    tmp: Path,
    plan: Plan,
    worker_env: dict[str, str],
    kill_delay: float,
    spread: bool,
    heartbeat_timeout_s: int,
) -> list[KillRecord]:
    beat_every = beat_interval(timedelta(seconds=heartbeat_timeout_s)).total_seconds()
    script = tmp / "kill-script.json"
    script.write_text(
        json.dumps(
            [
                {
                    "tool_calls": [
                        {
                            "name": "slow_write",
                            "arguments": {"path": "slow.txt", "content": "s", "seconds": TOOL_SECONDS},
                        }
                    ]
                },
                {"text": "unused"},
            ]
        )
    )
    ledger = tmp / "ledger.txt"
    workers = Workers(
        client,
        address,
        tmp,
        "sigkill",
        {
            **worker_env,
            "TURNKEEPER_MODEL": f"scripted:{script}",
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
            "TURNKEEPER_TOOLS": "slow_write",
            "TK_LEDGER": str(ledger),
        },
    )
    cli_env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    records: list[KillRecord] = []
    try:
        progress("SIGKILL: starting the first worker")
        victim = await workers.start()
        await pause_reconcile_schedule(client)
        for i in range(plan.repetitions):
            check_alone(workers, victim)
            chat_id = f"kill{i}-{uuid.uuid4().hex[:10]}"
            handle = await tk.send_message(
                client, workers.settings, chat_id, tk.new_message("write slowly", workers.settings)
            )
            await until(lambda: ledger_started(ledger, chat_id), f"chat {chat_id}: slow_write started")
            spare = await workers.start()  # warm and polling before the kill
            if kill_delay:
                await asyncio.sleep(kill_delay)
            if spread:  # repetition i kills at (i + 0.5) / n of the cycle
                await after_a_beat(client, chat_id, beat_every, 1 + i % 3, (i + 0.5) / plan.repetitions)

            kill_wall = time.time()
            kill_at = time.perf_counter()
            workers.signal(victim, signal.SIGKILL)
            started, beat = await last_heartbeat(client, chat_id)
            since = beat if beat is not None else started  # what the heartbeat timeout counts from
            (seen_at, calls, call_ms), (state_at, state) = await asyncio.gather(
                poll_visibility(address, chat_id, cli_env), poll_state(client, chat_id)
            )
            victim.proc.wait(timeout=10)

            # Dismiss the gate so nothing is left running; the run then closes.
            dismissed = await tk.decide(client, chat_id, "dismiss", state.recovery_id)
            final: TurnState = await asyncio.wait_for(handle.result(), WAIT_TIMEOUT_S)
            if dismissed.reason != Reason.DISMISSED or final.reason != Reason.DISMISSED:
                raise RuntimeError(f"chat {chat_id}: dismiss ended {final.status.value}/{final.reason}")

            history = await client.get_workflow_handle(
                tk.workflow_id(chat_id), run_id=handle.result_run_id
            ).fetch_history()
            timed_out = first_event(history, EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT)
            t_out = event_s(timed_out) if timed_out else kill_wall
            wft = first_event(history, EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED, after=t_out)
            upsert = first_event(history, EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES, after=t_out)
            seen_wall = kill_wall + (seen_at - kill_at)
            state_wall = kill_wall + (state_at - kill_at)
            rec = KillRecord(
                chat_id=chat_id,
                run_id=handle.result_run_id or "",
                visible_s=seen_at - kill_at,
                query_s=state_at - kill_at,
                heartbeat_age_s=None if since is None else kill_wall - since,
                tool_age_s=None if started is None else kill_wall - started,
                beats=beat is not None,
                timed_out_s=event_s(timed_out) - kill_wall if timed_out else None,
                gate_task_started_s=event_s(wft) - kill_wall if wft else None,
                gate_written_s=event_s(upsert) - kill_wall if upsert else None,
                cli_calls=calls,
                cli_call_ms=call_ms,
                reason=state.reason.value if state.reason else "",
                timeline=timeline(
                    history,
                    {
                        "SIGKILL of the worker running the tool (client)": kill_wall,
                        **({"last heartbeat the server recorded (describe)": beat} if beat else {}),
                        **(
                            {
                                "no heartbeat recorded yet: the timeout counts from ACTIVITY_TASK_STARTED": started
                            }
                            if beat is None and started
                            else {}
                        ),
                        "state query answers awaiting_user (client)": state_wall,
                        "temporal workflow list shows it (client)": seen_wall,
                    },
                ),
            )
            records.append(rec)
            progress(
                f"SIGKILL {i + 1}/{plan.repetitions}: listed after {rec.visible_s:.2f} s, state query "
                f"{rec.query_s:.2f} s, heartbeat timeout event {fmt_s(rec.timed_out_s)} "
                f"(tool started {fmt_s(rec.tool_age_s)} before the kill; "
                + (
                    f"last heartbeat {fmt_s(rec.heartbeat_age_s)} before it)"
                    if rec.beats
                    else "no heartbeat yet)"
                )
            )
            victim = spare
        return records
    except BaseException:
        workers.dump_logs()
        raise
    finally:
        workers.close()


# -- measurement 2: SIGTERM -> the turn finishes on the other worker --------------------------


@dataclass
class TermRecord:
    chat_id: str
    run_id: str
    completed_s: float  # SIGTERM -> workflow result at the client
    failed_s: float | None  # SIGTERM -> ACTIVITY_TASK_FAILED (WorkerShutdown)
    next_task_started_s: float | None  # SIGTERM -> the next WORKFLOW_TASK_STARTED
    rescheduled_s: float | None  # SIGTERM -> the second model call's ACTIVITY_TASK_SCHEDULED
    closed_s: float | None  # SIGTERM -> WORKFLOW_EXECUTION_COMPLETED
    worker_exit_s: float | None  # SIGTERM -> the stopped worker's process exited
    worker_exit_code: int | None
    timeline: list[dict[str, Any]] = field(default_factory=list)


async def measure_sigterm(
    client: Client, address: str, tmp: Path, plan: Plan, worker_env: dict[str, str]
) -> list[TermRecord]:
    records: list[TermRecord] = []
    with FakeChatServer() as server:
        workers = Workers(
            client,
            address,
            tmp,
            "sigterm",
            {
                **worker_env,
                "TURNKEEPER_MODEL": "openai:fake",
                "OPENAI_BASE_URL": server.base_url,
                "OPENAI_API_KEY": "x",
            },
        )
        try:
            progress("SIGTERM: starting the first worker")
            victim = await workers.start()
            await pause_reconcile_schedule(client)
            for i in range(plan.repetitions):
                check_alone(workers, victim)
                server.script(
                    [{"text": "cut off", "delay": MODEL_DELAY_S}, {"text": "from the other worker"}]
                )
                asked = len(server.requests)
                chat_id = f"term{i}-{uuid.uuid4().hex[:10]}"
                handle = await tk.send_message(
                    client, workers.settings, chat_id, tk.new_message("hello", workers.settings)
                )
                await until(lambda: len(server.requests) > asked, f"chat {chat_id}: model call under way")
                spare = await workers.start()

                result = asyncio.create_task(handle.result())
                term_wall = time.time()
                term_at = time.perf_counter()
                workers.signal(victim, signal.SIGTERM)
                exit_at: float | None = None
                while not result.done():
                    if exit_at is None and victim.proc.poll() is not None:
                        exit_at = time.perf_counter()
                    await asyncio.wait({result}, timeout=0.01)
                    if time.perf_counter() - term_at > WAIT_TIMEOUT_S:
                        result.cancel()
                        raise RuntimeError(f"chat {chat_id}: no result {WAIT_TIMEOUT_S:.0f} s after SIGTERM")
                done_at = time.perf_counter()
                final: TurnState = result.result()
                while exit_at is None:
                    if victim.proc.poll() is not None:
                        exit_at = time.perf_counter()
                    elif time.perf_counter() - term_at > WAIT_TIMEOUT_S:
                        raise RuntimeError(
                            f"{victim.name} still running {WAIT_TIMEOUT_S:.0f} s after SIGTERM"
                        )
                    else:
                        await asyncio.sleep(0.01)
                if final.status != TurnStatus.COMPLETED or final.reason is not None:
                    raise RuntimeError(f"chat {chat_id}: turn ended {final.status.value}/{final.reason}")
                if len(server.requests) != asked + 2:
                    raise RuntimeError(
                        f"chat {chat_id}: {len(server.requests) - asked} model requests, expected 2"
                    )

                history = await client.get_workflow_handle(
                    tk.workflow_id(chat_id), run_id=handle.result_run_id
                ).fetch_history()
                failed = first_event(history, EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED)
                t_failed = event_s(failed) if failed else term_wall
                wft = first_event(history, EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED, after=t_failed)
                again = first_event(history, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, after=t_failed)
                closed = first_event(history, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)
                rec = TermRecord(
                    chat_id=chat_id,
                    run_id=handle.result_run_id or "",
                    completed_s=done_at - term_at,
                    failed_s=t_failed - term_wall if failed else None,
                    next_task_started_s=event_s(wft) - term_wall if wft else None,
                    rescheduled_s=event_s(again) - term_wall if again else None,
                    closed_s=event_s(closed) - term_wall if closed else None,
                    worker_exit_s=exit_at - term_at,
                    worker_exit_code=victim.proc.returncode,
                    timeline=timeline(
                        history,
                        {
                            "SIGTERM of the worker running the model call (client)": term_wall,
                            "workflow result at the client": term_wall + (done_at - term_at),
                            "the SIGTERMed worker process exited": term_wall + (exit_at - term_at),
                        },
                    ),
                )
                records.append(rec)
                progress(
                    f"SIGTERM {i + 1}/{plan.repetitions}: completed after {rec.completed_s:.3f} s "
                    f"(model call failed as WorkerShutdown {fmt_s(rec.failed_s)}, "
                    f"worker exited {fmt_s(rec.worker_exit_s)} with {rec.worker_exit_code})"
                )
                victim = spare
            return records
        except BaseException:
            workers.dump_logs()
            raise
        finally:
            workers.close()


# -- report ---------------------------------------------------------------------------------------


def fmt_s(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f} s"


@dataclass
class Row:
    label: str
    values: list[float]
    goal_s: float | None = None
    digits: int = 2

    def stats(self) -> dict[str, float] | None:
        if not self.values:
            return None
        return {
            "median_s": statistics.median(self.values),
            "min_s": min(self.values),
            "max_s": max(self.values),
        }


def kill_rows(records: list[KillRecord]) -> list[Row]:
    def col(name: str) -> list[float]:
        return [v for r in records if (v := getattr(r, name)) is not None]

    return [
        Row("SIGKILL -> listed awaiting_user (CLI)", col("visible_s"), GOAL_SIGKILL_S),
        Row("  state query answers awaiting_user", col("query_s")),
        Row("  tool start before the kill", col("tool_age_s")),
        Row("  last heartbeat (or start) before it", col("heartbeat_age_s")),
        Row("  heartbeat timeout (TIMED_OUT event)", col("timed_out_s")),
        Row("  gate workflow task started", col("gate_task_started_s")),
        Row("  gate written (search attrs upserted)", col("gate_written_s")),
    ]


def term_rows(records: list[TermRecord]) -> list[Row]:
    def col(name: str) -> list[float]:
        return [v for r in records if (v := getattr(r, name)) is not None]

    return [
        Row("SIGTERM -> turn result on the other", col("completed_s"), GOAL_SIGTERM_S, digits=3),
        Row("  model call failed (WorkerShutdown)", col("failed_s"), digits=3),
        Row("  next workflow task started", col("next_task_started_s"), digits=3),
        Row("  model call scheduled again", col("rescheduled_s"), digits=3),
        Row("  workflow completed (server)", col("closed_s"), digits=3),
        Row("  SIGTERMed worker process exited", col("worker_exit_s"), digits=3),
    ]


def report(
    kills: list[KillRecord],
    terms: list[TermRecord],
    plan: Plan,
    heartbeat_timeout: int | None,
    kill_delay: float,
    spread: bool,
) -> dict[str, Any]:
    hb = heartbeat_timeout or PROJECT_HEARTBEAT_TIMEOUT_S
    beat_every = beat_interval(timedelta(seconds=hb)).total_seconds()
    # The SDK (Core) sends at most one heartbeat per min(0.8 x timeout, the worker's
    # max_heartbeat_throttle_interval); the rest wait for the next send.
    throttle = min(0.8 * hb, heartbeat_throttle(Settings(heartbeat_timeout=hb)).total_seconds())
    print()
    print(
        f"{plan.repetitions} repetitions per measurement, each on a fresh chat; real `python worker.py` "
        "processes; times from the signal, in seconds"
    )
    print(
        f"heartbeat timeout {hb} s; activities beat every {beat_every:.3g} s, the SDK sends at most one per "
        f"{throttle:.3g} s"
        + (
            f"  (TURNKEEPER_HEARTBEAT_TIMEOUT={hb} in the workers' environment)"
            if heartbeat_timeout
            else "  (the project's default)"
        )
    )
    if kills:
        print(
            "SIGKILL as soon as the spare worker polls"
            + (f", plus --kill-delay {kill_delay:g} s" if kill_delay else "")
            + (
                ", then at (i + 0.5) / n of a beat cycle after a beat the server recorded (--spread)"
                if spread
                else ""
            )
        )
    header = f"{'measurement':<42}{'median':>9}{'min':>9}{'max':>9}{'goal':>8}"
    print(header)
    print("-" * len(header))
    rows = (kill_rows(kills) if kills else []) + (term_rows(terms) if terms else [])
    for row in rows:
        st = row.stats()
        if st is None:
            print(f"{row.label:<42}{'-':>9}{'-':>9}{'-':>9}")
            continue
        goal = f"<= {row.goal_s:g}" if row.goal_s is not None else ""
        digits = row.digits
        print(
            f"{row.label:<42}{st['median_s']:>9.{digits}f}{st['min_s']:>9.{digits}f}{st['max_s']:>9.{digits}f}"
            f"{goal:>8}"
        )
    if kills:
        print(
            f"(the CLI took {statistics.mean(r.cli_call_ms for r in kills):.0f} ms per `temporal workflow list` "
            f"call, polled every {POLL_S * 1000:.0f} ms; gate reason: "
            f"{', '.join(sorted({r.reason for r in kills}))})"
        )

    goals: list[tuple[str, str, bool]] = []
    if kills:
        med = statistics.median(r.visible_s for r in kills)
        goals.append(
            (
                f"SIGKILL -> awaiting_user listed <= {GOAL_SIGKILL_S:g} s, median",
                f"{med:.2f} s",
                med <= GOAL_SIGKILL_S,
            )
        )
        worst = max(r.visible_s for r in kills)
        goals.append(("  the same, slowest kill", f"{worst:.2f} s", worst <= GOAL_SIGKILL_S))
    if terms:
        med = statistics.median(r.completed_s for r in terms)
        goals.append(
            (
                f"SIGTERM -> turn finished <= {GOAL_SIGTERM_S:g} s, median",
                f"{med:.3f} s",
                med <= GOAL_SIGTERM_S,
            )
        )
    print()
    print("goals")
    for goal, value, ok in goals:
        print(f"  {goal:<48}{value:>10}   {'PASS' if ok else 'MISS'}")

    shown: dict[str, dict[str, Any]] = {}
    for key, records, value in (("sigkill", kills, "visible_s"), ("sigterm", terms, "completed_s")):
        if not records:
            continue
        rec = near_median(records, lambda r: getattr(r, value))
        print_timeline(
            f"timeline of one {key.upper()} repetition near the median (chat {rec.chat_id}): "
            f"{getattr(rec, value):.3f} s from the signal; "
            "history events (server clock) and << client marks (same host clock)",
            rec.timeline,
        )
        shown[key] = {"chat_id": rec.chat_id, "events": rec.timeline}

    def strip(r: Any) -> dict[str, Any]:
        d = asdict(r)
        d.pop("timeline")
        return d

    return {
        "plan": asdict(plan),
        "heartbeat_timeout_s": hb,
        "heartbeat_beat_interval_s": beat_every,
        "heartbeat_send_interval_s": throttle,
        "kill_delay_s": kill_delay,
        "spread": spread,
        "poll_s": POLL_S,
        "rows": [{"label": r.label.strip(), **(r.stats() or {}), "goal_s": r.goal_s} for r in rows],
        "goals": [{"goal": g, "value": v, "pass": ok} for g, v, ok in goals],
        "sigkill": [strip(r) for r in kills],
        "sigterm": [strip(r) for r in terms],
        "timelines": shown,
    }


# -- main -----------------------------------------------------------------------------------------


async def run(
    plan: Plan,
    only: str | None,
    heartbeat_timeout: int | None,
    kill_delay: float,
    spread: bool,
    as_json: bool,
) -> None:
    worker_env = {"TURNKEEPER_HEARTBEAT_TIMEOUT": str(heartbeat_timeout)} if heartbeat_timeout else {}
    with tempfile.TemporaryDirectory(prefix="turnkeeper-recovery-") as tmp_name:
        tmp = Path(tmp_name)
        progress("starting the Temporal dev server")
        async with dev_server(tmp, ONE_PARTITION, attempts=3) as server:
            address = server.address
            client = await Client.connect(address, data_converter=pydantic_data_converter)
            kills = (
                await measure_sigkill(
                    client,
                    address,
                    tmp,
                    plan,
                    worker_env,
                    kill_delay,
                    spread,
                    heartbeat_timeout or PROJECT_HEARTBEAT_TIMEOUT_S,
                )
                if only in (None, "sigkill")
                else []
            )
            terms = (
                await measure_sigterm(client, address, tmp, plan, worker_env)
                if only in (None, "sigterm")
                else []
            )
            progress("stopping the dev server")
        summary = report(kills, terms, plan, heartbeat_timeout, kill_delay, spread)
    if as_json:
        print()
        print(json.dumps(summary, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK.repetitions} repetitions per measurement instead of {FULL.repetitions}",
    )
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--only", choices=("sigkill", "sigterm"), help="run one measurement only")
    parser.add_argument(
        "--heartbeat-timeout",
        type=int,
        metavar="S",
        help="run the workers with TURNKEEPER_HEARTBEAT_TIMEOUT=S "
        f"(default: unset, i.e. {PROJECT_HEARTBEAT_TIMEOUT_S} s)",
    )
    parser.add_argument(
        "--kill-delay",
        type=float,
        default=0.0,
        metavar="S",
        help="SIGKILL: wait S more seconds after the spare worker polls (default 0), to kill "
        f"at another point of the heartbeat cycle (slow_write runs {TOOL_SECONDS} s)",
    )
    parser.add_argument(
        "--spread",
        action="store_true",
        help="SIGKILL: kill repetition i at (i + 0.5) / n of a heartbeat cycle after a beat the "
        "server recorded, so the runs cover the cycle from its worst point to its best",
    )
    args = parser.parse_args()
    if not 0 <= args.kill_delay <= TOOL_SECONDS - 10:
        parser.error(f"--kill-delay must be between 0 and {TOOL_SECONDS - 10}")
    if args.heartbeat_timeout is not None and args.heartbeat_timeout < 1:
        parser.error("--heartbeat-timeout must be at least 1 (the setting is whole seconds)")
    run_and_exit(
        run(
            QUICK if args.quick else FULL,
            args.only,
            args.heartbeat_timeout,
            args.kill_delay,
            args.spread,
            args.json,
        )
    )


if __name__ == "__main__":
    main()
