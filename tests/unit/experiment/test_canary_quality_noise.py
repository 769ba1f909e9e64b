"""perf/canary_noise.py: the noise models perf/canary_quality.py --noise puts on the stand-in's."""

from __future__ import annotations

import importlib.util
import itertools
import math
import random
import statistics
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[3] / "perf" / "canary_noise.py"
_spec = importlib.util.spec_from_file_location("canary_noise", _PATH)
assert _spec and _spec.loader
cn = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("canary_noise", cn)
_spec.loader.exec_module(cn)


def test_standin_adds_nothing_and_draws_nothing() -> None:
    rng = random.Random(1)
    state = rng.getstate()
    h = cn.HostNoise(cn.Noise(), rng)
    h.restart()
    assert [h.window(1.03, 60.0) for _ in range(5)] == [1.03] * 5
    assert rng.getstate() == state  # the stand-in's figures stay exactly the script's earlier ones


def test_wilson_interval() -> None:
    lo, hi = cn.wilson(0, 2000)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.00192, abs=1e-5)
    lo, hi = cn.wilson(12, 2000)
    assert lo < 0.006 < hi and lo == pytest.approx(0.00344, abs=1e-4)


def test_correlated_windows_have_the_stated_lag1_and_sd() -> None:
    h = cn.HostNoise(cn.Noise(model="correlated", rho=0.6, ar_sd=0.02), random.Random(2))
    xs = [math.log(h.window(1.0, 60.0)) for _ in range(20_000)]
    m = statistics.fmean(xs)
    lag = sum((a - m) * (b - m) for a, b in itertools.pairwise(xs)) / sum((x - m) ** 2 for x in xs)
    assert statistics.pstdev(xs) == pytest.approx(0.02, rel=0.08)
    assert lag == pytest.approx(0.6, abs=0.05)


def test_heavy_keeps_the_sd_and_fattens_the_tails() -> None:
    h = cn.HostNoise(cn.Noise(model="heavy"), random.Random(3))
    g = 0.02  # one window's log deviation, scaled by the t mixture
    xs = [math.log(h.window(math.exp(g), 60.0)) / g for _ in range(40_000)]
    assert statistics.fmean(x * x for x in xs) == pytest.approx(1.0, rel=0.25)  # t3: slow to converge
    assert statistics.median(abs(x) for x in xs) < 0.8  # most scales below 1, a few far above


def test_warmup_penalty_is_in_the_first_window_then_gone() -> None:
    n = cn.Noise(model="warmup", rate=8 / 3)
    h = cn.HostNoise(n, random.Random(4))
    assert h.window(1.0, 60.0) == 1.0  # warm before any restart
    h.restart()
    first, second = h.window(1.0, 60.0), h.window(1.0, 60.0)
    # 160 requests in a 60 s window; the penalty decays over N/3 = 17..33 of them
    assert 1 - 0.066 * 34 / 160 < first < 1 - 0.066 * 16 / 160
    assert second > 0.9995


def test_outliers_hit_the_stated_share_and_dilute_in_longer_windows() -> None:
    h = cn.HostNoise(cn.Noise(model="outliers"), random.Random(5))
    vs = [h.window(1.0, 60.0) for _ in range(20_000)]
    assert sum(v != 1.0 for v in vs) / len(vs) == pytest.approx(0.02, abs=0.004)
    assert set(vs) == {0.5, 1.0, 1.5}
    long = {h.window(1.0, 120.0) for _ in range(2_000)}
    assert long == {0.75, 1.0, 1.25}


def test_step_applies_from_its_window_on() -> None:
    h = cn.HostNoise(cn.Noise(model="step", step=-0.08), random.Random(6))
    h.step_at = 3
    assert [h.window(1.0, 60.0) for _ in range(4)] == [1.0, 1.0, pytest.approx(0.92), pytest.approx(0.92)]
