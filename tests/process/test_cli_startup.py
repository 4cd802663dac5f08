"""The CLI's common commands import only what they use, so they start fast: no
model provider, no PostgreSQL driver, no tools, no worker; and each reads by its
one way only. `status` and `list`, which must answer within 0.4 s, read Temporal
over its HTTP API and never load the Temporal SDK (its import alone takes about
that long); `list` not even pydantic, asyncio or the store. `history` and
`events` read the store alone; `send` and the decisions use the SDK's client.
A test of the modules each command imports, run for real against a worker, not
of timings (docs/performance.md, "The CLI", has those)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from tests.support import Stack

# Run a command as the console script does, then list every module it imported.
_RUN = """
import json, os, sys
from turnkeeper import cli
code = cli.run(sys.argv[2:])
with open(sys.argv[1], "w") as out:
    json.dump(sorted(sys.modules), out)
os._exit(code)
"""

# Never needed by a command that is not `worker` or `web`. (`turnkeeper.recovery`,
# the recovery rules as plain functions, is: the CLI decides a failed turn by them.)
HEAVY = (
    "openai",
    "asyncpg",
    "httpx",
    "uvloop",
    "turnkeeper.activities.tools",
    "turnkeeper.activities.providers",
    "turnkeeper.activities.model_call",
    "turnkeeper.activities.tool_call",
    "turnkeeper.store.postgres",
    "temporalio.worker",
    "turnkeeper.workflows.chat_turn",
    "turnkeeper.workflows.reconcile",
    "turnkeeper.worker.main",
    "turnkeeper.web",
    "starlette",
    "uvicorn",
    "turnkeeper.payloads.codec_server",
    # Payload encryption: only when TURNKEEPER_ENCRYPTION_KEYS is set (it is not here).
    "cryptography",
)
SDK = ("temporalio", "google.protobuf")
HTTP = "turnkeeper.cli.temporal_http"
STORE = "turnkeeper.store"
# What each command must not load, and what shows the one way it reads by.
NOT_LOADED = {
    "status": (*SDK, STORE + ".postgres", "turnkeeper.payloads.encryption", "turnkeeper.telemetry.exporters"),
    "list": (
        *SDK,
        "pydantic",
        "asyncio",
        "turnkeeper.models",
        STORE,
        "turnkeeper.payloads",
        "turnkeeper.telemetry",
    ),
    "history": SDK,
    "events": SDK,
    "send": (),
    "continue": (),
    "dismiss": (),
    "stop": (),
}
WAY = {
    "status": HTTP,
    "list": HTTP,
    "history": STORE,
    "events": STORE,
    "send": "temporalio.client",
    "continue": "temporalio.client",
    "dismiss": "temporalio.client",
    "stop": "temporalio.client",
}


async def _imports(stack: Stack, *args: str) -> tuple[int, set[str], str]:
    out = stack.dir / f"modules-{args[0]}.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _RUN,
        str(out),
        *args,
        env=stack.env(),
        cwd=stack.dir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, set(json.loads(out.read_text())), err.decode()


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


async def test_common_commands_import_no_heavy_modules(stack: Stack) -> None:
    stack.script(
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}]},
            {"text": "wrote a.txt"},
            {"text": "again"},
        ]
    )
    await stack.start_worker()
    chat = stack.chat()
    await (await stack.send(chat, "please write a.txt")).result()

    # (command, its exit code): the refusals still run the command's imports up to
    # the refusal (nothing waits for a decision; no turn is running).
    unknown = stack.chat("never")
    commands = [
        (("status", chat), 0),
        (("status", chat, "--json"), 0),
        (("status", unknown), 1),
        (("history", chat), 0),
        (("history", chat, "--json"), 0),
        (("history", unknown), 1),
        (("events", chat), 0),
        (("events", chat, "--json", "--after", "1"), 0),
        (("events", unknown), 1),
        (("list",), 0),
        (("list", "--status", "completed", "--json"), 0),
        (("continue", chat), 1),
        (("dismiss", chat), 1),
        (("stop", chat), 1),
        (("send", chat, "once more"), 0),
        (("send", chat, "no wait", "--no-wait"), 0),
    ]
    for args, expected in commands:
        code, modules, err = await _imports(stack, *args)
        assert code == expected, f"turnkeeper {' '.join(args)} exited {code}: {err}"
        heavy = _loaded(modules, HEAVY)
        assert not heavy, f"turnkeeper {' '.join(args)} imported {heavy}"
        other_ways = _loaded(modules, NOT_LOADED[args[0]])
        assert not other_ways, f"turnkeeper {' '.join(args)} imported {other_ways}"
        assert WAY[args[0]] in modules  # the test sees what a command imports
