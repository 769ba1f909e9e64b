"""The stand-in's warm-up (SGLANG_SIM_WARMUP=1, model.Warmup): slower right after a start, converged over its first
~50-100 requests, seeded."""

from __future__ import annotations

import math
import random

import pytest

from knobfleet.lab.sim import model
from knobfleet.lab.sim.launch_server import read_setup


def test_the_published_shape_at_the_start_and_after_n_requests() -> None:
    w = model.Warmup(90.0)
    assert w.penalty() == 1.0
    assert w.step_factor() == pytest.approx(1 / (1 - 0.066))  # 6.6% lower throughput
    assert w.first_token_delay(0.1) == pytest.approx(0.027)  # TTFT +27% of a step
    w.served = 90
    assert w.penalty() == pytest.approx(math.exp(-3))  # 5% of the penalty left after n requests
    w.served = 1000
    assert w.step_factor() == pytest.approx(1.0, abs=1e-9)


def test_n_is_drawn_per_start_from_50_to_100_and_seeded() -> None:
    drawn = [model.Warmup.drawn(random.Random(f"{seed}-warmup")).n for seed in range(200)]
    assert all(50 <= n <= 100 for n in drawn) and max(drawn) - min(drawn) > 40
    assert model.Warmup.drawn(random.Random("7-warmup")).n == model.Warmup.drawn(random.Random("7-warmup")).n


@pytest.mark.parametrize(("value", "on"), [("1", True), ("on", True), ("0", False), ("", False), (None, False)])
def test_switched_by_the_environment(value: str | None, on: bool) -> None:
    import argparse

    args = argparse.Namespace(host=None, port=None, tp_size=None, model_path="/m")
    env = {} if value is None else {"SGLANG_SIM_WARMUP": value}
    assert read_setup(args, env).warmup is on
