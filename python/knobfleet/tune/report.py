"""What a campaign record says: text lines (the CLI) and one self-contained HTML page (``tune_page``, on the
report pages' own parts: experiment/html.py)."""

from __future__ import annotations

from typing import Any

from knobfleet.experiment.html import esc, page, pct, table


def knobs_text(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k.removeprefix('SGLANG_SM120_MMA_')}={v}" for k, v in knobs.items())


def budget_lines(doc: dict[str, Any]) -> list[str]:
    """How much of each budget the campaign used, stage by stage."""
    used, limits = doc.get("used") or {}, doc.get("budget") or {}
    st = doc.get("stages") or {}
    engine = sum(float((r.get("ab") or {}).get("wall_s") or 0) for r in (st.get("engine") or {}).get("results") or [])

    def part(kind: str, label: str) -> str:
        lim = float(limits.get(kind) or 0)
        u = float(used.get(kind) or 0)
        share = f" ({u / lim:.0%})" if lim else ""
        return f"{label} {u / 60:.1f} of {lim / 60:.0f} min{share}"

    by = doc.get("used_by_stage") or {}

    def stage(name: str, skipped: bool) -> str:
        return f"{name} {'skipped' if skipped else f'{float(by.get(name) or 0) / 60:.1f} min'}"

    return [
        "budget used: " + ", ".join([part("wall_s", "wall"), part("host_s", "host"), part("gpu_s", "GPU")]),
        "  by stage: "
        + " · ".join(
            [
                f"model {float(by.get('model') or 0):.2f}s",
                stage("kernel", bool((st.get("kernel") or {}).get("skipped"))),
                f"engine {float(by.get('engine') or 0) / 60:.1f} min (A/B {engine / 60:.1f})",
                stage("live", "live" not in by),
            ]
        ),
    ]


def summary_lines(doc: dict[str, Any]) -> list[str]:
    st = doc.get("stages") or {}
    out = [f"campaign {doc.get('space', {}).get('name')} over {doc.get('base')}: {doc.get('status')}"]
    m = st.get("model")
    if m:
        out.append(
            f"model: {m['candidates']} candidates scored for {doc.get('gpu')} ({doc.get('calibration') or 'model'}), "
            f"{len(m['kept'])} kept, {m['dropped']} dropped"
        )
        for r in m["rows"]:
            if r["kept"]:
                out.append(f"  c{r['index']} {knobs_text(r['knobs'])}: {r['reason']}")
    k = st.get("kernel")
    if k:
        if k.get("skipped"):
            out.append(f"kernel: skipped ({k['skipped']})")
        else:
            out.append(f"kernel: {k.get('points')} measured points from {k.get('source')}; kept {k['kept']}")
    e = st.get("engine")
    if e:
        for r in e.get("results") or []:
            ab = r.get("ab") or {}
            g = (ab.get("weighted_gain") or {}).get("estimate")
            gain = f" {g * 100:+.1f}%" if isinstance(g, int | float) else ""
            what = r.get("out") or r.get("skipped") or f"{ab.get('verdict')}{gain} in {ab.get('rounds')} rounds"
            out.append(f"engine: {r['name']} ({knobs_text(r['knobs'])}): {what}")
    d = doc.get("decision")
    if d:
        out.append(f"decision: {d['verdict']} {d.get('profile')} — {d.get('reason')}")
    out += budget_lines(doc)
    return out


def tune_page(doc: dict[str, Any]) -> str:
    """A tuning campaign: every stage, what it kept and dropped and why, the A/Bs, the decision, the budget."""
    st = doc.get("stages") or {}
    d = doc.get("decision") or {}
    verdict = str(d.get("verdict") or doc.get("status") or "running")
    decision = f"{verdict}: {d.get('profile', '')} — {d.get('reason', '')}" if d else f"campaign {doc.get('status')}"
    sections = [f"<p>{esc(line)}</p>" for line in budget_lines(doc)]
    m = st.get("model")
    if m:
        rows = [
            [f"c{r['index']}", knobs_text(r["knobs"]), f"{r['cost']:.5g}", pct(r["relative"]), r["reason"]]
            for r in sorted(m["rows"], key=lambda r: r["cost"])
        ]
        sections.append(
            f"<h2>1. Model: {m['candidates']} candidates, {len(m['kept'])} kept</h2>"
            f"<p>{esc(doc.get('gpu'))}, {esc(doc.get('sms'))} SMs; {esc(doc.get('calibration'))}</p>"
            + table(["candidate", "knobs", "predicted cost", "vs best", "why"], rows, 2)
        )
    k = st.get("kernel")
    if k:
        if k.get("skipped"):
            sections.append(f"<h2>2. Kernel: skipped</h2><p>{esc(k['skipped'])}</p>")
        else:
            rows = [
                [f"c{r['index']}", knobs_text(r["knobs"]), "-" if r["us_per_req"] is None else f"{r['us_per_req']:.3f}",
                 pct(r["vs_current"]), r["reason"]]
                for r in k["rows"]
            ]  # fmt: skip
            sections.append(
                f"<h2>2. Kernel: {esc(k.get('points'))} points from {esc(k.get('source'))}</h2>"
                + table(["candidate", "knobs", "µs per request", "vs current", "why"], rows, 2)
            )
    e = st.get("engine")
    if e:
        rows = []
        for r in e.get("results") or []:
            ab = r.get("ab") or {}
            g = ab.get("weighted_gain") or {}
            rows.append(
                [r["name"], knobs_text(r["knobs"]), r.get("out") or r.get("skipped") or ab.get("verdict"),
                 pct(g.get("estimate")), f"{pct(g.get('low'))} … {pct(g.get('high'))}", ab.get("rounds", "-")]
            )  # fmt: skip
        sections.append(
            "<h2>3. Engine: interleaved A/B against the current profile</h2>"
            + table(["candidate", "knobs", "verdict", "weighted gain", "interval", "rounds"], rows, 3)
        )
    live = st.get("live")
    if live:
        c = live.get("canary") or {}
        text = live.get("skipped") or f"canary {c.get('verdict')}: {c.get('reason')}"
        sections.append(f"<h2>4. Live</h2><p>{esc(text)}</p>")
    return page(f"knobfleet tune {(doc.get('space') or {}).get('name')}", decision, verdict, sections)
