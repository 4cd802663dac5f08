"""mypy on the package as it installs: `python tools/typecheck.py [mypy options]`.

pyproject.toml installs workflows/ and activities/ inside the package, as
turnkeeper.workflows and turnkeeper.activities (`package-dir`), and mypy finds a
module only where its dotted name lies on disk. So it checks a view of the
installed layout made of symlinks (.mypy_view/, rebuilt on every run), and its
messages are given back with the repository's paths.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VIEW = ROOT / ".mypy_view"  # pyproject.toml's [tool.mypy] reads it (mypy_path, files)


def build_view() -> dict[str, str]:
    """The view, and how its paths map back to the repository's."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        package_dir: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(VIEW, ignore_errors=True)
    (VIEW / "turnkeeper").mkdir(parents=True)
    back = {}
    for package, folder in package_dir.items():
        inside = package.split(".")[1:]  # "turnkeeper.workflows" -> ["workflows"]
        if inside:
            (VIEW / "turnkeeper" / Path(*inside)).symlink_to(ROOT / folder, target_is_directory=True)
            back[f".mypy_view/turnkeeper/{'/'.join(inside)}/"] = f"{folder}/"
    for entry in (ROOT / "turnkeeper").iterdir():
        if entry.name != "__pycache__":
            (VIEW / "turnkeeper" / entry.name).symlink_to(entry)
    (VIEW / "worker.py").symlink_to(ROOT / "worker.py")
    back[".mypy_view/turnkeeper/"] = "turnkeeper/"
    back[".mypy_view/worker.py"] = "worker.py"
    return back


def main() -> int:
    back = build_view()
    done = subprocess.run(
        [sys.executable, "-m", "mypy", *sys.argv[1:]], cwd=ROOT, capture_output=True, text=True
    )
    for line in (done.stdout + done.stderr).splitlines():
        for view, repo in back.items():  # the longest prefixes first: they were added first
            if line.startswith(view):
                line = repo + line[len(view) :]
                break
        print(line)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
