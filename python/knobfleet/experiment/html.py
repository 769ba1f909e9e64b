"""Self-contained HTML reports of experiments (``--report FILE.html``, ``knobfleet report RECORD``).

One file: inline CSS and inline SVG plots, no script, no font, no image and no link to any URL, so it opens from a
mail attachment on a machine with no network. The plots are drawn by matplotlib (the optional extra
``knobfleet[plots]``; without it the page says so and keeps its tables) and written as SVG, with matplotlib's
metadata and DOCTYPE stripped (the DOCTYPE names a DTD URL). The page's parts are in html_core.py.

- ``canary_page(record)``: the decision in one sentence; each judged window's canary-vs-baseline difference per
  metric with the pre-period before it, against the promotion and regression bars, and the final interval; what
  ran (the profile, its content hash, the engine, where the record has them); the hosts, the settings, the raw
  windows as a table.
- ``ab_page(doc)`` (html_ab.py): the decision; per-bucket throughput and latency of A and B with their 95%
  intervals; the sequential estimate round by round against the promotion, keep and futility bounds; what ran;
  the settings; the raw runs as a table.
- ``bench_page(doc)``: a sweep (``bench --report``, or ``bench --json``'s document): throughput per bucket, what
  ran, the settings the engine resolved.
- ``fleet_page(doc)``: ``drift --report``.
- ``restarts_page(doc)``: ``history --report``: every measured restart, its stop and the engine's phases.

Each page is a template under templates/ rendered in html_core's one jinja2 environment, which escapes every
value it writes: the functions here compute the page's values (plain text and numbers, and the plots as Markup).

Pure: a document in, text out. ``load(path)`` reads a stored record through ``safefile`` (bounded; a corrupt record
or one from a newer knobfleet is one line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from knobfleet.experiment.html_ab import ab_page
from knobfleet.experiment.html_core import pct, provenance, render_page, settings_rows, svg

__all__ = [
    "bench_page", "canary_page", "fleet_page", "load", "render", "restarts_page", "window_differences",
]  # fmt: skip


# --- canary ------------------------------------------------------------------------------------------------


def _side_mean(values: dict[str, Any], metric: str, hosts: list[str]) -> float | None:
    got = [float(values[metric][h]) for h in hosts if h in (values.get(metric) or {})]
    return sum(got) / len(got) if got else None


def window_differences(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """Per measured window (pre-period first), each metric as the judge sees it (``canary.METRICS``): positive is
    the new profile better. Throughput: new side / current side − 1 (the canaries / the baseline, and after a
    crossover's swap the baseline / the canaries); a lower-is-better metric (ITL) inverted, the same sign as the
    verdict's intervals. None where a side has no value."""
    from knobfleet.experiment.canary import METRICS

    out = []
    for pre, rows in ((True, rec.get("pre_period") or []), (False, rec.get("windows") or [])):
        for row in rows:
            vals = row.get("values") or {}
            diff: dict[str, float | None] = {}
            crossed = bool(row.get("crossed"))
            new, old = rec.get("canaries") or [], rec.get("baseline") or []
            if crossed:
                new, old = old, new
            for m in ("tput", "itl"):
                c = _side_mean(vals, m, new)
                b = _side_mean(vals, m, old)
                if c is None or b is None or c <= 0 or b <= 0:
                    diff[m] = None
                else:
                    diff[m] = c / b - 1 if METRICS.get(m, True) else b / c - 1
            iv = row.get("interval") if isinstance(row.get("interval"), dict) else {}
            out.append({"pre": pre, "crossed": crossed, "window": row.get("window"), "skipped": row.get("skipped"),
                        "interval": iv, "hung": _hung(row.get("probes"), new, old), **diff})  # fmt: skip
    return out


def _hung(probes: Any, new: list[str], old: list[str]) -> str:
    """The window's hung-stream probes, "hung/sent" on the new profile's side, then on the current one's ("" when
    the canary sent none)."""
    if not isinstance(probes, dict):
        return ""
    sides = []
    for hosts in (new, old):
        counts = [p for h, p in probes.items() if h in hosts and isinstance(p, dict)]
        hung, sent = (sum(p[k] for p in counts if isinstance(p.get(k), int)) for k in ("hung", "sent"))
        sides.append(f"{hung}/{sent}")
    return " · ".join(sides)


def canary_sentence(rec: dict[str, Any]) -> str:
    verdict = str(rec.get("verdict"))
    what = {"promote": "promoted", "rollback": "rolled back", "inconclusive": "inconclusive"}.get(verdict, verdict)
    mode = " (advisory: the verdict was not acted on)" if rec.get("advisory") else ""
    return (f"Canary of {rec.get('profile')} on {', '.join(rec.get('canaries') or [])} against "
            f"{', '.join(rec.get('baseline') or [])}: {what}{mode}, because {rec.get('reason')}.")  # fmt: skip


def canary_page(rec: dict[str, Any]) -> str:
    diffs = window_differences(rec)
    s = rec.get("settings") or {}
    bars = (float(s.get("min_effect") or 0.0), -float(s.get("max_regression") or 0.0))
    intervals = rec.get("intervals") or {}

    def draw(ax: Any) -> None:
        xs = list(range(1, len(diffs) + 1))
        for m, color, label in (("tput", "#1f77b4", "throughput"), ("itl", "#d62728", "inter-token speed (1/ITL)")):
            pts = [(x, d[m]) for x, d in zip(xs, diffs, strict=True) if d[m] is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] * 100 for p in pts], "o-", color=color, label=f"{label}, window")
            iv = intervals.get(m)
            if iv and all(isinstance(iv.get(k), int | float) for k in ("low", "high", "estimate")):
                ax.axhspan(iv["low"] * 100, iv["high"] * 100, color=color, alpha=0.12,
                           label=f"{label}: final interval {pct(iv['low'])} to {pct(iv['high'])}")  # fmt: skip
        for m, color in (("tput", "#1f77b4"), ("itl", "#d62728")):  # the sequential estimate after each window
            seq = [(x, d["interval"][m]) for x, d in zip(xs, diffs, strict=True) if m in (d["interval"] or {})]
            if seq:
                ax.plot([x for x, _ in seq], [iv["estimate"] * 100 for _, iv in seq], ":", color=color, lw=2,
                        label=f"{m}: running estimate")  # fmt: skip
                ax.fill_between([x for x, _ in seq], [iv["low"] * 100 for _, iv in seq],
                                [iv["high"] * 100 for _, iv in seq], color=color, alpha=0.08)  # fmt: skip
        pre = sum(1 for d in diffs if d["pre"])
        if pre:
            ax.axvspan(0.5, pre + 0.5, color="#999", alpha=0.12, label="pre-period (both on the current profile)")
        swap = next((x for x, d in zip(xs, diffs, strict=True) if d.get("crossed")), None)
        if swap is not None:
            ax.axvspan(swap - 0.5, len(diffs) + 0.5, color="#c90", alpha=0.08,
                       label="after the swap (the baseline on the new profile)")  # fmt: skip
        ax.axhline(bars[0] * 100, color="#2a7", ls="--", lw=1, label=f"promotion bar {pct(bars[0])}")
        ax.axhline(bars[1] * 100, color="#c33", ls="--", lw=1, label=f"regression bar {pct(bars[1])}")
        ax.set_xlabel("window (pre-period, then judged)")
        ax.set_ylabel("new profile vs current, % (+: new better)")
        ax.legend(fontsize=8, loc="best")

    rows = [["pre" if d["pre"] else "after swap" if d.get("crossed") else "judged", d["window"], pct(d["tput"]),
             pct(d["itl"]), d["hung"], d["skipped"] or ""] for d in diffs]  # fmt: skip
    iv_rows = [[m, pct(iv.get("estimate")), pct(iv.get("low")), pct(iv.get("high"))]
               for m, iv in sorted(intervals.items()) if isinstance(iv, dict)]  # fmt: skip
    host_rows: list[list[Any]] = [
        ["profile", rec.get("profile")],
        ["canaries", ", ".join(rec.get("canaries") or [])],
        ["baseline", ", ".join(rec.get("baseline") or [])],
        *[[k, v] for k, v in sorted(s.items())],
    ]
    return render_page(
        "canary.html.j2", f"canary {rec.get('profile')}", canary_sentence(rec), str(rec.get("verdict")),
        windows_plot=svg(draw), interval_rows=iv_rows, windows_counted=rec.get("windows_counted"),
        windows_pre=rec.get("windows_pre"), followup=rec.get("followup") or "-", what_ran=provenance(rec),
        settings_rows=host_rows, rows=rows, notes=rec.get("notes") or [], warmup=_warmup_text(rec.get("warmup")),
    )  # fmt: skip


