"""The chaos harness's users: each chat's user sends messages and follow-ups,
retries ids, presses Continue, Dismiss and Stop at random moments (by
turnkeeper.client.decide, which signals and reads the answer back from `state`, or
by a bare signal; with current, stale and made-up recovery ids), sends bursts of large
follow-ups while a tool runs; a gate driver answers every gate; and after the
run a probe message goes to every chat. Every action's answer time is recorded.
See tests/chaos/harness.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from typing import TYPE_CHECKING, Any

from temporalio.client import WorkflowExecutionStatus

from tests.chaos.base import CLOSED_TURN, MAX_MESSAGE_BYTES, Action, ChatLog, error_kind
from tests.chaos.infra import TASK
from turnkeeper import client as tk
from turnkeeper.models import UserMessage
from turnkeeper.store import SessionStore, StoreError, open_store

if TYPE_CHECKING:
    import random
    from collections import Counter

    from temporalio.client import Client

    from tests.chaos.base import ActionLog, ChaosConfig
    from turnkeeper.config import Settings


async def query_state(client: Any, chat_id: str, timeout: float = 20.0) -> dict[str, Any]:
    """The `state` query as a plain dict, so that fields the harness's copy of the
    models does not know yet (e.g. `store_unavailable`) are kept. A refused catch-up
    is asked again, as docs/contract.md tells clients to (at most three times)."""
    from temporalio.client import WorkflowQueryFailedError

    handle = client.get_workflow_handle(tk.workflow_id(chat_id))
    for attempt in range(3):
        try:
            return await asyncio.wait_for(handle.query("state", result_type=dict), timeout)
        except WorkflowQueryFailedError as err:
            if "QueryCatchUp" not in err.message or attempt == 2:
                raise
    raise AssertionError("unreachable")


def gate_key(chat_id: str, state: dict[str, Any]) -> tuple[str, ...]:
    """One gate: a turn keeps its recovery id at every gate it opens, so the id alone
    does not tell an answered approval gate from the next gate of the same turn."""
    return (
        chat_id,
        str(state.get("recovery_id")),
        str(state.get("reason")),
        str(state.get("attempts")),
        *sorted(str(a.get("id")) for a in state.get("approvals") or []),
    )


SUBAGENT_WAITING = "subagent_waiting"


def is_sub_chat(chat_id: str) -> bool:
    """A subagent's chat: `<parent>.sub<turn>-<hash>` (turnkeeper.subagents.sub_chat_id)."""
    return ".sub" in chat_id


def parent_chat(sub_chat: str) -> str:
    return sub_chat.rsplit(".sub", 1)[0]


def delegating_turn(sub_chat: str) -> int | None:
    """The turn of its parent's chat that delegated to `sub_chat`."""
    m = re.search(r"\.sub(\d+)-[0-9a-f]+$", sub_chat)
    return int(m.group(1)) if m else None


def shown_subagent(state: dict[str, Any]) -> dict[str, Any] | None:
    """The waiting subagent whose gate a `subagent_waiting` state shows."""
    return next(
        (
            v
            for v in state.get("subagents") or []
            if v.get("mode") == "wait"
            and v.get("status") == "awaiting_user"
            and v.get("recovery_id") == state.get("recovery_id")
        ),
        None,
    )


def _gist(state: dict[str, Any] | None) -> str:
    if not state:
        return "nothing (not asked)"
    return f"{state.get('status')}/{state.get('reason')} ({state.get('recovery_id')})"


def tool_running(state: dict[str, Any]) -> bool:
    return any(c.get("status") == "running" for c in state.get("tool_calls") or [])


def state_signature(state: dict[str, Any] | str) -> str:
    """What changes while a run makes progress."""
    if isinstance(state, str):
        return "query failed"
    return json.dumps(
        [
            state.get(k)
            for k in (
                "turn",
                "status",
                "reason",
                "recovery_id",
                "attempts",
                "pending_followups",
                "store_unavailable",
            )
        ]
        + [[c.get("id"), c.get("status")] for c in state.get("tool_calls") or []]
    )


