"""The interval the benchmarks put around a median round ratio (tests/support.py,
which bench/_common.py imports it from): it decides whether a throughput goal is
reported as told apart from noise."""

from __future__ import annotations

import math
import random

import pytest

from tests.support import median_interval


def _coverage(n: int, k: int) -> float:
    """Chance that [k-th lowest, k-th highest] of n draws holds the median."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n


@pytest.mark.parametrize(("n", "k"), [(6, 1), (12, 3), (20, 6)])
def test_median_interval_takes_the_narrowest_order_statistics_that_keep_90_percent(n: int, k: int) -> None:
    values = [1.0 + i / 100 for i in range(n)]
    shuffled = random.Random(n).sample(values, n)
    low, high, coverage = median_interval(shuffled, level=0.9)
    assert (low, high) == (values[k - 1], values[n - k])
    assert coverage == pytest.approx(_coverage(n, k))
    assert coverage >= 0.9 > _coverage(n, k + 1)


def test_median_interval_covers_the_median_as_often_as_it_says() -> None:
    """Rounds drawn from a known distribution: the interval holds its median at
    least as often as the coverage it reports."""
    rng = random.Random(7)
    held, trials = 0, 2000
    for _ in range(trials):
        low, high, coverage = median_interval([rng.gauss(1.0, 0.06) for _ in range(12)])
        held += low <= 1.0 <= high
    assert coverage == pytest.approx(_coverage(12, 3))
    assert held / trials >= coverage - 0.02


def test_median_interval_refuses_no_values() -> None:
    with pytest.raises(ValueError):
        median_interval([])
