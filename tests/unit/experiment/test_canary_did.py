"""The difference-in-differences judge: a host effect cancels, the pre-period's noise widens the interval, quiet
pre-periods are refused with their counts, and the router's error rate is a guardrail."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet.experiment import stats
from knobfleet.experiment.canary import (
    Settings,
    Window,
    did_interval,
    interval,
    judge,
    pre_period_shortfall,
    walk_variance,
)

NOISE = [0.004, -0.006, 0.003, -0.002, 0.005, -0.004, 0.001, -0.003, 0.002, -0.001, 0.004, -0.005]


def _w(ratio: float, k: int, host: float = 1.0, requests: int = 200, router: tuple[int, int] = (0, 0)) -> Window:
    c = 100.0 * host * ratio * math.exp(NOISE[k % len(NOISE)])
    return Window(
        {"tput": {"lab1": c}, "itl": {"lab1": 1 / c}},
        {"tput": {"lab2": 100.0}, "itl": {"lab2": 1 / 100.0}},
        requests,
        requests,
        router_requests=router[0],
        router_errors=router[1],
    )


def test_a_host_effect_cancels_on_either_side() -> None:
    s = Settings(max_regression=0.05, design="did")
    for host in (0.92, 1 / 0.92):
        pre = [_w(1.0, k, host) for k in range(4)]
        same = judge([_w(1.0, k + 4, host) for k in range(12)], s, pre)
        assert same.verdict == "promote", same.reason
        assert abs(same.intervals["tput"].estimate) < 0.005 and same.pre == 4
        # without the pre-period the same windows read as the host's own speed
        plain = judge([_w(1.0, k + 4, host) for k in range(12)], s)
        assert plain.verdict == ("rollback" if host < 1 else "promote")
    worse = judge([_w(0.95, k + 4, 1 / 0.92) for k in range(12)], s, [_w(1.0, k, 1 / 0.92) for k in range(4)])
    assert worse.verdict == "rollback" and worse.reason.startswith("tput is -5.0% on the canaries")


def test_the_interval_carries_the_pre_periods_variance() -> None:
    s = Settings()
    post = [0.01 + n for n in NOISE]
    pre = [n * 2 for n in NOISE[:4]]
    iv = did_interval(post, pre, 3.0, s)
    ss = sum((x - sum(post) / 12) ** 2 for x in post) + sum((y - sum(pre) / 4) ** 2 for y in pre)
    sigma = max(math.sqrt((s.sigma_prior_weight * stats.PRIOR_SIGMA**2 + ss) / (s.sigma_prior_weight + 14)), 0.01)
    assert iv.estimate == pytest.approx(sum(post) / 12 - sum(pre) / 4)
    assert iv.sigma >= sigma  # inflated for correlation, never below the pooled sd
    walk = walk_variance([post, pre], s)
    assert walk > 0  # never below the prior's share
    assert iv.high - iv.estimate == pytest.approx(3.0 * math.sqrt(iv.sigma**2 * (1 / 12 + 1 / 4) + walk * 16 / 3))
    # the same judged windows with a one-sided interval are narrower: the pre-period costs width
    assert iv.high - iv.low > 2 * 3.0 * interval(post, 3.0, s).sigma / math.sqrt(12) * 0.99
    with pytest.raises(ValueError, match="needs judged and pre-period windows"):
        did_interval(post, [], 3.0, s)


def test_a_wandering_host_ratio_widens_the_interval() -> None:
    """A ratio that walks (each window a step from the last) is measured by the variogram within each period and
    widens the interval beyond what the same steps in random order (no walk) give: the pre-period's ratio is not
    the one the judged windows run against."""
    s = Settings()
    steps = [0.006 * (1 if i % 3 else -1) for i in range(16)]
    walked = [sum(steps[: i + 1]) for i in range(16)]
    still = [steps[i] for i in range(16)]
    assert walk_variance([walked[4:], walked[:4]], s) > walk_variance([still[4:], still[:4]], s)
    assert walk_variance([[0.0] * 8, [0.0] * 8], s) == pytest.approx(s.walk_prior**2 * s.walk_prior_weight / 8)
    assert walk_variance([[0.0], [0.0]], s) == pytest.approx(s.walk_prior**2)  # no lag to read: the prior


def test_a_constant_series_has_no_measured_correlation() -> None:
    """Rounding makes the residuals of identical values ~1e-33, not 0: that must not read as rho = 0.9."""
    s = Settings()
    iv = did_interval([-0.077] * 12, [-0.077] * 4, 3.0, s)
    sigma = math.sqrt(s.sigma_prior_weight * stats.PRIOR_SIGMA**2 / (s.sigma_prior_weight + 14))
    assert iv.sigma == pytest.approx(sigma * math.sqrt((1 + s.prior_rho) / (1 - s.prior_rho)))
    assert walk_variance([[-0.077] * 12, [-0.077] * 4], s) < s.walk_prior**2  # no walk measured: below the prior


@given(
    host=st.floats(0.8, 1.25),
    effect=st.floats(-0.3, 0.3),
    noise=st.lists(st.floats(-0.02, 0.02), min_size=16, max_size=16),
)
def test_the_estimate_never_depends_on_the_host_effect(host: float, effect: float, noise: list[float]) -> None:
    post = [math.log1p(effect) + math.log(host) + n for n in noise[:12]]
    pre = [math.log(host) + n for n in noise[12:]]
    ref_post = [math.log1p(effect) + n for n in noise[:12]]
    ref_pre = list(noise[12:])
    a, b = did_interval(post, pre, 3.0, Settings()), did_interval(ref_post, ref_pre, 3.0, Settings())
    assert a.estimate == pytest.approx(b.estimate, abs=1e-9)
    assert a.high - a.low == pytest.approx(b.high - b.low, rel=1e-6)


@pytest.mark.parametrize(
    ("requests", "windows", "short"),
    [
        ([200, 200, 200, 200], 4, False),
        ([200, 5, 200, 5], 4, False),  # two windows count
        ([200, 5, 5, 5], 4, True),
        ([7, 7, 7, 7], 4, True),
        ([], 4, True),
    ],
)
def test_pre_period_shortfall(requests: list[int], windows: int, short: bool) -> None:
    pre = [_w(1.0, k, requests=r) for k, r in enumerate(requests)]
    msg = pre_period_shortfall(pre, Settings(pre_windows=windows))
    assert (msg is not None) == short
    if msg:
        assert msg.startswith("pre-period: too little traffic to measure the hosts: the canaries finished ")
        assert msg.endswith("each side needs 20 per window in at least 2 windows (a longer --window, or more traffic)"
                            "; nothing was applied")  # fmt: skip


def test_the_router_error_rate_against_its_pre_period() -> None:
    pre = [_w(1.0, k, router=(400, 1)) for k in range(4)]
    bad = judge([_w(1.0, k, router=(400, 30)) for k in range(2)], Settings(), pre)
    assert bad.verdict == "rollback"
    assert bad.reason == (
        "the router failed 60 of 800 requests (7.50%) while the canaries served, against 4 of 1600 (0.25%) before "
        "the change"
    )
    same = judge([_w(1.0, k, router=(400, 1)) for k in range(2)], Settings(), pre)
    assert same.verdict == "continue"
    no_router = judge([_w(1.0, k) for k in range(2)], Settings(), [_w(1.0, k) for k in range(4)])
    assert no_router.verdict == "continue"  # a router that exports nothing is no reason either way
