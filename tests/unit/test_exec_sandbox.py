"""`exec` in its sandbox (activities/tools/sandbox.py): the workspace is all of the
host's files a command can write, and all it can read besides the system's programs
and libraries; what it starts dies with it; `TURNKEEPER_EXEC_SANDBOX=off` runs it
as before; without a working bwrap, exec and the worker refuse."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnkeeper.activities.tools import (
    ToolContext,
    ToolOutcome,
    default_registry,
    sandbox,
)
from turnkeeper.config import ConfigError, Settings
from turnkeeper.worker.main import check_tools

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the sandbox is bubblewrap's, Linux only"
)

CAP = 16 * 1024
# A python3 the sandbox can run: under /usr, which it binds (the worker's own may live elsewhere).
SYSTEM_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin")


# --- the host's view of processes (a sandboxed command's own pids are its namespace's) ---------

_serial = itertools.count(1)


def sleep_marker(seconds: int) -> str:
    """A `sleep` argument of about `seconds` that no other process on the host has."""
    return f"{seconds}.{os.getpid()}{next(_serial):04d}1"


def host_sleeps(marker: str) -> list[int]:
    """Host pids of live processes running `sleep <marker>`, wherever they were started."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[:-1]
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # exited meanwhile
        if (
            len(argv) == 2
            and os.path.basename(argv[0]) == b"sleep"
            and argv[1] == marker.encode()
            and state not in ("Z", "X")
        ):
            found.append(int(entry))
    return found


class SeenSleeping:
    """Polls the host's process list while a call runs: which markers' sleeps ran."""

    def __init__(self, *markers: str) -> None:
        self.markers = markers
        self.seen: set[str] = set()

    async def _poll(self) -> None:
        while True:
            self.seen |= {m for m in self.markers if host_sleeps(m)}
            await asyncio.sleep(0.02)

    async def __aenter__(self) -> SeenSleeping:
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


# --- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture
def sandboxed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "MODE", "auto")


@pytest.fixture
def unsandboxed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "MODE", "off")


@pytest.fixture
def no_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    missing = tmp_path / "no-such-dir" / "bwrap"
    monkeypatch.setattr(sandbox, "BWRAP", str(missing))
    # check_tools sets the mode: put it back afterwards.
    monkeypatch.setattr(sandbox, "MODE", "auto")
    yield missing


async def run_exec(ws: Path, command: str, exec_timeout: float = 10) -> ToolOutcome:
    ctx = ToolContext.for_call(
        workspace=ws, chat_id="chat-1", turn=1, tool_call_id="call_1", exec_timeout=exec_timeout
    )
    return await default_registry().run(
        "exec", json.dumps({"command": command}), ctx, enabled=["exec"], max_output_bytes=CAP
    )


# --- confinement ------------------------------------------------------------------------------------


async def test_exec_cannot_read_a_file_outside_the_workspace(
    workspace: Path, outside: Path, sandboxed: None
) -> None:
    out = await run_exec(workspace, f"pwd; cat ../outside/secret.txt; cat {outside}/secret.txt; ls {outside}")
    assert out.status == "done"
    assert out.content.startswith(f"exit code 2\n{workspace}\n")  # ran, in the workspace (ls failed last)
    assert "top secret" not in out.content and "secret.txt\n" not in out.content
    assert out.content.count("No such file or directory") == 3


async def test_exec_cannot_write_outside_the_workspace(
    workspace: Path, tmp_path: Path, outside: Path, sandboxed: None
) -> None:
    host_tmp = Path("/tmp") / f"tk-exec-sandbox-{uuid.uuid4().hex}"
    targets = [host_tmp, tmp_path / "escaped.txt", outside / "new.txt"]
    try:
        out = await run_exec(
            workspace, "; ".join(f"echo x > {t}" for t in targets) + "; echo y > /usr/tk-escaped"
        )
        assert out.status == "done"
        for target in targets:
            assert not target.exists(), target
        assert not Path("/usr/tk-escaped").exists()
        assert "Read-only file system" in out.content  # /usr
    finally:
        for target in (*targets, Path("/usr/tk-escaped")):
            target.unlink(missing_ok=True)


async def test_exec_cannot_read_through_a_symlink_pointing_out(
    workspace: Path, outside: Path, sandboxed: None
) -> None:
    (workspace / "link").symlink_to(outside / "secret.txt")
    (workspace / "linkdir").symlink_to(outside)
    out = await run_exec(workspace, "cat link; cat linkdir/secret.txt; ls linkdir/")
    assert out.status == "done" and out.content.startswith("exit code ")
    assert "top secret" not in out.content and "secret.txt\n" not in out.content


async def test_exec_proc_root_does_not_reach_the_host(
    workspace: Path, outside: Path, sandboxed: None
) -> None:
    command = "; ".join(f"cat /proc/{who}/root{outside}/secret.txt" for who in ("self", "1", "$$", "$PPID"))
    out = await run_exec(workspace, command + "; ls /proc/1/root/")
    assert out.status == "done"
    assert "top secret" not in out.content
    # What /proc/1/root shows is the sandbox's own root, not the host's.
    listed = set(out.content.split("\n"))
    assert "usr" in listed and "proc" in listed
    assert not {"root", "home", "var", "srv"} & listed


