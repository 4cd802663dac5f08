"""The Temporal UI of the embedded dev server, in a real browser (Debian's
chromium, driven by playwright), shows encrypted payloads decrypted through
`turnkeeper codec-server`: the endpoint the worker gave the UI, the codec
server's CORS for the UI's origin and its preflights, as the page uses them.
A screenshot goes to tests/artifacts/."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.async_api import async_playwright

from tests.support import ROOT, free_port
from tests.workflow.test_encryption import KEYS_1, CodecServer
from turnkeeper import client as tk
from turnkeeper.config import Settings
from turnkeeper.models import TurnStatus
from turnkeeper.worker.dev_server import ensure_dev_server, stop_dev_server
from turnkeeper.worker.main import run_worker

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

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason=f"{CHROMIUM} is not installed (apt-get install chromium; .ci/run does it)",
    ),
]


async def test_the_dev_servers_ui_shows_payloads_decrypted(tmp_path: Path) -> None:
    ui_port, codec_port = free_port(), free_port()
    env = {
        "TURNKEEPER_ENCRYPTION_KEYS": KEYS_1,
        "TURNKEEPER_DATA_DIR": str(tmp_path / "data"),
        "TURNKEEPER_WORKSPACE": str(tmp_path / "ws"),
        "TURNKEEPER_DEV_SERVER_PORT": str(free_port()),
        "TURNKEEPER_DEV_UI_PORT": str(ui_port),
        "TURNKEEPER_CODEC_ADDRESS": f"127.0.0.1:{codec_port}",
        "TURNKEEPER_TASK_QUEUE": f"tq-{uuid.uuid4().hex[:8]}",
        "TURNKEEPER_RECONCILE_EVERY": "3600",
    }
    answer = f"CANARY-ui-{uuid.uuid4().hex[:12]}"
    (tmp_path / "script.json").write_text(f'[{{"text": "{answer}"}}]')
    settings = Settings.from_env({**env, "TURNKEEPER_MODEL": f"scripted:{tmp_path / 'script.json'}"})
    codec = None
    try:
        await ensure_dev_server(settings)  # as `turnkeeper worker` starts it: with the UI's codec endpoint
        client = await tk.connect(settings)
        stop = asyncio.Event()
        worker = asyncio.create_task(run_worker(settings, client=client, stop=stop))
        try:
            chat = f"ui-{uuid.uuid4().hex[:8]}"
            handle = await tk.send_message(client, settings, chat, tk.new_message("hello", settings))
            assert (await handle.result()).status == TurnStatus.COMPLETED
        finally:
            stop.set()
            await asyncio.wait_for(worker, 30)
        # Without the codec server the page has only ciphertext to show.
        raw = await client.get_workflow_handle(handle.id).fetch_history()
        assert not any(answer.encode() in e.SerializeToString() for e in raw.events)

        codec = CodecServer(tmp_path, KEYS_1, port=codec_port, TURNKEEPER_DEV_UI_PORT=str(ui_port))
        codec.wait()
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page()
                asked: list[str] = []
                page.on(
                    "request",
                    lambda r: asked.append(f"{r.method} {r.url}") if r.url.startswith(codec.url) else None,
                )
                await page.goto(
                    f"http://127.0.0.1:{ui_port}/namespaces/default/workflows/{handle.id}/"
                    f"{handle.result_run_id}/history"
                )
                shown = page.get_by_text(answer).first
                await shown.wait_for(timeout=30_000)  # visible: the model's answer, decrypted
                await shown.scroll_into_view_if_needed()
                ARTIFACTS.mkdir(exist_ok=True)
                await page.screenshot(path=str(ARTIFACTS / "temporal-ui-decrypted.png"), full_page=True)
            finally:
                await browser.close()
        # The page asked the codec server itself (cross-origin: CORS and its preflight).
        assert any(
            a.startswith("POST ") and urlsplit(a.partition(" ")[2]).path == "/decode" for a in asked
        ), asked
    finally:
        if codec is not None:
            codec.stop()
        stop_dev_server(settings)
