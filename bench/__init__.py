"""The benchmarks and the chaos harness (bench/README.md).

Each script runs from the repository root as `.venv/bin/python bench/<script>.py`
and imports what the scripts share as a part of this package: `bench._common`
(the dev server, statistics, timelines, exits), `bench.turn_latency`,
`bench.chaos_base`, ... Python puts a script's own directory first on sys.path,
not the root: each script puts the root there itself, before its first import
of the project, with

    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root, for `bench.*`

Tests import the parts the same way (`from bench.chaos import run_chaos`).
"""
