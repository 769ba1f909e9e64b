"""Prometheus textfile-collector files (pure): ``drift --prom``'s findings, profiles, generations and probe success,
and ``canary --prom``'s running estimate, interval and verdict. Imported from ``knobfleet.report`` (which loads this
module on first use: only ``--prom`` writes one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from knobfleet.live.verify import HostVerdict


def _esc(v: object) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus(verdicts: list[HostVerdict], now: float | None = None) -> str:
    """Prometheus textfile-collector format; ``now`` (Unix time of the run) adds
    ``knobfleet_drift_last_run_timestamp_seconds``, which the shipped KnobfleetDriftCheckStale alert watches."""
    esc = _esc
    lines = [
        "# HELP knobfleet_drift_findings Findings per host and kind from the last knobfleet drift run.",
        "# TYPE knobfleet_drift_findings gauge",
    ]
    for v in verdicts:
        counts: dict[str, int] = {}
        for f in v.findings:
            counts[f.kind.value] = counts.get(f.kind.value, 0) + 1
        for kind, n in sorted(counts.items()):
            lines.append(f'knobfleet_drift_findings{{host="{esc(v.host)}",kind="{kind}"}} {n}')
    lines += [
        "# HELP knobfleet_profile_info Profile each host's current generation runs.",
        "# TYPE knobfleet_profile_info gauge",
    ]
    for v in verdicts:
        if v.profile is not None:
            lines.append(
                f'knobfleet_profile_info{{host="{esc(v.host)}",profile="{esc(v.profile)}",'
                f'version="{v.version}",hash="{esc(v.hash)}"}} 1'
            )
    lines += [
        "# HELP knobfleet_generation The generation each host's current link points at (a rollback lowers it).",
        "# TYPE knobfleet_generation gauge",
    ]
    for v in verdicts:
        if v.generation is not None:
            lines.append(f'knobfleet_generation{{host="{esc(v.host)}"}} {int(v.generation)}')
    lines += [
        "# HELP knobfleet_probe_success Whether the host could be probed (1) or not (0).",
        "# TYPE knobfleet_probe_success gauge",
    ]
    for v in verdicts:
        lines.append(
            f'knobfleet_probe_success{{host="{esc(v.host)}"}} {0 if v.status in ("unreachable", "error") else 1}'
        )
    if now is not None:
        lines += [
            "# HELP knobfleet_drift_last_run_timestamp_seconds When the drift run that wrote this file ended.",
            "# TYPE knobfleet_drift_last_run_timestamp_seconds gauge",
            f"knobfleet_drift_last_run_timestamp_seconds {now:.3f}",
        ]
    return "\n".join(lines) + "\n"


CANARY_SERIES = (
    ("knobfleet_canary_estimate", "estimate", "The running canary's estimate of the change per metric (canary against "
     "baseline, the pre-period's host difference removed), as a fraction: -0.05 is 5% lower."),
    ("knobfleet_canary_interval_low", "low", "Low end of the estimate's interval (the sequential rule's, after this "
     "many looks)."),
    ("knobfleet_canary_interval_high", "high", "High end of the estimate's interval."),
)  # fmt: skip


def canary_prometheus(
    profile: str,
    verdict: str,
    windows: int,
    intervals: dict[str, dict[str, float]],
    now: float,
    canaries: Sequence[str] = (),
    baseline: Sequence[str] = (),
) -> str:
    """``canary --prom``'s textfile, rewritten after every judged window and at the end: the estimate and interval
    per metric (fractions, as the record keeps them), the windows counted, the verdict so far (``continue`` while
    it runs) and when the file was written. The dashboard knobfleet-canary.json draws the interval, not two
    lines."""
    p = f'profile="{_esc(profile)}"'
    lines: list[str] = []
    for name, key, help_ in CANARY_SERIES:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        for metric, iv in sorted(intervals.items()):
            value = iv.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                lines.append(f'{name}{{{p},metric="{_esc(metric)}"}} {value:.6g}')
    hosts = f'canaries="{_esc(",".join(canaries))}",baseline="{_esc(",".join(baseline))}"'
    lines += [
        "# HELP knobfleet_canary_windows Windows the running canary has judged.",
        "# TYPE knobfleet_canary_windows gauge",
        f"knobfleet_canary_windows{{{p}}} {windows}",
        "# HELP knobfleet_canary_verdict The canary's verdict so far (continue, promote, rollback, inconclusive).",
        "# TYPE knobfleet_canary_verdict gauge",
        f'knobfleet_canary_verdict{{{p},verdict="{_esc(verdict)}",{hosts}}} 1',
        "# HELP knobfleet_canary_last_update_timestamp_seconds When the canary last rewrote this file.",
        "# TYPE knobfleet_canary_last_update_timestamp_seconds gauge",
        f"knobfleet_canary_last_update_timestamp_seconds{{{p}}} {now:.3f}",
    ]
    return "\n".join(lines) + "\n"
