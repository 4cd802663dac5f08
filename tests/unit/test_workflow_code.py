"""Workflow code stays deterministic without relying on the sandbox at run time.

Production workers run workflows outside Temporal's sandbox (see README,
"Performance"). The in-process test workers run them inside it, which catches a
restricted call in `workflows/chat_turn.py` and `workflows/reconcile.py`; but the
modules those pass through the sandbox (e.g. `workflows/recovery.py`) are never
checked by it. This test reads every workflow module and refuses what would make
a replay differ: clocks, randomness, I/O, threads, environment.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import ROOT

WORKFLOW_MODULES = sorted((ROOT / "workflows").glob("*.py"))

FORBIDDEN_MODULES = {
    "os", "sys", "time", "random", "secrets", "uuid", "socket", "subprocess", "threading",
    "multiprocessing", "pathlib", "shutil", "sqlite3", "asyncpg", "httpx", "openai", "requests",
    "urllib", "tempfile", "io", "logging",
}
# Calls whose value depends on when or where the code runs.
FORBIDDEN_ATTRIBUTES = {"now", "utcnow", "today", "time", "monotonic", "perf_counter", "random", "uuid4",
                        "getenv", "environ", "open"}
# The deterministic replacements workflow code is meant to use.
ALLOWED_CALLS = {("workflow", "now"), ("workflow", "uuid4"), ("workflow", "random"), ("workflow", "time")}


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _attribute_uses(tree: ast.AST) -> list[tuple[str, str, int]]:
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            owner = node.value.id if isinstance(node.value, ast.Name) else "?"
            if (owner, node.attr) not in ALLOWED_CALLS:
                uses.append((owner, node.attr, node.lineno))
        elif isinstance(node, ast.Name) and node.id == "open" and isinstance(node.ctx, ast.Load):
            uses.append(("", "open", node.lineno))
    return uses


def test_there_are_workflow_modules_to_check() -> None:
    assert {p.name for p in WORKFLOW_MODULES} >= {"chat_turn.py", "recovery.py", "reconcile.py"}


@pytest.mark.parametrize("path", WORKFLOW_MODULES, ids=lambda p: p.name)
def test_workflow_module_imports_nothing_nondeterministic(path: Path) -> None:
    used = _imports(ast.parse(path.read_text())) & FORBIDDEN_MODULES
    assert not used, f"{path.name} imports {sorted(used)}: do that in an activity"


@pytest.mark.parametrize("path", WORKFLOW_MODULES, ids=lambda p: p.name)
def test_workflow_module_reads_no_clock_randomness_or_environment(path: Path) -> None:
    uses = _attribute_uses(ast.parse(path.read_text()))
    assert not uses, f"{path.name}: " + ", ".join(f"{o}.{a} (line {n})" for o, a, n in uses) + \
        " — use workflow.now() / workflow.uuid4() / workflow.random(), or an activity"


def test_the_check_catches_what_it_is_for() -> None:
    bad = ast.parse("import time\nfrom datetime import datetime\nx = datetime.now()\ny = time.time()\n"
                    "z = open('f')\nw = workflow.now()\n")
    assert _imports(bad) & FORBIDDEN_MODULES == {"time"}
    assert [(o, a) for o, a, _ in _attribute_uses(bad)] == [("datetime", "now"), ("time", "time"), ("", "open")]
