"""docs/configuration.md's table of variables, written from `Settings` itself (each
field's docstring is its meaning), so the page and the code cannot drift apart:
tests/unit/test_docs.py holds the page to it, `python -m turnkeeper.config_docs`
rewrites it."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from turnkeeper import config
from turnkeeper.config import TEMPORAL_CONNECTION_ENV_VARS, Settings

TEMPORAL_CONNECTION_MEANING = (
    "read by `temporalio.envconfig` when `TEMPORAL_ADDRESS` is set: a `temporal.toml` profile, an API key "
    '(which also turns TLS on; Temporal Cloud), mTLS ([operations.md](operations.md), "Running on several '
    'machines")'
)


def docs_table() -> str:
    """docs/configuration.md's table: a row per field, and one for the connection variables."""
    import ast

    tree = ast.parse(Path(config.__file__).read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings").body
    meanings = {
        a.target.id: " ".join(b.value.value.split())
        for a, b in zip(body, body[1:], strict=False)
        if isinstance(a, ast.AnnAssign)
        and isinstance(a.target, ast.Name)
        and isinstance(b, ast.Expr)
        and isinstance(b.value, ast.Constant)
        and isinstance(b.value.value, str)
    }
    rows = ["| variable | meaning | default |", "| --- | --- | --- |"]
    for f in fields(Settings):
        rows.append(
            f"| `{f.metadata['env']}` | {meanings[f.name]} | {f.metadata['shown'] or _shown(f.default)} |"
        )
    names = ", ".join(f"`{n}`" for n in TEMPORAL_CONNECTION_ENV_VARS)
    rows.append(f"| {names} | {TEMPORAL_CONNECTION_MEANING} | unset |")
    return "\n".join(rows) + "\n"


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return "`on`" if default else "`off`"
    if isinstance(default, tuple):
        return f"`{','.join(default)}`" if default else "none"
    return "unset" if default is None else f"`{default}`"


if __name__ == "__main__":  # rewrites the table in a checkout's docs/configuration.md
    page = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    head, start, rest = page.read_text().partition("<!-- written by `python -m turnkeeper.config_docs` -->\n")
    end = "<!-- end of the written table -->"
    page.write_text(f"{head}{start}\n{docs_table()}\n{end}{rest.partition(end)[2]}")
