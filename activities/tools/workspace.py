"""Keep tool paths inside the workspace.

This is a guard against a model wandering off with `..`, absolute paths or
symlinks; it is not a sandbox (a check-then-use race remains, and `exec` can
reach anything the worker can).
"""

from __future__ import annotations

from pathlib import Path


class WorkspaceEscape(ValueError):
    """A tool path is empty, malformed, or points outside the workspace."""


def resolve_in_workspace(workspace: Path, path: str) -> Path:
    """Return the real path of `path` (relative to `workspace`), refusing escapes.

    Symlinks are followed, so a link inside the workspace that points outside
    (or a path under a linked directory that does) is refused. The target need
    not exist: its longest existing prefix is resolved and the rest appended.
    """
    if not isinstance(path, str) or not path.strip():
        raise WorkspaceEscape("path must not be empty")
    if "\x00" in path:
        raise WorkspaceEscape(f"path {path!r} contains a NUL byte")
    candidate = Path(path)
    if candidate.is_absolute():
        raise WorkspaceEscape(
            f"path {path!r} escapes the workspace: absolute paths are not allowed; use a path relative to the workspace"
        )
    if ".." in candidate.parts:
        raise WorkspaceEscape(f"path {path!r} escapes the workspace: '..' components are not allowed")
    root = Path(workspace).resolve()
    resolved = (root / candidate).resolve()
    if not resolved.is_relative_to(root):
        raise WorkspaceEscape(
            f"path {path!r} escapes the workspace: it resolves (through a symlink) to a location outside it"
        )
    return resolved
