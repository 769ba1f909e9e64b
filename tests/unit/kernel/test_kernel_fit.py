"""The calibration fit and the planner scored on the recorded H200 sweep (no GPU needed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet import waves
from knobfleet.kernel import fit

ROOT = Path(__file__).resolve().parents[3]
SWEEPS = [ROOT / "perf/results/kernel/sweep-h200.json", ROOT / "perf/results/kernel/sweep-h200-rep2.json"]


@pytest.fixture(scope="module")
def sweeps() -> list[fit.Sweep]:
    return [fit.load_sweep(p) for p in SWEEPS]


@pytest.fixture(scope="module")
def samples(sweeps: list[fit.Sweep]) -> list[fit.Sample]:
    return fit.merge(sweeps)


@pytest.fixture(scope="module")
def heldout_fit(samples: list[fit.Sample], sweeps: list[fit.Sweep]) -> tuple[waves.Calibration, list[fit.Sample]]:
    train, test = fit.split(samples, "alt-batch")
    return fit.fit(train, sweeps[0]), test


def test_recorded_sweep_is_the_full_grid_on_an_h200(sweeps: list[fit.Sweep], samples: list[fit.Sample]) -> None:
    assert sweeps[0].fingerprint == "NVIDIA H200|sm90|132"
    assert len(samples) == 20 * 7 * 3 * 2 * 2
    assert {s.batch for s in samples} == set(range(8, 161, 8))
    # KV came from HBM: every launch cycled through >= 256 MB (many distinct regions, or one region larger than L2)
    raw = json.loads(SWEEPS[0].read_text(encoding="utf-8"))
    assert min(r["kv_mb_rotated"] for r in raw["results"]) >= 256


def test_sweep_used_knobfleets_nsplit_rule(samples: list[fit.Sample]) -> None:
    for s in samples:
        knobs = waves.KernelKnobs(s.target_ctas, s.block_h)
        assert s.nsplit == waves.nsplit_for(s.batch, knobs, s.heads, s.context)
        assert s.ctas == s.batch * math.ceil(s.heads / s.block_h) * s.nsplit


def test_repeated_sweeps_agree(sweeps: list[fit.Sweep]) -> None:
    a = {(*s.cell, s.target_ctas): s.total_us for s in sweeps[0].samples}
    b = {(*s.cell, s.target_ctas): s.total_us for s in sweeps[1].samples}
    diffs = sorted(abs(a[k] / b[k] - 1) for k in a)
    assert diffs[len(diffs) // 2] < 0.01


def test_calibrated_planner_meets_the_issue_target_on_held_out_cells(
    heldout_fit: tuple[waves.Calibration, list[fit.Sample]],
) -> None:
    cal, test = heldout_fit
    acc = fit.score(test, cal.sms, cal)
    assert acc.cells == 120
    assert acc.within >= 0.90
    assert acc.mean_loss <= 0.02


def test_uncalibrated_planner_is_far_off(heldout_fit: tuple[waves.Calibration, list[fit.Sample]]) -> None:
    cal, test = heldout_fit
    acc = fit.score(test, cal.sms, None)
    assert acc.within < 0.6 and acc.mean_loss > 0.05


def test_fit_finds_the_occupancy_triton_reports(
    heldout_fit: tuple[waves.Calibration, list[fit.Sample]], sweeps: list[fit.Sweep]
) -> None:
    cal, _ = heldout_fit
    reported = {k["block_h"]: k["occupancy_ctas_per_sm"] for k in sweeps[0].kernels}
    assert {bh: t.resident for bh, t in cal.blocks.items()} == reported == {16: 4, 32: 2, 64: 1}
    for t in cal.blocks.values():
        assert 3 < t.fixed_us < 20  # a per-CTA fixed cost of some µs
    assert cal.block_h_factor(16) > 1.05  # BLOCK_H 16 does the same work slower than 32
    assert 0 < cal.combine_per_unit_us < 0.01


@pytest.mark.parametrize("holdout", ["L=4096", "H=128", "random:0.3:1"])
def test_other_holdouts_also_generalise(samples: list[fit.Sample], sweeps: list[fit.Sweep], holdout: str) -> None:
    train, test = fit.split(samples, holdout)
    cal = fit.fit(train, sweeps[0])
    acc = fit.score(test, cal.sms, cal)
    assert acc.within >= 0.85 and acc.mean_loss <= 0.02


@settings(max_examples=12, deadline=None)
@given(
    resident=st.integers(1, 4),
    fixed=st.floats(1.0, 20.0),
    per_token=st.floats(0.02, 0.3),
    partial=st.sampled_from([0.0, 0.2, 0.4, 0.6, 0.8]),
)
def test_fit_recovers_known_terms_from_noise_free_timings(
    resident: int, fixed: float, per_token: float, partial: float
) -> None:
    truth = waves.BlockTerms(resident, fixed, per_token, partial)
    samples = []
    for b in (8, 24, 40, 64, 96, 136, 160):
        for tc in (128, 256, 512, 1024, 1536):
            for length in (2048, 4096):
                ns = waves.nsplit_for(b, waves.KernelKnobs(tc, 32), 64, length)
                ctas = b * 2 * ns
                t = waves.attention_us(ctas, ns, length, 132, truth)
                samples.append(fit.Sample(b, 64, length, 32, tc, ns, ctas, t, 0.0, t))
    got = fit.fit_block(samples, 132)
    assert got.rms_rel < 1e-3
    for s in samples:
        pred = waves.attention_us(s.ctas, s.nsplit, s.context, 132, got.terms)
        assert pred == pytest.approx(s.attn_us, rel=2e-3)


def test_least_squares_keeps_terms_non_negative() -> None:
    c0, c1, rms = fit._lsq_rel([(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)], [3.0, 2.0, 1.0])  # falling line
    assert c0 >= 0 and c1 >= 0 and rms > 0
    c0, c1, rms = fit._lsq_rel([(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)], [3.0, 5.0, 7.0])
    assert c0 == pytest.approx(1.0) and c1 == pytest.approx(2.0) and rms == pytest.approx(0, abs=1e-9)


def test_spearman() -> None:
    assert fit.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert fit.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert fit.spearman([1, 1, 1], [1, 2, 3]) == 1.0  # no spread: nothing to rank


def test_holdout_specs(samples: list[fit.Sample]) -> None:
    _, test = fit.split(samples, "alt-batch")
    assert {s.batch for s in test} == set(range(16, 161, 16))
    assert not fit.split(samples, "none")[1]
    assert {s.context for s in fit.split(samples, "L=4096")[1]} == {4096}
    assert {s.batch for s in fit.split(samples, "B>=96")[1]} == set(range(96, 161, 8))
    for bad in ("nope", "H=x", "random:2"):
        with pytest.raises(ValueError, match="--holdout"):
            fit.split(samples, bad)
    with pytest.raises(ValueError, match="nothing to fit"):
        fit.split(samples, "B>=1")


def test_bad_sweeps_are_refused(tmp_path: Path, sweeps: list[fit.Sweep]) -> None:
    with pytest.raises(fit.SweepError, match="skipped"):
        fit.parse_sweep({"skipped": True, "reason": "skipped: no GPU on lab1"})
    with pytest.raises(fit.SweepError, match="correctness"):
        fit.parse_sweep({"skipped": False, "check": {"ok": False}, "results": []})
    with pytest.raises(fit.SweepError, match="not a kernel bench result"):
        fit.parse_sweep({"check": {"ok": True}, "gpu": {"name": "x"}, "results": []})
    with pytest.raises(fit.SweepError, match="cannot read"):
        fit.load_sweep(tmp_path / "missing.json")
    other = fit.Sweep("x", {**sweeps[0].gpu, "sms": 188}, [], {}, sweeps[0].samples[:3])
    with pytest.raises(fit.SweepError, match="different GPUs"):
        fit.merge([sweeps[0], other])


# --- hostile sweep files (issue 40, cause 5): every number finite, every parse error one line -------------------


def _good_doc() -> dict[str, object]:
    return {
        "check": {"ok": True},
        "gpu": {"name": "H200", "cc": "9.0", "sms": 132},
        "results": [{"batch": 8, "heads": 16, "context": 4096, "block_h": 16, "target_ctas": 512, "nsplit": 4,
                     "ctas": 512, "attn_us": 10.5, "combine_us": 1.5, "total_us": 12.0}],
    }  # fmt: skip


@pytest.mark.parametrize(
    "text",
    [
        '{"check": {"ok": true}, "results": [{"attn_us": NaN}]}',
        "[" * 100_000 + "]" * 100_000,
        '{"check": {"ok": true}, "gpu": {"name": "x", "cc": 1, "sms": ' + "9" * 5000 + "}}",
        "[1, 2, 3]",
        '"a string"',
        '{"check": "yes"}',
        '{"check": {"ok": true}, "gpu": {"name": "H200", "cc": "9.0", "sms": 132}, "results": {"a": 1}}',
    ],
    ids=["nan-literal", "deep", "5000-digits", "a-list", "a-string", "check-not-object", "results-an-object"],
)
def test_a_hostile_sweep_file_is_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(text)
    with pytest.raises(fit.SweepError) as exc:
        fit.load_sweep(path)
    assert "\n" not in str(exc.value) and str(exc.value).startswith(str(path))


@settings(max_examples=100, deadline=None)
@given(
    field=st.sampled_from(["attn_us", "combine_us", "total_us", "batch", "nsplit"]),
    value=st.one_of(st.just(float("nan")), st.just(float("inf")), st.just(-1.0), st.just(0), st.floats(-1e9, -1e-9),
                    st.integers(10**9 + 1, 10**30)),
)  # fmt: skip
def test_a_timing_or_a_size_that_is_not_finite_and_positive_is_refused(field: str, value: float) -> None:
    import copy

    doc = copy.deepcopy(_good_doc())
    doc["results"][0][field] = value  # type: ignore[index]
    timing = field.endswith("_us")
    finite_ok = isinstance(value, int | float) and math.isfinite(value) and value >= 0
    if timing and finite_ok and (value > 0 or field != "total_us"):
        fit.parse_sweep(doc)  # a large timing is a slow kernel; a part may be 0 (no combine), the total may not
        return
    with pytest.raises(fit.SweepError) as exc:
        fit.parse_sweep(doc)
    assert "\n" not in str(exc.value)
    if isinstance(value, int) or (timing and not math.isnan(value)):
        assert f"results[0].{field} is" in str(exc.value)


def test_a_good_sweep_still_parses() -> None:
    assert fit.parse_sweep(_good_doc()).samples[0].total_us == 12.0


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8", "looks like a secret"),
        ("H100\u202e", "invisible character"),
        ("H\u3164100", "invisible character"),
        ("x" * 129, "129 characters"),
        ("  ", "is empty"),
        (7, "must be a text, not int"),
        ("NVIDIA H100 80GB HBM3", None),
    ],
    ids=["token", "bidi", "blank-letter", "long", "empty", "number", "real-name"],
)  # fmt: skip
def test_the_recorded_gpu_name_is_one_that_may_be_printed_and_stored(name: object, why: str | None) -> None:
    """`waves calibrate` prints the sweep's gpu.name and stores it as the calibration's name (attack harness)."""
    import copy

    doc = copy.deepcopy(_good_doc())
    doc["gpu"]["name"] = name  # type: ignore[index]
    if why is None:
        assert fit.parse_sweep(doc).gpu["name"] == name
        return
    with pytest.raises(fit.SweepError, match=r"gpu\.name") as exc:
        fit.parse_sweep(doc)
    assert why in str(exc.value) and "\n" not in str(exc.value) and "A1b2C3" not in str(exc.value)