def _warmup_text(w: Any) -> str:
    """What the canary set aside while the engines warmed up after their restarts (canary_warm); records from before
    the rule have none."""
    if not isinstance(w, dict):
        return "not recorded (a canary from before the warm-up rule: every window after a restart was judged)"
    text = f"{w.get('windows', 0)} window(s) and {w.get('requests', 0)} requests set aside"
    if w.get("unconverged_periods"):
        text += f"; {w['unconverged_periods']} period(s) never settled within the bound and were judged anyway"
    return text


# --- bench -------------------------------------------------------------------------------------------------


def is_bench(doc: dict[str, Any]) -> bool:
    """A bench document: ``kind: bench`` (``bench --report``), or ``bench --json``'s output as it was printed."""
    if doc.get("kind") == "bench":
        return True
    buckets = doc.get("buckets")
    return ({"host", "repeats", "buckets", "tool"} <= set(doc) and "a" not in doc and isinstance(buckets, list)
            and all(isinstance(b, dict) and "mean" in b for b in buckets))  # fmt: skip


def running_label(doc: dict[str, Any]) -> str:
    """The profile a bench measured, with the generation its host ran (``bench_page``'s title and legend)."""
    gens = doc.get("generations") or {}
    gen = gens.get(doc.get("host")) if isinstance(gens, dict) else None
    name = doc.get("profile") or "the current profile (not recorded)"
    return f"{name}, generation {gen:04d}" if isinstance(gen, int) else str(name)


