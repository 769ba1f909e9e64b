"""Every human / JSON rendering of results. Pure: returns strings, prints nothing."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec

if TYPE_CHECKING:  # drift and verify import this module: it stays free of pydantic
    from knobfleet.live.verify import HostVerdict
    from knobfleet.profiles.model import Profile
    from knobfleet.waves import WaveRow


P = ParamSpec("P")


def visible(text: str) -> str:
    """Human output as it will show: raw terminal escapes, CR, other control and format characters (U+200B,
    U+202E…), line separators and undecodable bytes are written as escapes (\\x1b, \\r, \\u200b, \\udcff), so a
    value can neither hide itself nor rewrite the screen. Newlines and tabs stay."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch in "\n\t" or ch.isprintable():
            out.append(ch)
        elif ch == "\r":
            out.append("\\r")
        else:
            n = ord(ch)
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
    return "".join(out)


def _human(render: Callable[P, str]) -> Callable[P, str]:
    """Decorator: the human rendering's text passes through ``visible``."""
    import functools

    @functools.wraps(render)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> str:
        return visible(render(*args, **kwargs))

    return wrapper


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float as None: JSON has neither (``Infinity`` breaks strict parsers)."""
    import math

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def to_json(data: Any) -> str:
    return json.dumps(finite(data), indent=2, sort_keys=False, ensure_ascii=False, allow_nan=False)


def terminal_width() -> int | None:
    """Columns to fit tables into: $COLUMNS, else the terminal's width when stdout is one; None (no limit) when
    writing to a pipe or file, so scripts and saved outputs get one line per row."""
    import os
    import shutil
    import sys

    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if sys.stdout.isatty():
        return shutil.get_terminal_size((120, 24)).columns
    return None


@_human
def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "", width: int | None = None) -> str:
    """A plain aligned text table. ``align`` holds one 'l'/'r' per column (default: left). Wider than ``width``
    (default: ``terminal_width()``), the last column (notes, messages) wraps onto continuation lines."""
    import textwrap

    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    aligns = (align or "l" * len(headers)).ljust(len(headers), "l")
    limit = terminal_width() if width is None else width
    wrap_at = 0
    if limit and len(headers) > 1 and aligns[-1] == "l":
        lead = sum(widths[:-1]) + 2 * (len(widths) - 1)
        if lead + widths[-1] > limit and limit - lead >= 20:
            wrap_at = limit - lead
            widths[-1] = max(len(cells[0][-1]), min(widths[-1], wrap_at))
    lines = []
    for n, r in enumerate(cells):
        tail = textwrap.wrap(r[-1], wrap_at, break_long_words=True) if wrap_at and n and len(r[-1]) > wrap_at else []
        row = [*r[:-1], tail[0]] if tail else r
        parts = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row, widths, aligns, strict=True)]
        lines.append("  ".join(parts).rstrip())
        pad = " " * (sum(widths[:-1]) + 2 * (len(widths) - 1))
        lines += [pad + more for more in tail[1:]]
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


@_human
def profile_list(rows: list[tuple[str, str, str, str]]) -> str:
    return table(["profile", "version", "extends", "description"], rows)


@_human
def catalog_diff(d: Any) -> str:
    """``catalog diff``: the breaking changes first (removed, renamed, changed), then the additions, then the
    metric names knobfleet reads that changed; counts on the first line."""
    counts = {w: len(d.of(w)) for w in ("removed", "renamed", "changed", "added", "metric")}
    head = f"{d.engine} {d.old} -> {d.new}: " + ", ".join(f"{n} {w}" for w, n in counts.items())
    rows = []
    for c in [*d.of("removed"), *d.of("renamed"), *d.of("changed"), *d.of("added"), *d.of("metric")]:
        what = c.detail if c.what != "renamed" else f"-> {c.new_name} ({c.detail})"
        rows.append((c.what, c.name, what or "-"))
    return head + ("\n" + table(["change", "knob", "detail"], rows) if rows else "\nno difference")


@_human
def profile_show(profile: Profile, locked: str | None) -> str:
    out = [
        f"profile    {profile.ref}  ({' -> '.join(profile.chain)})",
        f"engine     {profile.engine}",
        f"hash       {profile.content_hash}",
        f"lock       {'published' if locked == profile.content_hash else 'not locked yet'}",
    ]
    if profile.description:
        out.append(f"about      {profile.description}")
    out.append("env")
    out += [f"  {k}={v}" for k, v in profile.env_strings().items()]
    out.append("args")
    out += [f"  --{k}" if v is True else f"  --{k}={v}" for k, v in profile.args.items() if v is not False]
    g = profile.gate
    weights = ",".join(f"{c}={w:g}" for c, w in sorted(g.weights.items()))
    out.append(
        f"gate       baseline={g.baseline} conc={','.join(map(str, g.concurrency))} weights={weights} "
        f"min_effect={g.min_effect:g} max_regression={g.max_regression:g}"
    )
    return "\n".join(out)


def _short_names(names: list[str]) -> dict[str, str]:
    """Knob names without the prefix they all share (up to its last underscore), for compact tables."""
    import os.path

    common = os.path.commonprefix(names) if len(names) > 1 else ""  # noqa: RUF071 - knob names, not paths
    cut = common.rfind("_") + 1
    return {n: n[cut:] for n in names}


@_human
def waves_table(
    rows: list[WaveRow], sms: int, heads: int, knobs: dict[str, int], cliffs: list[int], note: str = ""
) -> str:
    short = _short_names(list(knobs))
    knob_s = " ".join(f"{short[k]}={v}" for k, v in knobs.items())
    body = table(
        ["batch", "n_hg", "nsplit", "CTAs", "waves", "ceil", "last wave", "cost", "combine", "step", "step/req"],
        [
            [
                r.batch,
                r.n_hg,
                r.nsplit,
                r.ctas,
                f"{r.waves:.2f}",
                r.waves_ceil,
                f"{r.last_wave_ctas} CTAs ({r.last_wave_fill:.0%})",
                f"{r.cost:.3f}",
                f"{r.combine_cost:.3f}",
                f"{r.step_cost:.3f}",
                f"{r.step_cost / r.batch:.4f}",
            ]
            for r in rows
        ],
        align="rrrrrrrrrrr",
    )
    lines = [f"{sms} SMs, {heads} heads, {knob_s}", *([note] if note else []), body]
    for b in cliffs:
        lines.append(f"warning: cliff at batch {b}: attention cost per request rises as the batch grows")
    if rows:
        lines.append("step = cost (attention) + combine (split-K merge): the planner ranks TARGET_CTAS by step")
    return "\n".join(lines)


NOTE_WIDTH = 60


def _note(text: str) -> str:
    """Table cells stay short; the whole message is printed below the table."""
    return text if len(text) <= NOTE_WIDTH else text[: NOTE_WIDTH - 1] + "…"


@_human
def apply_summary(result: Any) -> str:
    """Per-host table of an apply (or plan), then diffs and knob changes for a plan."""
    rows = []
    for h in result.hosts:
        live = " ".join(f"{k}={v}" for k, v in h.seen.items())
        gen = "-" if h.generation is None else f"{h.generation:04d}"
        if h.previous is not None and h.generation != h.previous:
            gen = f"{h.previous:04d}→{gen}"
        rows.append(
            [
                h.host,
                h.status,
                gen,
                h.main_pid or "-",
                f"{h.ready_s:.1f}s" if h.ready_s else "-",
                live or "-",
                _note(h.message or ("restarted" if h.restarted else "")),
            ]
        )
    verb = "plan" if result.check else "apply"
    head = f"{verb} {result.profile.ref} ({result.profile.content_hash[:19]}…)"
    out = [head, table(["host", "result", "generation", "engine pid", "ready", "live knobs", "note"], rows)]
    if result.check:
        for h in result.hosts:
            if h.knob_changes:
                out.append(f"\n{h.host}: " + ", ".join(h.knob_changes))
            for d in h.diffs:
                if d.get("diff"):
                    out.append(d["diff"].rstrip("\n"))
    groups: dict[str, list[Any]] = {}
    for h in result.hosts:
        if getattr(h, "group", ""):
            groups.setdefault(h.group.rsplit(" ", 2)[0], []).append(h)
    for name, ranks in groups.items():
        states = sorted({h.status for h in ranks})
        out.append(
            f"engine group {name}: "
            + ", ".join(f"{h.host} ({h.group.split(' ', 1)[1]})" for h in ranks)
            + f" — one unit, restarted together: {'/'.join(states)}"
        )
    failed = [h for h in result.hosts if h.status == "failed"]
    counts = {
        s: sum(h.status == s for h in result.hosts)
        for s in ("applied", "unchanged", "failed", "refused", "rolled-back", "not-run", "pending", "in-sync")
    }
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    forced = [h for h in result.hosts if getattr(h, "dropped", None) is not None]
    if forced:
        dropped = sum(h.dropped or 0 for h in forced)
        summary += f"; --force-restart dropped {dropped} request(s) on {len(forced)} host(s)"
    out.append(f"{summary}; {result.wall_s:.1f}s")
    for h in forced:
        out.append(f"warning: {h.host}: drain timed out; restarted with {h.dropped} request(s) still in flight")
    for h in result.hosts:
        if h.status == "refused":
            out.append(f"error: {h.host}: refused, nothing was changed: {h.message}")
    for h in failed:
        out.append(f"error: {h.host}: {h.message}")
        r = h.restored
        if r is not None and r.ok and r.uninstalled:
            out.append(f"  restored: {h.host}: {r.message}")
        elif r is not None and r.ok:
            gen = "-" if r.generation is None else f"{r.generation:04d}"
            out.append(
                f"  restored: {h.host} is back on generation {gen} ({r.profile}@{r.version}), "
                "restarted, ready and verified"
            )
        elif r is not None:
            out.append(f"  RESTORE FAILED on {h.host}: {r.message}")
        elif not h.committed and h.lock is None:
            out.append(f"  nothing was changed on {h.host}")
    if not result.check:
        final = [f"{h.host}={_final_generation(h)}" for h in result.hosts]
        out.append("final generations: " + " ".join(final))
    return "\n".join(out)


def _final_generation(h: Any) -> str:
    if h.restored is not None and h.restored.ok and h.restored.generation is not None:
        return f"{h.restored.generation:04d}"
    if h.status == "failed" and h.committed:
        return "unknown"
    gen = h.generation if h.status != "failed" or h.previous is None else h.previous
    return "-" if gen is None else f"{gen:04d}"


@_human
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


@_human
def drift_head(title: str, hosts: Sequence[str]) -> str:
    """The title and column heads of a streamed drift report (``drift_rows`` below it as hosts answer)."""
    widths = _drift_widths(hosts)
    head = "  ".join(c.ljust(w) for c, w in zip(DRIFT_COLUMNS, widths, strict=False)).rstrip()
    dashes = "  ".join("-" * w for w in widths).rstrip()
    return f"{title}\n{head}\n{dashes}"


def _drift_widths(hosts: Sequence[str]) -> list[int]:
    return [max([4, *(len(h) for h in hosts)]), STATUS_WIDTH, PROFILE_WIDTH, 10, 8, 5]


@_human
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


@_human
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


def json_line(data: Any) -> str:
    """One JSON document on one line (``--json-lines``)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


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


