"""The A/B page (``ab --report``, ``knobfleet report report.json``): the decision; per-bucket throughput of A and B
with their 95% intervals, and their latency (ITL, TTFT, end-to-end) where the document keeps it; the sequential
estimate round by round, recomputed from the recorded runs with the decision rule the run used
(``design.decide``), against the bounds that rule checks: promotion, keep, the futility bound and the per-bucket
regression guardrail; what ran (profiles with content hashes, engine); the settings; every run. Pure.

Latency in the document, per bucket: ``latency: {"A": {"itl": [...], "ttft": [...], "e2e": [...]}, "B": {...}}``,
one value per run in seconds (the run's median, the bench client's ``p50``), in run order like ``runs``."""

from __future__ import annotations

import math
from typing import Any

from markupsafe import Markup

from knobfleet.experiment.html_core import mean_interval, pct, provenance, render_page, svg

LATENCY = (("itl", "inter-token latency (ITL)"), ("ttft", "time to first token (TTFT)"), ("e2e", "end-to-end latency"))
ARMS = (("A", "#1f77b4"), ("B", "#d62728"))


def _settings(doc: dict[str, Any]) -> Any:
    from knobfleet.experiment import design

    s = doc.get("settings") or {}
    return design.Settings(
        weights={int(k): float(v) for k, v in (s.get("weights") or {}).items()},
        **{k: s[k] for k in ("min_effect", "max_regression", "min_rounds", "max_rounds", "alpha", "futility")
           if k in s},
    )  # fmt: skip


def futility_bound(gain: Any, s: Any) -> float | None:
    """The weighted mean log-ratio below which ``design.decide`` keeps A for futility after ``gain.n`` rounds: the
    estimate m at which B's chance of clearing the promotion bar by the last round (``design.promotion_chance``)
    equals ``s.futility``. That chance is 1 - Phi((bar - m) / sd) with sd = sigma sqrt((N - k) / (N k)), so the
    bound is bar - sd Phi^-1(1 - futility). None where the rule does not look at futility: before
    ``min_rounds``, at the last round, or with the stop turned off (futility 0)."""
    from knobfleet.experiment import design, stats

    k, n = gain.n, s.max_rounds
    if s.futility <= 0 or k < s.min_rounds or k >= n:
        return None
    sd = gain.sigma * math.sqrt((n - k) / (n * k))
    bound: float = design.promotion_bar(gain, s) - sd * stats.normal_quantile(1 - s.futility)
    return bound


# The page replays the sequential test round by round (each round's decision reads every round before it): the
# replay's work grows with the square of the rounds, so it stops here, far above what an A/B runs (issue 56: a
# record of 1,500 rounds took minutes to render). The page says when it stopped.
MAX_REPLAYED_ROUNDS = 200


def recorded_rounds(doc: dict[str, Any]) -> int:
    """How many rounds every bucket of the record holds runs for (both arms)."""
    counts = [min(len(b["runs"]["A"]), len(b["runs"]["B"])) for b in doc.get("buckets") or []]
    return min(counts, default=0)


def sequential(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """After each round: the weighted gain's estimate and interval, the futility bound, B's chance of promotion by
    the last round, and what the rule said (``continue``, ``promote``, ``keep``, ``inconclusive``), recomputed
    from the recorded runs with ``design.decide``: what the sequential test saw, round by round. Gains as ratios
    minus one."""
    from knobfleet.experiment import design, stats

    settings = _settings(doc)
    per: dict[int, list[float]] = {}
    for b in doc.get("buckets") or []:
        a_runs, b_runs = b["runs"]["A"], b["runs"]["B"]
        per[int(b["concurrency"])] = [stats.log_ratio(x, y) for x, y in zip(a_runs, b_runs, strict=False) if x > 0
                                      and y > 0]  # fmt: skip
    rounds = min(min((len(v) for v in per.values()), default=0), MAX_REPLAYED_ROUNDS)
    out = []
    for r in range(1, rounds + 1):
        d = design.decide({c: v[:r] for c, v in per.items()}, settings)
        if d.gain is None:
            continue
        bound = futility_bound(d.gain, settings)
        out.append({"round": r, "estimate": math.expm1(d.gain.estimate), "low": math.expm1(d.gain.low),
                    "high": math.expm1(d.gain.high), "futility": None if bound is None else math.expm1(bound),
                    "chance": d.promote_chance, "verdict": d.verdict})  # fmt: skip
    return out


def latency_runs(bucket: dict[str, Any], arm: str, metric: str) -> list[float]:
    """One bucket's per-run latency of one arm (seconds), runs without a value left out."""
    lat = bucket.get("latency")
    got = ((lat.get(arm) or {}).get(metric) if isinstance(lat, dict) else None) or []
    return [float(v) for v in got if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)]


def _per_bucket(doc: dict[str, Any], key: str, values: Any, scale: float, ylabel: str) -> Markup | None:
    """A and B per bucket: the mean of the runs with its 95% interval, ``values(bucket, arm)`` the runs. Each arm's
    points are the SVG group ``ab-KEY-ARM``."""
    buckets = doc.get("buckets") or []

    def draw(ax: Any) -> None:
        for arm, color in ARMS:
            pts = [(b["concurrency"], *mean_interval(vs)) for b in buckets if (vs := values(b, arm))]
            bars = ax.errorbar([p[0] for p in pts], [p[1] * scale for p in pts], yerr=[p[2] * scale for p in pts],
                               marker="o", capsize=4, color=color, label=f"{arm}: {doc.get(arm.lower())}")  # fmt: skip
            bars.lines[0].set_gid(f"ab-{key}-{arm}")
        ax.set_xticks(sorted({b["concurrency"] for b in buckets}))  # the ticks sit at the buckets measured
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)

    return svg(draw, (8.0, 3.6))