def bench_page(doc: dict[str, Any]) -> str:
    """``bench --report``: throughput per concurrency bucket with its 95% interval (Student-t over the runs); what
    ran (the profile with its content hash, the engine version, the tool); the settings the engine resolved (its
    own report, with ``--tool engine``); every run's numbers."""
    buckets = doc.get("buckets") or []

    def sweep(ax: Any) -> None:
        xs = [b["concurrency"] for b in buckets]
        ys = [b["mean"] for b in buckets]
        lo = [b["mean"] - b["low"] if b.get("low") is not None else 0.0 for b in buckets]
        hi = [b["high"] - b["mean"] if b.get("high") is not None else 0.0 for b in buckets]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=4, color="#1f77b4", label=running_label(doc))
        ax.set_xticks(xs)  # the ticks sit at the buckets measured
        ax.set_xlabel("concurrency")
        ax.set_ylabel("aggregate tok/s (mean, 95% interval)")
        ax.legend(fontsize=8)

    errors = doc.get("errors") or 0
    sentence = (f"bench of {running_label(doc)} on {doc.get('host')}: {len(buckets)} "
                f"bucket(s), {doc.get('repeats')} run(s) each, {errors} request error(s); measured with "
                f"{doc.get('tool')}" + (f" against engine {doc['engine_version']}" if doc.get("engine_version")
                                         else "") + ".")  # fmt: skip
    rows = [[b["concurrency"], f"{b['mean']:.1f}",
             "-" if b.get("low") is None else f"{b['low']:.1f} to {b['high']:.1f}",
             " ".join(f"{v:.1f}" for v in b.get("runs") or [])] for b in buckets]  # fmt: skip
    scale = doc.get("time_scale")
    extra = [["bench tool", doc.get("tool") or "-", "recorded by the run"]] + (
        [["lab time scale", f"{scale:g} (tok/s are {1 / scale:.3g}x the modelled GPU's)", "the host's env"]]
        if isinstance(scale, int | float) and scale > 0 and scale != 1 else [])  # fmt: skip
    settings = doc.get("settings")
    resolved, cut = settings_rows(settings) if settings else (None, False)  # None: the engine was not asked
    return render_page(
        "bench.html.j2", f"bench of {running_label(doc)} on {doc.get('host')}", sentence,
        "promote" if errors == 0 else "rollback", sweep_plot=svg(sweep), what_ran=provenance(doc, extra),
        settings_rows=resolved, settings_cut=cut, rows=rows,
    )  # fmt: skip


