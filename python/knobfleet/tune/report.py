"""What a campaign record says: text lines (the CLI) and one self-contained HTML page (``tune_page``: the template
experiment/templates/tune.html.j2, rendered like every report page in experiment/html_core's autoescaping jinja2
environment)."""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from knobfleet.experiment.html_core import pct, provenance, render_page, svg


def knobs_text(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k.removeprefix('SGLANG_SM120_MMA_')}={v}" for k, v in knobs.items())


def restarts(stages: dict[str, Any]) -> int:
    """The engine host's restarts the campaign's A/Bs caused."""
    results = (stages.get("engine") or {}).get("results") or []
    return sum(int(((r.get("ab") or {}).get("spent") or {}).get("restarts") or 0) for r in results)


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
        f"  restarts: {float(used.get('restart_s') or 0) / 60:.1f} min of the host's (the engine's stops and starts "
        f"to ready, measured on the host; {restarts(st)} restart(s))",
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


def model_points(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every candidate the model scored, best first: its predicted cost against the current profile's (ratio minus
    one: below 0 is predicted faster), whether it was kept, and its measured kernel time against the current
    profile's where the kernel stage measured it."""
    st = doc.get("stages") or {}
    m = st.get("model") or {}
    current = m.get("current_cost")
    measured = {r["index"]: r.get("vs_current") for r in (st.get("kernel") or {}).get("rows") or []}
    return [
        {"name": f"c{r['index']}" + (" (current)" if str(r.get("reason")).startswith("the current profile") else ""),
         "predicted": r["cost"] / current - 1 if current else None, "kept": r["kept"],
         "measured": measured.get(r["index"])}
        for r in sorted(m.get("rows") or [], key=lambda r: (r["cost"], r["index"]))
    ]  # fmt: skip


def engine_points(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each candidate the engine stage ran an A/B for: its weighted gain over the current profile with the
    interval the sequential rule ended on, and the verdict."""
    out = []
    for r in ((doc.get("stages") or {}).get("engine") or {}).get("results") or []:
        ab = r.get("ab") or {}
        g = ab.get("weighted_gain") or {}
        if all(isinstance(g.get(k), int | float) for k in ("estimate", "low", "high")):
            out.append({"name": r["name"], "estimate": g["estimate"], "low": g["low"], "high": g["high"],
                        "verdict": ab.get("verdict")})  # fmt: skip
    return out


def _model_plot(points: list[dict[str, Any]]) -> Markup | None:
    def draw(ax: Any) -> None:
        xs = range(len(points))
        ax.bar(xs, [(p["predicted"] or 0) * 100 for p in points], color=["#2a7" if p["kept"] else "#bbb" for p in
               points], label="predicted cost vs the current profile (green: kept)")  # fmt: skip
        got = [(x, p["measured"] * 100) for x, p in zip(xs, points, strict=True) if p["measured"] is not None]
        if got:
            ax.plot([x for x, _ in got], [y for _, y in got], "D", color="#d62728", label="measured on the GPU",
                    gid="tune-measured")  # fmt: skip
        if len(points) <= 40:
            ax.set_xticks(list(xs), [p["name"] for p in points], rotation=60, fontsize=7)
        ax.axhline(0, color="#333", lw=1)
        ax.set_xlabel("candidate, best prediction first")
        ax.set_ylabel("attention cost per request vs current, %")
        ax.legend(fontsize=8)

    return svg(draw, (8.0, 3.6), integer_x=False)


def _engine_plot(points: list[dict[str, Any]]) -> Markup | None:
    def draw(ax: Any) -> None:
        for x, p in enumerate(points):
            color = "#2a7" if p["verdict"] == "promote" else "#c33" if p["verdict"] == "keep" else "#d90"
            bars = ax.errorbar([x], [p["estimate"] * 100], yerr=[[(p["estimate"] - p["low"]) * 100],
                               [(p["high"] - p["estimate"]) * 100]], marker="o", capsize=5, color=color)  # fmt: skip
            bars.lines[0].set_gid(f"tune-engine-{p['name']}")
        ax.set_xticks(range(len(points)), [f"{p['name']}\n{p['verdict']}" for p in points], fontsize=8)
        ax.axhline(0, color="#333", lw=1)
        ax.set_xlabel("candidate (green: promoted; red: kept the current profile; amber: inconclusive)")
        ax.set_ylabel("weighted gain over current, % (interval)")

    return svg(draw, (8.0, 3.4), integer_x=False)


def _model_section(doc: dict[str, Any], m: dict[str, Any]) -> dict[str, Any]:
    rows = [
        [f"c{r['index']}", knobs_text(r["knobs"]), f"{r['cost']:.5g}", pct(r["relative"]), r["reason"]]
        for r in sorted(m["rows"], key=lambda r: r["cost"])
    ]
    return {"candidates": m["candidates"], "kept": len(m["kept"]), "plot": _model_plot(model_points(doc)), "rows": rows}


def _kernel_section(k: dict[str, Any]) -> dict[str, Any]:
    if k.get("skipped"):
        return {"skipped": k["skipped"]}
    rows = [
        [f"c{r['index']}", knobs_text(r["knobs"]), "-" if r["us_per_req"] is None else f"{r['us_per_req']:.3f}",
         pct(r["vs_current"]), r["reason"]]
        for r in k["rows"]
    ]  # fmt: skip
    return {"skipped": None, "points": k.get("points"), "source": k.get("source"), "rows": rows}


def _engine_section(doc: dict[str, Any], e: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for r in e.get("results") or []:
        ab = r.get("ab") or {}
        g = ab.get("weighted_gain") or {}
        rows.append(
            [r["name"], knobs_text(r["knobs"]), r.get("out") or r.get("skipped") or ab.get("verdict"),
             pct(g.get("estimate")), f"{pct(g.get('low'))} … {pct(g.get('high'))}", ab.get("rounds", "-")]
        )  # fmt: skip
    points = engine_points(doc)
    return {"points": bool(points), "plot": _engine_plot(points) if points else None, "rows": rows}


def tune_page(doc: dict[str, Any]) -> str:
    """A tuning campaign: every stage, what it kept and dropped and why (the model's prediction per candidate and,
    where measured, the GPU's; each A/B's weighted gain with its interval, as plots and tables), the decision,
    what ran (the base and decided profiles with their content hashes, the space file's hash), the budget."""
    st = doc.get("stages") or {}
    d = doc.get("decision") or {}
    verdict = str(d.get("verdict") or doc.get("status") or "running")
    decision = f"{verdict}: {d.get('profile', '')} — {d.get('reason', '')}" if d else f"campaign {doc.get('status')}"
    live, live_text = st.get("live"), None
    if live:
        c = live.get("canary") or {}
        live_text = live.get("skipped") or f"canary {c.get('verdict')}: {c.get('reason')}"
    sp = doc.get("space") or {}
    return render_page(
        "tune.html.j2", f"knobfleet tune {sp.get('name')}", decision, verdict, budget=budget_lines(doc),
        gpu=doc.get("gpu"), sms=doc.get("sms"), calibration=doc.get("calibration"),
        model=_model_section(doc, st["model"]) if st.get("model") else None,
        kernel=_kernel_section(st["kernel"]) if st.get("kernel") else None,
        engine=_engine_section(doc, st["engine"]) if st.get("engine") else None, live=live_text,
        what_ran=provenance(doc, [[f"space file {sp.get('path')}", sp.get("sha256") or "-", "recorded by the run"]]),
    )  # fmt: skip
