from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet import waves
from knobfleet.waves import KernelKnobs, row


def test_hand_computed_c96_default_on_188_sms() -> None:
    r = row(96, KernelKnobs(target_ctas=256, block_h=32), sms=188, heads=64)
    assert (r.n_hg, r.nsplit, r.ctas, r.waves, r.waves_ceil, r.last_wave_ctas) == (2, 2, 384, 2.0426, 3, 8)
    assert r.last_wave_fill == pytest.approx(0.04, abs=0.005)


def test_hand_computed_c96_ctas512() -> None:
    r = row(96, KernelKnobs(target_ctas=512, block_h=32), sms=188, heads=64)
    assert (r.nsplit, r.ctas, r.waves_ceil) == (3, 576, 4)


@pytest.mark.parametrize(
    ("batch", "knobs", "context", "nsplit"),
    [
        (1, KernelKnobs(256, 32, 16, 32), 4096, 16),  # NSPLIT_MAX caps 128
        (1, KernelKnobs(256, 32, 64, 32), 4096, 64),
        (1, KernelKnobs(256, 32, 64, 32), 1000, 31),  # MIN_CHUNK: 1000 // 32
        (1, KernelKnobs(256, 32, 64, 2048), 1000, 1),  # never below 1
        (48, KernelKnobs(256, 16), 4096, 2),  # n_hg 4: ceil(256 / 192)
        (200, KernelKnobs(256, 64), 4096, 2),  # n_hg 1: ceil(256 / 200)
    ],
)
def test_nsplit_limits(batch: int, knobs: KernelKnobs, context: int, nsplit: int) -> None:
    assert row(batch, knobs, 188, 64, context).nsplit == nsplit


def test_cost_counts_whole_waves_and_split_work() -> None:
    # default at B64: 2 waves x (L / 2) -> 1.0 ; ctas512 at B64: 3 waves x (L / 4) -> 0.75
    assert row(64, KernelKnobs(256), 188).cost == pytest.approx(1.0)
    assert row(64, KernelKnobs(512), 188).cost == pytest.approx(0.75)
    # BLOCK_H 16 halves only the compute share of a CTA
    assert row(64, KernelKnobs(256, 16), 188).cost == pytest.approx(2 * (0.16 + 0.84 * 0.5))


def test_cliffs_flag_c96_for_default() -> None:
    rows = waves.table([48, 64, 80, 96], KernelKnobs(256), 188)
    assert 96 in waves.cliffs(rows)
    assert 80 not in waves.cliffs(rows)


def test_from_env_validates() -> None:
    assert KernelKnobs.from_env({"SGLANG_SM120_MMA_TARGET_CTAS": "512"}).target_ctas == 512
    with pytest.raises(ValueError, match="expected an integer"):
        KernelKnobs.from_env({"SGLANG_SM120_MMA_TARGET_CTAS": "abc"})
    with pytest.raises(ValueError, match="must be >= 1"):
        KernelKnobs.from_env({"SGLANG_SM120_MMA_BLOCK_H": "0"})


def test_gpu_catalog() -> None:
    gpus = waves.load_gpus()
    assert gpus["rtx-pro-6000"] == 188 and gpus["h200"] == 132 and gpus["b200"] == 148
    assert gpus["l40s"] == 142 and gpus["a100"] == 108 and gpus["h100"] == 132


def test_weighted_cost_prefers_ctas512_over_default_for_the_campaign_mix() -> None:
    w = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}
    assert waves.weighted_cost(KernelKnobs(512), w, 188) < waves.weighted_cost(KernelKnobs(256), w, 188)


# --- calibrated model ---------------------------------------------------------------------------------------

CAL = waves.Calibration(
    fingerprint="Test GPU|sm90|100",
    gpu="testgpu",
    sms=100,
    blocks={16: waves.BlockTerms(4, 5.0, 0.1, 0.5), 32: waves.BlockTerms(2, 6.0, 0.1, 0.4)},
    combine_fixed_us=1.0,
    combine_per_unit_us=0.001,
    meta={"created": "2026-01-01T00:00:00"},
)


def test_calibrated_row_counts_waves_of_resident_ctas() -> None:
    # B64 BLOCK_H 32, TARGET_CTAS 256: n_hg 2, nsplit 2, 256 CTAs over 100 SMs x 2 -> 1 full wave + 56 CTAs
    r = row(64, KernelKnobs(256, 32), 100, 64, 4096, CAL)
    assert (r.nsplit, r.ctas, r.waves_ceil, r.last_wave_ctas, r.resident, r.calibrated) == (2, 256, 2, 56, 2, True)
    per_wave = 6.0 + 0.1 * 4096 / 2
    # last wave: at most 1 CTA on any SM of 2 resident -> saves partial * (1 - 1/2)
    assert r.cost == pytest.approx(per_wave * (1 + 1 - 0.4 * 0.5), rel=1e-4)
    assert waves.combine_cost(64, 2, 64, CAL) == pytest.approx(1.0 + 0.001 * 64 * 64 * 2)
    assert waves.combine_cost(64, 1, 64, CAL) == 0.0


