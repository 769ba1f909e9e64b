"""`drift --prom`'s textfile: exact series, escaping, and a file promtool accepts (the shipped alert rules read
these names: monitoring/rules/knobfleet.rules.yml)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from knobfleet.live.verify import Finding, HostVerdict, Kind
from knobfleet.report import prometheus


def _verdicts() -> list[HostVerdict]:
    return [
        HostVerdict("lab1", "in_sync", "ctas512", 2, "sha256:ab", 3),
        HostVerdict(
            "lab2",
            "drift",
            "ctas512",
            2,
            "sha256:ab",
            3,
            [Finding(Kind.ENV_MISMATCH, "m"), Finding(Kind.ENV_MISMATCH, "n"), Finding(Kind.FILE_CHANGED, "f")],
        ),
        HostVerdict('la"b\\3', "unreachable", error="ssh: timeout"),
    ]


def test_series_per_host_and_kind() -> None:
    text = prometheus(_verdicts())
    series = [line for line in text.splitlines() if not line.startswith("#")]
    assert series == [
        'knobfleet_drift_findings{host="lab2",kind="env_mismatch"} 2',
        'knobfleet_drift_findings{host="lab2",kind="file_changed"} 1',
        'knobfleet_profile_info{host="lab1",profile="ctas512",version="2",hash="sha256:ab"} 1',
        'knobfleet_profile_info{host="lab2",profile="ctas512",version="2",hash="sha256:ab"} 1',
        'knobfleet_probe_success{host="lab1"} 1',
        'knobfleet_probe_success{host="lab2"} 1',
        'knobfleet_probe_success{host="la\\"b\\\\3"} 0',
    ]
    assert "knobfleet_drift_last_run_timestamp_seconds" not in text


def test_the_run_time_is_exported_when_given() -> None:
    text = prometheus(_verdicts(), now=1764600000.25)
    assert text.endswith("knobfleet_drift_last_run_timestamp_seconds 1764600000.250\n")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: `make test` installs prometheus")
def test_promtool_accepts_the_textfile() -> None:
    text = prometheus(_verdicts(), now=1.0)
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