# --- the fleet ---------------------------------------------------------------------------------------------


def fleet_page(doc: dict[str, Any], title: str = "fleet") -> str:
    """``drift --report``: every host's status, profile, generation, engine version and findings, and the fleet's
    profile distribution as a bar per profile. ``doc``: drift's JSON document (``hosts`` and ``summary``)."""
    hosts = doc.get("hosts") or []
    summary = doc.get("summary") or {}
    profiles = summary.get("profiles") or {}

    def spread(ax: Any) -> None:
        names = list(profiles) or ["(none)"]
        counts = [len(profiles[n]) for n in profiles] or [0]
        ax.barh(range(len(names)), counts, color="#1f77b4")
        ax.set_yticks(range(len(names)), [n.split(" (")[0] for n in names])
        ax.invert_yaxis()
        ax.set_xlabel("hosts")

    counts = {k: summary.get(k, 0) for k in ("in_sync", "drift", "unreachable", "error")}
    verdict = "promote" if counts["drift"] == counts["unreachable"] == counts["error"] == 0 else "rollback"
    sentence = (f"{summary.get('hosts', len(hosts))} hosts: {counts['in_sync']} in sync, {counts['drift']} drifted, "
                f"{counts['unreachable']} unreachable, {counts['error']} error; {len(profiles)} profile(s)"
                + (", engine version skew" if summary.get("engine_version_skew") else "") + ".")  # fmt: skip
    rows = [[h.get("host"), h.get("status"), f"{h['profile']}@{h.get('version')}" if h.get("profile") else "-",
             "-" if h.get("generation") is None else f"{h['generation']:04d}", h.get("engine_version") or "-",
             len(h.get("findings") or []), h.get("error") or ""] for h in hosts]  # fmt: skip
    finding_rows = [[h.get("host"), f.get("kind"), f.get("name") or "", f.get("message")]
                    for h in hosts for f in h.get("findings") or []]  # fmt: skip
    return render_page(
        "fleet.html.j2", title, sentence, verdict, spread_plot=svg(spread, (8.0, 0.6 + 0.45 * max(1, len(profiles)))),
        profile_rows=[[n, ", ".join(hs)] for n, hs in profiles.items()], rows=rows, finding_rows=finding_rows,
    )  # fmt: skip


# --- restarts ----------------------------------------------------------------------------------------------

