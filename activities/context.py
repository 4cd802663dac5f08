"""What a model call sees: at most TURNKEEPER_CONTEXT_TOKENS tokens.

The chat's latest turns go whole; what came before them is folded into a summary
the model itself makes (`ModelProvider.summarise`), kept in the store and reused
by every later call, so a call loads the summary and the rows after it: the same
cost at turn 2,000 as at turn 20. A tool call and its result are never split: a
fold ends only where no call before it has its result after it. The transcript
(`history`, the page, the API) is never shortened; only what the model is sent.

Counting is rough on purpose: a row costs its JSON's bytes / 4, plus a little for
its framing. Folding runs inside the model activity: a fold lost with its worker
is a lost model step like any other, and a summary already kept is not made again.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from turnkeeper.activities.providers import ModelProvider
from turnkeeper.activities.providers.base import SummaryRequest, ensure_tool_call_ids
from turnkeeper.config import Settings
from turnkeeper.models import ChatMessage, ModelReply, ToolCall, ToolSpec
from turnkeeper.store import ContextRows, SessionStore, StoredRow, Summary

BYTES_PER_TOKEN = 4
ROW_TOKENS = 4
"""Each message's framing (role, separators), as providers count it."""
SUMMARY_SHARE = 8
"""A summary may take 1/8 of the budget."""
SUMMARY_PROMPT_TOKENS = 120
"""A summary call's instruction."""
SUMMARY_HEADING = "Summary of the earlier conversation (its messages are not repeated here):\n"

Guard = Callable[[Awaitable[str]], Awaitable[str]]


