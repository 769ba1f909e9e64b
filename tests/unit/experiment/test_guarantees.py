"""The A/B decision rule's statistical guarantees, checked by seeded simulation (1,000 experiments per cell).

The noise model is perf/decision_quality.py's: per run (one sweep over the buckets) log-throughput = true
effect + D(t) + e, with D a slow Ornstein-Uhlenbeck drift shared by all buckets and e white noise per bucket,
6.5% run-to-run in all. Each experiment runs AB/BA rounds through ``design.decide`` until it stops, exactly
as ``knobfleet ab`` does. Seeds are fixed, so every rate below is a deterministic number; the bounds are the
ones the rule promises (issue 19), not the ones it happens to reach.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter

import pytest

from knobfleet.experiment import stats
from knobfleet.experiment.design import Settings, decide, order

TRIALS = 1000
SIGMA = 0.065  # run-to-run noise of one throughput measurement on a shared GPU
SIGMA_WHITE = 0.015
SIGMA_DRIFT = math.sqrt(SIGMA**2 - SIGMA_WHITE**2)
TAU = 20.0  # drift correlation time, in runs
W = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}


def pct(x: float) -> float:
    """A throughput change in percent as a log-ratio: +3% → ln(1.03)."""
    return math.log1p(x / 100)


def experiment(rng: random.Random, effects: dict[int, float], s: Settings) -> tuple[str, str, int]:
    """One ``knobfleet ab`` run against a machine where B's true log-effect per bucket is ``effects``:
    (verdict, reason, rounds)."""
    a = math.exp(-1 / TAU)
    drift = rng.gauss(0, SIGMA_DRIFT)
    per_bucket: dict[int, list[float]] = {b: [] for b in effects}
    for r in range(s.max_rounds):
        run: dict[str, dict[int, float]] = {}
        for arm in order(r):
            drift = a * drift + math.sqrt(1 - a * a) * SIGMA_DRIFT * rng.gauss(0, 1)
            run[arm] = {b: (e if arm == "B" else 0.0) + drift + rng.gauss(0, SIGMA_WHITE) for b, e in effects.items()}
        for b in effects:
            per_bucket[b].append(run["B"][b] - run["A"][b])
        d = decide(per_bucket, s)
        if d.final:
            return d.verdict, d.reason, d.rounds
    raise AssertionError("decide() did not stop at max_rounds")


def verdicts(effects: dict[int, float], s: Settings, seed: str) -> Counter[str]:
    """How often each verdict comes out of TRIALS experiments; "guardrail" counts the keeps it caused."""
    rng = random.Random(seed)
    out: Counter[str] = Counter()
    for _ in range(TRIALS):
        verdict, reason, _rounds = experiment(rng, effects, s)
        out[verdict] += 1
        out["guardrail"] += "regression guardrail" in reason and verdict == "keep"
    return out


def rate(c: Counter[str], verdict: str) -> float:
    return c[verdict] / TRIALS


def test_aa_false_promotion_at_most_2_percent() -> None:
    c = verdicts(dict.fromkeys(W, 0.0), Settings(weights=W), "aa")
    assert rate(c, "promote") <= 0.02, c  # measured: 0.9% (1.1% before the futility stop)
    assert c["promote"] + c["keep"] + c["inconclusive"] == TRIALS


def test_plus_3_percent_under_6_5_percent_noise_is_promoted_at_least_95_percent() -> None:
    c = verdicts(dict.fromkeys(W, pct(3)), Settings(weights=W), "plus3")
    assert rate(c, "promote") >= 0.95, c  # measured: 98.6% (99.3% before the futility stop)


def test_minus_3_percent_is_never_promoted() -> None:
    c = verdicts(dict.fromkeys(W, pct(-3)), Settings(weights=W), "minus3")
    assert rate(c, "promote") == 0, c
    assert rate(c, "keep") >= 0.95, c


class Uncorrected(Settings):
    """The rule without its multiple-look correction: every look uses the one-look z."""

    def z(self) -> float:
        return stats.normal_quantile(1 - self.alpha)


def test_the_multiple_look_correction_is_what_keeps_aa_false_promotion_low() -> None:
    corrected = verdicts(dict.fromkeys(W, 0.0), Settings(weights=W), "aa")
    naive = verdicts(dict.fromkeys(W, 0.0), Uncorrected(weights=W), "aa")
    assert rate(naive, "promote") > 0.08, naive  # measured: 12.1% (same seeds as the corrected rule)
    assert rate(naive, "promote") > 5 * rate(corrected, "promote")


def test_settings_z_is_bonferroni_over_the_looks() -> None:
    s = Settings(weights=W, min_rounds=3, max_rounds=15, alpha=0.05)
    assert s.z() == pytest.approx(stats.normal_quantile(1 - 0.05 / 13))
    assert Settings(weights=W, min_rounds=5, max_rounds=5).z() == pytest.approx(stats.normal_quantile(0.95))
    assert Settings(weights=W, min_rounds=9, max_rounds=5).z() == pytest.approx(stats.normal_quantile(0.95))


# --- the regression guardrail ------------------------------------------------------------------------------

GAINING = {48: pct(6), 64: pct(6), 80: pct(6)}  # B is 6% faster in three buckets out of four


@pytest.mark.parametrize("regression", [5, 10])
def test_a_bucket_beyond_the_guardrail_is_never_promoted(regression: int) -> None:
    s = Settings(weights=W)
    assert regression / 100 > s.max_regression
    c = verdicts({**GAINING, 96: pct(-regression)}, s, f"guard{regression}")
    # Promotion needs every bucket's one-sided 95% interval inside the guardrail. A stochastic rule cannot
    # promise zero: measured 0.6% (-5%) and under 0.5% (-10%); the rule before this bound was 34.7% at -5%.
    assert rate(c, "promote") <= 0.01, c


def test_a_bucket_far_beyond_the_guardrail_is_kept_almost_always() -> None:
    """What today's rule does hold: a bucket 10% worse (three times the guardrail) stops the experiment with
    keep, citing the guardrail, in ≥ 99% of experiments even when every other bucket gains 6%."""
    c = verdicts({**GAINING, 96: pct(-10)}, Settings(weights=W), "guard10")
    assert rate(c, "keep") >= 0.99, c  # measured: 99.9%


def test_guardrail_keeps_a_at_once_with_the_bucket_in_the_reason() -> None:
    rounds = 3
    per_bucket = {48: [pct(6)] * rounds, 64: [pct(6)] * rounds, 80: [pct(6)] * rounds, 96: [pct(-12)] * rounds}
    d = decide(per_bucket, Settings(weights=W))
    assert d.verdict == "keep" and d.final
    assert "concurrency 96" in d.reason and "-12.0%" in d.reason and "3% regression guardrail" in d.reason
    # the same data without the regressing bucket is a clear promote
    del per_bucket[96]
    assert decide(per_bucket, Settings(weights=W)).verdict == "promote"


def test_guardrail_ignores_a_regression_within_the_limit() -> None:
    per_bucket = {48: [pct(6)] * 8, 96: [pct(-2)] * 8}
    d = decide(per_bucket, Settings(weights={48: 0.9, 96: 0.1}))
    assert d.buckets[96][1] == "worse"  # significantly worse, but by less than max_regression
    assert d.verdict == "continue" and "may still be beyond the 3% regression guardrail" in d.reason
    per_bucket = {48: [pct(6)] * 12, 96: [pct(-2)] * 12}  # enough rounds to be sure it is inside
    assert decide(per_bucket, Settings(weights={48: 0.9, 96: 0.1})).verdict == "promote"


# --- traffic weights ---------------------------------------------------------------------------------------

# B is 6% faster at concurrency 48 and 1.5% slower at 96 (inside the 3% guardrail): whether it should be
# promoted depends only on which bucket carries the traffic.
SPLIT = {48: pct(6), 96: pct(-1.5)}


def test_weights_on_the_winning_bucket_promote() -> None:
    c = verdicts(SPLIT, Settings(weights={48: 0.9, 96: 0.1}), "heavy48")
    # measured: 78.8% (the rest inconclusive at the round budget, no guardrail keep). Before promotion
    # needed the losing bucket inside the guardrail with confidence it was ~91%: the power paid for the bound
    # that a bucket beyond the guardrail is (almost) never promoted.
    assert rate(c, "promote") >= 0.70, c


def test_weights_on_the_losing_bucket_do_not_promote() -> None:
    # weighted true gain -0.75%: promoting B is a false promotion, held to the A/A bound
    c = verdicts(SPLIT, Settings(weights={48: 0.1, 96: 0.9}), "heavy96")
    assert rate(c, "promote") <= 0.02, c  # measured: 0.3-0.9% over four seeds


def test_a_bucket_without_traffic_does_not_count_toward_the_gain() -> None:
    c = verdicts(SPLIT, Settings(weights={48: 0.0, 96: 1.0}), "only96")
    assert rate(c, "promote") <= 0.01, c


def test_a_bucket_inside_the_guardrail_never_trips_it() -> None:
    # The guardrail keeps A early only when a bucket is significantly beyond -max_regression (measured: 0.2%
    # of experiments for a bucket 2% worse, by chance over many looks; it was 12.8% when it fired on a bucket
    # significantly worse than 0 whose estimate was past the limit).
    c = verdicts({48: pct(6), 96: pct(-2)}, Settings(weights={48: 0.9, 96: 0.1}), "inside")
    assert rate(c, "guardrail") <= 0.01, c


def test_same_rounds_different_weights_different_verdict() -> None:
    rng = random.Random("weights")
    per_bucket = {
        48: [pct(6) + rng.gauss(0, 0.01) for _ in range(12)],
        96: [pct(-2) + rng.gauss(0, 0.01) for _ in range(12)],
    }
    towards_48 = decide(per_bucket, Settings(weights={48: 0.9, 96: 0.1}))
    towards_96 = decide(per_bucket, Settings(weights={48: 0.1, 96: 0.9}))
    assert towards_48.verdict == "promote"
    assert towards_96.verdict == "keep" and "cannot beat A by 1%" in towards_96.reason
    assert towards_48.gain is not None and towards_96.gain is not None
    assert towards_48.gain.estimate == pytest.approx(0.9 * pct(6) + 0.1 * pct(-2), abs=0.01)
    assert towards_96.gain.estimate == pytest.approx(0.1 * pct(6) + 0.9 * pct(-2), abs=0.01)


# --- nothing worth deciding: gains and losses that cancel --------------------------------------------------

# ctas768 against ctas512 on the stand-in's wave model (python/knobfleet/lab/sim/model.py, noise off): gains at
# C48 and C96 nearly cancel a loss at C64 beyond the guardrail; weighted -0.84% at the campaign's weights.
CANCEL = {48: pct(1.39), 64: pct(-4.36), 80: pct(-0.45), 96: pct(2.17)}


def outcomes(effects: dict[int, float], s: Settings, seed: str) -> list[tuple[str, str, int]]:
    rng = random.Random(seed)
    return [experiment(rng, effects, s) for _ in range(TRIALS)]


def test_cancelling_gains_and_losses_end_keep_well_before_the_budget() -> None:
    runs = outcomes(CANCEL, Settings(weights=W), "cancel")
    verdicts_ = Counter(v for v, _, _ in runs)
    rounds = sorted(n for _, _, n in runs)
    assert verdicts_["keep"] >= 0.95 * TRIALS, verdicts_  # measured: 100%
    assert verdicts_["promote"] <= 0.02 * TRIALS, verdicts_  # a false promotion: held to the A/A bound
    assert rounds[TRIALS // 2] <= 5 and rounds[int(0.9 * TRIALS)] <= 8, rounds  # measured: median 3, p90 6
    futile = [r for v, r, _ in runs if r.startswith("B cannot reach promotion")]
    assert len(futile) >= 0.8 * TRIALS  # measured: 93%; the rest the guardrail or "cannot beat A by 1%"
    assert all(r.endswith("pulls it down most") for r in futile)
    # the verdict names the bucket that drove it: C64 in 918 of 926 (C80, by noise, in the rest)
    assert sum("; concurrency 64 (" in r for r in futile) >= 0.95 * len(futile)


def test_without_the_futility_stop_the_same_experiments_run_out_the_budget() -> None:
    """The cause, pinned: keeping A otherwise needs proof of a negative at the multiple-look z (B below +1%, or
    C64 below -3%), which 15 rounds of this noise rarely give."""
    runs = outcomes(CANCEL, Settings(weights=W, futility=0.0), "cancel")
    assert sum(v == "inconclusive" for v, _, _ in runs) >= 0.2 * TRIALS  # measured: 29.7%
    assert statistics.mean(n for _, _, n in runs) >= 8  # measured: 10.3 rounds
