"""The canary judge: verdicts per window sequence, the one-line reasons, traffic and error rules."""

from __future__ import annotations

import math

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


def _run(ratio: float, n: int, **kw: object) -> list[Window]:
    return [_w(ratio, k, **kw) for k in range(n)]  # type: ignore[arg-type]


def test_observation_is_signed_so_positive_is_better() -> None:
    w = _w(1.1, 0)
    assert observation(w, "tput") == pytest.approx(math.log(1.1) + NOISE[0])
    assert observation(w, "itl") == pytest.approx(math.log(1.1) + NOISE[0])  # lower ITL is better


@pytest.mark.parametrize(
    ("ratio", "windows", "verdict", "reason"),
    [
        (0.55, 3, "rollback", "tput is -45.0% on the canaries"),
        (1.05, 3, "promote", "tput +5."),
        (1.0, 2, "continue", "2 of at least 3 windows"),
        (0.985, 12, "inconclusive", "after 12 windows: tput -1.5%, itl -1.5%; not certain either way"),
        (0.98, 12, "rollback", "tput is -2.0% on the canaries (-3.7% to -0.3%): significantly worse"),
    ],
)
def test_verdicts(ratio: float, windows: int, verdict: str, reason: str) -> None:
    v = judge(_run(ratio, windows))
    assert v.verdict == verdict, v.reason
    assert reason in v.reason


def test_identical_profiles_promote_once_shown_within_the_margin() -> None:
    v = judge(_run(1.0, 6))
    assert v.verdict == "continue" and v.reason.startswith("tput +0.0% (-3.2% to +3.3%)")
    v = judge(_run(1.0, 9))
    assert v.verdict == "promote"
    assert v.reason == "tput +0.0% (-2.3% to +2.3%) and no metric beyond the 3% regression limit after 9 windows"


def test_windows_with_too_little_traffic_do_not_count() -> None:
    quiet = _run(0.55, 3, requests=5)
    v = judge(quiet)
    assert (v.verdict, v.windows, v.skipped) == ("continue", 0, 3)
    assert v.reason == "too little traffic for a verdict: 5 requests in window, need 20"
    assert judge(_run(0.55, 12, requests=5)).verdict == "inconclusive"
    mixed = quiet + _run(0.55, 3)
    assert judge(mixed).verdict == "rollback" and judge(mixed).skipped == 3


def test_an_error_rate_above_the_baselines_rolls_back() -> None:
    v = judge([_w(1.05, k, errors=(12, 0)) for k in range(2)])
    assert v.verdict == "rollback"
    assert v.reason == "the canaries failed 24 of 400 requests (6.00%) against 0 of 400 (0.00%) on the baseline"
    assert judge([_w(1.05, k, errors=(1, 1)) for k in range(3)]).verdict == "promote"


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
