"""The canary judge: verdicts per window sequence, the one-line reasons, traffic and error rules."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from knobfleet.experiment.canary import Settings, Window, interval, judge, lag1, observation

NOISE = [0.004, -0.006, 0.003, -0.002, 0.005, -0.004, 0.001, -0.003, 0.002, -0.001, 0.004, -0.005]


def _w(ratio: float, k: int, requests: int = 200, errors: tuple[int, int] = (0, 0)) -> Window:
    c = 100.0 * ratio * math.exp(NOISE[k % len(NOISE)])
    return Window(
        {"tput": {"lab1": c}, "itl": {"lab1": 1 / c}},
        {"tput": {"lab2": 100.0}, "itl": {"lab2": 1 / 100.0}},
        requests,
        requests,
        *errors,
    )


D = Settings(design="did")  # the sequential rule on one period: the subsets compared directly (no pre-period)


def _run(ratio: float, n: int, **kw: object) -> list[Window]:
    return [_w(ratio, k, **kw) for k in range(n)]  # type: ignore[arg-type]


def test_observation_is_signed_so_positive_is_better() -> None:
    w = _w(1.1, 0)
    assert observation(w, "tput") == pytest.approx(math.log(1.1) + NOISE[0])
    assert observation(w, "itl") == pytest.approx(math.log(1.1) + NOISE[0])  # lower ITL is better


@pytest.mark.parametrize(
    ("ratio", "windows", "max_windows", "verdict", "reason"),
    [
        (0.55, 3, 16, "rollback", "tput is -45.0% on the canaries"),
        (1.05, 3, 16, "promote", "tput +5."),
        (1.0, 2, 16, "continue", "2 of at least 3 windows"),
        # -3%: neither shown worse than 0 at the rollback side's z nor better than -5% at the promotion side's
        (0.97, 4, 16, "continue", "tput -3.0% (-7.6% to +1.8%)"),
        (0.98, 12, 16, "rollback", "tput is -2.0% on the canaries (-3.8% to -0.2%): significantly worse"),
        (0.985, 16, 16, "rollback", "tput is -1.5% on the canaries (-2.5% to -0.5%): significantly worse"),
    ],
)
def test_verdicts(ratio: float, windows: int, max_windows: int, verdict: str, reason: str) -> None:
    v = judge(_run(ratio, windows), replace(D, max_windows=max_windows))
    assert v.verdict == verdict, v.reason
    assert reason in v.reason


def test_windows_too_noisy_to_tell_at_the_last_look_are_inconclusive() -> None:
    """-3% on average, but the windows swing by 6%: neither worse than 0 nor better than -5% is shown by the last
    look, so the canaries go back; the same mean with calm windows is shown within the 5% and promoted."""

    def w(ratio: float) -> Window:
        return Window({"tput": {"lab1": 100 * ratio}, "itl": {"lab1": 1 / (100 * ratio)}},
                      {"tput": {"lab2": 100.0}, "itl": {"lab2": 0.01}}, 200, 200)  # fmt: skip

    v = judge([w(r) for r in (1.0, 0.94, 1.0, 0.94)], replace(D, max_windows=4))
    assert v.verdict == "inconclusive"
    assert v.reason == "after 4 windows: tput -3.0%, itl -3.0%; not certain either way, so the canaries go back"
    assert judge([w(r) for r in (0.99, 0.95, 0.99, 0.95)], replace(D, max_windows=4)).verdict == "promote"


def test_the_last_look_spends_most_of_each_budget() -> None:
    """An early verdict needs a clearer answer than the last look: most of alpha and beta is kept for it."""
    s = Settings()
    assert s.z() > s.z(final=True) and s.z_promote() > s.z_promote(final=True)
    assert s.z(final=True) == pytest.approx(2.878, abs=1e-3)  # 80% of alpha (0.5%), over 2 metrics
    assert s.z_promote(final=True) == pytest.approx(1.175, abs=1e-3)  # 80% of beta (15%), per metric
    # a crossover's looks: the first period's 4 (rollback only) and the second's 8; the did design's 14
    assert (s._looks(), s._looks(rollback=False), D._looks()) == (12, 8, 14)
    one_look = replace(D, min_windows=3, max_windows=3)
    assert one_look.z() == one_look.z(final=True)


def test_identical_profiles_promote_once_shown_within_the_margin() -> None:
    v = judge(_run(1.0, 2), D)
    assert v.verdict == "continue" and v.reason == "2 of at least 3 windows"
    v = judge(_run(1.0, 3), D)
    assert v.verdict == "promote"
    assert v.reason == (
        "tput +0.0% (at least -4.6%) and every metric shown better than the 5% regression a canary must catch, "
        "after 3 windows"
    )
    assert judge(_run(1.0, 3), replace(D, max_regression=0.03)).verdict == "continue"  # -4.6% is not within 3%


def test_windows_with_too_little_traffic_do_not_count() -> None:
    quiet = _run(0.55, 3, requests=5)
    v = judge(quiet, D)
    assert (v.verdict, v.windows, v.skipped) == ("continue", 0, 3)
    assert v.reason == "too little traffic for a verdict: 5 requests in window, need 20"
    assert judge(_run(0.55, 15, requests=5), D).verdict == "continue"
    assert judge(_run(0.55, 16, requests=5), D).verdict == "inconclusive"
    mixed = quiet + _run(0.55, 3)
    assert judge(mixed, D).verdict == "rollback" and judge(mixed, D).skipped == 3


def test_an_error_rate_above_the_baselines_rolls_back() -> None:
    v = judge([_w(1.05, k, errors=(12, 0)) for k in range(2)], D)
    assert v.verdict == "rollback"
    assert v.reason == "the canaries failed 24 of 400 requests (6.00%) against 0 of 400 (0.00%) on the baseline"
    assert judge([_w(1.05, k, errors=(1, 1)) for k in range(3)], D).verdict == "promote"


def test_lag1_and_the_inflated_interval() -> None:
    assert lag1([1.0, 2.0]) is None and lag1([1.0, 1.0, 1.0]) is None
    assert lag1([1.0, 2.0, 3.0, 4.0]) == pytest.approx(0.25)
    xs = [0.01, 0.012, 0.011, 0.013, 0.012]
    s = Settings()
    iv = interval(xs, 2.0, s)
    rho = min(0.8, max(0.0, ((lag1(xs) or 0.0) * 4 + s.prior_rho * s.prior_weight) / (4 + s.prior_weight)))
    from knobfleet.experiment import stats

    assert iv.sigma == pytest.approx(stats.interval(xs, 2.0).sigma * math.sqrt((1 + rho) / (1 - rho)))
    assert iv.high - iv.estimate == pytest.approx(2.0 * iv.sigma / math.sqrt(5))


def test_a_missing_side_is_a_clear_error() -> None:
    w = Window({"tput": {}}, {"tput": {"lab2": 1.0}}, 100, 100)
    with pytest.raises(ValueError, match=r"^tput: no value on the canary side$"):
        observation(w, "tput")
