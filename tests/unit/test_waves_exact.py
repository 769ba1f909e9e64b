"""The wave planner to the digit: input bounds, the numbers a `knobfleet waves` table prints (rounded as
printed), the calibrated model's interpolation and validation, the traffic weighting, and the TARGET_CTAS
pick as the argmin of the step cost it documents."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet import waves
from knobfleet.waves import KernelKnobs, WaveRow, row

CAL = waves.Calibration(
    fingerprint="Test GPU|sm90|100",
    gpu="testgpu",
    sms=100,
    blocks={
        16: waves.BlockTerms(4, 5.0, 0.1, 0.5),
        32: waves.BlockTerms(2, 6.0, 0.14, 0.4),
        128: waves.BlockTerms(1, 9.0, 0.3, 0.2),
    },
    combine_fixed_us=1.23456,
    combine_per_unit_us=0.0000123,
    meta={"created": "2026-01-01T00:00:00"},
)


# --- inputs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["batch", "sms", "heads", "context"])
def test_every_size_must_be_at_least_one(field: str) -> None:
    args = {"batch": 8, "sms": 100, "heads": 64, "context": 4096}
    bad = {**args, field: 0}
    with pytest.raises(ValueError, match=r"^batch, sms, heads and context must be >= 1$"):
        row(bad["batch"], KernelKnobs(), bad["sms"], bad["heads"], bad["context"])
    one = {**args, field: 1}
    r = row(one["batch"], KernelKnobs(), one["sms"], one["heads"], one["context"])
    assert r.ctas >= 1 and r.cost > 0


@pytest.mark.parametrize(
    ("env", "knobs"),
    [
        ({}, KernelKnobs(256, 32, 16, 32)),
        ({"SGLANG_SM120_MMA_NSPLIT_MAX": "4", "SGLANG_SM120_MMA_MIN_CHUNK": 64}, KernelKnobs(256, 32, 4, 64)),
        ({"SGLANG_SM120_MMA_TARGET_CTAS": 1, "SGLANG_SM120_MMA_BLOCK_H": "1"}, KernelKnobs(1, 1, 16, 32)),
    ],
)
def test_from_env_reads_all_four_knobs_and_accepts_one(env: dict[str, object], knobs: KernelKnobs) -> None:
    assert KernelKnobs.from_env(env) == knobs


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SGLANG_SM120_MMA_MIN_CHUNK": 0}, "SGLANG_SM120_MMA_MIN_CHUNK=0: must be >= 1"),
        ({"SGLANG_SM120_MMA_NSPLIT_MAX": "-2"}, "SGLANG_SM120_MMA_NSPLIT_MAX=-2: must be >= 1"),
        ({"SGLANG_SM120_MMA_BLOCK_H": True}, "SGLANG_SM120_MMA_BLOCK_H=True: expected an integer"),
        ({"SGLANG_SM120_MMA_TARGET_CTAS": "5x"}, "SGLANG_SM120_MMA_TARGET_CTAS='5x': expected an integer"),
    ],
)
def test_from_env_refusals(env: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as info:
        KernelKnobs.from_env(env)
    assert str(info.value) == message


# --- the numbers of a table row -------------------------------------------------------------------------------


def test_plain_row_as_printed() -> None:
    # B48 BLOCK_H 16 on 132 SMs: n_hg 4, nsplit ceil(512/192) = 3, 576 CTAs = 4.3636 waves, 48 CTAs in the 5th
    r = row(48, KernelKnobs(512, 16), 132, 64, 4096)
    per_cta = (4096 / 3) / 4096 * (0.16 + 0.84 * 16 / 32)
    assert r.as_dict() == {
        "batch": 48,
        "n_hg": 4,
        "nsplit": 3,
        "ctas": 576,
        "waves": 4.3636,
        "waves_ceil": 5,
        "last_wave_ctas": 48,
        "last_wave_fill": 0.3636,
        "cost": round(5 * per_cta, 6),
        "resident": 1,
        "calibrated": False,
        "combine_cost": round(0.03 * 48 * 64 * 3 / (96 * 64 * 2), 6),
        "step_cost": round(round(5 * per_cta, 6) + round(0.03 * 48 * 64 * 3 / (96 * 64 * 2), 6), 6),
    }
    assert r.cost == 0.966667


def test_calibrated_row_as_printed() -> None:
    # B48 BLOCK_H 32, TARGET 512: n_hg 2, nsplit 6, 576 CTAs over 100 SMs x 2 resident = 2.88 waves
    r = row(48, KernelKnobs(512, 32), 100, 64, 4096, CAL)
    t = CAL.blocks[32]
    per_wave = t.fixed_us + t.per_token_us * 4096 / 6
    # the last wave holds 176 CTAs: 2 on some SM, so it is a full wave's time
    combine = round(CAL.combine_fixed_us + CAL.combine_per_unit_us * 48 * 64 * 6, 4)
    cost = round(3 * per_wave, 4)
    assert r == WaveRow(48, 2, 6, 576, 2.88, 3, 176, 0.88, cost, 2, True, combine, round(cost + combine, 4))
    r = row(40, KernelKnobs(512, 32), 100, 64, 4096, CAL)  # 7 splits: 560 CTAs = 2.8 waves, the last 160
    assert (r.waves, r.last_wave_ctas, r.last_wave_fill) == (2.8, 160, 0.8)
    r = row(56, KernelKnobs(512, 16), 100, 64, 4096, CAL)  # 4 groups x 3 splits: 672 CTAs over 400 slots
    assert (r.waves, r.waves_ceil, r.last_wave_ctas, r.last_wave_fill) == (1.68, 2, 272, 0.68)
    r = row(9, KernelKnobs(256, 32), 7, 64, 4096, CAL)  # 2 groups x 15 splits: 270 CTAs over 14 slots
    assert (r.waves, r.last_wave_fill) == (19.2857, 0.2857)
    # 4 CTAs left on 7 SMs: at most 1 on any SM of 2 resident
    assert r.cost == pytest.approx((6.0 + 0.14 * 4096 / 15) * (19 + 1 - 0.4 * (1 - 1 / 2)), abs=1e-4)
    r = row(11, KernelKnobs(256, 32), 7, 64, 4096, CAL)  # 12 splits: 264 CTAs, 12 left: 2 on some SM, a full wave
    assert (r.waves, r.waves_ceil, r.last_wave_ctas) == (18.8571, 19, 12)
    assert r.cost == round(19 * (6.0 + 0.14 * 4096 / 12), 4) == 1021.9467  # µs to 4 decimals


def test_a_table_uses_the_calibration_for_every_row() -> None:
    rows = waves.table([64, 48, 64], KernelKnobs(512, 32), 100, calibration=CAL)
    assert [r.batch for r in rows] == [48, 64]
    assert rows == [
        row(48, KernelKnobs(512, 32), 100, 64, 4096, CAL),
        row(64, KernelKnobs(512, 32), 100, 64, 4096, CAL),
    ]
    assert all(r.calibrated and r.resident == 2 for r in rows)


def test_combine_cost_defaults_and_rounding() -> None:
    # 64 heads unless told; µs to 4 decimals with a calibration
    assert waves.combine_cost(96, 2) == pytest.approx(waves.COMBINE_UNIT)
    assert waves.combine_cost(96, 2) == waves.combine_cost(96, 2, 64)
    assert waves.combine_cost(48, 3, calibration=CAL) == round(1.23456 + 0.0000123 * 48 * 64 * 3, 4) == 1.3479


# --- costs summed the way the planner ranks them --------------------------------------------------------------


def test_step_cost_is_attention_plus_combine() -> None:
    k = KernelKnobs(512, 32)
    r = row(48, k, 100, 64, 4096, CAL)
    assert waves.step_cost(48, k, 100, calibration=CAL) == r.cost + waves.combine_cost(48, r.nsplit, 64, CAL)
    plain = row(48, k, 132)
    assert waves.step_cost(48, k, 132) == plain.cost + waves.COMBINE_UNIT * 48 * 64 * plain.nsplit / (96 * 64 * 2)
    assert waves.step_cost(48, k, 132) > plain.cost


def test_weighted_cost_is_the_traffic_weighted_cost_per_request() -> None:
    k = KernelKnobs(512, 32)
    w = {48: 2.0, 80: 1.0, 96: 1.0}  # weights need not sum to 1
    plain = sum(wt / 4.0 * row(b, k, 132).cost / b for b, wt in w.items())
    assert waves.weighted_cost(k, w, 132) == pytest.approx(plain, rel=1e-12)  # no combine without a calibration
    cal = sum(
        wt
        / 4.0
        * (row(b, k, 100, 64, 4096, CAL).cost + waves.combine_cost(b, row(b, k, 100, 64, 4096, CAL).nsplit, 64, CAL))
        / b
        for b, wt in w.items()
    )
    assert waves.weighted_cost(k, w, 100, calibration=CAL) == pytest.approx(cal, rel=1e-12)


@pytest.mark.parametrize("weights", [{}, {48: 0.0}, {48: 0.0, 64: 0.0}])
def test_weighted_cost_needs_some_traffic(weights: dict[int, float]) -> None:
    with pytest.raises(ValueError, match=r"^weights must sum to more than 0$"):
        waves.weighted_cost(KernelKnobs(), weights, 132)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 256),
    candidates=st.lists(st.sampled_from([64, 128, 192, 256, 384, 512, 768, 1024, 2048]), min_size=1, max_size=5),
    block_h=st.sampled_from([16, 32, 64]),
    min_chunk=st.sampled_from([16, 32, 256, 1024]),
    context=st.sampled_from([512, 2048, 4096]),
    calibrated=st.booleans(),
)
def test_best_target_ctas_is_the_cheapest_step(
    batch: int, candidates: list[int], block_h: int, min_chunk: int, context: int, calibrated: bool
) -> None:
    cal = CAL if calibrated else None
    knobs = KernelKnobs(999, block_h, 16, min_chunk)

    def cost(tc: int) -> float:
        return waves.step_cost(batch, KernelKnobs(tc, block_h, 16, min_chunk), 100, 64, context, cal)

    best = waves.best_target_ctas(batch, knobs, candidates, 100, context=context, calibration=cal)
    assert best in candidates
    assert cost(best) <= min(cost(c) for c in candidates) + 1e-9
    assert best == min(c for c in candidates if cost(c) <= cost(best) + 1e-9)  # ties: the smallest


def test_best_target_ctas_is_not_simply_the_smallest() -> None:
    # B40 BLOCK_H 32 on 132 SMs: 128 CTAs leave 1.0125 units, 256: 0.775, 512: 0.758, 768: 0.7625
    candidates = [128, 256, 512, 768]
    costs = {tc: waves.step_cost(40, KernelKnobs(tc, 32), 132) for tc in candidates}
    assert costs[512] < costs[768] < costs[256] < costs[128]
    assert waves.best_target_ctas(40, KernelKnobs(), candidates, 132) == 512
    assert waves.best_target_ctas(40, KernelKnobs(), [768, 256, 128], 132) == 768
    # calibrated, the same batch on 100 SMs picks 768 (µs: 294.0, 300.1, 265.2, 254.9)
    assert waves.best_target_ctas(40, KernelKnobs(), candidates, 100, calibration=CAL) == 768
    assert waves.best_target_ctas(48, KernelKnobs(), candidates, 100, calibration=CAL) == 128


def test_a_cliff_is_a_rise_beyond_one_in_ten_thousand() -> None:
    def r(batch: int, cost: float) -> WaveRow:
        return WaveRow(batch, 1, 1, 1, 1.0, 1, 1, 1.0, cost)

    assert waves.cliffs([r(1, 1.0), r(1, 1.0001)]) == []  # exactly the tolerance: not a cliff
    assert waves.cliffs([r(1, 1.0), r(1, 1.00005)]) == []
    assert waves.cliffs([r(1, 1.0), r(1, 1.0002)]) == [1]
    assert waves.cliffs([r(10, 10.0), r(20, 20.0), r(30, 33.0), r(40, 40.0)]) == [30]


# --- calibrations ---------------------------------------------------------------------------------------------


def test_unmeasured_block_h_interpolates_between_neighbours_and_scales_beyond() -> None:
    # 64 lies between 32 and 128: per token 0.14 + (0.3 - 0.14) * 32 / 96, occupancy and fixed cost of 32 (nearest)
    t = CAL.terms(64)
    assert (t.resident, t.fixed_us, t.partial) == (2, 6.0, 0.4)
    assert t.per_token_us == pytest.approx(0.14 + 0.16 * 32 / 96, rel=1e-12)
    t = CAL.terms(96)  # nearest is 128
    assert (t.resident, t.fixed_us) == (1, 9.0) and t.per_token_us == pytest.approx(0.14 + 0.16 * 64 / 96, rel=1e-12)
    t = CAL.terms(8)  # below the lowest: 16's per-token cost scaled by 8/16
    assert t.resident == 4 and t.per_token_us == pytest.approx(0.05, rel=1e-12)
    t = CAL.terms(256)  # above the highest: 128's scaled by 256/128
    assert t.resident == 1 and t.per_token_us == pytest.approx(0.6, rel=1e-12)
    assert CAL.terms(32) is CAL.blocks[32]


def test_block_h_factor_compares_time_per_head_and_token_with_32() -> None:
    assert CAL.block_h_factor(32) == 1.0
    # 16: 0.1 / (4 * 16) against 32: 0.14 / (2 * 32)
    assert CAL.block_h_factor(16) == pytest.approx((0.1 / 64) / (0.14 / 64), rel=1e-12)
    assert CAL.block_h_factor(128, reference=16) == pytest.approx((0.3 / 128) / (0.1 / 64), rel=1e-12)


def test_summary_as_printed_above_a_calibrated_table() -> None:
    assert CAL.summary() == (
        "calibrated: testgpu (Test GPU|sm90|100); BLOCK_H 16: 4 CTA/SM, 5.0 µs/CTA + 100.0 ns/token; "
        "BLOCK_H 32: 2 CTA/SM, 6.0 µs/CTA + 140.0 ns/token; BLOCK_H 128: 1 CTA/SM, 9.0 µs/CTA + 300.0 ns/token"
    )


@pytest.mark.parametrize(
    ("edit", "ok"),
    [
        ({"sms": 1}, True),
        ({"sms": 0}, False),
        ({"blocks": {"32": {"resident": 1, "fixed_us": 1, "per_token_us": 0.1, "partial": 0}}}, True),
        ({"blocks": {"32": {"resident": 0, "fixed_us": 1, "per_token_us": 0.1, "partial": 0}}}, False),
        ({"blocks": {}}, False),
    ],
)
def test_a_calibration_needs_sms_and_resident_ctas(edit: dict[str, object], ok: bool) -> None:
    data = {**CAL.as_json(), **edit}
    if ok:
        assert waves.Calibration.from_json(data).as_json() == data
    else:
        with pytest.raises(ValueError) as info:
            waves.Calibration.from_json(data)
        assert str(info.value) == ("calibration Test GPU|sm90|100: needs at least one BLOCK_H and sms, resident >= 1")


def test_the_newest_of_several_matching_calibrations_wins(tmp_path: Path) -> None:
    def entry(fp: str, created: str | None) -> dict[str, object]:
        data = {**CAL.as_json(), "fingerprint": fp}
        data["meta"] = {"created": created} if created else {}
        return data

    path = tmp_path / "cal.json"
    entries = [entry("Test GPU|sm90|100", "2026-01-01"), entry("Test GPU|sm90|101", "2026-03-01")]
    entries.append(entry("Test GPU|sm90|102", None))  # no date: older than any dated one
    path.write_text(json.dumps({e["fingerprint"]: e for e in entries}))
    newest = waves.calibration_for("testgpu", path)
    assert newest is not None and newest.fingerprint == "Test GPU|sm90|101"
    path.write_text(json.dumps({e["fingerprint"]: e for e in reversed(entries)}))
    again = waves.calibration_for("Test GPU", path)
    assert again is not None and again.fingerprint == "Test GPU|sm90|101"


def test_the_shipped_data() -> None:
    assert waves.fingerprint("NVIDIA H200", "9.0", 132) == "NVIDIA H200|sm90|132"
    assert waves.fingerprint("NVIDIA RTX PRO 6000", "12.0", 188) == "NVIDIA RTX PRO 6000|sm120|188"
    gpus = waves.load_gpus()
    assert gpus["h200"] == 132 and gpus["rtx-pro-6000"] == 188 and not any(n.startswith("_") for n in gpus)
    h200 = waves.calibration_for("h200")
    assert h200 is not None and h200.fingerprint == waves.fingerprint("NVIDIA H200", "9.0", gpus["h200"])
    assert waves.load_calibrations()[h200.fingerprint] == h200
    assert math.isclose(h200.block_h_factor(32), 1.0)
