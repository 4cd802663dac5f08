"""The chat page in a real browser (Debian's chromium, driven by playwright),
against `turnkeeper web`, the dev server and real workers; a turn's subagents
against answers of the API made up here. A screenshot of each state goes to
tests/artifacts/."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from playwright.async_api import Browser, Page, Route, async_playwright, expect

from tests.support import ROOT, Stack
from tests.web_support import serving
from turnkeeper import recovery
from turnkeeper.config import Settings
from turnkeeper.models import Reason, SubagentView, TurnState, TurnStatus

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = ROOT / "tests" / "artifacts"
INJECTED = '<img src=x onerror="window.__injected = 1"><script>window.__injected = 2</script>'

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason=f"{CHROMIUM} is not installed (apt-get install chromium; .ci/run does it)",
    ),
]


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


async def snap(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


async def _ledger_says(path: Path, word: str, timeout: float = 30.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if path.exists() and word in path.read_text():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never got {word!r}")


async def test_send_see_the_answer_and_markup_stays_text(stack: Stack, browser: Browser) -> None:
    stack.script([{"text": f"model says {INJECTED} done"}, {"text": "second answer"}])
    await stack.start_worker()
    chat = stack.chat("page")
    with serving(stack.settings()) as web:
        page = await browser.new_page()
        await page.goto(f"{web.url}/chats/{chat}")
        box = page.get_by_role("textbox", name="Message")
        await box.fill(f"user says {INJECTED}")
        await box.press("Enter")
        thread = page.locator("#thread")
        await expect(thread).to_contain_text(f"model says {INJECTED} done")
        await expect(thread).to_contain_text(f"user says {INJECTED}")
        await expect(page.get_by_role("status")).to_contain_text("completed")
        assert await page.evaluate("window.__injected") is None
        assert await thread.locator("img, script, b").count() == 0
        await expect(thread.locator("li.pending")).to_have_count(0)  # the committed row replaced it
        await expect(page.get_by_role("navigation", name="Chats")).to_contain_text(chat)
        await snap(page, "page-answer")

        # Too large: refused, and the page says so.
        await box.fill("x" * (64 * 1024 + 1))
        await page.get_by_role("button", name="Send").click()
        await expect(page.get_by_role("alert")).to_contain_text("Not sent: message is 65537 bytes")

        # A double click sends one message.
        await box.fill("once only")
        await page.get_by_role("button", name="Send").dblclick()
        await expect(thread).to_contain_text("second answer")
        await expect(thread.locator("li.user")).to_have_count(2)
        await stack.wait_turn_done(chat, 2)
        users = [m["content"] for m in await stack.history(chat) if m["role"] == "user"]
        assert users == [f"user says {INJECTED}", "once only"]
        assert await page.evaluate("window.__injected") is None
        await snap(page, "page-second-answer")
        await page.close()


@pytest.mark.crash
async def test_continue_after_a_killed_worker_and_a_stale_tab(stack: Stack, browser: Browser) -> None:
    ledger = stack.dir / "ledger.txt"
    stack.env_extra.update(
        {
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
            "TURNKEEPER_TOOLS": "slow_write",
            "TK_LEDGER": str(ledger),
        }
    )
    stack.script(
        [
            {
                "tool_calls": [
                    {"name": "slow_write", "arguments": {"path": "k.txt", "content": "x", "seconds": 8}}
                ]
            },
            {"text": "I could not confirm the write; please check k.txt"},
        ]
    )
    first = stack.spawn_worker()
    second_worker = stack.spawn_worker()  # the one left when the first is killed
    await stack.wait_serving(first, second_worker)
    chat = stack.chat("crash")
    with serving(stack.settings()) as web:
        page = await browser.new_page()
        await page.goto(f"{web.url}/chats/{chat}")
        await page.get_by_role("textbox", name="Message").fill("write k.txt slowly")
        await page.get_by_role("button", name="Send").click()
        await _ledger_says(ledger, "start")
        working = page.locator("[aria-live]")
        await expect(working).to_contain_text("slow_write: running")
        await expect(page.get_by_role("button", name="Stop")).to_be_visible()
        await snap(page, "page-working")
        # Kill whichever worker runs the tool: both, then start a fresh one.
        stack.kill(first)
        stack.kill(second_worker)
        stack.spawn_worker()

        status = page.get_by_role("status")
        await expect(status).to_contain_text("awaiting_user (tool_state_unknown)", timeout=45_000)
        await expect(page.locator("#notice")).to_contain_text("may or may not have done its work")
        continue_button = page.get_by_role("button", name="Continue")
        await expect(continue_button).to_be_visible()
        await expect(page.get_by_role("button", name="Dismiss")).to_be_visible()
        await expect(page.get_by_role("button", name="Stop")).to_be_hidden()
        await snap(page, "page-waiting")

        # A second tab that hears nothing more (its event stream cut) keeps the old gate.
        other = await browser.new_page()
        await other.route(re.compile(r".*/events(\?.*)?$"), lambda route: route.abort())
        await other.goto(f"{web.url}/chats/{chat}")
        await expect(other.get_by_role("button", name="Continue")).to_be_visible()

        await continue_button.click()
        await expect(page.locator("#thread")).to_contain_text("I could not confirm the write", timeout=30_000)
        await expect(status).to_contain_text("recovered (continued)")
        await snap(page, "page-continued")
        assert ledger.read_text().count("start") == 1 and "done" not in ledger.read_text()

        await other.get_by_role("button", name="Continue").click()
        refusal = other.get_by_role("alert")
        await expect(refusal).to_contain_text("Continue was refused: not waiting for confirmation")
        await expect(other.get_by_role("status")).to_contain_text("recovered (continued)")
        await snap(other, "page-stale-tab-refused")
        assert ledger.read_text().count("start") == 1
        await other.close()
        await page.close()


async def test_a_tool_that_asks_first_is_approved_or_denied(stack: Stack, browser: Browser) -> None:
    stack.env_extra["TURNKEEPER_CONFIRM_TOOLS"] = "write_file"
    ask = {"tool_calls": [{"name": "write_file", "arguments": {"path": "p.txt", "content": "yes"}}]}
    stack.script([ask, {"text": "written"}, ask])
    await stack.start_worker()
    chat = stack.chat("approve")
    with serving(stack.settings()) as web:
        page = await browser.new_page()
        await page.goto(f"{web.url}/chats/{chat}")
        box = page.get_by_role("textbox", name="Message")
        await box.fill("write p.txt")
        await box.press("Enter")
        status = page.get_by_role("status")
        await expect(status).to_contain_text("awaiting_user (approval_required)")
        await expect(page.get_by_role("list", name="Waiting for your approval")).to_contain_text(
            'write_file({"path": "p.txt", "content": "yes"})'
        )
        await expect(page.get_by_role("button", name="Continue")).to_be_hidden()
        await snap(page, "page-approval")
        await page.get_by_role("button", name="Approve").click()
        await expect(page.locator("#thread")).to_contain_text("written")
        await expect(status).to_contain_text("completed")
        assert (stack.ws / "p.txt").read_text() == "yes"

        (stack.ws / "p.txt").unlink()
        await box.fill("write p.txt again")
        await box.press("Enter")
        await expect(status).to_contain_text("awaiting_user (approval_required)")
        await page.get_by_role("button", name="Deny").click()
        await expect(status).to_contain_text("recovered (dismissed)")
        await expect(page.locator("#thread")).to_contain_text("denied by the user")
        await expect(page.get_by_role("button", name="Dismiss")).to_be_hidden()
        assert not (stack.ws / "p.txt").exists()
        await snap(page, "page-denied")
        await page.close()


async def test_stop_while_a_tool_runs(stack: Stack, browser: Browser) -> None:
    stack.env_extra.update(
        {
            "TURNKEEPER_TOOL_MODULES": "tests.ledger_tools",
            "TURNKEEPER_TOOLS": "slow_write",
            "TK_LEDGER": str(stack.dir / "ledger.txt"),
        }
    )
    stack.script(
        [
            {
                "tool_calls": [
                    {"name": "slow_write", "arguments": {"path": "s.txt", "content": "x", "seconds": 30}}
                ]
            }
        ]
    )
    await stack.start_worker()
    chat = stack.chat("stop")
    with serving(stack.settings()) as web:
        page = await browser.new_page()
        await page.goto(f"{web.url}/chats/{chat}")
        await page.get_by_role("textbox", name="Message").fill("write slowly")
        await page.get_by_role("button", name="Send").click()
        await expect(page.locator("[aria-live]")).to_contain_text("slow_write: running")
        await page.get_by_role("button", name="Stop").click()
        await expect(page.get_by_role("status")).to_contain_text("recovered (stopped)")
        await expect(page.locator("[aria-live]")).to_be_hidden()
        await expect(page.get_by_role("button", name="Stop")).to_be_hidden()
        await snap(page, "page-stopped")
        await page.close()


async def test_login_when_a_token_is_set(stack: Stack, browser: Browser) -> None:
    with serving(stack.settings(), token="page-secret") as web:
        context = await browser.new_context()
        page = await context.new_page()
        assert (await page.request.get(f"{web.url}/api/chats")).status == 401
        await page.goto(f"{web.url}/")
        token = page.get_by_label("Token")
        await expect(token).to_be_visible()
        await expect(page.get_by_role("navigation", name="Chats")).to_be_hidden()
        await snap(page, "page-login")

        await token.fill("wrong")
        await page.get_by_role("button", name="Log in").click()
        await expect(page.get_by_role("alert")).to_contain_text("Wrong token")
        await token.fill("page-secret")
        await page.get_by_role("button", name="Log in").click()
        await expect(page.get_by_role("navigation", name="Chats")).to_be_visible()
        assert (await page.request.get(f"{web.url}/api/chats")).status == 200
        assert "turnkeeper_session" not in await page.evaluate("document.cookie")  # HttpOnly
        await snap(page, "page-logged-in")
        await context.close()


async def test_the_answer_streams_in(stack: Stack, browser: Browser) -> None:
    """The working row shows the answer as the model streams it (as text, markup
    included), and the recorded answer takes its place in the thread."""
    from turnkeeper.testing import FakeChatServer

    words = f"first second third {INJECTED} fourth fifth sixth seventh"
    with FakeChatServer([{"text": words, "chunk_delay": 0.25}]) as server:
        stack.env_extra.update(
            {
                "TURNKEEPER_MODEL": "openai:fake",
                "OPENAI_BASE_URL": server.base_url,
                "OPENAI_API_KEY": "test-key",
            }
        )
        await stack.start_worker()
        chat = stack.chat("streaming")
        with serving(stack.settings()) as web:
            page = await browser.new_page()
            await page.goto(f"{web.url}/chats/{chat}")
            box = page.get_by_role("textbox", name="Message")
            await box.fill("stream please")
            await box.press("Enter")
            answer = page.locator("#working #answer")
            await expect(answer).to_contain_text("first second")
            partial = await answer.text_content()
            assert partial and "seventh" not in partial  # seen while it grows
            await expect(page.locator("#working")).to_have_attribute("aria-live", "polite")
            await snap(page, "page-streaming")
            thread = page.locator("#thread")
            await expect(thread).to_contain_text(words)
            await expect(page.locator("#working")).to_be_hidden()
            assert await page.evaluate("window.__injected") is None
            await snap(page, "page-streamed")
            await page.close()


async def test_a_turns_subagents_and_a_subagents_gate(browser: Browser, tmp_path: Path) -> None:
    """The page lists the turn's subagents from its state, opens a sub-chat as the
    chat it is, and shows a waiting subagent's gate as the parent's own, whose
    Continue goes to the parent chat with the gate's recovery id (the workflow
    hands it on). The API's answers are made up here: no workflow needed."""
    parent, sub, other = "sa", "sa.sub1-0123456789ab", "sa.sub1-89abcdef0123"
    task = f"write k.txt slowly {INJECTED}"

    def view(chat_id: str, **fields: Any) -> SubagentView:
        return SubagentView(chat_id=chat_id, workflow_id=f"chat-{chat_id}", tool_call_id="c", **fields)

    def parent_state(status: TurnStatus, reason: Reason | None, recovery_id: str | None) -> dict[str, Any]:
        waiting = view(sub, task=task, mode="wait", status=status, reason=reason, recovery_id=recovery_id)
        running = TurnState(
            chat_id=parent,
            turn=1,
            subagents=[waiting, view(other, task="list the workspace", mode="background")],
        )
        return recovery.shown(running).model_dump(mode="json")

    states = {
        parent: parent_state(TurnStatus.AWAITING_USER, Reason.TOOL_STATE_UNKNOWN, "rec-sub"),
        sub: TurnState(
            chat_id=sub,
            turn=1,
            status=TurnStatus.AWAITING_USER,
            reason=Reason.TOOL_STATE_UNKNOWN,
            recovery_id="rec-sub",
        ).model_dump(mode="json"),
    }
    rows = {sub: [{"role": "user", "content": task}]}
    posted: list[tuple[str, Any]] = []

    async def api(route: Route) -> None:
        request = route.request
        path = unquote(urlsplit(request.url).path)
        chat = path.removeprefix("/api/chats/").removesuffix("/messages").removesuffix("/events")
        if request.method == "POST":
            posted.append((path, request.post_data_json))
            states[parent] = parent_state(TurnStatus.RESUMING, None, "rec-sub")
            await route.fulfill(json=states[parent])
        elif path.endswith("/events"):
            await route.fulfill(status=204)  # no stream: an EventSource does not try again
        elif path.endswith("/messages"):
            await route.fulfill(json=rows.get(chat, []), headers={"X-Event-Seq": "0"})
        elif path == "/api/chats":
            await route.fulfill(json=[])
        else:
            await route.fulfill(json=states[chat])

    settings = Settings.from_env({"TURNKEEPER_DATA_DIR": str(tmp_path), "TEMPORAL_ADDRESS": "127.0.0.1:9"})
    with serving(settings) as web:
        page = await browser.new_page()
        await page.route(re.compile(r".*/api/.*"), api)
        await page.goto(f"{web.url}/chats/{parent}")
        await expect(page.get_by_role("status")).to_contain_text("awaiting_user (subagent_waiting)")
        notice = page.locator("#notice")
        await expect(notice).to_contain_text("A subagent this turn waits for needs you.")
        await expect(notice).to_contain_text("may or may not have done its work")
        await expect(notice).to_contain_text(f"Why: subagent {sub} waits for the user: tool_state_unknown")
        await expect(notice.get_by_role("link", name=f"Open the subagent's chat ({sub})")).to_be_visible()
        listed = page.get_by_role("list", name="Subagents")
        await expect(listed.get_by_role("listitem")).to_have_count(2)
        first, second = listed.get_by_role("listitem").nth(0), listed.get_by_role("listitem").nth(1)
        await expect(first).to_contain_text("awaiting_user (tool_state_unknown)")
        await expect(first).to_contain_text("waited for")
        await expect(first).to_contain_text(task)
        await expect(second).to_contain_text("running")
        await expect(second).to_contain_text("in the background")
        assert await listed.locator("img, script").count() == 0
        assert await page.evaluate("window.__injected") is None
        await expect(page.get_by_role("button", name="Dismiss")).to_be_visible()
        await snap(page, "page-subagent-gate")

        await page.get_by_role("button", name="Continue").click()
        await expect(first).to_contain_text("resuming")
        assert posted == [(f"/api/chats/{parent}/continue", {"recovery_id": "rec-sub"})]
        await expect(notice).to_be_hidden()
        await expect(page.get_by_role("status")).to_contain_text("Turn 1: running")
        # Its next gate opens in its own chat's log: the page reads the waiting turn's state again.
        states[parent] = parent_state(TurnStatus.AWAITING_USER, Reason.LOOP_GUARD, "rec-sub")
        await expect(notice).to_contain_text("The step that was continued was interrupted again.")

        await listed.get_by_role("link", name=sub).click()
        await page.wait_for_url(f"{web.url}/chats/{sub}")
        await expect(page.locator("#chat-title")).to_have_text(sub)
        await expect(page.locator("#thread")).to_contain_text(task)
        await expect(page.get_by_role("status")).to_contain_text("awaiting_user (tool_state_unknown)")
        await expect(page.locator("#subagents")).to_be_hidden()
        await snap(page, "page-sub-chat")
        await page.close()
