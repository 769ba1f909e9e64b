"""The shipped drift timer: systemd accepts its units, it writes where node_exporter reads, and it treats the
drift exit codes (2, 4, 6) as results, not failures."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "monitoring" / "systemd"


def _unit(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read(UNITS / name)
    return cp


def test_the_service_writes_the_textfile_and_accepts_drift_exit_codes() -> None:
    svc = _unit("knobfleet-drift.service")["Service"]
    assert svc["Type"] == "oneshot"
    assert svc["ExecStart"].endswith("drift --prom /var/lib/prometheus/node-exporter/knobfleet.prom")
    assert set(svc["SuccessExitStatus"].split()) == {"2", "4", "6"}


def test_the_timer_runs_well_inside_the_stale_alert() -> None:
    timer = _unit("knobfleet-drift.timer")["Timer"]
    assert timer["OnUnitActiveSec"] == "5min"
    rules = (UNITS.parent / "rules" / "knobfleet.rules.yml").read_text(encoding="utf-8")
    assert "knobfleet:drift_check_age_seconds > 1800" in rules  # six missed runs


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing (make installs systemd)")
def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    for name in ("knobfleet-drift.service", "knobfleet-drift.timer"):
        shutil.copy(UNITS / name, tmp_path / name)
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "--recursive-errors=no", *map(str, sorted(tmp_path.iterdir()))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    problems = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if "knobfleet-drift" in line and "Command /usr/local/bin/knobfleet is not executable" not in line
    ]
    assert problems == [], proc.stdout + proc.stderr