def text_tokens(text: str) -> int:
    return -(-len(text.encode("utf-8", errors="replace")) // BYTES_PER_TOKEN)


def row_tokens(message: ChatMessage) -> int:
    return text_tokens(message.model_dump_json(exclude_none=True)) + ROW_TOKENS


def tools_tokens(tools: Sequence[ToolSpec]) -> int:
    """What the tools' schemas add to every call that offers them."""
    specs = [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools]
    return text_tokens(json.dumps(specs)) if specs else 0


def context_budget(settings: Settings, provider: ModelProvider) -> int:
    """TURNKEEPER_CONTEXT_TOKENS, or the model's window less its answer's room."""
    return settings.context_tokens or max(1, provider.context_window - provider.answer_tokens)


@dataclass(frozen=True)
class Budget:
    total: int

    @property
    def summary_tokens(self) -> int:
        return max(16, self.total // SUMMARY_SHARE)

    def keep(self, tools: int) -> int:
        """What a fold leaves whole: half of what the summary and the tools leave, so
        the next fold comes only after as much again."""
        return max(0, (self.total - tools - self.summary_tokens) // 2)

    @property
    def fold_chunk(self) -> int:
        """Rows one summary call takes: its request stays within the budget too."""
        return max(ROW_TOKENS, self.total - self.summary_tokens - SUMMARY_PROMPT_TOKENS)


def cuts(rows: Sequence[StoredRow]) -> list[bool]:
    """`cuts[i]`: rows[:i] may be folded and rows[i:] kept (len(rows) + 1 entries):
    no tool call before i has its result at or after i."""
    allowed = [True] * (len(rows) + 1)
    asked_at = {c.id: i for i, r in enumerate(rows) for c in r.message.tool_calls or []}
    for j, row in enumerate(rows):
        a = asked_at.get(row.message.tool_call_id or "") if row.message.role == "tool" else None
        if a is not None:
            for i in range(a + 1, j + 1):
                allowed[i] = False
    return allowed


def fold_point(rows: Sequence[StoredRow], keep: int) -> int:
    """How many of `rows` (oldest first) to fold so that the rest fit in `keep`:
    whole turns where they fit, else whole pairs of the latest turn; when not even
    the last of those fits, all but it. 0: nothing can be folded."""
    allowed = cuts(rows)
    after = [0] * (len(rows) + 1)  # tokens of rows[i:]
    for i in range(len(rows) - 1, -1, -1):
        after[i] = after[i + 1] + row_tokens(rows[i].message)
    fitting = [i for i in range(1, len(rows)) if allowed[i] and after[i] <= keep]
    turn_starts = [i for i in fitting if rows[i].turn != rows[i - 1].turn]
    if turn_starts:
        return turn_starts[0]
    if fitting:
        return fitting[0]
    return max((i for i in range(1, len(rows)) if allowed[i]), default=0)


def fold_chunks(rows: Sequence[StoredRow], limit: int) -> list[list[StoredRow]]:
    """`rows` in runs of at most `limit` tokens for one summary call each, cut where
    a fold may end (a pair larger than `limit` is a run of its own)."""
    allowed = cuts(rows)
    out: list[list[StoredRow]] = []
    start = 0
    while start < len(rows):
        size, end = 0, 0
        for i in range(start, len(rows)):
            size += row_tokens(rows[i].message)
            if size > limit and end:
                break
            if allowed[i + 1]:
                end = i + 1
        out.append(list(rows[start:end]))
        start = end
    return out


def summary_message(summary: Summary) -> ChatMessage:
    return ChatMessage(role="system", content=SUMMARY_HEADING + summary.text)


def compose(summary: Summary | None, rows: Sequence[StoredRow]) -> list[ChatMessage]:
    """The messages a model call is sent: the summary first, then the rows whole."""
    asked = {c.id for r in rows for c in r.message.tool_calls or []}
    out = [summary_message(summary)] if summary else []
    # A result whose call went into the summary is never kept apart from it (see
    # `cuts`); should one be, it is left out rather than sent without its call.
    out.extend(r.message for r in rows if r.message.role != "tool" or r.message.tool_call_id in asked)
    return out


def cap_text(text: str, tokens: int) -> str:
    data = text.encode("utf-8", errors="replace")
    limit = tokens * BYTES_PER_TOKEN
    return text if len(data) <= limit else data[: limit - 3].decode("utf-8", errors="ignore") + "..."


@dataclass(frozen=True)
class Context:
    messages: list[ChatMessage]
    tokens: int
    """As counted here, the tools' schemas included."""
    call_index: int
    """Assistant rows of the whole chat before this call (summarised ones included)."""
    summary: Summary | None
    rows: int
    """Transcript rows sent whole."""
    summaries_made: int
    """Summary calls this build made (0 when the stored one was enough)."""
    preamble: int = 0
    """System rows sent before the summary and the rows (a subagent's instructions)."""


async def _as_is(call: Awaitable[str]) -> str:
    return await call


class ContextBuilder:
    """Builds each model call's context from the store, folding as it must."""

    def __init__(
        self, store: SessionStore, provider: ModelProvider, budget_tokens: int, guard: Guard | None = None
    ) -> None:
        self._store = store
        self._provider = provider
        self.budget = Budget(budget_tokens)
        self._guard = guard or _as_is  # the model activity's: a summary call gives way to a shutdown

    async def build(
        self,
        chat_id: str,
        tools: Sequence[ToolSpec],
        loaded: ContextRows | None = None,
        instructions: str | None = None,
    ) -> Context:
        """`loaded`: the rows already read (`SessionStore.prepare_model_call`).
        `instructions`: a system row sent first (a subagent profile's), counted as the tools are."""
        if loaded is None:
            loaded = await self._store.context_rows(chat_id)
        summary, rows = loaded.summary, list(loaded.rows)
        sizes = [row_tokens(r.message) for r in rows]
        preamble = [ChatMessage(role="system", content=instructions)] if instructions else []
        # Sent with every call, like the tools' schemas: a fixed cost the fold leaves room for.
        tools_cost = tools_tokens(tools) + sum(row_tokens(m) for m in preamble)
        made = 0
        while self._size(summary, sizes, tools_cost) > self.budget.total:
            cut = fold_point(rows, self.budget.keep(tools_cost))
            if cut == 0:
                break  # one pair (or row) larger than the budget: it goes as it is
            summary, calls = await self._fold(chat_id, summary, rows[:cut])
            made += calls
            rows, sizes = rows[cut:], sizes[cut:]
        assistant = (summary.assistant_rows if summary else 0) + sum(
            r.message.role == "assistant" for r in rows
        )
        return Context(
            messages=[*preamble, *compose(summary, rows)],
            tokens=self._size(summary, sizes, tools_cost),
            call_index=assistant,
            summary=summary,
            rows=len(rows),
            summaries_made=made,
            preamble=len(preamble),
        )

    async def unique_call_ids(self, chat_id: str, reply: ModelReply, context: Context) -> ModelReply:
        """Tool call ids are the store's keys. A provider makes them unique against what
        it was sent; one that a folded row used (a server that reuses ids) is replaced too."""
        if not reply.tool_calls:
            return reply
        if context.summary is None and len(context.messages) == context.preamble + context.rows:
            # The call was sent every row of the chat: checked here, without a read.
            calls = ensure_tool_call_ids(reply.tool_calls, context.messages, call_index=context.call_index)
            return reply if calls == reply.tool_calls else reply.model_copy(update={"tool_calls": calls})
        used = await self._store.answered_call_ids(chat_id, [c.id for c in reply.tool_calls if c.id])
        if not used and all(c.id for c in reply.tool_calls):
            return reply
        folded = ChatMessage(role="assistant", tool_calls=[ToolCall(id=i, name="") for i in used])
        calls = ensure_tool_call_ids(
            reply.tool_calls, [folded, *context.messages], call_index=context.call_index
        )
        return reply.model_copy(update={"tool_calls": calls})

    @staticmethod
    def _size(summary: Summary | None, sizes: list[int], tools: int) -> int:
        return (
            tools
            + sum(sizes)
            + (summary.tokens + ROW_TOKENS + text_tokens(SUMMARY_HEADING) if summary else 0)
        )

    async def _fold(
        self, chat_id: str, summary: Summary | None, rows: list[StoredRow]
    ) -> tuple[Summary, int]:
        """Fold `rows` (which follow `summary`) into a new summary, kept as each part is made."""
        calls = 0
        cap = self.budget.summary_tokens
        for chunk in fold_chunks(rows, self.budget.fold_chunk):
            text = await self._guard(
                self._provider.summarise(
                    SummaryRequest(
                        earlier=summary.text if summary else None,
                        rows=[r.message for r in chunk],
                        max_tokens=cap,
                    )
                )
            )
            calls += 1
            text = cap_text(text, cap)
            summary = await self._store.add_summary(
                chat_id,
                Summary(
                    upto_id=chunk[-1].id,
                    text=text,
                    tokens=text_tokens(text),
                    assistant_rows=(summary.assistant_rows if summary else 0)
                    + sum(r.message.role == "assistant" for r in chunk),
                ),
            )
        assert summary is not None  # rows is never empty here
        return summary, calls
