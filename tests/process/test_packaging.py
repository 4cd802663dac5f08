"""turnkeeper installs as one package, `turnkeeper`: nothing of ours takes a generic
top-level name (`activities`, `workflows`, `worker`) that a user's own project may
hold, and a user's tool module in the current directory loads."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support import ROOT, Stack

# The repository's directories that install inside `turnkeeper` (pyproject.toml, package-dir).
MAPPED = {
    "turnkeeper": "turnkeeper",
    "workflows": "turnkeeper/workflows",
    "activities": "turnkeeper/activities",
}

USER_TOOLS = '''
from turnkeeper.activities.tools import tool

@tool(effect="read")
def shout(text: str) -> str:
    """Say it louder."""
    return text.upper() + "!"
'''


def _tracked(*paths: str) -> list[str]:
    return subprocess.run(
        ["git", "ls-files", *paths], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()


def test_a_wheel_holds_only_the_turnkeeper_package(tmp_path: Path) -> None:
    source = tmp_path / "src"
    for name in _tracked("pyproject.toml", "README.md", *MAPPED):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "-w", str(tmp_path / "out"), "--no-deps", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "out").glob("turnkeeper-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names}
    assert tops == {"turnkeeper", next(t for t in tops if t.endswith(".dist-info"))}
    # Every source file lands under its `turnkeeper` name, and nothing else does.
    expected = set()
    for name in _tracked(*MAPPED):
        top, _, rest = name.partition("/")
        expected.add(f"{MAPPED[top]}/{rest}")
    assert {n for n in names if not n.split("/")[0].endswith(".dist-info")} == expected


def _user_project(stack: Stack) -> Path:
    """A directory of a user's own: modules named as ours were before, and a tool module."""
    project = stack.dir / "project"
    project.mkdir()
    (project / "activities.py").write_text('"""A user\'s own activities."""\n')
    (project / "workflows.py").write_text('"""A user\'s own workflows."""\n')
    (project / "mytools.py").write_text(USER_TOOLS)
    return project


@pytest.mark.parametrize(
    "command",
    [
        pytest.param((sys.executable, "-m", "turnkeeper.worker"), id="python -m turnkeeper.worker"),
        pytest.param((str(Path(sys.executable).parent / "turnkeeper"), "worker"), id="turnkeeper worker"),
    ],
)
async def test_the_worker_runs_beside_a_users_modules_and_loads_their_tools(
    stack: Stack, command: tuple[str, ...]
) -> None:
    project = _user_project(stack)
    stack.script([{"tool_calls": [{"name": "shout", "arguments": {"text": "hello"}}]}, {"text": "said it"}])
    worker = stack.spawn_worker(
        command, cwd=project, TURNKEEPER_TOOL_MODULES="mytools", TURNKEEPER_TOOLS="read_file,shout"
    )
    await stack.wait_serving(worker)
    chat = stack.chat()
    assert (await (await stack.send(chat, "say hello")).result()).status.value == "completed"
    assert [m["content"] for m in await stack.history(chat) if m["role"] == "tool"] == ["HELLO!"]
