"""The A/B decision rule (experiment/design.py) at its exact boundaries, and the bucket that drives a keep in its
corner cases: a bucket the weights leave out, a bucket without rounds, weights that do not sum to 1. Written
against the fixed mutation sample's survivors (issue 58, docs/TESTING.md)."""

from __future__ import annotations

import math

import pytest

from knobfleet.experiment import stats
from knobfleet.experiment.design import Decision, Settings, _driven, decide, driver

W = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}
NOISE = (0.01, -0.01, 0.0, 0.005)


def pct(x: float) -> float:
    return math.log1p(x / 100)


# --- driver(): the bucket that pulls the weighted gain down most ------------------------------------------------


@pytest.mark.parametrize(
    ("per_bucket", "weights", "want"),
    [
        # a bucket the weights do not name has no say, as one weighted 0 has none
        ({48: [0.02], 99: [-0.1]}, {48: 0.3}, 48),
        ({99: [-0.1]}, {48: 0.3}, None),
        # a bucket without rounds yet has no say (and no mean to take)
        ({48: [0.02], 64: []}, {48: 0.3, 64: 0.6}, 48),
        ({48: [], 64: []}, {48: 0.3, 64: 0.6}, None),
        # ties go to the lowest concurrency
        ({80: [-0.02], 48: [-0.02]}, {48: 0.5, 80: 0.5}, 48),
    ],
)
def test_driver_corner_cases(per_bucket: dict[int, list[float]], weights: dict[int, float], want: int | None) -> None:
    assert driver(per_bucket, weights) == want


# --- the driver's line in a keep's reason ------------------------------------------------------------------------


def kept(per_bucket: dict[int, list[float]], weights: dict[int, float]) -> Decision:
    d = decide(per_bucket, Settings(weights=weights))
    assert d.verdict == "keep" and d.reason.startswith("B cannot "), d.reason  # beat A by 1% / reach promotion
    return d


@pytest.mark.parametrize(
    ("weights", "suffix"),
    [
        # the weight shown is the driver's share of the weights of the buckets measured: 0.3 / 0.6, not 0.3 of 1
        ({48: 0.3, 64: 0.3, 96: 0.4}, "; concurrency 64 (-4.3%, weight 0.50) pulls it down most"),
        ({48: 0.9, 64: 0.9}, "; concurrency 64 (-4.3%, weight 0.50) pulls it down most"),
        ({48: 0.1, 64: 0.3, 96: 0.0}, "; concurrency 64 (-4.3%, weight 0.75) pulls it down most"),
    ],
)
def test_the_driver_s_weight_is_its_share_of_the_buckets_measured(weights: dict[int, float], suffix: str) -> None:
    per = {48: [pct(0.5) + d for d in NOISE], 64: [pct(-4.4) + d for d in NOISE]}
    d = kept(per, weights)
    assert d.driver == 64 and d.reason.endswith(suffix)


def test_a_driver_that_gains_is_not_named() -> None:
    # every bucket exactly level with A: the driver (the lowest concurrency, all shares 0.0) pulls nothing down
    d = kept({b: [0.0] * 10 for b in W}, W)
    assert d.driver == 48 and d.buckets[48][0].estimate == 0.0
    assert d.reason.endswith("(chance 0.0%)")


@pytest.mark.parametrize("driving", [None, 64])
def test_no_driver_line_without_a_measured_driver(driving: int | None) -> None:
    # _driven's guard: no driver, or one that is not among the decision's buckets (decide never makes one; a
    # Decision built elsewhere can)
    iv = stats.Interval(-0.05, -0.08, -0.02, 3, 0.03)
    assert _driven(Decision("keep", "", 3, iv, {48: (iv, "worse")}, driver=driving), Settings(weights=W)) == ""


# --- the per-bucket guardrail at its exact boundary -----------------------------------------------------------


def guardrail_at(low: float) -> float:
    """A ``max_regression`` whose guardrail ``log1p(-max_regression)`` is exactly ``low`` (None: no float has it)."""
    m = -math.expm1(low)
    for _ in range(8):
        for c in (m, *(math.nextafter(m, t) for t in (0.0, 1.0))):
            if math.log1p(-c) == low:
                return c
        m = math.nextafter(m, 1.0)
    raise AssertionError(f"no max_regression puts the guardrail at {low!r}")


@pytest.mark.parametrize(
    ("where", "verdict"),
    [
        ("at", "continue"),  # one-sided 95% low end exactly on the guardrail: not confidently inside it
        ("inside", "promote"),  # the guardrail one step lower: inside it, and B's gain is certain
    ],
)
def test_a_bucket_exactly_on_the_guardrail_is_not_yet_inside_it(where: str, verdict: str) -> None:
    per = {b: [pct(5) + d for d in NOISE] for b in (48, 64, 80)}
    per[96] = [pct(-1.5) + d for d in (0.02, -0.02, 0.0, 0.01)]
    low = stats.interval(per[96], stats.normal_quantile(0.95)).low
    m = guardrail_at(low)
    if where == "inside":
        m = math.nextafter(m, 1.0)
        assert math.log1p(-m) < low
    d = decide(per, Settings(weights=W, max_regression=m))
    assert d.verdict == verdict
    if verdict == "continue":
        assert d.reason.endswith(f"but concurrency 96 may still be beyond the {m:.0%} regression guardrail")


# --- the weighted gain's low end exactly at 0 ---------------------------------------------------------------------


def gain_low_at_zero() -> dict[int, list[float]]:
    """Rounds whose weighted gain has its low end exactly at 0.0 (48/64/80 shifted by bisection), with 96 noisy
    enough to be unsure about the guardrail."""

    def per(g: float) -> dict[int, list[float]]:
        out = {b: [g + d for d in NOISE] for b in (48, 64, 80)}
        out[96] = [pct(-1.5) + d for d in (0.02, -0.02, 0.0, 0.01)]
        return out

    def low(g: float) -> float:
        gain = decide(per(g), Settings(weights=W)).gain
        assert gain is not None
        return gain.low

    lo, hi = 0.0, 0.2
    while (mid := (lo + hi) / 2) not in (lo, hi):
        lo, hi = (mid, hi) if low(mid) < 0 else (lo, mid)
    g = next((x for x in (lo, hi) if low(x) == 0.0), None)
    assert g is not None, "no shift puts the gain's low end exactly at 0"
    return per(g)


def test_a_gain_whose_low_end_is_exactly_0_is_not_a_gain_yet() -> None:
    d = decide(gain_low_at_zero(), Settings(weights=W))
    assert d.gain is not None and d.gain.low == 0.0 and d.gain.estimate > 0
    assert d.verdict == "continue"
    # not "B gains ..., but concurrency 96 may still be beyond the guardrail": a low end of 0 is no gain
    assert d.reason.startswith("gain +3.2% (+0.0% to ") and d.reason.endswith(") not certain yet")
