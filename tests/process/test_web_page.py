"""The chat page in a real browser (Debian's chromium, driven by playwright),
against `turnkeeper web`, the dev server and real workers. A screenshot of each
state goes to tests/artifacts/."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from tests.support import ROOT, Stack
from tests.web_support import serving

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
