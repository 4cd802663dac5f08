"""The documentation keeps one home per fact: every variable the code reads has its
row in docs/configuration.md and nowhere else, the recovery table is shown on
docs/recovery.md alone (tests/unit/test_recovery_machine.py checks it is current),
and docs/testing.md's example is the test file that runs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.support import ROOT
from turnkeeper import config, config_docs, recovery_table

CONFIGURATION = ROOT / "docs" / "configuration.md"
# Where the code that reads the environment lives (the tests and benches have their own).
SOURCES = ("turnkeeper", "activities", "workflows")
ROW = re.compile(r"^\| (`[A-Z][A-Z0-9_]*`(?:, `[A-Z][A-Z0-9_]*`)*) \|", re.MULTILINE)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _rows(text: str) -> set[str]:
    """The variables a page's table rows start with."""
    return {name for cell in ROW.findall(text) for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", cell)}


def _read_by_the_code() -> set[str]:
    names = set(config.ENV_VARS) | set(config.TEMPORAL_CONNECTION_ENV_VARS)
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(re.findall(r"\bTURNKEEPER_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    return names


def test_the_table_is_the_settings_model() -> None:
    assert config_docs.docs_table() in CONFIGURATION.read_text(), (
        "docs/configuration.md's table differs from turnkeeper/config.py: run `python -m turnkeeper.config_docs`"
    )


def test_every_variable_the_code_reads_has_its_row() -> None:
    documented = _rows(CONFIGURATION.read_text())
    missing = sorted(_read_by_the_code() - documented)
    assert not missing, f"docs/configuration.md has no row for {missing}"


def test_every_row_names_a_variable_the_code_reads() -> None:
    stale = sorted(_rows(CONFIGURATION.read_text()) - _read_by_the_code())
    assert not stale, f"docs/configuration.md documents variables nothing reads: {stale}"


def test_no_other_page_copies_the_variables_table() -> None:
    for page in _pages():
        if page != CONFIGURATION:
            copied = sorted(_rows(page.read_text()) & _read_by_the_code())
            assert not copied, (
                f"{page.relative_to(ROOT)} has table rows for {copied}: link docs/configuration.md"
            )


def test_the_recovery_table_has_one_home() -> None:
    shown = [
        page.relative_to(ROOT).as_posix()
        for page in _pages()
        if recovery_table.table().splitlines()[2] in page.read_text()
    ]
    assert shown == ["docs/recovery.md"]


def test_the_testing_page_shows_its_example_as_it_runs() -> None:
    example = ROOT / "docs" / "examples" / "test_my_tool.py"
    blocks = re.findall(r"^```python\n(.*?)^```$", (ROOT / "docs" / "testing.md").read_text(), re.M | re.S)
    assert example.read_text() in blocks, (
        f"docs/testing.md's example is not {example.name} as it is: copy it in"
    )
    # ... and `make test` runs it.
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "docs/examples" in pytest_options["testpaths"]
