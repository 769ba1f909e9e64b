"""Pure statistics for paired A/B throughput comparisons.

Each round measures A and B back to back (AB, then BA, …), so slow drift of the machine mostly cancels
in the per-round log-ratio x = ln(B / A). Noise is estimated from the spread of those log-ratios, shrunk
toward a prior (``PRIOR_SIGMA`` with ``PRIOR_WEIGHT`` pseudo-observations) and never below ``FLOOR_SIGMA``:
a few lucky rounds cannot make the interval look tighter than the machine is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

PRIOR_SIGMA = 0.03  # sd of one round's log-ratio on a shared GPU with AB/BA interleaving
PRIOR_WEIGHT = 4.0
FLOOR_SIGMA = 0.01


def log_ratio(a: float, b: float) -> float:
    if a <= 0 or b <= 0:
        raise ValueError(f"throughput must be > 0 (got A={a}, B={b})")
    return math.log(b / a)


def mean(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("no observations")
    return sum(xs) / len(xs)


def shrunk_sigma(
    xs: Sequence[float], prior: float = PRIOR_SIGMA, weight: float = PRIOR_WEIGHT, floor: float = FLOOR_SIGMA
) -> float:
    """Sample sd of ``xs`` pooled with a prior sd worth ``weight`` observations, floored."""
    n = len(xs)
    ss = sum((x - mean(xs)) ** 2 for x in xs) if n > 1 else 0.0
    pooled = math.sqrt((weight * prior**2 + ss) / (weight + max(n - 1, 0)))
    return max(pooled, floor)


def normal_quantile(p: float) -> float:
    """Inverse standard normal CDF (the standard library's ``statistics.NormalDist``)."""
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    return NormalDist().inv_cdf(p)


def normal_cdf(x: float) -> float:
    """Standard normal CDF."""
    return NormalDist().cdf(x)


# Two-sided 95% Student-t quantiles t(0.975, df) for df = 1..30 (to 3 decimals, the textbook table).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_quantile_975(df: int) -> float:
    """t(0.975, df): the half-width factor of a 95% interval of a mean of df+1 runs. Beyond the table, the
    normal quantile with the first Cornish-Fisher correction (error < 0.001 from df 31 on)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = NormalDist().inv_cdf(0.975)
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_interval_95(xs: Sequence[float]) -> tuple[float, float]:
    """95% Student-t interval of the mean of ``xs`` (at least two values)."""
    import statistics

    m = statistics.mean(xs)
    half = t_quantile_975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m - half, m + half


@dataclass(frozen=True)
class Interval:
    estimate: float  # mean log-ratio
    low: float
    high: float
    n: int
    sigma: float

    @property
    def ratio(self) -> float:
        return math.exp(self.estimate)

    def as_ratios(self) -> tuple[float, float, float]:
        return math.exp(self.estimate), math.exp(self.low), math.exp(self.high)


def interval(xs: Sequence[float], z: float) -> Interval:
    m = mean(xs)
    s = shrunk_sigma(xs)
    half = z * s / math.sqrt(len(xs))
    return Interval(m, m - half, m + half, len(xs), s)


def classify(iv: Interval, min_effect: float) -> str:
    """better / worse / same (interval inside ±min_effect) / inconclusive — on the log-ratio scale."""
    m = math.log1p(min_effect)
    if iv.low > -m and iv.high < m:
        return "same"
    if iv.low > 0:
        return "better"
    if iv.high < 0:
        return "worse"
    return "inconclusive"


def weighted_rounds(per_bucket: Mapping[int, Sequence[float]], weights: Mapping[int, float]) -> list[float]:
    """Per round, the traffic-weighted log-ratio over buckets (weights renormalised to the buckets present)."""
    buckets = [b for b in per_bucket if weights.get(b, 0) > 0]
    if not buckets:
        raise ValueError("no bucket has a positive weight")
    total = sum(weights[b] for b in buckets)
    rounds = min(len(per_bucket[b]) for b in buckets)
    return [sum(weights[b] / total * per_bucket[b][r] for b in buckets) for r in range(rounds)]
