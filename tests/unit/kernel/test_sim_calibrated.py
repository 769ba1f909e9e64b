"""The stand-in engine with a calibration: same magnitude at the reference point, the GPU's shape elsewhere."""

from __future__ import annotations

import pytest

from knobfleet import waves
from knobfleet.lab.sim import model


def cal() -> waves.Calibration:
    c = waves.calibration_for("h200")
    assert c is not None
    return c


def test_reference_point_matches_the_uncalibrated_engine() -> None:
    knobs = waves.KernelKnobs()
    plain = model.step_seconds(64, knobs, 132, 4096)
    assert model.step_seconds(64, knobs, 132, 4096, cal()) == pytest.approx(plain, rel=1e-6)


def test_calibrated_engine_follows_the_calibrated_planner() -> None:
    c = cal()
    for b in (48, 64, 80, 96, 128):
        by_ctas = {
            tc: model.step_seconds(b, waves.KernelKnobs(tc), 132, 4096, c) for tc in (128, 256, 384, 512, 768, 1024)
        }
        best = min(by_ctas, key=lambda tc: (by_ctas[tc], tc))
        assert best == waves.best_target_ctas(b, waves.KernelKnobs(), sorted(by_ctas), 132, 64, 4096, c)


def test_no_calibration_changes_nothing() -> None:
    knobs = waves.KernelKnobs(512, 32)
    assert model.step_seconds(96, knobs, 188, 4160) == model.step_seconds(96, knobs, 188, 4160, None)
    assert model.aggregate_tok_s(96, knobs, 188) == model.aggregate_tok_s(96, knobs, 188, calibration=None)


def test_engine_calibration_from_env() -> None:
    assert model.engine_calibration({"SGLANG_SIM_GPU": "h200"}) == cal()
    assert model.engine_calibration({"SGLANG_SIM_GPU": "h200", "SGLANG_SIM_CALIBRATION": "0"}) is None
    assert model.engine_calibration({"SGLANG_SIM_GPU": "rtx-pro-6000"}) is None
    assert model.engine_calibration({}) is None
