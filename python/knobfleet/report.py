"""The drift and verify report: ``drift_head``, ``drift_rows`` as hosts answer, ``drift_tail``; ``drift_report``.
Pure: returns strings, prints nothing.

The other renderings are files of their own, imported from there by their callers: the shared text
(``report_text``: ``visible``, ``table``, JSON), apply, history and rollback
(``report_rollout``), profiles, catalogs and the wave model (``report_knobs``), the Prometheus textfiles
(``report_prom``). Drift's path loads none of the last three.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from knobfleet.report_text import human, table

if TYPE_CHECKING:  # drift and verify import this module: it stays free of pydantic
    from knobfleet.live.verify import HostVerdict

__all__ = [
    "DRIFT_COLUMNS",
    "PROFILE_WIDTH",
    "STATUS_WIDTH",
    "drift_head",
    "drift_report",
    "drift_rows",
    "drift_tail",
]


@human
def drift_report(verdicts: list[Any], summary: dict[str, Any], title: str) -> str:
    rows = []
    for v in verdicts:
        prof = f"{v.profile}@{v.version}" if v.profile else "-"
        gen = "-" if v.generation is None else f"{v.generation:04d}"
        rows.append([v.host, v.status, prof, gen, len(v.findings), v.error or ""])
    out = [title, table(["host", "status", "profile", "generation", "findings", "error"], rows, "lllllr")]
    for v in verdicts:
        out += _grouped_findings(v.host, v.findings)
    out.append(drift_tail(summary))
    return "\n".join(out)


DRIFT_COLUMNS = ("host", "status", "profile", "generation", "findings", "error")
STATUS_WIDTH = len("unreachable")
PROFILE_WIDTH = 16


@human
def drift_head(title: str, hosts: Sequence[str]) -> str:
    """The title and column heads of a streamed drift report (``drift_rows`` below it as hosts answer)."""
    widths = _drift_widths(hosts)
    head = "  ".join(c.ljust(w) for c, w in zip(DRIFT_COLUMNS, widths, strict=False)).rstrip()
    dashes = "  ".join("-" * w for w in widths).rstrip()
    return f"{title}\n{head}\n{dashes}"


def _drift_widths(hosts: Sequence[str]) -> list[int]:
    return [max([4, *(len(h) for h in hosts)]), STATUS_WIDTH, PROFILE_WIDTH, 10, 8, 5]


@human
def drift_rows(v: HostVerdict, hosts: Sequence[str]) -> str:
    """One host's row (as it answers, in the columns of ``drift_head``), then its findings."""
    w = _drift_widths(hosts)
    prof = f"{v.profile}@{v.version}" if v.profile else "-"
    gen = "-" if v.generation is None else f"{v.generation:04d}"
    cells = [
        v.host.ljust(w[0]),
        v.status.ljust(w[1]),
        prof.ljust(w[2]),
        gen.ljust(w[3]),
        str(len(v.findings)).rjust(w[4]),
    ]
    row = "  ".join(cells) + ("  " + v.error if v.error else "")
    return "\n".join([row.rstrip(), *_grouped_findings(v.host, v.findings)])


@human
def drift_tail(summary: dict[str, Any]) -> str:
    """What follows the rows: hosts per profile, version skew, the counts."""
    out = [""]
    for prof, hosts in summary["profiles"].items():
        out.append(f"{prof}: {', '.join(hosts)}")
    if summary["version_skew"]:
        out.append(f"warning: version skew: hosts run {len(summary['profiles'])} different profiles")
    if summary.get("engine_version_skew"):  # mid-upgrade, or a host left behind
        on = "; ".join(f"{v} on {', '.join(h)}" for v, h in sorted(summary["engine_versions"].items()))
        out.append(f"warning: engine version skew: {on}")
    out.append(
        f"{summary['hosts']} hosts: {summary['in_sync']} in sync, {summary['drift']} drifted, "
        f"{summary['unreachable']} unreachable, {summary['error']} error"
    )
    return "\n".join(out)


def _grouped_findings(host: str, findings: list[Any]) -> list[str]:
    """One line per distinct finding; the same env finding on several processes of the unit is one line."""
    lines: list[str] = []
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for f in findings:
        key = (f.kind, f.name, str(f.expected), str(f.actual), f.source) if f.name else (id(f),)
        groups.setdefault(key, []).append(f)
    for group in groups.values():
        f = group[0]
        if len(group) > 1:
            pids = ", ".join(str(g.pid) for g in group)
            what = f"{f.name}={f.actual}" if f.actual is not None else f"{f.name} not set"
            expect = "" if f.expected is None else f", expected {f.expected}"
            lines.append(f"{host}: {f.kind}: pids {pids}: {what}{expect}")
        else:
            lines.append(f"{host}: {f.kind}: {f.message}")
        if f.diff:
            lines.append(f.diff.rstrip("\n"))
    return lines
