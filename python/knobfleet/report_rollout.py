"""Renderings of what changed hosts (pure): an ``apply`` or ``plan`` per host, ``history`` (generations, ledger,
kept canary records) and ``rollback``. Imported from ``knobfleet.report`` (which loads this module on first use).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from knobfleet.report_text import human, table

NOTE_WIDTH = 60


def _note(text: str) -> str:
    """Table cells stay short; the whole message is printed below the table."""
    return text if len(text) <= NOTE_WIDTH else text[: NOTE_WIDTH - 1] + "…"


@human
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
            for why in getattr(h, "cache_cold", None) or []:
                out.append(f"{h.host}: compile cache cold after the restart: {why}")
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
        elif not h.committed and h.lock is None and not getattr(h, "died", False):
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


@human
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
        out.extend(_starts(h.ledger))
        for entry in h.ledger[-ledger:] if ledger else []:
            out.append("  ledger: " + " ".join(f"{k}={v}" for k, v in entry.items() if k != "files"))
        out.append("")
    return "\n".join(out).rstrip("\n")


SHOWN_STARTS = 5


def _starts(ledger: list[Any]) -> list[str]:
    """The host's last measured starts (ledger events ``start``: module_utils/knob_startup.py), one line each."""
    measured = [e for e in ledger if isinstance(e, dict) and e.get("event") == "start"]
    measured = [e for e in measured if isinstance(e.get("start_s"), int | float)]
    rows = []
    for e in measured[-SHOWN_STARTS:]:
        stop = e.get("stop_s")
        phases = " ".join(
            f"{p.get('phase')} {p.get('s'):.1f}s"
            for p in e.get("phases") or []
            if isinstance(p, dict) and isinstance(p.get("s"), int | float)
        )
        rows.append(
            [
                str(e.get("time") or "-")[:19],
                str(e.get("kind") or "-") + (f", cache {e['cache']}" if e.get("cache") else ""),
                "-" if e.get("generation") is None else f"{e['generation']:04d}",
                f"{e.get('profile')}@{e.get('version')}" if e.get("profile") else "-",
                str(e.get("engine_version") or "-"),
                f"{stop:.1f}s" if isinstance(stop, int | float) else "-",
                f"{e['start_s']:.1f}s",
                phases or "-",
            ]
        )
    if not rows:
        return []
    head = ["started", "kind", "gen", "profile", "engine", "stop", "start", "phases (from the journal)"]
    return ["  restarts, newest last:", *("  " + line for line in table(head, rows).splitlines())]


@human
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