PHASE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _seconds(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and x >= 0 else None


def _median(xs: list[float]) -> str:
    if not xs:
        return "unmeasured"
    ys = sorted(xs)
    mid = len(ys) // 2
    return f"{(ys[mid] if len(ys) % 2 else (ys[mid - 1] + ys[mid]) / 2):.1f}s"


def _all(events: list[dict[str, Any]], key: str) -> list[float]:
    return [x for e in events if (x := _seconds(e.get(key))) is not None]


def _restart_row(host: str, e: dict[str, Any]) -> list[Any]:
    gen = e.get("generation")
    return [
        host, e.get("time", ""), e.get("kind") or "-", f"{gen:04d}" if isinstance(gen, int) else "-",
        f"{e['profile']}@{e.get('version')}" if e.get("profile") else "-", e.get("engine_version") or "-",
        e.get("cache") or "-", f"{_seconds(e.get('stop_s')) or 0:.1f}s", f"{_seconds(e.get('start_s')) or 0:.1f}s",
        " ".join(f"{p.get('phase')} {_seconds(p.get('s')) or 0:.1f}s" for p in e.get("phases") or []) or "-",
    ]  # fmt: skip


def restarts_page(doc: dict[str, Any]) -> str:
    """``history --report``: every restart knobfleet measured (the ``start`` events of each host's ledger, as
    ``history --json`` gives them: docs/RESTARTS.md), a bar each from stop to API-ready split into the stop, the
    phases the engine logged and the rest; the median per host; and every restart as a row."""
    hosts = [h for h in doc.get("hosts") or [] if isinstance(h, dict)]
    starts = [(str(h.get("host")), e) for h in hosts for e in h.get("ledger") or []
              if isinstance(e, dict) and e.get("event") == "start"]  # fmt: skip
    phase_names = list(dict.fromkeys(str(p.get("phase")) for _, e in starts for p in e.get("phases") or []))

    def bars(ax: Any) -> None:
        seen: set[str] = set()

        def seg(y: int, left: float, width: float, name: str, colour: str) -> None:
            ax.barh(y, width, left=left, color=colour, label=None if name in seen else name)
            seen.add(name)

        for y, (_, e) in enumerate(starts):
            stop, start = _seconds(e.get("stop_s")) or 0.0, _seconds(e.get("start_s")) or 0.0
            seg(y, 0.0, stop, "stop", "#999")
            at = stop
            for p in e.get("phases") or []:
                width = _seconds(p.get("s")) or 0.0
                name = str(p.get("phase"))
                seg(y, at, width, name, PHASE_COLOURS[phase_names.index(name) % len(PHASE_COLOURS)])
                at += width
            if stop + start > at:
                seg(y, at, stop + start - at, "rest of the start", "#ccc")
        ax.set_yticks(range(len(starts)), [f"{h} {str(e.get('time', ''))[:16]}" for h, e in starts])
        ax.invert_yaxis()
        ax.set_xlabel("seconds from stop to API-ready")
        if starts:
            ax.legend(fontsize=8, loc="best")

    host_rows = []
    for h in hosts:
        mine = [e for name, e in starts if name == str(h.get("host"))]
        last = str(mine[-1].get("time", "")) if mine else "-"
        medians = [_median(_all(mine, "start_s")), _median(_all(mine, "stop_s"))]
        host_rows.append([h.get("host"), len(mine), *medians, last])
    rows = [_restart_row(host, e) for host, e in starts]
    measured = _all([e for _, e in starts], "start_s")
    sentence = (f"{len(starts)} measured restart(s) on {len({h for h, _ in starts})} of {len(hosts)} host(s); "
                f"median start to API-ready {_median(measured)}.")  # fmt: skip
    return render_page(
        "restarts.html.j2", "restarts", sentence, "promote" if starts else "inconclusive",
        restarts_plot=svg(bars, (8.0, 1.2 + 0.35 * max(1, len(starts))), integer_x=False), host_rows=host_rows,
        rows=rows,
    )  # fmt: skip


# --- records -----------------------------------------------------------------------------------------------


def render(doc: dict[str, Any], where: str = "record") -> str:
    """The page of a stored record: a canary record (``kind: canary``), a bench (``kind: bench``, or ``bench
    --json``'s document) or an A/B report (``report.json``)."""
    from knobfleet.errors import KnobfleetError

    try:
        if doc.get("kind") == "canary":
            return canary_page(doc)
        if is_bench(doc):
            return bench_page(doc)
        if {"a", "b", "buckets"} <= set(doc):
            return ab_page(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise KnobfleetError(f"{where}: not a complete record ({type(exc).__name__}: {str(exc)[:80]})") from None
    raise KnobfleetError(f"{where}: neither a canary record nor an A/B report nor a bench document; nothing to render")


def load(path: Path) -> dict[str, Any]:
    """A stored record or A/B report.json, read like every record (bounded, no FIFO, device or symlink)."""
    import json

    from knobfleet import paths, safefile
    from knobfleet.experiment import records

    try:
        text = safefile.read_text(path, records.MAX_RECORD_BYTES, "record")
    except safefile.FileRefused as exc:
        raise records.RecordError(f"{paths.display(path)}: {exc}") from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise records.RecordError(f"{paths.display(path)}: not a knobfleet record ({str(exc)[:80]})") from None
    if not isinstance(doc, dict):
        raise records.RecordError(f"{paths.display(path)}: not a knobfleet record")
    version = doc.get("schema_version")
    if isinstance(version, int) and version > records.SCHEMA_VERSION:
        raise records.RecordError(
            f"{paths.display(path)}: record schema {version} is newer than this knobfleet reads "
            f"({records.SCHEMA_VERSION}); upgrade knobfleet to read it"
        )
    return doc
