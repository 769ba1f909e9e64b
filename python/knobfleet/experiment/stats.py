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
    """Inverse standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9)."""
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    a = (
        -3.969683028665376e01,
        2.209460984245205e02,
        -2.759285104469687e02,
        1.383577518672690e02,
        -3.066479806614716e01,
        2.506628277459239e00,
    )
    b = (
        -5.447609879822406e01,
        1.615858368580409e02,
        -1.556989798598866e02,
        6.680131188771972e01,
        -1.328068155288572e01,
    )
    c = (
        -7.784894002430293e-03,
        -3.223964580411365e-01,
        -2.400758277161838e00,
        -2.549732539343734e00,
        4.374664141464968e00,
        2.938163982698783e00,
    )
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    lo = 0.02425
    if p < lo:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1
        )
    if p > 1 - lo:
        return -normal_quantile(1 - p)
    q = p - 0.5
    r = q * q
    return (
        (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5])
        * q
        / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
    )


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
