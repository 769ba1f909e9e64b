"""The Student-t quantile behind `knobfleet ab`'s per-profile error bars, checked against the t distribution
itself: its CDF is integrated here (Simpson's rule on the density, accurate to ~1e-12), so every entry of the
3-decimal table must be the rounding of the true quantile, and the large-df formula must be as accurate as a
third-order expansion is."""

from __future__ import annotations

import itertools
import math
import statistics
from functools import cache

import pytest

from knobfleet.experiment import stats


def t_cdf(t: float, df: int, steps: int = 4000) -> float:
    """P(T <= t) for T ~ Student-t(df), t >= 0: one half plus the density integrated over [0, t]."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def density(x: float) -> float:
        return float(c * (1 + x * x / df) ** (-(df + 1) / 2))

    h = t / steps
    odd = sum(density((2 * i - 1) * h) for i in range(1, steps // 2 + 1))
    even = sum(density(2 * i * h) for i in range(1, steps // 2))
    return 0.5 + h / 3 * (density(0.0) + 4 * odd + 2 * even + density(t))


@cache
def t_975(df: int) -> float:
    """The exact 0.975 quantile, by bisection on the CDF."""
    lo, hi = 1.9, 13.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < 0.975 else (lo, mid)
    return (lo + hi) / 2


def test_the_integrated_cdf_is_right_where_it_has_a_closed_form() -> None:
    # df = 1 is the Cauchy distribution, df = 2 has t = (2p - 1) / sqrt(2p(1 - p))
    assert t_975(1) == pytest.approx(math.tan(math.pi * 0.475), abs=1e-9)
    assert t_975(2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), abs=1e-9)


@pytest.mark.parametrize("df", range(1, 31))
def test_every_table_entry_is_the_true_quantile_to_3_decimals(df: int) -> None:
    assert stats.t_quantile_975(df) == round(t_975(df), 3)


@pytest.mark.parametrize("df", [31, 40, 60, 100, 250, 1000])
def test_beyond_the_table_the_formula_is_accurate_to_third_order(df: int) -> None:
    # the docstring promises an error below 0.001 from df 31 on; the expansion's next term is O(df^-3)
    error = abs(stats.t_quantile_975(df) - t_975(df))
    assert error < 1e-3
    assert error < 3.0 / df**3


def test_the_quantile_falls_towards_the_normal_one_without_a_jump_at_the_table_end() -> None:
    qs = [stats.t_quantile_975(df) for df in range(1, 200)]
    assert all(a > b for a, b in itertools.pairwise(qs))
    assert qs[-1] > statistics.NormalDist().inv_cdf(0.975)


@pytest.mark.parametrize("df", [0, -1])
def test_no_quantile_without_a_degree_of_freedom(df: int) -> None:
    with pytest.raises(ValueError, match=r"^df must be >= 1$"):
        stats.t_quantile_975(df)


@pytest.mark.parametrize(
    "xs", [[10.0, 12.0, 14.0], [1.0, 2.0], [5.0, 5.5, 4.0, 6.5, 5.0], [float(i % 7) for i in range(40)]]
)
def test_mean_interval_95_is_the_student_t_interval(xs: list[float]) -> None:
    n = len(xs)
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    half = t_975(n - 1) * sd / math.sqrt(n)
    low, high = stats.mean_interval_95(xs)
    assert low == pytest.approx(m - half, abs=1e-3 * sd) and high == pytest.approx(m + half, abs=1e-3 * sd)
    assert low < m < high


def test_mean_interval_95_of_identical_runs_is_a_point() -> None:
    assert stats.mean_interval_95([3.0, 3.0, 3.0]) == (3.0, 3.0)
