"""`drift --prom`'s textfile: exact series, escaping, and a file promtool accepts (the shipped alert rules read
these names: monitoring/rules/knobfleet.rules.yml)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from knobfleet.live.verify import Finding, HostVerdict, Kind
from knobfleet.report_prom import prometheus


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
        'knobfleet_generation{host="lab1"} 3',
        'knobfleet_generation{host="lab2"} 3',
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


# --- `canary --prom`: the running canary's estimate, interval and verdict ----------------------------------------

import math  # noqa: E402
import re  # noqa: E402

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from knobfleet.report_prom import canary_prometheus  # noqa: E402


def test_the_canary_textfile_has_each_metrics_band_the_verdict_and_the_time() -> None:
    ivs = {"tput": {"estimate": -0.05, "low": -0.09, "high": -0.01}, "itl": {"estimate": 0.02, "low": math.nan,
           "high": math.inf}}  # fmt: skip
    text = canary_prometheus("slower5", "continue", 3, ivs, 1764600000.25, ["lab1"], ["lab2"])
    series = [line for line in text.splitlines() if not line.startswith("#")]
    assert series == [
        'knobfleet_canary_estimate{profile="slower5",metric="itl"} 0.02',
        'knobfleet_canary_estimate{profile="slower5",metric="tput"} -0.05',
        'knobfleet_canary_interval_low{profile="slower5",metric="tput"} -0.09',  # a NaN end is left out
        'knobfleet_canary_interval_high{profile="slower5",metric="tput"} -0.01',  # and so is an infinite one
        'knobfleet_canary_windows{profile="slower5"} 3',
        'knobfleet_canary_verdict{profile="slower5",verdict="continue",canaries="lab1",baseline="lab2"} 1',
        'knobfleet_canary_last_update_timestamp_seconds{profile="slower5"} 1764600000.250',
    ]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: `make test` installs prometheus")
def test_promtool_accepts_the_canary_textfile() -> None:
    text = canary_prometheus('we"ird\\name', "rollback", 5, {"tput": {"estimate": -0.3, "low": -0.4, "high": -0.2}},
                             2.0, ["a", "b"], ["c"])  # fmt: skip
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


LINE = re.compile(r'^(\w+)\{((?:\w+="(?:[^"\\]|\\.)*",?)*)\} (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(
    profile=st.text(min_size=1, max_size=20),
    metric=st.sampled_from(["tput", "itl", "ttft"]),
    estimate=finite,
    low=finite,
    high=finite,
    windows=st.integers(min_value=0, max_value=1000),
)
def test_every_value_and_label_reads_back_as_written(
    profile: str, metric: str, estimate: float, low: float, high: float, windows: int
) -> None:
    text = canary_prometheus(profile, "continue", windows, {metric: {"estimate": estimate, "low": low,
                             "high": high}}, 1.0)  # fmt: skip
    got = {}
    for line in text.rstrip("\n").split("\n"):  # the format's lines end at \n only (not at \x1e or \r)
        if line.startswith("#"):
            continue
        m = LINE.match(line)
        assert m, line
        labels = {k: _unescape(v) for k, v in LABEL.findall(m.group(2))}
        assert labels["profile"] == profile
        got[(m.group(1), labels.get("metric"))] = float(m.group(3))
    for name, want in (("estimate", estimate), ("interval_low", low), ("interval_high", high)):
        assert got[(f"knobfleet_canary_{name}", metric)] == pytest.approx(want, rel=1e-5, abs=1e-300)
    assert got[("knobfleet_canary_windows", None)] == windows
