"""`turnkeeper replay`: the deploy gate (turnkeeper.replay), and what it prints."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import TYPE_CHECKING

from turnkeeper.cli.common import EXIT_OK, EXIT_REFUSED, connect_client
from turnkeeper.cli.output import print_json
from turnkeeper.config import Settings

if TYPE_CHECKING:
    from turnkeeper.replay import ReplayReport


async def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    """The deploy gate: exit 0 when every recent history replays on this code, 1 otherwise."""
    from dataclasses import asdict

    from turnkeeper import replay

    client = await connect_client(settings)
    report = await replay.replay_recent(client, settings, limit=args.limit, since=args.since)
    if args.json:
        print_json(
            {
                "task_queue": settings.task_queue,
                "replayed": report.replayed,
                "running": report.running,
                "ok": report.ok,
                "failures": [asdict(f) for f in report.failures],
            }
        )
    else:
        for line in replay_lines(report, settings.task_queue, args.since):
            print(line)
    return EXIT_OK if report.ok else EXIT_REFUSED


def replay_lines(report: ReplayReport, task_queue: str, since: timedelta) -> list[str]:
    window = f"running, or closed in the last {_duration(since)}"
    if not report.replayed:
        return [f"no runs on task queue {task_queue!r} {window}: nothing to replay"]
    lines = [
        f"does not replay: {f.workflow_id} run {f.run_id} ({f.workflow_type}, "
        f"{'running' if f.running else 'closed'}): {f.error}"
        for f in report.failures
    ]
    counts = f"{report.replayed} histories on task queue {task_queue!r} ({report.running} running)"
    if report.ok:
        lines.append(f"replayed {counts}, {window}: all replay on this code")
    else:
        lines.append(
            f"{len(report.failures)} of {counts} do not replay on this code: workers running it "
            "would fail each such run's next workflow task, again and again, until the reconciler "
            "ends the run after a minute and recovers its turn. Ship it as a new worker deployment "
            "version (running turns stay on the build that began them), or mend what fails "
            '(docs/operations.md, "Shipping a change to workflow code")'
        )
    return lines


def _duration(d: timedelta) -> str:
    seconds = int(d.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
