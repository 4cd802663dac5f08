"""The benchmarks and the chaos harness (bench/README.md).

Each script runs from the repository root as `.venv/bin/python bench/<script>.py`
and imports what the scripts share as a part of this package: `bench._common`
(the dev server, statistics, timelines, exits), `bench.turn_latency`, ...
Python puts a script's own directory first on sys.path, not the root: each script puts the root there itself, before its first import
of the project, with

    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

Tests never import `bench`: what both need is in tests/support.py (the dev server,
free ports, the median's interval), and the chaos harness is tests/chaos/; the scripts
import those from there, through the same root on sys.path.
"""
