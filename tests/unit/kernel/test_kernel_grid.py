"""The sweep grid, the role's files and the shipped microbenchmark's skip path (no GPU needed)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from knobfleet import waves
from knobfleet.kernel.grid import Grid, parse_ints

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles/knob_kernel"


def test_grid_points_use_knobfleets_nsplit() -> None:
    grid = Grid()
    points = grid.points()
    assert len(points) == 20 * 7 * 3 * 2 * 2
    for b, h, length, bh, tc, ns in points:
        assert ns == waves.nsplit_for(b, waves.KernelKnobs(tc, bh), h, length)
    doc = grid.as_json()
    assert doc["num_warps"] == {"16": 4, "32": 4, "64": 8} and doc["axes"]["batches"][0] == 8


def test_recorded_grid_file_is_the_default_grid() -> None:
    recorded = json.loads((ROOT / "perf/results/kernel/grid-full.json").read_text(encoding="utf-8"))
    assert recorded == Grid().as_json()


def test_parse_ints() -> None:
    assert parse_ints("8..32:8,64") == (8, 16, 24, 32, 64)
    assert parse_ints("256, 128,256") == (128, 256)
    for bad in ("", "0", "a", "8..x"):
        with pytest.raises(ValueError):
            parse_ints(bad)


def test_role_argument_specs_cover_the_defaults() -> None:
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text(encoding="utf-8"))
    specs = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text(encoding="utf-8"))
    options = specs["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)
    assert all(name.startswith("knob_kernel_") for name in options)


def test_microbenchmark_reports_skipped_without_torch(tmp_path: Path) -> None:
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here; the skip path needs a Python without it")
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, str(ROLE / "files/kernel_bench.py"), "--budget-s", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["skipped"] is True and doc["reason"].startswith("skipped: no torch on ")
    assert json.loads(proc.stdout.strip().splitlines()[-1])["skipped"] is True
