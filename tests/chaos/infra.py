"""The chaos harness's surroundings: the fake model and the worker processes
(its Temporal dev server is tests/support.py's `dev_server`). See tests/chaos/harness.py."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.chaos.base import CONFIRM_TOOL, TOOL, ChaosConfig
from tests.support import ROOT
from turnkeeper.activities.providers.base import SUMMARY_INSTRUCTION
from turnkeeper.subagents import DELEGATE_TOOL

SUMMARY_LEAD = SUMMARY_INSTRUCTION.split("{", 1)[0][:40]


# -- the model --------------------------------------------------------------------------


# A delegated task names itself, its depth and its mode; the sub-chat's model reads
# them from the task, its first user message (tests/chaos/check.py reads them too).
TASK = re.compile(r"^subtask n(\d+) d(\d+) (wait|background):")
# A background subagent's answer in its parent's chat (activities/subagent_activities.py's heads).
REPORT_LEAD = "Subagent"


def task_text(marker: int, depth: int, mode: str) -> str:
    return f"subtask n{marker} d{depth} {mode}: note a few things in the ledger"


ANSWER_LEAD = "answer of subtask"


def answer_text(marker: str | None, rounds: int) -> str:
    """The final answer: a subagent's names its task, so that its parent's row can be matched."""
    head = f"{ANSWER_LEAD} n{marker}: " if marker else ""
    return f"{head}done after {rounds} tool round(s)"


class ChaosModel:
    """The FakeChatServer responder: decides each request from its messages.

    A chat's user message gets tool calls (or, with `delegate`, a delegate call);
    a sub-chat is told by its first user message (`subtask n<id> d<depth> <mode>: ...`)
    and does tool rounds like a chat, delegating once more in wait mode now and then
    where the depth allows; a background subagent's report (a user message that
    starts with "Subagent") gets a text answer, never a delegation: nothing loops."""

    def __init__(self, cfg: ChaosConfig, rng: random.Random) -> None:
        self.cfg = cfg
        self.rng = rng
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.requests = 0
        # The FakeChatServer keeps every request; with bursts of large follow-ups
        # the transcripts weigh megabytes: it drops them (the model counts them).
        self.forget: list[dict[str, Any]] | None = None

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.forget is not None:
            self.forget.clear()
        messages = request.get("messages") or []
        last_role = messages[-1].get("role") if messages else None
        rounds = 0
        for m in reversed(messages):
            if m.get("role") == "user":
                break
            if m.get("role") == "assistant" and m.get("tool_calls"):
                rounds += 1
        cfg = self.cfg
        unanswered = unanswered_tool_calls(messages)
        task = sub_chat_task(messages)
        offered = {str((t.get("function") or {}).get("name")) for t in request.get("tools") or []}
        with self.lock:
            self.requests += 1
            r = self.rng
            if is_summary_request(request):
                # A long chat's older turns folded (bursts make chats long): a model answers in words.
                self.counts["summary"] += 1
                return {
                    "text": f"summary {self.counts['summary']}: the user sent numbered messages and bursts",
                    "delay": round(r.uniform(0, cfg.model_delay_max_s), 3),
                }
            if cfg.strict_protocol and unanswered:
                # What api.openai.com answers to such a request (a permanent error).
                self.counts["protocol_violation"] += 1
                return {
                    "status": 400,
                    "message": (
                        "An assistant message with 'tool_calls' must be followed by tool messages responding "
                        "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                        + ", ".join(unanswered)
                    ),
                }
            if r.random() < cfg.provider_errors:
                self.counts["429"] += 1
                return {"status": 429, "message": "chaos: slow down"}
            delay = round(
                r.uniform(1.0, 3.0) if r.random() < cfg.slow_model else r.uniform(0, cfg.model_delay_max_s), 3
            )
            if last_role == "user" and is_report(messages[-1]):
                # A background subagent's answer: acknowledged in words, never delegated again.
                self.counts["report_answer"] += 1
                return {"text": "noted the subagent's report", "delay": delay}
            if last_role == "user" and DELEGATE_TOOL in offered:
                depth = int(task.group(2)) if task else 0
                if (task is None and r.random() < cfg.delegate) or (
                    task is not None and r.random() < cfg.nested
                ):
                    return {
                        "tool_calls": self._delegate_calls(depth, nested=task is not None),
                        "delay": delay,
                    }
            wants_tools = last_role == "user" or (
                last_role == "tool" and rounds < cfg.max_rounds and r.random() < cfg.second_round
            )
            if wants_tools:
                n = 2 if r.random() < cfg.parallel_tools else 1
                self.counts[f"tool_calls_{n}"] += 1
                return {"tool_calls": [self._ledger_call() for _ in range(n)], "delay": delay}
            self.counts["text" if task is None else "subagent_answer"] += 1
            return {"text": answer_text(task.group(1) if task else None, rounds), "delay": delay}

    def _ledger_call(self) -> dict[str, Any]:
        r = self.rng
        return {
            "name": CONFIRM_TOOL if r.random() < self.cfg.confirm else TOOL,
            "arguments": {
                "note": f"n{r.randrange(10**6)}",
                "seconds": round(r.uniform(0, self.cfg.tool_max_s), 2),
            },
        }

    def _delegate_calls(self, depth: int, nested: bool) -> list[dict[str, Any]]:
        """One delegate call (two with `fanout`), each a task marked with its depth and
        mode; now and then one the workflow must refuse in words; now and then a ledger
        call beside them."""
        r, cfg = self.rng, self.cfg
        n = 2 if r.random() < cfg.fanout else 1
        calls: list[dict[str, Any]] = []
        for _ in range(n):
            mode = "background" if not nested and r.random() < cfg.background else "wait"
            args: dict[str, Any] = {"task": task_text(r.randrange(10**9), depth + 1, mode), "mode": mode}
            if r.random() < cfg.bad_delegate:
                bad = r.choice(["profile", "mode"])
                args["profile" if bad == "profile" else "mode"] = (
                    "no-such-profile" if bad == "profile" else "later"
                )
                self.counts[f"delegate_bad_{bad}"] += 1
            else:
                self.counts[f"delegate_{'nested_' if nested else ''}{mode}"] += 1
            calls.append({"name": DELEGATE_TOOL, "arguments": args})
        self.counts[f"delegate_calls_{n}"] += 1
        if r.random() < cfg.parallel_tools / 2:
            calls.append(self._ledger_call())
            self.counts["delegate_with_ledger_call"] += 1
        return calls


def sub_chat_task(messages: list[dict[str, Any]]) -> re.Match[str] | None:
    """A sub-chat's task marker: its first user message."""
    first = next((m for m in messages if m.get("role") == "user"), None)
    return TASK.match(str(first.get("content") or "")) if first else None