class Users:
    """Mixed into `Chaos`: everything the users and the gate driver do."""

    # Set by `Chaos`.
    cfg: ChaosConfig
    rng: random.Random
    client: Client
    settings: Settings
    chats: dict[str, ChatLog]
    actions: ActionLog
    stop_sending: asyncio.Event
    gates_done: asyncio.Event
    outage_active: bool
    completed_turns: int
    probing: bool
    probe_summary: dict[str, Any]
    probe_failures: dict[str, str]
    burst_log: list[dict[str, Any]]
    answered_gates: set[tuple[str, ...]]
    gates_answered: Counter[str]
    gate_rejections: Counter[str]
    stale_probes: Counter[str]
    rejection_samples: dict[str, str]
    send_errors: Counter[str]
    outage_looks: Counter[str]
    slow_turns: list[str]
    run_errors: list[str]
    stops: int
    _answering: dict[str, asyncio.Task[None]]
    sub_logs: dict[str, ChatLog]
    sub_modes: dict[str, str]  # sub-chat -> wait/background, as learnt
    subagent_gates_decided: Counter[str]
    unshown_child_gates: list[str]
    outliving_children: list[str]

    def _now(self) -> float: ...
    def _rand(self) -> float: ...
    def _log(self, text: str) -> None: ...
    def _due(self, target: int) -> int: ...

    # -- sending messages ---------------------------------------------------------------------
    async def _chat_loop(self, chat: ChatLog) -> None:
        while not self.stop_sending.is_set():
            await self._send_new(chat)
            await self._follow_turn(chat)
            await asyncio.sleep(self.rng.uniform(0, self.cfg.think_max_s))

    async def _send_new(self, chat: ChatLog, kind: str = "message") -> None:
        chat.n += 1
        message_id = f"{chat.chat_id}-m{chat.n}"
        text = f"message {chat.n} of {chat.chat_id}"
        chat.texts[message_id] = text
        acked = await self._send(chat, message_id, text, kind=kind)
        if acked and self._rand() < self.cfg.dup_retry:
            await self._send(chat, message_id, text, dup=True, kind="retry")  # a client retry: one message

    async def _send(
        self, chat: ChatLog, message_id: str, text: str, dup: bool = False, kind: str = "message"
    ) -> bool:
        async with chat.send_lock:  # one send at a time per chat: the order of acknowledgements is known
            return await self._send_unlocked(chat, message_id, text, dup=dup, kind=kind)

    async def _send_unlocked(
        self,
        chat: ChatLog,
        message_id: str,
        text: str,
        dup: bool = False,
        kind: str = "message",
        attempts: int = 3,
    ) -> bool:
        for attempt in range(attempts):
            chat.sends += 1
            chat.sent[message_id] += 1
            if dup or attempt:
                chat.dup_sends += 1
            action = self.actions.add(
                Action(kind=kind, chat_id=chat.chat_id, source="user", at_s=self._now())
            )
            outage = self.outage_active
            started = time.monotonic()
            try:
                await asyncio.wait_for(
                    tk.send_message(
                        self.client,
                        self.settings,
                        chat.chat_id,
                        UserMessage(message_id=message_id, text=text),
                    ),
                    self.cfg.action_wait_s,
                )
            except Exception as err:
                if not isinstance(err, asyncio.TimeoutError):
                    action.latency_s = time.monotonic() - started
                action.outcome = f"error: {type(err).__name__}"
                self.send_errors[type(err).__name__] += 1
                if message_id not in chat.acked_set:
                    chat.unacked.add(message_id)
                await asyncio.sleep(1.0)
                continue
            action.latency_s = time.monotonic() - started
            action.outcome = "accepted"
            if message_id not in chat.acked_set:
                chat.acked.append(message_id)
                chat.acked_set.add(message_id)
                chat.unacked.discard(message_id)
                if outage or self.outage_active:
                    chat.acked_during_outage.add(message_id)
            return True
        return False

    async def _follow_turn(self, chat: ChatLog) -> None:
        """Wait until the chat has no running run; meanwhile send follow-ups and
        retries, and press Continue, Dismiss or Stop now and then."""
        cfg = self.cfg
        handle = self.client.get_workflow_handle(tk.workflow_id(chat.chat_id))
        started = time.monotonic()
        followups = 0
        reported_slow = False
        while True:
            result = asyncio.create_task(handle.result())  # the latest run, following continue-as-new
            try:
                while not result.done():
                    await asyncio.wait({result}, timeout=self.rng.uniform(0.3, 0.8))
                    if self.stop_sending.is_set():
                        return  # the settling phase waits for the runs from here
                    if result.done():
                        continue
                    p_action = cfg.resuming_action if chat.resumed_at is not None else cfg.action
                    if followups < cfg.max_followups and self._rand() < cfg.followup:
                        followups += 1
                        await self._send_new(chat, kind="followup")
                    elif self._rand() < cfg.stop:
                        await self._stop(chat, None)
                    elif self._rand() < p_action:
                        await self._user_action(chat)
                    elif len(chat.acked) > 1 and self._rand() < cfg.late_dup:
                        old = self.rng.choice(chat.acked[:-1])
                        chat.late_dups.append((self._now(), old))
                        await self._send(chat, old, chat.texts[old], dup=True, kind="late retry")
                    if not reported_slow and time.monotonic() - started > cfg.slow_turn_s:
                        reported_slow = True
                        try:
                            state: Any = await query_state(self.client, chat.chat_id)
                        except Exception as err:
                            state = f"query failed: {err}"
                        self.slow_turns.append(
                            f"{chat.chat_id}: still running after {cfg.slow_turn_s:.0f} s: {state}"
                        )
            finally:
                if not result.done():
                    result.cancel()
                    with contextlib.suppress(BaseException):
                        await result
                chat.resumed_at = None
            if not result.cancelled() and result.exception() is not None:
                err = result.exception()
                self.run_errors.append(f"{chat.chat_id}: run ended with {type(err).__name__}: {err}")
            try:
                desc = await asyncio.wait_for(handle.describe(), 20)
            except Exception:
                await asyncio.sleep(0.5)
                continue
            if desc.status != WorkflowExecutionStatus.RUNNING:
                return

    async def _look(self, chat_id: str, timeout: float = 20.0) -> dict[str, Any]:
        """A user's (or the driver's) `state` query; counts what it shows during store outages."""
        outage = self.outage_active
        state = await query_state(self.client, chat_id, timeout)
        if outage and self.outage_active:
            self.outage_looks["queries"] += 1
            self.outage_looks["store_unavailable"] += bool(state.get("store_unavailable"))
        return state

    # -- Continue, Dismiss, Stop at random moments ----------------------------------------------
    async def _user_action(self, chat: ChatLog) -> None:
        """The user looks at the chat (most of the time) and presses a button,
        with the recovery id on the screen or one remembered from earlier."""
        state: dict[str, Any] | None = None
        if chat.resumed_at is not None or self._rand() < 0.7:
            with contextlib.suppress(Exception):
                state = await self._look(chat.chat_id, timeout=self.cfg.action_wait_s)
        status = state.get("status") if state else None
        if state:
            chat.saw(state.get("recovery_id"))
            if status != "resuming":
                chat.resumed_at = None
        r = self._rand()
        if status == "resuming":  # a Continue runs: Dismiss it, Stop it, supersede it, or press again
            verb = "dismiss" if r < 0.45 else "stop" if r < 0.6 else "message" if r < 0.75 else "continue"
        else:
            verb = "continue" if r < 0.4 else "dismiss" if r < 0.8 else "stop"
        if verb == "stop":
            await self._stop(chat, status, state)
        elif verb == "message":
            await self._send_new(chat, kind="superseding message")
        else:
            await self._recovery_action(chat, verb, state)

    def _pick_recovery_id(self, chat: ChatLog, state: dict[str, Any] | None) -> tuple[str, str]:
        current = state.get("recovery_id") if state else None
        choices: list[tuple[str, str, float]] = [("made-up", f"stale-{uuid.uuid4().hex[:8]}", 0.15)]
        if current:
            choices.append(("current", current, 0.6))
        if chat.recovery_ids:
            choices.append(("last-seen", chat.recovery_ids[-1], 0.15))
        if len(chat.recovery_ids) > 1:
            choices.append(("old", self.rng.choice(chat.recovery_ids[:-1]), 0.1))
        r = self._rand() * sum(w for _, _, w in choices)
        for kind, value, w in choices:
            r -= w
            if r <= 0:
                return kind, value
        return choices[-1][0], choices[-1][1]

    async def _recovery_action(
        self,
        chat: ChatLog,
        verb: str,
        state: dict[str, Any] | None,
        source: str = "user",
        id_kind: str | None = None,
        recovery_id: str | None = None,
    ) -> str:
        if recovery_id is None:
            id_kind, recovery_id = self._pick_recovery_id(chat, state)
        form = "signal" if source == "user" and self._rand() < self.cfg.signal_form else "decide"
        action = self.actions.add(
            Action(
                kind=f"{verb}/{form}",
                chat_id=chat.chat_id,
                source=source,
                at_s=self._now(),
                status_seen=state.get("status") if state else None,
                reason_seen=state.get("reason") if state else None,
                turn_seen=state.get("turn") if state else None,
                id_kind=id_kind,
                recovery_id=recovery_id,
            )
        )
        await self._decide(
            chat, action, verb, form, recovery_id, count=source == "gate" and id_kind == "current"
        )
        if verb == "continue" and action.outcome == "accepted":
            chat.resumed_at = time.monotonic()
        return action.outcome

    async def _stop(
        self, chat: ChatLog, status_seen: str | None, state: dict[str, Any] | None = None
    ) -> None:
        form = "signal" if self._rand() < self.cfg.signal_form else "decide"
        action = self.actions.add(
            Action(
                kind=f"stop/{form}",
                chat_id=chat.chat_id,
                source="user",
                at_s=self._now(),
                status_seen=status_seen,
                reason_seen=state.get("reason") if state else None,
                turn_seen=state.get("turn") if state else None,
            )
        )
        await self._decide(chat, action, "stop", form, None, count=False)
        if action.outcome in ("accepted", "accepted by the server"):
            self.stops += 1

    async def _decide(
        self, chat: ChatLog, action: Action, verb: str, form: str, recovery_id: str | None, count: bool
    ) -> None:
        """`verb` as a bare signal (answered once the server has it) or by tk.decide
        (answered once a worker has judged it: the state it led to, or the refusal)."""
        wait = self.cfg.action_wait_s
        started = time.monotonic()
        try:
            if form == "signal":
                handle = self.client.get_workflow_handle(tk.workflow_id(chat.chat_id))
                payload = {} if verb == "stop" else {"recovery_id": recovery_id}
                await asyncio.wait_for(handle.signal(verb, payload), wait)
                action.outcome = "accepted by the server"
            else:
                # tk.decide gives up after `wait` itself (DecisionPending); wait_for only guards its RPCs.
                await asyncio.wait_for(
                    tk.decide(self.client, chat.chat_id, verb, recovery_id, timeout=wait), wait + 10
                )
                action.outcome = "accepted"
            action.latency_s = time.monotonic() - started
        except (TimeoutError, tk.DecisionPending):
            action.outcome = "no answer"
        except tk.DecisionRefused as err:
            action.latency_s = time.monotonic() - started
            action.outcome = f"refused: {self._rejected(str(err), count=count)}"
        except Exception as err:
            action.latency_s = time.monotonic() - started
            action.outcome = f"refused: {self._rejected(f'{type(err).__name__}: {err}', count=count)}"

    def _rejected(self, text: str, count: bool = True) -> str:
        kind = error_kind(text)
        if count:
            self.gate_rejections[kind] += 1
        self.rejection_samples.setdefault(kind, text[:300])
        return kind

    # -- bursts of large follow-ups while a tool runs --------------------------------------------
    async def _burster(self) -> None:
        """Paced over the target turns like the kills: a chat whose turn shows a
        tool running gets a burst of large follow-ups from its user."""
        cfg = self.cfg
        target = cfg.burst_target
        done = 0
        while not self.stop_sending.is_set() and done < target:
            await asyncio.sleep(0.3)
            if done >= self._due(target):
                continue
            candidates = [c for c in self.chats.values() if c.bursts < 2]
            self.rng.shuffle(candidates)
            candidates.sort(key=lambda c: c.resumed_at is None)  # chats whose Continue runs first
            for chat in candidates[:4]:
                try:
                    state = await self._look(chat.chat_id, timeout=5)
                except Exception:
                    continue
                if tool_running(state) and not self.stop_sending.is_set():
                    done += 1
                    await self._burst(chat)
                    break

    async def _burst(self, chat: ChatLog) -> None:
        cfg = self.cfg
        chat.bursts += 1
        n = self.rng.randint(*cfg.burst_size)
        oversize_at = self.rng.randrange(n) if self._rand() < cfg.oversize else -1
        record: dict[str, Any] = {
            "chat_id": chat.chat_id,
            "at_s": round(self._now(), 2),
            "messages": 0,
            "bytes": 0,
            "acked": 0,
            "oversize": oversize_at >= 0,
            "during_outage": self.outage_active,
            "while_resuming": chat.resumed_at is not None,
        }
        self.actions.add(
            Action(
                kind="burst",
                chat_id=chat.chat_id,
                source="burst",
                at_s=self._now(),
                status_seen="running",
                outcome=f"{n} follow-ups",
                latency_s=0.0,
            )
        )
        self._log(
            f"burst: {n} large follow-ups to {chat.chat_id}"
            f"{' during a store outage' if self.outage_active else ''}"
        )
        started = time.monotonic()
        async with chat.send_lock:
            for j in range(n):
                size = MAX_MESSAGE_BYTES + 4096 if j == oversize_at else self.rng.randint(*cfg.burst_bytes)
                message_id = f"{chat.chat_id}-b{chat.bursts}-{j}"
                head = f"burst {chat.bursts} follow-up {j} of {chat.chat_id}: "
                text = head + self.rng.randbytes((size - len(head)) // 2 + 1).hex()[: size - len(head)]
                chat.texts[message_id] = text
                record["messages"] += 1
                record["bytes"] += len(text)
                if await self._send_unlocked(chat, message_id, text, kind="burst follow-up", attempts=2):
                    record["acked"] += 1
                await asyncio.sleep(self.rng.uniform(0, cfg.burst_gap_s))
        record["took_s"] = round(time.monotonic() - started, 2)
        record["during_outage"] = record["during_outage"] or self.outage_active
        self.burst_log.append(record)

    # -- the gate driver ------------------------------------------------------------------------
    async def _gate_driver(self) -> None:
        query = "WorkflowType='ChatTurn' AND ExecutionStatus='Running' AND TurnStatus='awaiting_user'"
        while not self.gates_done.is_set():
            try:
                async for wf in self.client.list_workflows(query):
                    chat_id = wf.id.removeprefix("chat-")
                    if chat_id in self._answering:
                        continue
                    if chat_id in self.chats:
                        task = asyncio.create_task(self._answer_gate(chat_id))
                    elif is_sub_chat(chat_id):
                        task = asyncio.create_task(self._sub_chat_gate(chat_id))
                    else:
                        continue
                    self._answering[chat_id] = task
                    task.add_done_callback(lambda _t, c=chat_id: self._answering.pop(c, None))
            except Exception as err:
                self.gate_rejections[f"list failed: {type(err).__name__}"] += 1
            await asyncio.sleep(0.5)

    def _chat_log(self, chat_id: str) -> ChatLog:
        if chat_id in self.chats:
            return self.chats[chat_id]
        return self.sub_logs.setdefault(chat_id, ChatLog(chat_id))

    async def _gate_key(self, chat_id: str, state: dict[str, Any]) -> tuple[str, ...]:
        """A gate shown for a subagent is the subagent's own gate: the next gate of the
        same subagent's turn keeps its recovery id, so its own key is part of this one."""
        key = gate_key(chat_id, state)
        for _ in range(4):  # a subagent's subagent's gate climbs as well
            if state.get("reason") != SUBAGENT_WAITING:
                break
            holder = shown_subagent(state)
            if holder is None:
                break
            try:
                state = await self._look(holder["chat_id"], timeout=10)
            except Exception:
                break
            key += gate_key(holder["chat_id"], state)
        return key

    async def _gate_state(self, chat_id: str) -> dict[str, Any] | None:
        """`chat_id`'s state when it waits at a gate (with its recovery id), else None."""
        try:
            state = await self._look(chat_id)
        except Exception:
            return None
        if state.get("status") != "awaiting_user" or not state.get("recovery_id"):
            return None
        return state

    async def _answer_gate(self, chat_id: str, where: str = "") -> None:
        """Answers the gate `chat_id` shows: its own, or a subagent's (subagent_waiting).
        `where`: set when `chat_id` is a sub-chat, which chat of the user's it stands for."""
        cfg = self.cfg
        chat = self._chat_log(chat_id)
        state = await self._gate_state(chat_id)
        if state is None:
            return
        recovery_id = state["recovery_id"]
        chat.saw(recovery_id)
        key = await self._gate_key(chat_id, state)
        if key in self.answered_gates:
            return  # visibility lags behind: this gate was answered already
        subagents = state.get("reason") == SUBAGENT_WAITING
        if subagents and chat_id in self.chats and not self.probing and self._rand() < cfg.subagent_gate_user:
            # The chat's user presses a button there, at a random moment, with whichever id
            # (the one on screen, one remembered, a made-up one), in either form; or Stop.
            await asyncio.sleep(self.rng.uniform(0, 3 * cfg.gate_think_max_s))
            await self._user_action(chat)
            return  # the driver comes back while a gate is still shown
        await asyncio.sleep(self.rng.uniform(0, cfg.gate_think_max_s))
        if self._rand() < cfg.stale_probe:
            outcome = await self._recovery_action(
                chat,
                self.rng.choice(["continue", "dismiss"]),
                state,
                "gate",
                "made-up",
                f"stale-{uuid.uuid4().hex[:8]}",
            )
            self.stale_probes["ACCEPTED" if outcome == "accepted" else outcome] += 1
        asks = state.get("reason") == "approval_required"  # Continue approves the calls, Dismiss denies them
        p_continue = 1.0 if self.probing else cfg.p_approve if asks else cfg.p_continue
        verb = "continue" if state.get("can_continue", True) and self._rand() < p_continue else "dismiss"
        outcome = await self._recovery_action(chat, verb, state, "gate", "current", recovery_id)
        if outcome == "accepted":
            self.gates_answered[("approve" if verb == "continue" else "deny") if asks else verb] += 1
            self.answered_gates.add(key)
            if where:
                self.subagent_gates_decided[f"{verb} {where}"] += 1
            if subagents:
                self.subagent_gates_decided[f"{verb} from the parent's chat"] += 1
        elif outcome == "no answer":
            self.gate_rejections["timeout"] += 1

    async def _sub_chat_gate(self, chat_id: str) -> None:
        """A sub-chat at a gate. A background subagent's gate stays in its own chat: the
        driver decides it there, as its user would. A waiting subagent's gate must show
        in the chat its user sees (its parent's, or above): once it has not for
        sub_gate_grace_s, it is counted, and decided here so that nothing waits forever."""
        cfg = self.cfg
        state = await self._gate_state(chat_id)
        if state is None:
            return
        recovery_id = state["recovery_id"]
        facing = await self._user_facing(chat_id)
        if facing == chat_id:
            await self._answer_gate(chat_id, "in a background subagent's chat")
            return
        if state.get("reason") == SUBAGENT_WAITING:
            return  # shown here for a subagent of its own, whose gate this driver follows
        since = time.monotonic()
        shown: dict[str, Any] | None = None
        while time.monotonic() - since < cfg.sub_gate_grace_s:
            await asyncio.sleep(2.0)
            try:
                now = await self._look(chat_id, timeout=10)
            except Exception:
                continue
            if now.get("status") != "awaiting_user" or now.get("recovery_id") != recovery_id:
                return  # decided, from the parent's chat or otherwise
            try:
                shown = await self._look(facing, timeout=10)
            except Exception:
                shown = None
                since = time.monotonic()  # the chat the user sees cannot be asked: no verdict
                continue
            if shown.get("status") == "awaiting_user":
                if shown.get("recovery_id") == recovery_id or shown.get("reason") != SUBAGENT_WAITING:
                    return  # shown there (or another gate first, which the driver decides there)
                since = min(since + 2.0, time.monotonic())  # another subagent's gate first: one at a time
        where = "in a waiting subagent's chat (not shown in its parent's)"
        parent = parent_chat(chat_id)
        try:
            delegator = await self._look(parent, timeout=10)
        except Exception as err:
            delegator = {"status": f"query failed: {type(err).__name__}"}
        if delegator.get("status") in CLOSED_TURN or delegator.get("turn") != delegating_turn(chat_id):
            # Its parent's turn has ended: a waiting subagent must have ended with it.
            self.outliving_children.append(
                f"{chat_id}: at gate {state.get('reason')} ({recovery_id}) for {cfg.sub_gate_grace_s:.0f} s "
                f"while its parent {parent}'s turn {delegating_turn(chat_id)} is over: the parent shows turn "
                f"{delegator.get('turn')} {_gist(delegator)}"
            )
            where = "in a waiting subagent's chat (its parent's turn over)"
        else:
            self.unshown_child_gates.append(
                f"{chat_id}: gate {state.get('reason')} ({recovery_id}) not shown in chat {facing} for "
                f"{cfg.sub_gate_grace_s:.0f} s: {facing} shows {_gist(shown)}"
            )
        self._log(f"subagent {chat_id}'s gate not shown in its user's chat {facing}: deciding it there")
        await self._answer_gate(chat_id, where)

    async def _user_facing(self, chat_id: str) -> str:
        """The chat whose user decides `chat_id`'s gates: a waiting subagent's parent's
        (and so on up), a background subagent's own, a chat of the harness's own."""
        while is_sub_chat(chat_id):
            if await self._mode_of(chat_id) != "wait":
                return chat_id
            chat_id = parent_chat(chat_id)
        return chat_id

    async def _mode_of(self, sub_chat: str) -> str | None:
        """A subagent's mode: its parent's `state` lists it while the delegating turn
        runs; else its task (its chat's first row) names it."""
        if sub_chat in self.sub_modes:
            return self.sub_modes[sub_chat]
        with contextlib.suppress(Exception):
            parent = await self._look(parent_chat(sub_chat), timeout=10)
            for view in parent.get("subagents") or []:
                self.sub_modes[view["chat_id"]] = view["mode"]
        if sub_chat not in self.sub_modes:
            store = open_store(self.settings)
            with contextlib.suppress(Exception):
                await store.open()
                try:
                    rows = await store.transcript_rows(sub_chat)
                finally:
                    await store.close()
                task = TASK.match(rows[0].message.content or "") if rows else None
                if task:
                    self.sub_modes[sub_chat] = task.group(3)
        return self.sub_modes.get(sub_chat)

    # -- the probe: one more message to every chat, which must be answered ------------------------
    async def _probe_chats(self) -> None:
        """After settling: every chat gets one more message; its turn must close
        with an assistant row within probe_timeout_s."""
        self.probing = True
        acked_at: dict[str, float] = {}

        async def probe(chat: ChatLog) -> None:
            chat.probe_id = f"{chat.chat_id}-probe"
            chat.texts[chat.probe_id] = f"probe of {chat.chat_id}"
            if await self._send(chat, chat.probe_id, chat.texts[chat.probe_id], kind="probe"):
                acked_at[chat.chat_id] = time.monotonic()
            else:
                self.probe_failures[chat.chat_id] = "the probe message was not acknowledged"

        await asyncio.gather(*(probe(c) for c in self.chats.values()))
        waiting = dict(acked_at)
        answered: dict[str, float] = {}
        outcomes: dict[str, str] = {}
        store = open_store(self.settings)
        await store.open()
        try:
            await self._wait_for_probes(store, waiting, answered, outcomes)
        finally:
            await store.close()
        self.probe_summary.update(
            {
                "sent": len(self.chats),
                "answered": len(answered),
                "unanswered": len(self.probe_failures),
                "max_s": round(max(answered.values(), default=0.0), 2),
                **{f"closed {k}": v for k, v in sorted(_count(outcomes.values()).items())},
            }
        )

    async def _wait_for_probes(
        self,
        store: SessionStore,
        waiting: dict[str, float],
        answered: dict[str, float],
        outcomes: dict[str, str],
    ) -> None:
        while waiting:
            await asyncio.sleep(1.0)
            seen = await self._probe_answers(store, list(waiting))
            now = time.monotonic()
            for chat_id, (done, what) in seen.items():
                if done:
                    answered[chat_id] = now - waiting.pop(chat_id)
                    outcomes[chat_id] = what
                elif now - waiting[chat_id] > self.cfg.probe_timeout_s:
                    waiting.pop(chat_id)
                    with contextlib.suppress(Exception):
                        what += f"; state {await query_state(self.client, chat_id, timeout=10)}"
                    self.probe_failures[chat_id] = what

    async def _probe_answers(self, store: SessionStore, chat_ids: list[str]) -> dict[str, tuple[bool, str]]:
        """Per chat: (answered, what the store shows) for its probe message, read
        through the store's API (either backend)."""
        out: dict[str, tuple[bool, str]] = {}
        for chat_id in chat_ids:
            probe_id = self.chats[chat_id].probe_id
            try:
                rows = await store.transcript_rows(chat_id)
                probe = next((r for r in rows if r.message.role == "user" and r.message_id == probe_id), None)
                if probe is None:
                    out[chat_id] = (False, "not committed")
                    continue
                record = await store.get_turn(chat_id, probe.turn)
            except StoreError as err:
                out[chat_id] = (False, f"store not readable: {err}")
                continue
            final = any(
                r.turn == probe.turn
                and r.id > probe.id
                and r.message.role == "assistant"
                and r.message.content
                and not r.message.tool_calls
                for r in rows
            )
            status = (
                f"{record.status.value}/{record.reason.value if record.reason else None}" if record else "?/?"
            )
            what = f"turn {probe.turn} {status}"
            closed = record is not None and record.status.value in ("completed", "recovered")
            out[chat_id] = (closed and final, what if final else what + ", no assistant answer")
        return out


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        key = v.split(" ", 2)[-1]  # "turn N status/reason" -> "status/reason"
        out[key] = out.get(key, 0) + 1
    return out
