"""The crossover judge: the subsets swap roles, so a host effect enters the two periods with opposite signs and
cancels; the change is measured twice, so its noise counts a quarter; the first period only looks for a rollback."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet.experiment.canary import Settings, Window, crossover_interval, did_interval, judge

NOISE = [0.004, -0.006, 0.003, -0.002, 0.005, -0.004, 0.001, -0.003, 0.002, -0.001, 0.004, -0.005]


def _w(new: float, k: int, new_host: float, old_host: float) -> Window:
    """One window: the new side's hosts at ``new_host`` speed running a profile ``new`` times as fast, the current
    side's at ``old_host``."""
    c = 100.0 * new_host * new * math.exp(NOISE[k % len(NOISE)])
    b = 100.0 * old_host
    return Window({"tput": {"n": c}, "itl": {"n": 1 / c}}, {"tput": {"o": b}, "itl": {"o": 1 / b}}, 200, 200)


def _canary(change: float, canary_host: float, n1: int, n2: int) -> tuple[list[Window], list[Window], list[Window]]:
    """(pre-period, first period, second period): the canary host at ``canary_host``, the baseline's at 1."""
    pre = [_w(1.0, k, canary_host, 1.0) for k in range(3)]
    first = [_w(change, k + 3, canary_host, 1.0) for k in range(n1)]
    second = [_w(change, k + 3 + n1, 1.0, canary_host) for k in range(n2)]  # swapped: the baseline runs it
    return pre, first, second


@given(
    st.floats(min_value=0.8, max_value=1.25),
    st.floats(min_value=0.9, max_value=1.1),
    st.integers(min_value=1, max_value=10),
    st.integers(min_value=1, max_value=10),
)
def test_a_host_effect_cancels_whatever_its_size(host: float, change: float, n1: int, n2: int) -> None:
    """Without noise the crossover's estimate is the change itself, whichever host is slower and by how much."""
    first = [math.log(change) + math.log(host)] * n1
    second = [math.log(change) - math.log(host)] * n2
    iv = crossover_interval(first, second, 2.0, Settings())
    assert iv.estimate == pytest.approx(math.log(change), abs=1e-12)
    assert iv.low < iv.estimate < iv.high and iv.n == n1 + n2


def test_the_noise_counts_a_quarter_of_the_did_s_and_the_walk_is_carried() -> None:
    s = Settings(walk_prior=0.0)
    a, b = [0.01 + n for n in NOISE[:6]], [0.01 - n for n in NOISE[6:12]]
    cross, did = crossover_interval(a, b, 1.0, s), did_interval(a, b, 1.0, s)
    assert cross.sigma == pytest.approx(did.sigma)  # the same pooled sd of one window
    assert (cross.high - cross.estimate) ** 2 == pytest.approx(
        cross.sigma**2 * (1 / 6 + 1 / 6) / 4 + 0.0, rel=0.5
    )  # the walk read from these windows is small; the quarter is the bulk
    walked = crossover_interval(a, b, 1.0, Settings(walk_prior=0.02))
    assert walked.high - walked.estimate > cross.high - cross.estimate
    with pytest.raises(ValueError, match="both periods"):
        crossover_interval(a, [], 1.0, s)


@pytest.mark.parametrize(
    ("change", "host", "verdict", "reason"),
    [
        (1.0, 0.92, "promote", "0.0% (at least -1.8%)"),  # the slow host a canary
        (1.0, 1 / 0.92, "promote", "0.0% (at least -1.8%)"),  # the slow host in the baseline
        (0.95, 1 / 0.92, "rollback", "tput is -5.0% on the canaries"),  # 5% worse next to a slow baseline
        (0.95, 0.92, "rollback", "tput is -5.0% on the canaries"),
    ],
)
def test_the_second_period_judges_the_change_not_the_hosts(
    change: float, host: float, verdict: str, reason: str
) -> None:
    pre, first, second = _canary(change, host, 6, 10)
    v = None
    for k in range(1, 11):
        v = judge(first, Settings(), pre, second[:k])
        if v.final:
            break
    assert v is not None and v.verdict == verdict, v.reason
    assert reason in v.reason and v.crossed == k and v.windows == 6 + k


def test_the_first_period_never_promotes_and_rolls_a_clear_regression_back() -> None:
    pre, first, _ = _canary(1.0, 1.0, 6, 0)
    v = judge(first, Settings(), pre)
    assert (
        v.verdict == "continue" and v.reason.startswith("first period: tput ") and "0.0% (-5.2% to +5.4%)" in v.reason
    )
    pre, bad, _ = _canary(0.55, 1.0, 3, 0)
    v = judge(bad, Settings(), pre)
    assert v.verdict == "rollback" and v.reason.startswith("tput is -45.0% on the canaries") and v.crossed == 0
    # no pre-period: the subsets compared directly, for a clear rollback only
    assert judge(bad, Settings()).verdict == "rollback"
    assert judge(first, Settings()).verdict == "continue"


def test_a_quiet_second_period_is_inconclusive_at_its_end_and_settings_are_checked() -> None:
    pre, first, second = _canary(1.0, 1.0, 6, 10)
    quiet = [Window(w.canary, w.baseline, 5, 5) for w in second]
    assert judge(first, Settings(), pre, quiet[:9]).verdict == "continue"
    v = judge(first, Settings(), pre, quiet)
    assert v.verdict == "inconclusive" and v.reason == "too little traffic for a verdict: 5 requests in window, need 20"
    assert Settings().check() is None and Settings(design="did", max_windows=4).check() is None
    assert Settings(max_windows=8).check() == (
        "max_windows 8 leaves 2 window(s) after the swap at 6; the second period needs at least 3 (raise --max-windows)"
    )
    assert Settings(design="abba").check() == "design 'abba': use crossover or did"