def is_report(message: dict[str, Any]) -> bool:
    return message.get("role") == "user" and str(message.get("content") or "").startswith(REPORT_LEAD)


def is_summary_request(request: dict[str, Any]) -> bool:
    """The model activity asks the model to summarise a chat's older rows (no tools)."""
    messages = request.get("messages") or []
    first = messages[0] if messages else {}
    return (
        not request.get("tools")
        and first.get("role") == "system"
        and str(first.get("content", "")).startswith(SUMMARY_LEAD)
    )


def unanswered_tool_calls(messages: list[dict[str, Any]]) -> list[str]:
    """Tool call ids of assistant messages not followed by their tool messages."""
    missing: list[str] = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            continue
        answered = set()
        for follower in messages[i + 1 :]:
            if follower.get("role") != "tool":
                break
            answered.add(follower.get("tool_call_id"))
        missing += [c.get("id") for c in m["tool_calls"] if c.get("id") not in answered]
    return missing


# -- worker processes -------------------------------------------------------------------

# The worker's own line once it is about to poll (turnkeeper/worker/main.py).
SERVING_LINE = re.compile(
    rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) INFO turnkeeper\.worker: worker serving"
)


@dataclass
class WorkerProc:
    index: int
    proc: subprocess.Popen[bytes]
    log: Path
    started: float  # time.monotonic() at spawn
    serving_at: float | None = None  # time.monotonic() of its "worker serving" line
    ended_at: float | None = None  # time.monotonic() when it was killed or seen gone

    @property
    def pid(self) -> int:
        return self.proc.pid

    def look_for_serving(self) -> None:
        """Reads the log's time of the serving line (logging's local-time clock,
        turned into this process's monotonic one)."""
        if self.serving_at is not None:
            return
        with contextlib.suppress(OSError):
            for line in self.log.read_bytes().splitlines():
                m = SERVING_LINE.match(line)
                if m:
                    wall = (
                        time.mktime(time.strptime(m.group(1).decode(), "%Y-%m-%d %H:%M:%S"))
                        + int(m.group(2)) / 1000
                    )
                    self.serving_at = time.monotonic() - (time.time() - wall)
                    return


class WorkerPool:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.workers: list[WorkerProc] = []
        self.lives: list[WorkerProc] = []  # every worker ever started, for its serving window
        self.started = 0
        self.stopped_at: float | None = None  # time.monotonic() when stop_all began
        self.died: list[dict[str, Any]] = []

    def spawn(self) -> WorkerProc:
        log = self.logs / f"worker-{self.started:03d}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "worker.py"],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        w = WorkerProc(self.started, proc, log, time.monotonic())
        self.started += 1
        self.workers.append(w)
        self.lives.append(w)
        return w

    def kill(self, w: WorkerProc, sig: int = signal.SIGKILL) -> None:
        w.look_for_serving()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.pid, sig)
        if w.ended_at is None:
            w.ended_at = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(timeout=30)
        if w in self.workers:
            self.workers.remove(w)

    def reap(self) -> list[WorkerProc]:
        """Workers that exited by themselves (not killed by us)."""
        gone = [w for w in self.workers if w.proc.poll() is not None]
        for w in gone:
            w.look_for_serving()
            w.ended_at = time.monotonic()
            self.workers.remove(w)
            self.died.append({"index": w.index, "pid": w.pid, "code": w.proc.returncode, "log": str(w.log)})
        return gone

    def look_for_serving(self) -> None:
        for w in self.workers:
            w.look_for_serving()

    def serving_windows(self, until: float) -> list[tuple[float, float]]:
        """The spans (monotonic) in which at least one worker was serving, merged."""
        spans = sorted(
            (w.serving_at, w.ended_at if w.ended_at is not None else until)
            for w in self.lives
            if w.serving_at is not None
        )
        merged: list[tuple[float, float]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            elif b > a:
                merged.append((a, b))
        return merged

    def stop_all(self) -> None:
        self.stopped_at = time.monotonic()
        for w in list(self.workers):
            w.look_for_serving()
            if w.ended_at is None:
                w.ended_at = self.stopped_at
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for w in list(self.workers):
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if w.proc.poll() is None:
                self.kill(w)
        self.workers.clear()
