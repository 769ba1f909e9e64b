"""The AB/BA schedule and the sequential stopping rule of ``knobfleet ab`` (pure).

Rounds alternate AB, BA, AB, … so linear drift cancels within each pair of rounds. After each round
from ``min_rounds`` on, the traffic-weighted log-ratio G gets an interval with a Bonferroni-corrected
z for the number of looks still possible (so peeking every round keeps the one-sided false-promote rate
at most ``alpha``):

* a guardrail fails (request errors, consistency failure, or a bucket significantly worse than
  ``-max_regression``) → ``keep`` A at once;
* the interval's low end is above 0 and G ≥ ``min_effect`` → ``promote`` B;
* the interval's high end is below ``min_effect`` → ``keep`` A (B cannot be better by a useful margin);
* otherwise run another round, up to ``max_rounds``; then ``inconclusive`` (A stays).

Error rates (perf/decision_quality.py measures them): at most ``alpha`` false promotes when A and B
are equal; power against a true +3% effect is ≥ 95% for the lab's noise at the default budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from knobfleet.experiment import stats


@dataclass(frozen=True)
class Settings:
    weights: dict[int, float]
    min_effect: float = 0.01
    max_regression: float = 0.03
    min_rounds: int = 3
    max_rounds: int = 15
    alpha: float = 0.05  # one-sided false-promote rate over all looks (Bonferroni: conservative)

    def z(self) -> float:
        looks = max(1, self.max_rounds - self.min_rounds + 1)
        return stats.normal_quantile(1 - self.alpha / looks)


def order(round_index: int) -> tuple[str, str]:
    """AB for even rounds, BA for odd ones."""
    return ("A", "B") if round_index % 2 == 0 else ("B", "A")


@dataclass
class Decision:
    verdict: str  # continue | promote | keep | inconclusive
    reason: str
    rounds: int
    gain: stats.Interval | None = None
    buckets: dict[int, tuple[stats.Interval, str]] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        return self.verdict != "continue"


def _pct(x: float) -> str:
    return f"{(math.exp(x) - 1) * 100:+.1f}%"


def decide(
    per_bucket: dict[int, list[float]], s: Settings, *, errors: int = 0, consistency_ok: bool = True
) -> Decision:
    """Look at the log-ratios so far (bucket → one value per round) and say whether to stop."""
    rounds = min((len(v) for v in per_bucket.values()), default=0)
    if errors:
        return Decision(
            "keep", f"B had {errors} failed requests; a profile that drops requests is never promoted", rounds
        )
    if not consistency_ok:
        return Decision(
            "keep", "B's outputs under load differ from its serial outputs (consistency check failed)", rounds
        )
    if rounds == 0:
        return Decision("continue", "no rounds yet", 0)
    z = s.z()
    buckets = {}
    for b, xs in sorted(per_bucket.items()):
        iv = stats.interval(xs, z)
        buckets[b] = (iv, stats.classify(iv, s.min_effect))
    gain = stats.interval(stats.weighted_rounds(per_bucket, s.weights), z)
    d = Decision("continue", "", rounds, gain, buckets)
    if rounds < s.min_rounds:
        d.reason = f"{rounds} of at least {s.min_rounds} rounds"
        return d
    limit = math.log1p(-s.max_regression)
    for b, (iv, _cls) in buckets.items():
        if iv.high < limit:  # significantly beyond the guardrail, not merely worse than A
            d.verdict = "keep"
            d.reason = (
                f"B is {_pct(iv.estimate)} at concurrency {b}, beyond the {s.max_regression:.0%} regression guardrail"
            )
            return d
    floor = math.log1p(s.min_effect)
    # Promotion also needs every bucket confidently inside the guardrail: one-sided 95% per bucket (the gain
    # itself carries the multiple-look correction). A bucket truly beyond it is then (almost) never promoted.
    z_guard = stats.normal_quantile(0.95)
    unsure = [b for b, xs in sorted(per_bucket.items()) if stats.interval(xs, z_guard).low <= limit]
    if gain.low > 0 and gain.estimate >= floor and not unsure:
        d.verdict = "promote"
        d.reason = (
            f"B gains {_pct(gain.estimate)} traffic-weighted ({_pct(gain.low)} to {_pct(gain.high)}) "
            f"after {rounds} rounds, with no bucket beyond the regression guardrail"
        )
    elif gain.high < floor:
        d.verdict = "keep"
        d.reason = (
            f"B cannot beat A by {s.min_effect:.0%}: weighted gain {_pct(gain.estimate)} "
            f"({_pct(gain.low)} to {_pct(gain.high)}) after {rounds} rounds"
        )
    elif rounds >= s.max_rounds:
        d.verdict = "inconclusive"
        d.reason = (
            f"after {rounds} rounds the weighted gain is {_pct(gain.estimate)} ({_pct(gain.low)} to "
            f"{_pct(gain.high)}): not certain either way, so A stays"
        )
    elif unsure and gain.low > 0:
        d.reason = (
            f"B gains {_pct(gain.estimate)} traffic-weighted, but concurrency {unsure[0]} may still be beyond the "
            f"{s.max_regression:.0%} regression guardrail"
        )
    else:
        d.reason = f"gain {_pct(gain.estimate)} ({_pct(gain.low)} to {_pct(gain.high)}) not certain yet"
    return d
