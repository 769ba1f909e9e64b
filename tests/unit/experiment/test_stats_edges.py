"""Edges of the A/B statistics a slow or short experiment reaches: throughputs below one unit, and the noise
estimate from exactly two rounds (the first with a sample spread)."""

from __future__ import annotations

import math

import pytest

from knobfleet.experiment import stats


@pytest.mark.parametrize(("a", "b"), [(0.5, 1.0), (1.0, 0.25), (0.001, 0.002), (1e-9, 1e-9)])
def test_a_throughput_below_one_is_still_a_throughput(a: float, b: float) -> None:
    assert stats.log_ratio(a, b) == pytest.approx(math.log(b / a))


def test_two_rounds_pool_their_spread_with_the_prior() -> None:
    xs = [0.1, 0.3]  # mean 0.2, sum of squares 0.02, one degree of freedom
    assert stats.shrunk_sigma(xs) == pytest.approx(math.sqrt((4 * 0.03**2 + 0.02) / (4 + 1)))
    assert stats.shrunk_sigma(xs, floor=0.0, weight=0.0) == pytest.approx(math.sqrt(0.02))  # the sample sd alone
    iv = stats.interval(xs, 1.96)
    assert iv.sigma == stats.shrunk_sigma(xs) and iv.high - iv.low == pytest.approx(2 * 1.96 * iv.sigma / math.sqrt(2))
