"""Workflow code stays deterministic without relying on the sandbox at run time.

Production workers run workflows outside Temporal's sandbox (see README,
"Performance"). The in-process test workers run them inside it, but `ChatTurn`
passes its own modules through it (`turn_loop.py`, `inputs.py`, `steps.py`, ...)
along with the `turnkeeper` modules they import, and the sandbox never checks
code it passes through. This test reads every workflow module, and every
`turnkeeper` module workflow code imports, and refuses what would make a replay
differ: clocks, randomness, I/O, threads, environment.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import ROOT

WORKFLOW_MODULES = sorted((ROOT / "workflows").glob("*.py"))

FORBIDDEN_MODULES = {
    "os",
    "sys",
    "time",
    "random",
    "secrets",
    "uuid",
    "socket",
    "subprocess",
    "threading",
    "multiprocessing",
    "pathlib",
    "shutil",
    "sqlite3",
    "asyncpg",
    "httpx",
    "openai",
    "requests",
    "urllib",
    "tempfile",
    "io",
    "logging",
}
# Calls whose value depends on when or where the code runs.
FORBIDDEN_ATTRIBUTES = {
    "now",
    "utcnow",
    "today",
    "time",
    "monotonic",
    "perf_counter",
    "random",
    "uuid4",
    "getenv",
    "environ",
    "open",
}
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


def _turnkeeper_imports(tree: ast.AST) -> set[Path]:
    """The files of the `turnkeeper` modules (outside workflows/) that `tree` imports."""
    found: set[Path] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            candidates = [parts] + [[*parts, alias.name] for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name.split(".") for alias in node.names]
        else:
            continue
        for parts in candidates:
            if len(parts) >= 2 and parts[0] == "turnkeeper" and parts[1] not in ("workflows", "activities"):
                module = ROOT.joinpath(*parts)  # a module, or a package's __init__
                for path in (module.with_suffix(".py"), module / "__init__.py"):
                    if path.exists():
                        found.add(path)
    return found


def _imported_modules() -> list[Path]:
    """Every `turnkeeper` module workflow code reaches, directly or through another one."""
    seen: set[Path] = set()
    todo = list(WORKFLOW_MODULES)
    while todo:
        for path in _turnkeeper_imports(ast.parse(todo.pop().read_text())):
            if path not in seen:
                seen.add(path)
                todo.append(path)
    return sorted(seen)


IMPORTED_MODULES = _imported_modules()
CHECKED = WORKFLOW_MODULES + IMPORTED_MODULES


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


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_there_are_workflow_modules_to_check() -> None:
    # The turn's modules as they are now: a module renamed or added shows here first.
    assert {p.name for p in WORKFLOW_MODULES} >= {
        "chat_turn.py",
        "turn_loop.py",
        "inputs.py",
        "steps.py",
        "reconcile.py",
    }
    assert {p.name for p in IMPORTED_MODULES} >= {
        "activity_io.py",
        "models.py",
        "statuses.py",
        "metrics.py",
        "search_attributes.py",
        "reconcile_io.py",
        "recovery.py",
        "inbox.py",
        "raw.py",
    }


@pytest.mark.parametrize("path", CHECKED, ids=_name)
def test_workflow_module_imports_nothing_nondeterministic(path: Path) -> None:
    used = _imports(ast.parse(path.read_text())) & FORBIDDEN_MODULES
    assert not used, f"{_name(path)} imports {sorted(used)}: do that in an activity"


@pytest.mark.parametrize("path", CHECKED, ids=_name)
def test_workflow_module_reads_no_clock_randomness_or_environment(path: Path) -> None:
    uses = _attribute_uses(ast.parse(path.read_text()))
    assert not uses, (
        f"{_name(path)}: "
        + ", ".join(f"{o}.{a} (line {n})" for o, a, n in uses)
        + " — use workflow.now() / workflow.uuid4() / workflow.random(), or an activity"
    )


def test_the_check_catches_what_it_is_for() -> None:
    bad = ast.parse(
        "import time\nfrom datetime import datetime\nx = datetime.now()\ny = time.time()\n"
        "z = open('f')\nw = workflow.now()\n"
    )
    assert _imports(bad) & FORBIDDEN_MODULES == {"time"}
    assert [(o, a) for o, a, _ in _attribute_uses(bad)] == [
        ("datetime", "now"),
        ("time", "time"),
        ("", "open"),
    ]


def test_the_walk_follows_imports_into_turnkeeper() -> None:
    tree = ast.parse(
        "from turnkeeper import activity_io\nfrom turnkeeper.telemetry import metrics\n"
        "from turnkeeper.models import X\n"
        "from turnkeeper import recovery\nimport turnkeeper.statuses\n"
    )
    assert {p.relative_to(ROOT).as_posix() for p in _turnkeeper_imports(tree)} == {
        "turnkeeper/activity_io.py",
        "turnkeeper/telemetry/__init__.py",  # run by the import of the module in it
        "turnkeeper/telemetry/metrics.py",
        "turnkeeper/models.py",
        "turnkeeper/statuses.py",
        "turnkeeper/recovery.py",
    }