def latency_section(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The latency section's plots (one per metric the document keeps) and its table of every run; None where the
    document keeps throughput only."""
    buckets = doc.get("buckets") or []
    present = [(m, label) for m, label in LATENCY if any(latency_runs(b, "A", m) for b in buckets)]
    if not present:
        return None
    plots, rows = [], []
    for m, label in present:
        plots.append(_per_bucket(doc, m, lambda b, arm, m=m: latency_runs(b, arm, m), 1000.0, f"{label}, ms"))
        for b in buckets:
            a_ms, b_ms = ([f"{v * 1000:.1f}" for v in latency_runs(b, arm, m)] for arm in ("A", "B"))
            if a_ms or b_ms:
                rows.append([m, b["concurrency"], " ".join(a_ms), " ".join(b_ms)])
    return {"plots": plots, "rows": rows}


def _rounds_plot(seq: list[dict[str, Any]], s: Any) -> Markup | None:
    def draw(ax: Any) -> None:
        xs = [p["round"] for p in seq]
        ax.plot(xs, [p["estimate"] * 100 for p in seq], "o-", color="#333", label="weighted gain of B over A",
                gid="ab-rounds-estimate")  # fmt: skip
        ax.fill_between(xs, [p["low"] * 100 for p in seq], [p["high"] * 100 for p in seq], color="#333", alpha=0.15,
                        label="its interval (the multiple-look z)")  # fmt: skip
        ax.axhline(0, color="#2a7", lw=1, label="promote B: the interval's low end above 0 …")
        ax.axhline(s.min_effect * 100, color="#2a7", ls="--", lw=1,
                   label=f"… and the estimate at least {pct(s.min_effect)}; keep A: the high end below it")  # fmt: skip
        fut = [(p["round"], p["futility"] * 100) for p in seq if p["futility"] is not None]
        if fut:
            ax.plot(
                [x for x, _ in fut],
                [y for _, y in fut],
                "v-",
                color="#c60",
                lw=1.2,
                gid="ab-rounds-futility",
                label=f"futility bound: the estimate below it keeps A (chance of promotion < {s.futility:.0%})",
            )
        ax.axhline(
            -s.max_regression * 100,
            color="#c33",
            ls=":",
            lw=1,
            label=f"regression guardrail {pct(-s.max_regression)} (per bucket, not the weighted gain)",
        )
        ax.set_xlabel("round")
        ax.set_ylabel("B vs A, %")
        ax.legend(fontsize=7.5, loc="best")  # fmt: skip

    return svg(draw)


def rounds_section(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The sequential estimate's section: its plot, the rule's settings it names, a row per round, and how many
    rounds the record holds where the replay stopped short of them; None where no round was measured."""
    seq = sequential(doc)
    if not seq:
        return None
    s = _settings(doc)
    rows = [[p["round"], pct(p["estimate"]), f"{pct(p['low'])} to {pct(p['high'])}", pct(p["futility"]),
             "-" if p["chance"] is None else f"{p['chance']:.1%}", p["verdict"]] for p in seq]  # fmt: skip
    held = recorded_rounds(doc)
    return {"held": held if held > MAX_REPLAYED_ROUNDS else None, "replayed": MAX_REPLAYED_ROUNDS,
            "plot": _rounds_plot(seq, s), "off": s.futility <= 0, "max_rounds": s.max_rounds,
            "futility": f"{s.futility:.0%}", "min_rounds": s.min_rounds, "rows": rows}  # fmt: skip


def ab_page(doc: dict[str, Any]) -> str:
    buckets = doc.get("buckets") or []
    s = doc.get("settings") or {}

    def tput(b: dict[str, Any], arm: str) -> list[float]:
        return [float(v) for v in b["runs"][arm]]

    g = doc.get("weighted_gain") or {}
    sentence = (f"A/B of {doc.get('a')} (A) and {doc.get('b')} (B) on {doc.get('host')}: {doc.get('verdict')} after "
                f"{doc.get('rounds')} rounds, because {doc.get('reason')}. Weighted gain of B {pct(g.get('estimate'))} "
                f"({pct(g.get('low'))} to {pct(g.get('high'))}); {doc.get('winner')} is live.")  # fmt: skip
    rows = [[b["concurrency"], f"{b['weight']:.2f}", f"{b['a_mean']:.1f}", f"{b['b_mean']:.1f}", pct(b.get("ratio")),
             f"{pct(b.get('low'))} to {pct(b.get('high'))}", b.get("class"),
             " ".join(f"{v:.0f}" for v in b["runs"]["A"]), " ".join(f"{v:.0f}" for v in b["runs"]["B"])]
            for b in buckets]  # fmt: skip
    settings_rows: list[list[Any]] = [["A", doc.get("a")], ["B", doc.get("b")], ["host", doc.get("host")],
                     *[[k, v] for k, v in sorted(s.items())]]  # fmt: skip
    return render_page(
        "ab.html.j2", f"A/B {doc.get('a')} vs {doc.get('b')}", sentence, str(doc.get("verdict")),
        tput_plot=_per_bucket(doc, "tput", tput, 1.0, "tok/s (mean of runs, 95% interval)"),
        latency=latency_section(doc), rounds=rounds_section(doc), what_ran=provenance(doc),
        settings_rows=settings_rows, rows=rows,
    )  # fmt: skip
