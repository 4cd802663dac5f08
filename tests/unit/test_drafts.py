"""The draft writer: a write under way when the reply comes is let finish, and a
cancelled activity stays cancelled (activities/drafts.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from turnkeeper.activities.drafts import FIRST_FLUSH_S, DraftWriter


class SlowDraftStore:
    """`write_draft` that waits for `finish`; records what happened to each write."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finish = asyncio.Event()
        self.writes: list[str] = []
        self.outcomes: list[str] = []

    async def write_draft(
        self, chat_id: str, turn: int, step: int, text: str, attempt: int | None = None
    ) -> int:
        self.writes.append(text)
        self.started.set()
        try:
            await self.finish.wait()
        except asyncio.CancelledError:
            self.outcomes.append("cancelled")
            raise
        self.outcomes.append("written")
        return 1


def writer(store: Any) -> DraftWriter:
    return DraftWriter(store, "chat", 1, 0)


async def test_closing_lets_a_write_under_way_finish_instead_of_cancelling_it() -> None:
    store = SlowDraftStore()
    draft = writer(store)
    await draft.__aenter__()
    draft("hello")
    await asyncio.wait_for(store.started.wait(), 5)
    closing = asyncio.create_task(draft.__aexit__(None, None, None))
    await asyncio.sleep(0.05)
    assert not closing.done()  # the reply is recorded after the draft write, never beside it
    store.finish.set()
    await asyncio.wait_for(closing, 5)
    assert store.outcomes == ["written"] and store.writes == ["hello"]


async def test_an_activity_cancelled_while_the_writer_closes_stays_cancelled() -> None:
    store = SlowDraftStore()
    recorded: list[str] = []

    async def model_call() -> None:
        async with writer(store) as draft:
            draft("hello")
            await store.started.wait()
        recorded.append("reply")  # what runs after the writer closes: must not when cancelled

    call = asyncio.create_task(model_call())
    await asyncio.wait_for(store.started.wait(), 5)
    await asyncio.sleep(0.01)  # the call now waits for the draft write, closing the writer
    call.cancel()  # Stop, Dismiss or the end of a shutdown's grace
    await asyncio.sleep(0.05)
    store.finish.set()
    await asyncio.gather(call, return_exceptions=True)
    assert call.cancelled()
    assert recorded == []
    await asyncio.sleep(0)
    assert store.outcomes == ["written"]  # the write itself was not cut off half way


async def test_closing_an_idle_writer_ends_it_at_once() -> None:
    store = SlowDraftStore()
    store.finish.set()
    async with writer(store) as draft:
        draft("a")
        await asyncio.wait_for(store.started.wait(), 5)
        await asyncio.sleep(0.01)  # written; now the writer sleeps or waits for more text
    assert store.outcomes == ["written"]

    async with writer(SlowDraftStore()):
        pass  # no text at all: nothing written, nothing left running


async def test_a_reply_whose_whole_text_comes_at_once_writes_no_draft() -> None:
    """The record that follows would only remove it again."""
    store = SlowDraftStore()
    store.finish.set()
    async with writer(store) as draft:
        draft("the whole answer")
        await asyncio.sleep(0)  # the writer has seen the text
    await asyncio.sleep(FIRST_FLUSH_S * 3)
    assert store.writes == []


async def test_the_first_piece_of_a_streaming_reply_is_written_within_the_first_flush() -> None:
    store = SlowDraftStore()
    store.finish.set()
    async with writer(store) as draft:
        draft("the first words")
        await asyncio.wait_for(store.started.wait(), FIRST_FLUSH_S + 1.0)
        draft(" and more")
    assert store.writes[0] == "the first words"
