"""The stand-in engine's calibration: the model's table computed directly, no server."""

from __future__ import annotations

import itertools
import random

import pytest

from knobfleet.lab.sim import model
from knobfleet.waves import KernelKnobs

SMS = 188
CONC = (48, 64, 80, 96)


def agg(knobs: KernelKnobs) -> dict[int, float]:
    return {c: model.aggregate_tok_s(c, knobs, SMS) for c in CONC}


def test_default_knobs_match_the_campaign_within_5_percent() -> None:
    got = agg(KernelKnobs(256, 32))
    for c, target in zip(CONC, (685, 720, 833, 799), strict=True):
        assert got[c] == pytest.approx(target, rel=0.05), c
    assert got[96] < got[80], "C96 must sit below C80 (4%-full last wave)"


def test_ctas512_gains_and_rises_monotonically() -> None:
    base, new = agg(KernelKnobs(256)), agg(KernelKnobs(512))
    assert 0.05 <= new[64] / base[64] - 1 <= 0.15
    assert 0.02 <= new[96] / base[96] - 1 <= 0.10
    assert new[48] < new[64] < new[80] < new[96]


def test_ctas768_trades_c64_for_c96() -> None:
    c512, c768 = agg(KernelKnobs(512)), agg(KernelKnobs(768))
    assert 0.01 <= c768[96] / c512[96] - 1 <= 0.05
    assert -0.08 <= c768[64] / c512[64] - 1 <= -0.03


def test_blockh16_is_worse_at_c48_and_c64() -> None:
    base, bh16 = agg(KernelKnobs(256)), agg(KernelKnobs(256, 16))
    for c in (48, 64):
        assert -0.12 <= bh16[c] / base[c] - 1 <= -0.02


def test_greedy_tokens_depend_on_prompt_only() -> None:
    a = [model.greedy_token("prompt-1", i) for i in range(50)]
    assert a == [model.greedy_token("prompt-1", i) for i in range(50)]
    assert a != [model.greedy_token("prompt-2", i) for i in range(50)]


def test_corruption_hits_a_fraction_of_requests() -> None:
    hits = sum(model.corruption_start(f"p{i}", i, 256) is not None for i in range(600))
    assert 150 <= hits <= 250


def test_drift_off_is_exactly_one_and_on_swings_a_few_percent() -> None:
    assert model.Drift(0.0, random.Random(1)).factor(1.0) == 1.0
    d = model.Drift(model.DEFAULT_NOISE, random.Random(7))
    runs = []
    for _ in range(40):  # 40 "runs" of 300 steps, 0.1 s model time each
        runs.append(sum(d.factor(0.1) for _ in range(300)) / 300)
    swings = [abs(b / a - 1) for a, b in itertools.pairwise(runs)]
    assert max(swings) < 0.15
    assert max(swings) > 0.01