async def test_exec_has_no_network(workspace: Path, sandboxed: None) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        # Interfaces of the command's network namespace: loopback only.
        out = await run_exec(workspace, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert out == ToolOutcome(status="done", content="exit code 0\nlo\n")
        if SYSTEM_PYTHON:
            # The host's loopback is not the command's: a port listening there is not reachable.
            probe = (
                f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "    print('connected')\nexcept OSError as e:\n    print('refused', e.errno)\n"
            )
            out = await run_exec(workspace, f'python3 -c "{probe}"')
            assert out.status == "done" and "refused" in out.content and "connected" not in out.content
    finally:
        listener.close()


async def test_a_background_child_does_not_outlive_the_command(workspace: Path, sandboxed: None) -> None:
    plain, nohup, daemon = sleep_marker(30), sleep_marker(30), sleep_marker(30)
    command = (
        f"sleep {plain} >/dev/null 2>&1 & "
        f"nohup sleep {nohup} >/dev/null 2>&1 & "
        f"setsid sh -c 'sleep {daemon}' </dev/null >/dev/null 2>&1 & "
        "sleep 0.3; echo done"
    )
    async with SeenSleeping(plain, nohup, daemon) as watch:
        out = await run_exec(workspace, command)
    assert out == ToolOutcome(status="done", content="exit code 0\ndone\n")
    assert watch.seen == {plain, nohup, daemon}  # they ran, on the host's process list too
    for marker in (plain, nohup, daemon):
        assert host_sleeps(marker) == [], marker


async def test_a_timeout_kills_the_sandboxed_command(workspace: Path, sandboxed: None) -> None:
    fg, bg = sleep_marker(30), sleep_marker(30)
    async with SeenSleeping(fg, bg) as watch:
        out = await run_exec(workspace, f"sleep {bg} & echo started; sleep {fg}", exec_timeout=1)
    assert out.status == "error" and "timed out after 1s" in out.content and out.content.endswith("started\n")
    assert watch.seen == {fg, bg}
    await asyncio.sleep(0.2)
    assert host_sleeps(fg) == [] and host_sleeps(bg) == []


# --- ordinary commands ------------------------------------------------------------------------------


async def test_ordinary_commands_work_in_the_sandbox(workspace: Path, sandboxed: None) -> None:
    (workspace / "here.txt").write_text("x")
    out = await run_exec(
        workspace,
        "echo hello; ls; echo made > made.txt; mkdir -p sub/dir && echo deep > sub/dir/f; "
        "echo scratch > /tmp/scratch && cat /tmp/scratch; date +%Y >/dev/null && id -u",
    )
    assert out == ToolOutcome(
        status="done", content=f"exit code 0\nhello\nhere.txt\nscratch\n{os.getuid()}\n"
    )
    assert (workspace / "made.txt").read_text() == "made\n"  # the host sees what it wrote in the workspace
    assert (workspace / "sub" / "dir" / "f").read_text() == "deep\n"
    assert (workspace / "made.txt").stat().st_uid == os.getuid()


@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no python3 under /usr on this machine")
async def test_python_runs_in_the_sandbox(workspace: Path, sandboxed: None) -> None:
    out = await run_exec(
        workspace,
        "python3 -c 'import json, pathlib; "
        'pathlib.Path("py.json").write_text(json.dumps([1, 2])); print(6 * 7)\'',
    )
    assert out == ToolOutcome(status="done", content="exit code 0\n42\n")
    assert json.loads((workspace / "py.json").read_text()) == [1, 2]


async def test_exec_sandbox_off_runs_as_before(workspace: Path, outside: Path, unsandboxed: None) -> None:
    """`off`: only the working directory is set; the command reaches what the worker can."""
    out = await run_exec(workspace, "pwd; cat ../outside/secret.txt")
    assert out == ToolOutcome(status="done", content=f"exit code 0\n{workspace}\ntop secret")


# --- no sandbox: refused ----------------------------------------------------------------------------


async def test_exec_refuses_without_a_sandbox(workspace: Path, no_bwrap: Path) -> None:
    out = await run_exec(workspace, "touch ran")
    assert out.status == "error"
    assert out.content.startswith("Error: SandboxUnavailable: bubblewrap is not installed")
    assert str(no_bwrap) in out.content and "TURNKEEPER_EXEC_SANDBOX=off" in out.content
    assert not (workspace / "ran").exists()


async def test_exec_refuses_when_bwrap_cannot_make_its_sandbox(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox, "BWRAP", str(fake))
    monkeypatch.setattr(sandbox, "MODE", "auto")
    out = await run_exec(workspace, "touch ran")
    assert out.status == "error" and "No permissions to create new namespace" in out.content
    assert not (workspace / "ran").exists()


def test_the_worker_refuses_to_start_with_exec_and_no_sandbox(no_bwrap: Path) -> None:
    with pytest.raises(ConfigError, match=r"TURNKEEPER_TOOLS enables exec.*bubblewrap is not installed"):
        check_tools(Settings(tools=("read_file", "exec")))
    check_tools(Settings(tools=("read_file",)))  # no exec: no sandbox needed
    check_tools(Settings(tools=("read_file", "exec"), exec_sandbox="off"))
    assert sandbox.MODE == "off"


def test_the_worker_starts_with_exec_and_a_working_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "MODE", sandbox.MODE)
    check_tools(Settings(tools=("exec",)))
    assert sandbox.MODE == "auto"


def test_exec_sandbox_setting() -> None:
    assert Settings.from_env({}).exec_sandbox == "auto"
    assert Settings.from_env({"TURNKEEPER_EXEC_SANDBOX": " OFF "}).exec_sandbox == "off"
    assert Settings.from_env({"TURNKEEPER_EXEC_SANDBOX": "auto"}).exec_sandbox == "auto"
    with pytest.raises(ConfigError, match="TURNKEEPER_EXEC_SANDBOX must be one of auto, off, got 'on'"):
        Settings.from_env({"TURNKEEPER_EXEC_SANDBOX": "on"})
