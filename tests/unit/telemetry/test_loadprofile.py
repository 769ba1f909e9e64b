"""Weights from live running-request samples: nearest bucket, idle and out-of-range samples apart, rounding."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet.telemetry.loadprofile import LoadProfileError, profile

B = [48, 64, 80, 96]


def test_nearest_bucket_ties_to_the_lower() -> None:
    samples = [48] * 10 + [56] * 10 + [57] * 10 + [72] * 10 + [100] * 10  # 56 and 72 are ties
    p = profile(samples, B, min_samples=1)
    assert p.weights == {48: 0.4, 64: 0.4, 80: 0.0, 96: 0.2}
    assert (p.samples, p.in_range, p.idle, p.below, p.above) == (50, 50, 0, 0, 0)
    assert p.weights_arg() == "48=0.40,64=0.40,80=0.00,96=0.20"


def test_idle_and_out_of_range_are_counted_apart() -> None:
    samples = [0.0] * 5 + [math.nan] * 2 + [10.0] * 3 + [39.9, 40.0] + [103.9, 104.0] + [64.0] * 30
    p = profile(samples, B)
    assert (p.idle, p.below, p.above, p.in_range) == (7, 4, 1, 32)
    assert p.weights[48] == pytest.approx(1 / 32) and p.weights[96] == pytest.approx(1 / 32)


def test_too_little_load_says_how_much_there_was() -> None:
    with pytest.raises(LoadProfileError) as info:
        profile([0.0] * 100 + [64.0] * 5, B)
    assert str(info.value) == (
        "too little load for weights: 5 of 105 samples near the buckets [48, 64, 80, 96] (100 idle, 0 below, "
        "0 above), need 30; widen --window or send traffic"
    )


def test_a_load_held_at_48_80_puts_its_mass_there() -> None:
    samples = [52.0, 60.0, 66.0, 70.0, 77.0] * 20 + [90.0] * 10 + [30.0] * 5
    p = profile(samples, B)
    assert p.mass_between(48, 80) >= 0.8


@given(st.lists(st.floats(min_value=0, max_value=200, allow_nan=False), min_size=40, max_size=400))
def test_weights_sum_to_one_and_the_argument_too(samples: list[float]) -> None:
    try:
        p = profile(samples, B, min_samples=1)
    except LoadProfileError:
        return
    assert sum(p.weights.values()) == pytest.approx(1.0)
    assert sum(float(kv.split("=")[1]) for kv in p.weights_arg().split(",")) == pytest.approx(1.0)
    assert p.in_range + p.idle + p.below + p.above == p.samples == len(samples)
