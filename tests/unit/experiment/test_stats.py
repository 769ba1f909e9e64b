from __future__ import annotations

import math
import random

import pytest

from knobfleet.experiment import stats
from knobfleet.experiment.design import Settings, decide, order

W = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}


def test_normal_quantile_known_values() -> None:
    assert stats.normal_quantile(0.975) == pytest.approx(1.959964, abs=1e-5)
    assert stats.normal_quantile(0.5) == pytest.approx(0.0, abs=1e-9)
    assert stats.normal_quantile(0.001) == pytest.approx(-3.090232, abs=1e-5)


def test_log_ratio_and_bad_input() -> None:
    assert stats.log_ratio(100, 103) == pytest.approx(math.log(1.03))
    with pytest.raises(ValueError, match="throughput must be > 0"):
        stats.log_ratio(0, 1)


def test_zero_variance_cannot_shrink_the_interval_below_the_prior() -> None:
    xs = [0.02] * 3  # three identical rounds: a naive estimate would claim certainty
    iv = stats.interval(xs, 1.96)
    assert iv.sigma == pytest.approx(math.sqrt(4 * 0.03**2 / (4 + 2)))
    assert iv.low < 0.02 < iv.high and iv.high - iv.low > 0.04


def test_floor_applies_to_many_identical_rounds() -> None:
    assert stats.shrunk_sigma([0.0] * 10_000) == stats.FLOOR_SIGMA


def test_one_observation_uses_the_prior() -> None:
    assert stats.shrunk_sigma([0.5]) == pytest.approx(stats.PRIOR_SIGMA)


@pytest.mark.parametrize(
    ("low", "high", "cls"),
    [
        (0.001, 0.005, "same"),
        (0.005, 0.05, "better"),
        (-0.05, -0.02, "worse"),
        (-0.02, 0.04, "inconclusive"),
        (-0.03, -0.001, "worse"),
        (-0.009, 0.009, "same"),
    ],
)
def test_classify(low: float, high: float, cls: str) -> None:
    assert stats.classify(stats.Interval((low + high) / 2, low, high, 5, 0.03), 0.01) == cls


def test_weighted_rounds_renormalises_to_present_buckets() -> None:
    assert stats.weighted_rounds({64: [0.1, 0.2]}, W) == [pytest.approx(0.1), pytest.approx(0.2)]
    with pytest.raises(ValueError, match="no bucket has a positive weight"):
        stats.weighted_rounds({7: [0.1]}, W)


def test_order_alternates() -> None:
    assert [order(i) for i in range(3)] == [("A", "B"), ("B", "A"), ("A", "B")]


def rounds(
    effect: float, n: int, sd: float, seed: int, buckets: dict[int, float] | None = None
) -> dict[int, list[float]]:
    rng = random.Random(seed)
    return {b: [effect + rng.gauss(0, sd) for _ in range(n)] for b in (buckets or W)}


def test_clear_gain_is_promoted_with_reason() -> None:
    d = decide(rounds(math.log(1.05), 6, 0.01, 1), Settings(weights=W))
    assert d.verdict == "promote" and d.reason.startswith("B gains +5.")


def test_clear_loss_keeps_a_via_guardrail() -> None:
    d = decide(rounds(math.log(0.9), 4, 0.01, 2), Settings(weights=W))
    assert d.verdict == "keep" and "regression guardrail" in d.reason


def test_one_bucket_regression_blocks_promotion() -> None:
    data = rounds(math.log(1.06), 8, 0.005, 3)
    data[96] = [math.log(0.93) + x * 0 for x in data[96]]
    d = decide(data, Settings(weights=W))
    assert d.verdict == "keep" and "concurrency 96" in d.reason


def test_aa_tie_is_never_promoted_and_ends_inconclusive_or_keep() -> None:
    s = Settings(weights=W)
    d = decide(rounds(0.0, s.max_rounds, 0.03, 4), s)
    assert d.verdict in ("keep", "inconclusive")


def test_errors_and_consistency_reject_immediately() -> None:
    s = Settings(weights=W)
    assert decide({}, s, errors=3).verdict == "keep"
    assert "consistency" in decide({}, s, consistency_ok=False).reason


def test_too_few_rounds_continue() -> None:
    d = decide(rounds(math.log(1.2), 2, 0.001, 5), Settings(weights=W))
    assert d.verdict == "continue" and d.reason == "2 of at least 3 rounds"


def test_single_bucket_experiment() -> None:
    d = decide(rounds(math.log(1.04), 10, 0.01, 6, {64: 1.0}), Settings(weights={64: 1.0}))
    assert d.verdict == "promote" and set(d.buckets) == {64} and d.buckets[64][1] == "better"
