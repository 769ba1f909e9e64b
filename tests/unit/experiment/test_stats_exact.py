"""The A/B statistics and decision rule to the digit: quantiles on every branch, the shrunk noise estimate,
interval arithmetic, classification boundaries, weighting, and every verdict's reason text."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from knobfleet.experiment import stats
from knobfleet.experiment.design import Decision, Settings, decide, driver, promotion_bar, promotion_chance

W = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}


@pytest.mark.parametrize(
    "p", [1e-12, 1e-6, 0.001, 0.0242, 0.02425, 0.1, 0.3, 0.5, 0.7, 0.97575, 0.9758, 0.999, 1 - 1e-9]
)
def test_normal_quantile_matches_the_inverse_cdf_on_every_branch(p: float) -> None:
    assert stats.normal_quantile(p) == pytest.approx(NormalDist().inv_cdf(p), abs=1e-8)


@pytest.mark.parametrize("p", [0.0, 1.0, -0.1, 1.5])
def test_normal_quantile_outside_0_1(p: float) -> None:
    with pytest.raises(ValueError, match=r"^p must be in \(0, 1\)$"):
        stats.normal_quantile(p)


def test_mean_and_log_ratio() -> None:
    assert stats.mean([1.0, 2.0, 6.0]) == 3.0
    with pytest.raises(ValueError, match=r"^no observations$"):
        stats.mean([])
    assert stats.log_ratio(2.0, 1.0) == pytest.approx(-math.log(2))
    for a, b in ((1.0, 0.0), (-1.0, 1.0), (1.0, -2.0)):
        with pytest.raises(ValueError, match=rf"^throughput must be > 0 \(got A={a}, B={b}\)$"):
            stats.log_ratio(a, b)


def test_shrunk_sigma_pools_the_sample_with_the_prior() -> None:
    xs = [0.1, 0.2, 0.3]
    ss = 0.02
    assert stats.shrunk_sigma(xs) == pytest.approx(math.sqrt((4 * 0.03**2 + ss) / (4 + 2)))
    assert stats.shrunk_sigma(xs, prior=0.05, weight=2.0, floor=0.0) == pytest.approx(math.sqrt((2 * 0.0025 + ss) / 4))
    assert stats.shrunk_sigma(xs, floor=1.0) == 1.0
    assert stats.shrunk_sigma([0.3], prior=0.02) == pytest.approx(0.02)  # one round: the prior alone


def test_interval_arithmetic() -> None:
    xs = [0.01, 0.03, 0.05, 0.07]
    iv = stats.interval(xs, 2.0)
    s = stats.shrunk_sigma(xs)
    assert iv.estimate == pytest.approx(0.04) and (iv.n, iv.sigma) == (4, s)
    assert iv.low == pytest.approx(0.04 - 2.0 * s / 2) and iv.high == pytest.approx(0.04 + 2.0 * s / 2)
    assert iv.ratio == pytest.approx(math.exp(0.04))
    assert list(iv.as_ratios()) == pytest.approx([math.exp(0.04), math.exp(iv.low), math.exp(iv.high)])


def test_classify_boundaries_are_strict() -> None:
    m = math.log1p(0.01)

    def cls(low: float, high: float) -> str:
        return stats.classify(stats.Interval((low + high) / 2, low, high, 3, 0.03), 0.01)

    assert cls(-m / 2, m / 2) == "same"
    assert cls(-m, m / 2) == "inconclusive"  # touching the band is not inside it
    assert cls(-m / 2, m) == "inconclusive"
    assert cls(0.0, 0.05) == "inconclusive" and cls(1e-9, 0.05) == "better"
    assert cls(-0.05, 0.0) == "inconclusive" and cls(-0.05, -1e-9) == "worse"


def test_weighted_rounds() -> None:
    per = {48: [0.1, 0.2, 0.3], 96: [0.5, 0.6], 7: [9.0, 9.0]}
    out = stats.weighted_rounds(per, {48: 3.0, 96: 1.0, 7: 0.0})
    assert out == [pytest.approx(0.75 * 0.1 + 0.25 * 0.5), pytest.approx(0.75 * 0.2 + 0.25 * 0.6)]
    assert stats.weighted_rounds({48: [0.1]}, {48: 5.0, 96: 5.0}) == [pytest.approx(0.1)]
    with pytest.raises(ValueError, match=r"^no bucket has a positive weight$"):
        stats.weighted_rounds({48: [0.1]}, {48: 0.0, 96: -1.0})


# --- the decision rule's verdicts and reasons --------------------------------------------------------------


def const(x: float, n: int, buckets: dict[int, float] = W) -> dict[int, list[float]]:
    return {b: [x] * n for b in buckets}


def test_no_rounds_yet() -> None:
    d = decide({}, Settings(weights=W))
    assert (d.verdict, d.reason, d.rounds, d.gain, d.buckets, d.final) == (
        "continue",
        "no rounds yet",
        0,
        None,
        {},
        False,
    )


def test_errors_and_consistency_reasons() -> None:
    s = Settings(weights=W)
    d = decide(const(0.1, 5), s, errors=3)
    assert (d.verdict, d.rounds, d.final) == ("keep", 5, True)
    assert d.reason == "B had 3 failed requests; a profile that drops requests is never promoted"
    d = decide(const(0.1, 5), s, consistency_ok=False)
    assert d.reason == "B's outputs under load differ from its serial outputs (consistency check failed)"
    assert (d.verdict, d.rounds, d.gain) == ("keep", 5, None)


def test_before_min_rounds_the_intervals_are_reported_but_nothing_decided() -> None:
    d = decide(const(math.log(1.5), 2), Settings(weights=W, min_rounds=3))
    assert (d.verdict, d.reason, d.rounds) == ("continue", "2 of at least 3 rounds", 2)
    assert d.gain is not None and set(d.buckets) == set(W)
    assert decide(const(math.log(1.5), 3), Settings(weights=W, min_rounds=3)).verdict == "promote"


def test_promote_reason() -> None:
    d = decide(const(math.log(1.05), 6), Settings(weights=W))
    assert d.verdict == "promote" and d.final
    assert d.gain is not None
    lo, hi = (math.exp(d.gain.low) - 1) * 100, (math.exp(d.gain.high) - 1) * 100
    assert d.reason == (
        f"B gains +5.0% traffic-weighted ({lo:+.1f}% to {hi:+.1f}%) after 6 rounds, with no bucket beyond the "
        "regression guardrail"
    )
    assert all(cls == "better" for _, cls in d.buckets.values())


def test_a_significant_gain_below_min_effect_is_not_promoted() -> None:
    s = Settings(weights=W, min_effect=0.05, max_rounds=40)
    d = decide(const(math.log(1.03), 40), s)  # certainly > 0, but under 5%
    assert d.gain is not None and d.gain.low > 0
    assert d.verdict == "keep" and d.reason.startswith("B cannot beat A by 5%: weighted gain +3.0% (")
    assert d.reason.endswith(") after 40 rounds")


def test_inconclusive_at_max_rounds_and_continue_before() -> None:
    s = Settings(weights=W, max_rounds=6, futility=0.0)  # futility off: the budget alone ends it
    noisy = {b: [0.05, -0.03, 0.04, -0.02, 0.05, -0.03] for b in W}
    d = decide(noisy, s)
    assert d.verdict == "inconclusive" and d.reason.startswith("after 6 rounds the weighted gain is +")
    assert d.reason.endswith(": not certain either way, so A stays")
    d = decide({b: v[:5] for b, v in noisy.items()}, s)
    assert d.verdict == "continue" and d.reason.startswith("gain +") and d.reason.endswith(" not certain yet")


def test_guardrail_needs_the_bucket_beyond_the_limit_not_just_worse() -> None:
    per = const(math.log(1.06), 10)
    per[96] = [math.log(0.98)] * 10  # significantly worse, inside the 3% guardrail
    assert decide(per, Settings(weights=W)).verdict == "promote"
    per[96] = [math.log(0.96)] * 10  # beyond the guardrail, but not yet certainly: no promotion, no keep yet
    assert decide(per, Settings(weights=W)).verdict == "continue"
    per[96] = [math.log(0.90)] * 10
    d = decide(per, Settings(weights=W))
    assert d.verdict == "keep" and d.reason == ("B is -10.0% at concurrency 96, beyond the 3% regression guardrail")
    per[96] = [math.log(0.98)] * 10
    assert decide(per, Settings(weights=W, max_regression=0.05)).verdict == "promote"


def test_decision_final() -> None:
    assert Decision("keep", "", 1).final and not Decision("continue", "", 1).final


# --- the futility bound ------------------------------------------------------------------------------------


def test_promotion_bar_is_the_last_rounds_lower_bound_or_min_effect() -> None:
    s = Settings(weights=W)  # 15 rounds, z = 2.66529 (alpha 5% over 13 looks)
    iv = stats.Interval(0.0, -0.01, 0.01, 3, 0.03)
    assert promotion_bar(iv, s) == pytest.approx(s.z() * 0.03 / math.sqrt(15))  # 2.06% > ln(1.01)
    quiet = stats.Interval(0.0, -0.001, 0.001, 3, 0.01)
    assert promotion_bar(quiet, s) == pytest.approx(math.log1p(0.01))  # 0.69% < 1%: the useful margin rules


@pytest.mark.parametrize(
    ("estimate", "k", "chance"),
    [
        # final mean ~ N(m, s^2 (N-k) / (N k)); bar = 2.6737 * 0.03 / sqrt(15) = 0.020645
        (0.0, 3, 1 - NormalDist().cdf(0.020645 / (0.03 * math.sqrt(12 / 45)))),
        (-0.01, 6, 1 - NormalDist().cdf(0.030645 / (0.03 * math.sqrt(9 / 90)))),
        (0.03, 3, 1 - NormalDist().cdf(-0.009355 / (0.03 * math.sqrt(12 / 45)))),
    ],
)
def test_promotion_chance_is_the_predictive_probability_at_the_last_round(
    estimate: float, k: int, chance: float
) -> None:
    iv = stats.Interval(estimate, estimate - 0.05, estimate + 0.05, k, 0.03)
    assert promotion_chance(iv, Settings(weights=W)) == pytest.approx(chance, abs=1e-4)


def test_promotion_chance_once_no_round_is_left_is_the_verdict() -> None:
    s = Settings(weights=W, max_rounds=4)
    assert promotion_chance(stats.Interval(0.05, 0.01, 0.09, 4, 0.03), s) == 1.0
    assert promotion_chance(stats.Interval(0.05, -0.01, 0.11, 4, 0.03), s) == 0.0
    assert promotion_chance(stats.Interval(0.005, 0.001, 0.009, 4, 0.03), s) == 0.0  # below min_effect


def test_futility_keeps_a_with_the_driving_bucket_named() -> None:
    # the seed replay's shape: gains at 48/96 cancel a loss at 64 (rounds alternate a little around each value)
    per = {
        48: [pct(1.4) + d for d in (0.01, -0.01, 0.01)],
        64: [pct(-4.4) + d for d in (0.01, -0.01, 0.01)],
        80: [pct(-0.5) + d for d in (0.01, -0.01, 0.01)],
        96: [pct(2.2) + d for d in (0.01, -0.01, 0.01)],
    }
    d = decide(per, Settings(weights=W))
    assert d.verdict == "keep" and d.final and d.driver == 64
    assert d.promote_chance is not None and d.promote_chance < 0.05
    assert d.reason.startswith("B cannot reach promotion within 15 rounds: weighted gain -0.5% (")
    # the bar: z * sigma / sqrt(15) with sigma the pooled 2.54% of these rounds
    assert d.reason.endswith(
        "the last round would need +1.8% (chance 4.1%); concurrency 64 (-4.1%, weight 0.30) pulls it down most"
    )
    # the same rounds, futility off: nothing is decided yet
    assert decide(per, Settings(weights=W, futility=0.0)).verdict == "continue"


def test_futility_waits_while_a_promotion_is_still_possible() -> None:
    per = const(pct(1.5), 3)  # +1.5% after 3 quiet rounds: the bar at round 15 is reachable
    per = {b: [x + d for x, d in zip(xs, (0.02, -0.02, 0.0), strict=True)] for b, xs in per.items()}
    d = decide(per, Settings(weights=W))
    assert d.verdict == "continue" and d.promote_chance is not None and d.promote_chance > 0.05


def test_the_driver_is_the_bucket_with_the_lowest_weighted_share() -> None:
    assert driver({48: [0.02], 64: [-0.04], 96: [-0.1]}, {48: 0.3, 64: 0.6, 96: 0.1}) == 64  # -2.4% < -1%
    assert driver({48: [0.02], 96: [-0.1]}, {48: 0.3, 96: 0.0}) == 48  # no weight, no say
    assert driver({}, W) is None


def pct(x: float) -> float:
    return math.log1p(x / 100)
