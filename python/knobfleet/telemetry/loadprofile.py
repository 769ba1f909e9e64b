"""Pure: A/B weights from the live load.

Prometheus samples each engine's running requests (``sglang:num_running_reqs``, ``vllm:num_requests_running``)
over a window. Each sample is one engine at one instant; an engine decoding ``c`` requests runs its kernels at
batch ``c``, so the share of samples near each concurrency bucket is the share of decode time spent there: the
weight that ``ab`` and the gate give that bucket. A sample belongs to the nearest bucket (ties to the lower);
samples below ``idle_below`` (an idle engine) and beyond the outer buckets by more than half a bucket gap are
counted apart, never folded into the edge buckets, and reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from knobfleet.errors import KnobfleetError


def running_gauges() -> dict[str, str]:
    """Engine -> its running-requests gauge, from every catalog that names one (``serve.metrics.running``)."""
    from knobfleet.engines.adapter import engine, names
    from knobfleet.errors import KnobfleetError

    out = {}
    for name in names():
        try:
            (out[name],) = engine(name).metrics("load-profile")
        except KnobfleetError:
            continue  # an engine without metric names has none to read
    return out


class LoadProfileError(KnobfleetError):
    """Too little load to say anything, or buckets that make no sense."""


@dataclass(frozen=True)
class LoadProfile:
    weights: dict[int, float]  # bucket -> share of in-range samples, summing to 1
    samples: int  # all samples read
    in_range: int
    idle: int
    below: int  # busy but under the lowest bucket's range
    above: int  # over the highest bucket's range
    mean_running: float  # over busy samples

    def weights_arg(self) -> str:
        """The ``--weights`` argument of ``ab`` / ``bench`` / the gate (two decimals, adjusted to sum to 1)."""
        return ",".join(f"{b}={w:.2f}" for b, w in _rounded(self.weights).items())

    def mass_between(self, lo: float, hi: float) -> float:
        """The share of in-range samples in buckets lo..hi (inclusive)."""
        return sum(w for b, w in self.weights.items() if lo <= b <= hi)


def _rounded(weights: dict[int, float]) -> dict[int, float]:
    cents = {b: round(w * 100) for b, w in weights.items()}
    if cents:
        largest = max(cents, key=lambda b: (weights[b], -b))
        cents[largest] += 100 - sum(cents.values())
    return {b: c / 100 for b, c in cents.items()}


def _edges(buckets: Sequence[int]) -> tuple[float, float]:
    if len(buckets) == 1:
        return buckets[0] / 2, buckets[0] * 1.5
    lo_gap = buckets[1] - buckets[0]
    hi_gap = buckets[-1] - buckets[-2]
    return buckets[0] - lo_gap / 2, buckets[-1] + hi_gap / 2


def profile(
    running: Iterable[float], buckets: Sequence[int], idle_below: float = 1.0, min_samples: int = 30
) -> LoadProfile:
    """Weights per bucket from samples of running requests."""
    buckets = sorted(set(buckets))
    if not buckets or buckets[0] < 1:
        raise LoadProfileError("buckets: give concurrencies >= 1, e.g. 48,64,80,96")
    lo, hi = _edges(buckets)
    counts = dict.fromkeys(buckets, 0)
    total = idle = below = above = 0
    busy_sum = 0.0
    for value in running:
        total += 1
        if value != value or value < idle_below:  # NaN (a stale series) counts as idle
            idle += 1
            continue
        busy_sum += value
        if value < lo:
            below += 1
        elif value >= hi:
            above += 1
        else:
            nearest = min(buckets, key=lambda b: (abs(b - value), b))
            counts[nearest] += 1
    in_range = sum(counts.values())
    if in_range < min_samples:
        raise LoadProfileError(
            f"too little load for weights: {in_range} of {total} samples near the buckets {buckets} "
            f"({idle} idle, {below} below, {above} above), need {min_samples}; widen --window or send traffic"
        )
    busy = total - idle
    return LoadProfile(
        weights={b: counts[b] / in_range for b in buckets},
        samples=total,
        in_range=in_range,
        idle=idle,
        below=below,
        above=above,
        mean_running=busy_sum / busy if busy else 0.0,
    )
