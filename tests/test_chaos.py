"""A short run of the chaos harness (bench/chaos.py): three worker processes,
SIGKILLed at random while chats send messages, follow-ups and retried ids,
their users press Continue, Dismiss and Stop at random moments (updates and
signals, stale ids among them), a burst of large follow-ups arrives while a
tool runs, the store is out for a few seconds, and a driver answers every
gate; then every chat gets a probe message, and the harness's checker.

The harness starts its own dev server and worker processes. Set TK_CHAOS_SEED
to replay a seed (timing still varies); a failing run keeps its work directory
(logs, ledger, store, report.json, evidence/<chat>.json) under the test's
tmp_path."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.crash

_PATH = Path(__file__).resolve().parent.parent / "bench" / "chaos.py"


def _harness():
    spec = importlib.util.spec_from_file_location("turnkeeper_chaos_harness", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
async def test_short_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    chaos = _harness()
    seed = int(os.environ.get("TK_CHAOS_SEED", "20240611"))
    report = await chaos.run_chaos(chaos.ChaosConfig(
        turns=30, kills=5, workers=3, chats=8, seed=seed, bursts=1, outages=1,
        max_chaos_s=120, settle_timeout_s=90, workdir=tmp_path / "chaos",
        progress=lambda text: print(text, flush=True)))
    print(report.summary())
    assert report.target_reached, report.summary()
    assert report.kills >= 5 and report.turns_closed >= 30
    assert report.messages["acknowledged"] > 0 and report.tools["starts"] > 0
    assert len(report.bursts) == 1 and len(report.outages) == 1
    assert sum(report.user_actions.values()) > 5, report.user_actions
    assert report.probes["answered"] == 8, report.probes
    failed = {name: count for name, count in report.invariants.items() if count}
    assert not failed, f"invariants failed: {failed}\n{report.summary()}"