@_human
def history_report(hosts: list[Any], ledger: int = 0) -> str:
    out: list[str] = []
    for h in hosts:
        if h.unreachable:
            out.append(f"{h.host}: {h.unreachable}")
            continue
        cur = "none" if h.current is None else f"{h.current:04d}"
        out.append(f"{h.host} (current {cur})")
        rows = []
        for g in h.generations:
            prof = f"{g.profile}@{g.version}" if g.profile else "(pre-knobfleet files)"
            rows.append(
                [
                    ("* " if g.current else "  ") + f"{g.number:04d}",
                    prof,
                    (g.hash or "-")[7:19] or "-",
                    g.status or "-",
                    (g.created or "-")[:19],
                    g.operator or "-",
                    ("" if g.files_ok else "FILES MISSING; ") + g.reason[:70],
                ]
            )
        out.append(table(["gen", "profile", "hash", "status", "created", "operator", "reason"], rows))
        for err in h.errors:
            out.append(f"  error: {err}")
        for entry in h.ledger[-ledger:] if ledger else []:
            out.append("  ledger: " + " ".join(f"{k}={v}" for k, v in entry.items() if k != "files"))
        out.append("")
    return "\n".join(out).rstrip("\n")


@_human
def rollback_report(outcomes: list[Any]) -> str:
    rows = []
    for o in outcomes:
        prof = f"{o.profile}@{o.version}" if o.profile else ("(pre-knobfleet files)" if o.generation == 0 else "-")
        frm = "-" if o.previous is None else f"{o.previous:04d}"
        to = "-" if o.generation is None else f"{o.generation:04d}"
        rows.append(
            [o.host, "ok" if o.ok else "FAILED", f"{frm}→{to}", prof, o.message or "restarted, ready, verified"]
        )
    lines = [table(["host", "result", "generation", "profile", "note"], rows)]
    refused = [o for o in outcomes if not o.ok and o.generation is None]
    for o in refused:
        lines.append(
            f"error: {o.host}: rollback refused: {o.message.removesuffix('; nothing changed')}; nothing was changed"
        )
    return "\n".join(lines)


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


