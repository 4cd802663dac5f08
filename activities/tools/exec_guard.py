"""Runs one `exec` command so that it dies with the worker that started it.

    python -I -S exec_guard.py WORKER_PID COMMAND

A worker killed with SIGKILL cannot clean up: without this guard the command's
shell would carry on, and could finish its side effect after the turn had
already told the user the tool was interrupted. The guard asks Linux to send it
SIGTERM when its parent dies (PR_SET_PDEATHSIG) and then kills its whole
process group: itself, the shell and everything the shell started in it.

It is started as a script in isolated mode without `site` and uses the standard
library only, so it starts quickly and never imports the worker's code.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from types import FrameType

PR_SET_PDEATHSIG = 1


def _kill_group(signum: int, frame: FrameType | None) -> None:
    os.killpg(0, signal.SIGKILL)


def main() -> None:
    worker_pid, command = int(sys.argv[1]), sys.argv[2]
    if os.getpgrp() != os.getpid():
        # Killing the group must never reach the worker's own group.
        sys.exit("exec guard: must lead its own process group (start it with start_new_session)")
    signal.signal(signal.SIGTERM, _kill_group)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        sys.exit(f"exec guard: prctl failed (errno {ctypes.get_errno()})")
    if os.getppid() != worker_pid:
        # The worker died before the death signal was armed.
        _kill_group(signal.SIGTERM, None)
    pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", command], os.environ)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code < 0:
        # Report a shell killed by a signal the way the shell itself would have.
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
