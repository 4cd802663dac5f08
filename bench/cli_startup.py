"""How soon the CLI's commands answer: wall time from process start to exit, against
a dev server and a worker of their own holding a few finished chats.

    .venv/bin/python bench/cli_startup.py                # 20 runs of each command, interleaved
    .venv/bin/python bench/cli_startup.py --also OTHER/.venv/bin/turnkeeper

`--also` times another install's console script beside this one's (a checkout of
an earlier commit, say), command by command: the same server, the same chats,
the same moment of a shared machine. `python -c pass` is the floor under every
command; `import temporalio.client` is what loading the SDK alone costs. Goal:
`status` and `list` answer within 0.4 s (median).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

from bench._common import dev_server, progress, run_and_exit

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 0.4
CHATS = ("a", "b", "c")
COMMANDS = (
    ("status", "a"),
    ("list",),
    ("history", "a"),
    ("events", "a"),
    ("send", "s", "hello", "--no-wait"),
)
FLOORS = (("python -c pass", "pass"), ("python -c 'import temporalio.client'", "import temporalio.client"))


def _wall(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return elapsed


def _start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "worker.py"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + 60
    while "worker serving" not in log.read_text(errors="replace"):
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not start:\n{log.read_text()[-800:]}")
        time.sleep(0.2)
    return worker


async def main(runs: int, also: list[str]) -> None:
    ours = str(Path(sys.executable).parent / "turnkeeper")
    installs = {"this install": ours, **{f"--also {i + 1}": path for i, path in enumerate(also)}}
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as tmp_dir:
        tmp = Path(tmp_dir)
        async with dev_server(tmp) as server:
            env = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("TURNKEEPER_", "TEMPORAL_", "OPENAI_"))
            }
            env.update(
                {
                    "TEMPORAL_ADDRESS": server.address,
                    "TURNKEEPER_TEMPORAL_HTTP_ADDRESS": server.http_address,
                    "TURNKEEPER_DATA_DIR": str(tmp / "data"),
                    "TURNKEEPER_WORKSPACE": str(tmp / "workspace"),
                    "TURNKEEPER_TASK_QUEUE": "bench-cli",
                    "TURNKEEPER_MODEL": "demo",
                }
            )
            progress("starting the worker")
            worker = _start_worker(env, tmp / "worker.log")
            try:
                progress(f"sending chats {', '.join(CHATS)}")
                for chat in CHATS:
                    _wall([ours, "send", chat, "write notes.txt: hello"], env)
                progress(f"{runs} runs of each command, interleaved")
                timed: dict[tuple[str, str], list[float]] = {}
                for i in range(runs + 1):  # the first round warms the page cache, unmeasured
                    for args in COMMANDS:
                        for name, exe in installs.items():
                            elapsed = _wall([exe, *args], env)
                            if i:
                                timed.setdefault((" ".join(args), name), []).append(elapsed)
                    for label, code in FLOORS:
                        elapsed = _wall([sys.executable, "-c", code], env)
                        if i:
                            timed.setdefault((label, "this install"), []).append(elapsed)
            finally:
                worker.send_signal(signal.SIGTERM)
                worker.wait(timeout=60)
    print(f"| command | {' | '.join(installs)} |")
    print(f"| --- |{' --- |' * len(installs)}")
    for label in dict.fromkeys(k[0] for k in timed):
        cells = [
            f"{statistics.median(v):.3f} s (min {min(v):.3f})" if (v := timed.get((label, name))) else ""
            for name in installs
        ]
        print(f"| `{label}` | {' | '.join(cells)} |")
    for args in ("status a", "list"):
        median = statistics.median(timed[(args, "this install")])
        print(
            f"goal `turnkeeper {args}` <= {GOAL_S} s: {median:.3f} s, {'met' if median <= GOAL_S else 'MISSED'}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--also", action="append", default=[], help="another install's turnkeeper")
    args = parser.parse_args()
    run_and_exit(main(args.runs, args.also))
