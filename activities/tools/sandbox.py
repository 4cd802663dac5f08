"""The sandbox `exec` commands run in: bubblewrap (`bwrap`).

A command sees a file system of its own: the workspace (the only place it can
write), read-only /usr (with /bin, /sbin and /lib* as the host has them) and
the few files of /etc a shell and its programs read (dynamic linker cache,
alternatives, users and groups, time zone), a private /tmp, a minimal /dev, and
a /proc of a new pid namespace. Nothing else of the host is there to read. It
has no network (a namespace with loopback only: nothing a command sends leaves
the machine, and nothing listening on the host is reachable), no capabilities,
and its own session, so it cannot push input into a terminal.

bwrap rather than Landlock: it builds that view of the file system with mount
namespaces and also gives the command its own pid and network namespaces, so
what a command leaves running dies with it and nothing can be sent out; it runs
unprivileged and as root, in a container that allows namespaces; Landlock only
restricts file access, and needs a kernel with it enabled.

`TURNKEEPER_EXEC_SANDBOX` (`MODE`): `auto` runs every command in the sandbox and
refuses to run one when bwrap does not work here; `off` runs commands as the
worker's user with only the working directory set. The worker sets the mode
at start-up (`configure`) and, with `exec` enabled and `auto`, refuses to start
without a working bwrap (`check`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

MODES = ("auto", "off")
MODE = "auto"
# Where bwrap is: found on PATH when this module is imported.
BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"
# How long the start-up check may take.
CHECK_TIMEOUT = 10.0
# What a command left running may go on for once its shell exited, as outside
# the sandbox (exec_guard.LEFTOVER_GRACE_S); then the pid namespace is torn down.
LEFTOVER_GRACE_S = 1.0
_LEFTOVER_POLL_S = 0.05

# Top-level directories that hold programs and libraries: a symlink on a merged-/usr
# system (recreated as such), a directory elsewhere (bound read-only).
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What of /etc a shell and common programs read; bound read-only where present.
_ETC_FILES = (
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",  # names for uids (`id`, `ls -l`); no secrets: those are in /etc/shadow
    "/etc/group",
)

# Run as pid 2 of the namespace, under bwrap's init: runs the command, then gives
# what it left running the grace (pid 1 and this shell are the only processes
# left when it is over), then exits with the command's status. When it exits,
# bwrap's init exits and the kernel kills whatever is left in the namespace.
_WRAPPER = (
    '/bin/sh -c "$1"; code=$?; n=0; '
    f'while [ "$n" -lt {round(LEFTOVER_GRACE_S / _LEFTOVER_POLL_S)} ]; do '
    f'set -- /proc/[0-9]*; [ "$#" -le 2 ] && break; sleep {_LEFTOVER_POLL_S}; n=$((n + 1)); '
    'done; exit "$code"'
)

# bwrap paths that passed `check`.
_working: set[str] = set()


class SandboxUnavailable(RuntimeError):
    """bwrap is missing or cannot set up its sandbox here."""


def configure(mode: str) -> None:
    global MODE
    if mode not in MODES:
        raise ValueError(f"exec sandbox mode must be one of {', '.join(MODES)}, got {mode!r}")
    MODE = mode


def enabled() -> bool:
    return MODE != "off"


def argv(command: str, workspace: Path) -> list[str]:
    """The argv that runs `command` with `/bin/sh -c` in the sandbox, in `workspace`
    (an absolute path without symlinks: it is bound at the same path inside)."""
    ws = str(workspace)
    return [
        BWRAP,
        *_base_args(),
        "--bind",
        ws,
        ws,
        "--remount-ro",
        "/",
        "--chdir",
        ws,
        "/bin/sh",
        "-c",
        _WRAPPER,
        "sh",
        command,
    ]


def _base_args() -> list[str]:
    args = [
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--dir", "/etc"]
    for path in _ETC_FILES:
        args += ["--ro-bind-try", path, path]
    # /tmp before the workspace: a workspace under /tmp is bound onto the private one.
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    return args


def check() -> None:
    """Raise SandboxUnavailable unless bwrap can set up the sandbox here (a shell
    runs in it). Blocks for as long as that takes, some milliseconds."""
    bwrap = BWRAP
    probe = [bwrap, *_base_args(), "--remount-ro", "/", "--chdir", "/", "/bin/sh", "-c", "exit 0"]
    try:
        done = subprocess.run(
            probe,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env={"PATH": "/usr/bin:/bin"},
            timeout=CHECK_TIMEOUT,
        )
    except FileNotFoundError:
        raise SandboxUnavailable(
            f"bubblewrap is not installed ({bwrap} not found): install it (Debian, Ubuntu: apt-get "
            "install bubblewrap), or set TURNKEEPER_EXEC_SANDBOX=off to run commands unconfined"
        ) from None
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SandboxUnavailable(f"{bwrap} could not be run: {err}") from None
    if done.returncode != 0:
        reason = done.stderr.decode("utf-8", errors="replace").strip() or f"exit code {done.returncode}"
        raise SandboxUnavailable(
            f"{bwrap} cannot set up the sandbox here ({reason}); in a container, bwrap needs to be "
            "allowed to create namespaces. Or set TURNKEEPER_EXEC_SANDBOX=off to run commands unconfined"
        )
    _working.add(bwrap)


async def ensure_available() -> None:
    """`check`, once per bwrap path while it passes; off the event loop."""
    if BWRAP not in _working:
        await asyncio.to_thread(check)
