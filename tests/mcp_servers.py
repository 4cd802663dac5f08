"""The real MCP servers the tests run: `mcp-server-git` and `mcp-server-time`
(PyPI, in the venv), `@modelcontextprotocol/server-everything` (npm, installed
into tests/npm by `make setup`), and tests/mcp_probe_server.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
GIT = str(BIN / "mcp-server-git")
TIME = str(BIN / "mcp-server-time")
EVERYTHING = ROOT / "tests/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
PROBE = ROOT / "tests" / "mcp_probe_server.py"


def everything(*args: str) -> dict[str, Any]:
    """server-everything's entry, skipping the test only where Node is missing."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: @modelcontextprotocol/server-everything is a Node server")
    assert EVERYTHING.exists(), (
        f"{EVERYTHING} is missing: `make setup` installs it (npm ci --prefix tests/npm)"
    )
    return {"command": node, "args": [str(EVERYTHING), *args]}


def probe(ledger: Path) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(PROBE)], "env": {"TK_MCP_LEDGER": str(ledger)}}


def write_config(path: Path, servers: dict[str, dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def git_repo(path: Path, hooks: dict[str, str] | None = None) -> Path:
    """A repository with one commit and a staged change; `hooks` are shell scripts."""
    path.mkdir(parents=True)

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    git("config", "user.name", "turnkeeper tests")
    git("config", "user.email", "tests@turnkeeper.invalid")
    (path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "first")
    (path / "a.txt").write_text("one\ntwo\n")
    git("add", "a.txt")
    for name, script in (hooks or {}).items():
        hook = path / ".git" / "hooks" / name
        hook.write_text("#!/bin/sh\n" + script)
        hook.chmod(0o755)
    return path


def commits(repo: Path) -> list[str]:
    out = subprocess.run(["git", "log", "--format=%s"], cwd=repo, check=True, capture_output=True, text=True)
    return out.stdout.split("\n")[:-1]
