"""The package's layers: what is under turnkeeper/ (the store, the clients, the CLI,
the web process) never imports the activities or the workflows, except where it
runs or replays them (the worker, `turnkeeper replay`, the test kit)."""

from __future__ import annotations

import ast

from tests.support import ROOT

# The modules that run or replay the workflows and activities.
RUNS_THEM = ("turnkeeper/worker/", "turnkeeper/replay.py", "turnkeeper/testing/")
UP = ("turnkeeper.activities", "turnkeeper.workflows")


def _imported(tree: ast.AST) -> set[str]:
    """Every module a file imports, at its top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in ("turnkeeper", *UP):  # `from turnkeeper.workflows import steps`
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            else:
                found.add(node.module)
    return found


def test_nothing_under_turnkeeper_imports_up_into_activities_or_workflows() -> None:
    reaching_up = {}
    for path in sorted((ROOT / "turnkeeper").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name.startswith(RUNS_THEM):
            continue
        up = sorted(m for m in _imported(ast.parse(path.read_text())) if m.startswith(UP))
        if up:
            reaching_up[name] = up
    assert not reaching_up, f"import the activities or workflows from below: {reaching_up}"
