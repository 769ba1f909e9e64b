"""A/B experiment reports: JSON document, Markdown and a PNG plot (matplotlib, imported lazily)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any


def markdown(doc: dict[str, Any]) -> str:
    g = doc["weighted_gain"]
    lines = [
        f"# A/B: {doc['a']} vs {doc['b']} on {doc['host']}",
        "",
        f"**Verdict: {doc['verdict']}** — {doc['reason']}",
        "",
        f"Live at the end: `{doc['winner']}`. Rounds: {doc['rounds']} ({doc['rounds'] * 2} runs, AB/BA order).",
        "",
        f"Traffic-weighted gain of B over A: {fmt(g['estimate'])} (interval {fmt(g['low'])} to {fmt(g['high'])}).",
        "",
        "| concurrency | weight | A tok/s | B tok/s | B/A | interval | class |",
        "| ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for b in doc["buckets"]:
        lines.append(
            f"| {b['concurrency']} | {b['weight']:.2f} | {b['a_mean']:.1f} | {b['b_mean']:.1f} | "
            f"{fmt(b['ratio'])} | {fmt(b['low'])} … {fmt(b['high'])} | {b['class']} |"
        )
    lines += [
        "",
        f"Consistency: A {doc['consistency']['A']}, B {doc['consistency']['B']}. "
        f"Request errors: A {doc['errors']['A']}, B {doc['errors']['B']}.",
        "",
        "Method: paired per-round log-ratios, noise from the run-to-run spread shrunk toward a prior and "
        "floored; Bonferroni-corrected sequential looks, and a futility stop once B's predictive chance of "
        "promotion by the last round is small (see knobfleet.experiment.design).",
    ]
    return "\n".join(lines) + "\n"


def fmt(ratio_minus_one: float) -> str:
    return f"{ratio_minus_one * 100:+.1f}%"


def plot(doc: dict[str, Any], path: Path) -> bool:
    """Write the PNG; False (nothing written) without matplotlib: it is the optional extra knobfleet[plots]."""
    from knobfleet.experiment.stats import t_quantile_975

    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for arm, color in (("A", "#1f77b4"), ("B", "#d62728")):
        xs, ys, errs = [], [], []
        for b in doc["buckets"]:
            runs = b["runs"][arm]
            xs.append(b["concurrency"])
            ys.append(statistics.mean(runs))
            sd = statistics.stdev(runs) if len(runs) > 1 else 0.0
            errs.append(t_quantile_975(len(runs) - 1) * sd / math.sqrt(len(runs)) if len(runs) > 1 else 0.0)
        name = doc["a"] if arm == "A" else doc["b"]
        ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=4, color=color, label=f"{arm}: {name}")
    ax.set_xlabel("concurrency")
    ax.set_ylabel("aggregate tok/s (mean of runs, 95% interval)")
    ax.set_title(f"{doc['a']} vs {doc['b']} on {doc['host']}: {doc['verdict']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
