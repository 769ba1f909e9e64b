"""What a campaign record says, as text lines (the CLI) — the HTML page is ``experiment.html.tune_page``."""

from __future__ import annotations

from typing import Any


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

    return [
        "budget used: " + ", ".join([part("wall_s", "wall"), part("host_s", "host"), part("gpu_s", "GPU")]),
        f"  model {float((st.get('model') or {}).get('used_s') or 0):.2f}s · kernel "
        f"{'skipped' if (st.get('kernel') or {}).get('skipped') else 'measured'} · engine A/B {engine / 60:.1f} min"
        f" · live {'skipped' if (st.get('live') or {}).get('skipped') else 'canary'}",
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
