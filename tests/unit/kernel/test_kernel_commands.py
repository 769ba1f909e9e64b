"""Command bodies of `knobfleet kernel bench` and `knobfleet waves calibrate` (no GPU, no lab)."""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path
from typing import Any

import pytest

from knobfleet import waves
from knobfleet.errors import KnobfleetError
from knobfleet.fleet import runner
from knobfleet.kernel import commands
from knobfleet.kernel.grid import Grid

ROOT = Path(__file__).resolve().parents[3]
SWEEP = ROOT / "perf/results/kernel/sweep-h200.json"


def test_calibrate_dry_run_scores_and_stores_nothing(tmp_path: Path) -> None:
    store = tmp_path / "cal.json"
    res = commands.calibrate([SWEEP], holdout="alt-batch", write=False, store_path=store)
    assert not store.exists() and res["stored"] is None
    assert res["gpu"] == "h200" and res["fingerprint"] == "NVIDIA H200|sm90|132"
    assert res["target_met"] and res["after"]["within"] >= 0.9 and res["before"]["within"] < 0.6
    text = commands.render_calibrate(res)
    assert "calibrated" in text and "uncalibrated" in text and "not stored" in text and "met" in text
    json.dumps(res)  # JSON-able


def test_calibrate_stores_by_fingerprint_and_waves_reads_it(tmp_path: Path) -> None:
    store = tmp_path / "cal.json"
    res = commands.calibrate([SWEEP], gpu="h200", holdout="none", store_path=store)
    assert res["stored"] and "after" not in res
    data = json.loads(store.read_text(encoding="utf-8"))
    assert set(data) == {"_comment", "NVIDIA H200|sm90|132"}
    cal = waves.calibration_for("h200", store)
    assert cal is not None and cal.blocks[32].resident == 2
    assert waves.calibration_for("NVIDIA H200", store) == cal
    assert waves.calibration_for("NVIDIA H200|sm90|132", store) == cal
    assert waves.calibration_for("rtx-pro-6000", store) is None
    assert "stored in" in commands.render_calibrate(res)


def test_calibrate_refuses_a_gpu_with_other_sms() -> None:
    with pytest.raises(KnobfleetError, match="188 SMs"):
        commands.calibrate([SWEEP], gpu="rtx-pro-6000", write=False)
    with pytest.raises(KnobfleetError, match="--holdout"):
        commands.calibrate([SWEEP], holdout="bogus", write=False)


def test_the_repo_ships_a_calibration_for_the_h200() -> None:
    cal = waves.calibration_for("h200")
    assert cal is not None and cal.sms == 132
    held = cal.meta["held_out"]
    assert held["within_2pct"] >= 0.9 and held["mean_loss"] <= 0.02


def test_calibration_line() -> None:
    cal, line = commands.calibration_line("h200")
    assert cal is not None and line.startswith("calibrated: h200") and "held-out picks" in line
    cal, line = commands.calibration_line("h200", sms=100)
    assert cal is None and "not used" in line
    cal, line = commands.calibration_line(None)
    assert cal is None and "none for rtx-pro-6000" in line


def test_bench_arguments_parse_a_grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ap = argparse.ArgumentParser()
    commands.add_bench_arguments(ap)
    args = ap.parse_args(["--host", "gpu1", "--batch", "8..32:8,64", "--ctas", "256,512", "--budget", "60"])
    grid = commands.grid_from_args(args)
    assert grid.batches == (8, 16, 24, 32, 64) and grid.target_ctas == (256, 512) and args.budget == 60
    with pytest.raises(SystemExit):
        ap.parse_args(["--host", "h", "--batch", "0"])
    ap2 = argparse.ArgumentParser()
    commands.add_calibrate_arguments(ap2)
    monkeypatch.chdir(tmp_path)
    Path("s.json").write_text("{}")  # sweep files must exist and be regular files (checked while parsing)
    a2 = ap2.parse_args(["s.json", "--holdout", "L=4096", "--dry-run"])
    assert a2.sweeps == [Path("s.json")] and a2.dry_run


class FakeRun:
    def __init__(self, doc: dict[str, Any] | None, fail: str = "") -> None:
        self.doc, self.fail = doc, fail
        self.req: runner.RunRequest | None = None

    def __call__(self, req: runner.RunRequest) -> runner.RunResult:
        self.req = req
        res = runner.RunResult("r1", 0, "successful", {}, Path("/nonexistent"), 0.1)
        hr = res.host("gpu1")
        if self.fail:
            hr.failed = 1
            hr.failures.append(("Run the kernel microbenchmark", self.fail))
        elif self.doc is not None:
            hr.results["ansible.builtin.slurp"] = {"content": base64.b64encode(json.dumps(self.doc).encode()).decode()}
        return res


def test_kernel_bench_runs_the_role_and_keeps_the_sweep(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    doc = json.loads(SWEEP.read_text(encoding="utf-8"))
    fake = FakeRun(doc)
    monkeypatch.setattr(runner, "run_playbook", fake)
    out = tmp_path / "sweep.json"
    grid = Grid(batches=(8, 16), target_ctas=(256,), block_h=(32,), heads=(64,), contexts=(2048,))
    summary = commands.kernel_bench(tmp_path / "inv", "gpu1", grid, 30.5, out)
    assert fake.req is not None and fake.req.playbook == "kernel.yml" and fake.req.hosts == ("gpu1",)
    assert fake.req.trusted_vars["knob_kernel_budget_s"] == 31
    assert fake.req.unsafe_vars["knob_kernel_grid"]["points"] == [
        [8, 64, 2048, 32, 256, 16],
        [16, 64, 2048, 32, 256, 8],
    ]
    assert json.loads(out.read_text(encoding="utf-8"))["gpu"]["name"] == "NVIDIA H200"
    assert summary["fingerprint"] == "NVIDIA H200|sm90|132" and summary["n_points"] == 1680
    text = commands.render_bench(summary)
    assert "NVIDIA H200 (132 SMs" in text and "check: ok" in text and "2 CTAs/SM" in text
    assert "waves calibrate" in text
    json.dumps(summary)


def test_kernel_bench_skip_is_success(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeRun({"schema": 1, "skipped": True, "reason": "skipped: no torch on lab1"})
    monkeypatch.setattr(runner, "run_playbook", fake)
    summary = commands.kernel_bench(tmp_path / "inv", "gpu1", out=tmp_path / "x.json")
    assert summary == {"host": "gpu1", "skipped": True, "reason": "skipped: no torch on lab1"}
    assert not (tmp_path / "x.json").exists()
    assert commands.render_bench(summary) == "skipped: no torch on lab1"


def test_kernel_bench_failure_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(runner, "run_playbook", FakeRun(None, fail="non-zero return code"))
    with pytest.raises(commands.KernelBenchError, match="gpu1: kernel bench failed"):
        commands.kernel_bench(tmp_path / "inv", "gpu1")
    with pytest.raises(KnobfleetError, match="--budget"):
        commands.kernel_bench(tmp_path / "inv", "gpu1", budget_s=0)