def test_uncalibrated_calls_are_unchanged() -> None:
    r = row(96, KernelKnobs(256, 32), 188, 64)
    assert (r.resident, r.calibrated) == (1, False)
    assert waves.table([96], KernelKnobs(256), 188) == [r]
    assert waves.combine_cost(96, 2, 64) == pytest.approx(waves.COMBINE_UNIT)


def test_unmeasured_block_h_borrows_from_neighbours() -> None:
    t = CAL.terms(24)
    assert t.resident == 4 and t.per_token_us == pytest.approx(0.1)  # nearest: 16 (ties go low)
    t64 = CAL.terms(64)
    assert t64.per_token_us == pytest.approx(0.2) and t64.resident == 2
    assert CAL.block_h_factor(16) == pytest.approx((0.1 / 64) / (0.1 / 64))


def test_best_target_ctas_ties_go_to_the_smallest() -> None:
    # B8 BLOCK_H 32 on 188 SMs: every TARGET_CTAS from 256 up hits NSPLIT_MAX 16: identical costs
    assert waves.best_target_ctas(8, KernelKnobs(), [1024, 256, 512], 188) == 256


def test_calibration_round_trip_and_lookup(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    assert waves.load_calibrations(path) == {}
    assert waves.calibration_for("testgpu", path) is None
    path.write_text(json.dumps({"_comment": "x", CAL.fingerprint: CAL.as_json()}), encoding="utf-8")
    assert waves.calibration_for("testgpu", path) == CAL
    assert waves.calibration_for("test gpu", path) == CAL
    assert waves.calibration_for(CAL.fingerprint, path) == CAL
    bad = CAL.as_json()
    bad["blocks"] = {}
    path.write_text(json.dumps({CAL.fingerprint: bad}), encoding="utf-8")
    with pytest.raises(ValueError, match="at least one BLOCK_H"):
        waves.load_calibrations(path)
    path.write_text(json.dumps({CAL.fingerprint: {"gpu": "x"}}), encoding="utf-8")
    with pytest.raises(ValueError, match="malformed"):
        waves.load_calibrations(path)


def test_weighted_cost_with_calibration_includes_combine() -> None:
    w = {64: 1.0}
    r = row(64, KernelKnobs(256), 100, 64, 4096, CAL)
    expect = (r.cost + waves.combine_cost(64, r.nsplit, 64, CAL)) / 64
    assert waves.weighted_cost(KernelKnobs(256), w, 100, calibration=CAL) == pytest.approx(expect)


@given(
    ctas=st.integers(1, 5000),
    sms=st.integers(1, 200),
    resident=st.integers(1, 4),
    partial=st.floats(0, 1),
)
def test_effective_waves_lie_between_the_floor_and_ceiling(ctas: int, sms: int, resident: int, partial: float) -> None:
    terms = waves.BlockTerms(resident, 1.0, 0.0, partial)
    w = waves.attention_us(ctas, 1, 1, sms, terms)
    slots = sms * resident
    assert ctas // slots <= w <= math.ceil(ctas / slots) + 1e-9
    assert w >= ctas / slots - 1e-9 or partial > 0  # whole waves never cost less than the work (partial 0)
    assert w == waves.attention_us(ctas, 1, 1, sms, terms)  # pure


@given(batch=st.integers(1, 512), tc=st.integers(1, 4096), bh=st.sampled_from([16, 32, 64]))
def test_calibrated_and_plain_rows_agree_on_the_launch(batch: int, tc: int, bh: int) -> None:
    k = KernelKnobs(tc, bh)
    a, b = row(batch, k, 100, 64, 4096), row(batch, k, 100, 64, 4096, CAL)
    assert (a.n_hg, a.nsplit, a.ctas) == (b.n_hg, b.nsplit, b.ctas)
    assert b.cost > 0


@pytest.mark.parametrize("gpu", [None, "h200"])
@pytest.mark.parametrize("batch", [1, 48, 64, 80, 96, 200])
def test_each_row_carries_the_combine_pass_and_the_ranked_total(gpu: str | None, batch: int) -> None:
    """A user comparing `waves --json` rows by their total gets the planner's answer (step_cost)."""
    cal = waves.calibration_for(gpu) if gpu else None
    knobs = waves.KernelKnobs(target_ctas=512, block_h=32, nsplit_max=16, min_chunk=32)
    r = waves.row(batch, knobs, 132, calibration=cal)
    assert r.combine_cost == pytest.approx(waves.combine_cost(batch, r.nsplit, 64, cal), abs=1e-4)
    assert r.step_cost == pytest.approx(waves.step_cost(batch, knobs, 132, calibration=cal), abs=1e-4)
    assert r.as_dict()["step_cost"] == r.step_cost
    assert (r.combine_cost > 0) == (r.nsplit > 1)
