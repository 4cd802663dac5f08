"""The chaos harness from the command line: many chats on several worker processes
that are SIGKILLed at random, users who press every button at random moments, store
outages, then a checker of turnkeeper's invariants (tests/chaos/: what runs and what
is checked; tests/process/test_chaos.py runs it in short).

    .venv/bin/python bench/chaos.py [--turns 500] [--kills 50] [--workers 3] [--chats N]
                                    [--seed S] [--json] [--keep] [--no-replay]
                                    [--stall-kills P] [--bursts N] [--outages N] [--lenient-model]
                                    [--confirm P] [--p-approve P] [--postgres [URL]]
                                    [--delegate P] [--background P] [--nested P]

The summary goes to stdout (with --json, also the whole report as JSON); the exit
status is 1 if any invariant failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `tests.*`

from tests.chaos.base import ChaosConfig
from tests.chaos.harness import run_chaos
from tests.chaos.store import DEFAULT_POSTGRES_URL


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=500, help="closed turns to reach (default 500)")
    parser.add_argument("--kills", type=int, default=50, help="SIGKILLs to make at least (default 50)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes kept up (default 3)")
    parser.add_argument("--chats", type=int, default=None, help="chats driven at once (default: 8 x workers)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: a fresh one, printed)")
    parser.add_argument("--json", action="store_true", help="also print the whole report as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work directory even when all passed")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="work directory (default: a temporary one)"
    )
    parser.add_argument("--no-replay", action="store_true", help="skip replaying the recorded histories")
    parser.add_argument(
        "--stall-kills",
        type=float,
        default=ChaosConfig.stall_kills,
        help="share of kills made while the store's write lock is held for a moment "
        f"(default {ChaosConfig.stall_kills})",
    )
    parser.add_argument(
        "--bursts", type=int, default=None, help="bursts of large follow-ups (default: turns / 25)"
    )
    parser.add_argument(
        "--outages", type=int, default=None, help="store outages of 3-12 s (default: turns / 60)"
    )
    parser.add_argument(
        "--idle-after",
        type=float,
        default=ChaosConfig.idle_after_s,
        help=f"seconds a run may sit unchanged with nothing to do (default {ChaosConfig.idle_after_s:.0f})",
    )
    parser.add_argument(
        "--lenient-model",
        action="store_true",
        help="answer requests with unanswered tool calls instead of refusing them (400) as OpenAI does",
    )
    parser.add_argument("--max-minutes", type=float, default=25.0, help="cap on the chaos phase (default 25)")
    parser.add_argument(
        "--confirm",
        type=float,
        default=ChaosConfig.confirm,
        help=f"share of tool calls to the tool that asks first (default {ChaosConfig.confirm})",
    )
    parser.add_argument(
        "--postgres",
        nargs="?",
        const=DEFAULT_POSTGRES_URL,
        default=None,
        metavar="URL",
        help="run the workers on a PostgreSQL store: a role and a schema of the run's own on "
        f"the database at URL (default {DEFAULT_POSTGRES_URL}), whose user may create "
        "roles; outages there also make the store read-only or cut its sessions off",
    )
    parser.add_argument(
        "--p-approve",
        type=float,
        default=ChaosConfig.p_approve,
        help=f"chance the gate driver approves an approval gate (default {ChaosConfig.p_approve})",
    )
    parser.add_argument(
        "--delegate",
        type=float,
        default=ChaosConfig.delegate,
        help="chance a user message's first reply is a delegate call: a subagent in a sub-chat "
        f"(default {ChaosConfig.delegate}; 0 leaves the delegate tool off)",
    )
    parser.add_argument(
        "--background",
        type=float,
        default=ChaosConfig.background,
        help=f"chance a delegate call runs its subagent in background mode (default {ChaosConfig.background})",
    )
    parser.add_argument(
        "--nested",
        type=float,
        default=ChaosConfig.nested,
        help=f"chance a subagent's task delegates once more (default {ChaosConfig.nested})",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    cfg = ChaosConfig(
        turns=args.turns,
        kills=args.kills,
        workers=args.workers,
        chats=args.chats if args.chats is not None else 8 * args.workers,
        seed=args.seed,
        replay=not args.no_replay,
        stall_kills=args.stall_kills,
        bursts=args.bursts,
        outages=args.outages,
        idle_after_s=args.idle_after,
        strict_protocol=not args.lenient_model,
        workdir=args.workdir,
        keep=args.keep,
        max_chaos_s=args.max_minutes * 60,
        confirm=args.confirm,
        p_approve=args.p_approve,
        delegate=args.delegate,
        background=args.background,
        nested=args.nested,
        postgres_url=args.postgres,
        progress=lambda text: print(text, file=sys.stderr, flush=True),
    )
    code = 0
    try:
        report = asyncio.run(run_chaos(cfg))
        print(report.summary())
        if args.json:
            print(json.dumps(report.to_dict(), indent=2, default=str))
        code = 0 if report.ok else 1
    except Exception:
        traceback.print_exc()
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    # A Temporal runtime can abort at interpreter exit (sdk-python #300).
    os._exit(code)


if __name__ == "__main__":
    main()
