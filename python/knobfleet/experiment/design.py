"""The AB/BA schedule and the sequential stopping rule of ``knobfleet ab`` (pure).

Rounds alternate AB, BA, AB, … so linear drift cancels within each pair of rounds. After each round
from ``min_rounds`` on, the traffic-weighted log-ratio G gets an interval with a Bonferroni-corrected
z for the number of looks still possible (so peeking every round keeps the one-sided false-promote rate
at most ``alpha``):

* a guardrail fails (request errors, consistency failure, or a bucket significantly worse than
  ``-max_regression``) → ``keep`` A at once;
* the interval's low end is above 0 and G ≥ ``min_effect`` → ``promote`` B;
* the interval's high end is below ``min_effect`` → ``keep`` A (B cannot be better by a useful margin);
* futility: the chance that B still clears the promotion bar by the last possible round (the predictive
  probability of the weighted gain, below) is under ``futility`` → ``keep`` A (nothing left to decide:
  A stays whatever the remaining rounds show);
* otherwise run another round, up to ``max_rounds``; then ``inconclusive`` (A stays).

Why the futility bound (docs/PERFORMANCE.md, "Why the seed replay ran all 15 rounds"): the other two ways
to keep A ask for proof of a negative at the multiple-look z (2.665 for looks 3..15): that B is below +1%,
or that a bucket is below -3%. When B's gains and losses nearly cancel (weighted -0.8%, one bucket -4.4%),
that proof needs (2.665 x sigma / margin)^2 = 10 to 30 rounds of the lab's 2-3% per-round noise, beyond the
budget in a third of the stand-in replays, while the promotion bar (low end above 0 at that z by round 15)
is out of reach after a few rounds. The futility stop only ever ends experiments without promoting, so the
false-promote bound is untouched; its cost is power, which tests/unit/experiment/test_guarantees.py and
perf/decision_quality.py measure (0.9 points at +3%).

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
    futility: float = 0.05  # keep A once B's chance of clearing the promotion bar by max_rounds is below this

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
    promote_chance: float | None = None  # predictive probability of a promotion by max_rounds (None: not computed)
    driver: int | None = None  # the bucket that decided a keep (guardrail) or pulls the weighted gain down most

    @property
    def final(self) -> bool:
        return self.verdict != "continue"


def _pct(x: float) -> str:
    return f"{(math.exp(x) - 1) * 100:+.1f}%"


def promotion_bar(gain: stats.Interval, s: Settings) -> float:
    """The weighted mean log-ratio B needs at the last possible round to be promoted: the interval's low end
    above 0 at the multiple-look z (with today's noise estimate) and at least ``min_effect``."""
    return max(s.z() * gain.sigma / math.sqrt(max(s.max_rounds, gain.n)), math.log1p(s.min_effect))


def promotion_chance(gain: stats.Interval, s: Settings) -> float:
    """Predictive probability that the weighted gain clears ``promotion_bar`` at round ``max_rounds``, given
    ``gain.n`` rounds so far: with a flat prior on the true gain, the final mean of N rounds is normal around
    today's mean m with variance sigma^2 (N - k) / (N k) (what the remaining N - k rounds can still move it,
    plus today's uncertainty about the truth). 0 or 1 once no round is left."""
    k, n = gain.n, s.max_rounds
    bar = promotion_bar(gain, s)
    if k >= n:
        return 1.0 if gain.estimate >= bar and gain.low > 0 else 0.0
    sd = gain.sigma * math.sqrt((n - k) / (n * k))
    return 1 - stats.normal_cdf((bar - gain.estimate) / sd)


def driver(per_bucket: dict[int, list[float]], weights: dict[int, float]) -> int | None:
    """The bucket whose weighted contribution to the gain is lowest (the one that pulls it down most)."""
    shares = {b: weights.get(b, 0.0) * stats.mean(xs) for b, xs in per_bucket.items() if xs and weights.get(b, 0) > 0}
    return min(shares, key=lambda b: (shares[b], b)) if shares else None


def _driven(d: Decision, s: Settings) -> str:
    if d.driver is None or d.driver not in d.buckets:
        return ""
    iv = d.buckets[d.driver][0]
    if iv.estimate >= 0:
        return ""
    total = sum(w for b, w in s.weights.items() if b in d.buckets and w > 0)
    return (
        f"; concurrency {d.driver} ({_pct(iv.estimate)}, weight {s.weights[d.driver] / total:.2f}) pulls it down most"
    )


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
    d = Decision("continue", "", rounds, gain, buckets, driver=driver(per_bucket, s.weights))
    d.promote_chance = promotion_chance(gain, s)
    if rounds < s.min_rounds:
        d.reason = f"{rounds} of at least {s.min_rounds} rounds"
        return d
    limit = math.log1p(-s.max_regression)
    for b, (iv, _cls) in buckets.items():
        if iv.high < limit:  # significantly beyond the guardrail, not merely worse than A
            d.verdict, d.driver = "keep", b
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
            f"({_pct(gain.low)} to {_pct(gain.high)}) after {rounds} rounds" + _driven(d, s)
        )
    elif rounds >= s.max_rounds:
        d.verdict = "inconclusive"
        d.reason = (
            f"after {rounds} rounds the weighted gain is {_pct(gain.estimate)} ({_pct(gain.low)} to "
            f"{_pct(gain.high)}): not certain either way, so A stays"
        )
    elif d.promote_chance < s.futility:
        d.verdict = "keep"
        d.reason = (
            f"B cannot reach promotion within {s.max_rounds} rounds: weighted gain {_pct(gain.estimate)} "
            f"({_pct(gain.low)} to {_pct(gain.high)}) after {rounds} rounds, and the last round would need "
            f"{_pct(promotion_bar(gain, s))} (chance {d.promote_chance:.1%})" + _driven(d, s)
        )
    elif unsure and gain.low > 0:
        d.reason = (
            f"B gains {_pct(gain.estimate)} traffic-weighted, but concurrency {unsure[0]} may still be beyond the "
            f"{s.max_regression:.0%} regression guardrail"
        )
    else:
        d.reason = f"gain {_pct(gain.estimate)} ({_pct(gain.low)} to {_pct(gain.high)}) not certain yet"
    return d