def canary_records(listed: Sequence[Any]) -> str:
    """``history --canaries``: one row per kept canary record (``experiment.records.Listed``), newest first."""
    import math
    import time

    if not listed:
        return "no canary records on this controller (each `knobfleet canary` keeps one)"
    rows = []
    for item in listed:
        doc = item.doc
        if doc is None:
            rows.append(["?", "?", "", "", "unreadable", item.error, str(item.path.name)])
            continue
        started = doc.get("started")
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)) if isinstance(started, int | float) else "?"
        tput = (doc.get("intervals") or {}).get("tput") or {}
        nums = [tput.get(k) for k in ("estimate", "low", "high")]
        ok = [float(v) for v in nums if isinstance(v, int | float) and math.isfinite(v)]
        shown = f"{ok[0]:+.1%} ({ok[1]:+.1%} to {ok[2]:+.1%})" if len(ok) == 3 else "-"
        verdict = str(doc.get("verdict", "?")) + (" (advisory)" if doc.get("advisory") else "")
        sides = f"{','.join(doc.get('canaries') or [])} vs {','.join(doc.get('baseline') or [])}"
        windows = f"{doc.get('windows_pre', 0)}+{doc.get('windows_counted', 0)}"
        rows.append([when, str(doc.get("profile", "?")), sides, windows, verdict, shown, str(item.path.name)])
    return table(["started (UTC)", "profile", "canaries vs baseline", "pre+judged", "verdict", "tput", "record"], rows)
