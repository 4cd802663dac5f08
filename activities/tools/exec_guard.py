"""Runs one `exec` command so that it dies with the worker that started it.

    python -I -S exec_guard.py WORKER_PID PROGRAM [ARGUMENT...]

PROGRAM is `/bin/sh` (`-c COMMAND`), or bwrap running the shell in the sandbox
(sandbox.py), whose processes are the guard's descendants all the same.

A worker killed with SIGKILL cannot clean up: without this guard the command's
shell would carry on, and could finish its side effect after the turn had
already told the user the tool was interrupted. The guard asks Linux to send it
SIGTERM when its parent dies (PR_SET_PDEATHSIG); on SIGTERM it kills every
process the command started and then its whole process group: itself, the
shell and everything the shell started in it. The guard is also a child
subreaper (PR_SET_CHILD_SUBREAPER), so a process that left the group (`setsid`,
a daemon's double fork) is re-parented to the guard instead of to init and is
still found among its descendants. The worker sends the same SIGTERM on a
timeout or a cancelled call. When the shell exits, what it left running gets
LEFTOVER_GRACE to finish and is then killed: a tool call's processes end with
the call, so nothing acts after its result was reported.

It is started as a script in isolated mode without `site` and uses the standard
library only, so it starts quickly and never imports the worker's code.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from types import FrameType

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# Killing a process re-parents its own children to us: look again, a bounded number of times.
KILL_ROUNDS = 20
# Background jobs and daemons still running when the shell exits get this long.
LEFTOVER_GRACE_S = 1.0


def _descendants(root: int) -> list[int]:
    """Live processes below `root`, found through the parent ids in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if fields[0] not in (b"Z", b"X"):  # a zombie has nothing left to do
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found


def _kill_descendants() -> None:
    me = os.getpid()
    for _ in range(KILL_ROUNDS):
        pids = _descendants(me)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _kill_all(signum: int, frame: FrameType | None) -> None:
    _kill_descendants()
    os.killpg(0, signal.SIGKILL)


def _end_leftovers() -> None:
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while _descendants(os.getpid()) and time.monotonic() < deadline:
        _reap()
        time.sleep(0.05)
    _kill_descendants()
    _reap()


def _reap() -> None:
    """Collect exited children, our own and re-parented orphans alike."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def main() -> None:
    worker_pid, argv = int(sys.argv[1]), sys.argv[2:]
    if os.getpgrp() != os.getpid():
        # Killing the group must never reach the worker's own group.
        sys.exit("exec guard: must lead its own process group (start it with start_new_session)")
    signal.signal(signal.SIGTERM, _kill_all)
    libc = ctypes.CDLL(None, use_errno=True)
    for option, value in ((PR_SET_CHILD_SUBREAPER, 1), (PR_SET_PDEATHSIG, signal.SIGTERM)):
        if libc.prctl(option, value, 0, 0, 0) != 0:
            sys.exit(f"exec guard: prctl({option}) failed (errno {ctypes.get_errno()})")
    if os.getppid() != worker_pid:
        # The worker died before the death signal was armed.
        _kill_all(signal.SIGTERM, None)
    pid = os.posix_spawn(argv[0], argv, os.environ)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    _end_leftovers()
    if code < 0:
        # Report a shell killed by a signal the way the shell itself would have.
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
