"""Plots and tables for docs/KERNEL.md from recorded sweeps (matplotlib, Agg; imported only here).

python -m knobfleet.kernel.report perf/results/kernel/sweep-h200.json perf/results/kernel/sweep-h200-rep2.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from knobfleet import waves
from knobfleet.kernel import fit

SHOW_CTAS = (256, 512, 1024)
COLORS = {256: "tab:blue", 512: "tab:orange", 1024: "tab:green"}


def _uncal_scale(samples: list[fit.Sample], sms: int) -> float:
    """One least-squares factor from the uncalibrated model's relative units to µs (for plotting only)."""
    xs = [fit.predict(s, sms, None) for s in samples]
    ys = [s.total_us for s in samples]
    return sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)


def plot_predicted_vs_measured(
    samples: list[fit.Sample], cal: waves.Calibration, test_batches: set[int], out: Path, context: int = 4096
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sms = cal.sms
    scale = _uncal_scale(samples, sms)
    heads_all = sorted({s.heads for s in samples})
    blocks = sorted({s.block_h for s in samples})
    fig, axes = plt.subplots(
        len(heads_all), len(blocks), figsize=(5 * len(blocks), 3.8 * len(heads_all)), squeeze=False
    )
    index = {(*s.cell, s.target_ctas): s for s in samples}
    batches = sorted({s.batch for s in samples})
    for i, heads in enumerate(heads_all):
        for j, bh in enumerate(blocks):
            ax = axes[i][j]
            for tc in SHOW_CTAS:
                pts = [index[(b, heads, context, bh, tc)] for b in batches if (b, heads, context, bh, tc) in index]
                if not pts:
                    continue
                xb = [p.batch for p in pts]
                color = COLORS[tc]
                ax.plot(xb, [fit.predict(p, sms, cal) for p in pts], "-", color=color, lw=1.4, label=f"{tc} calibrated")
                ax.plot(xb, [scale * fit.predict(p, sms, None) for p in pts], ":", color=color, lw=1.2)
                held = [p for p in pts if p.batch in test_batches]
                fitted = [p for p in pts if p.batch not in test_batches]
                ax.plot([p.batch for p in fitted], [p.total_us for p in fitted], "o", mfc="none", color=color, ms=4)
                ax.plot([p.batch for p in held], [p.total_us for p in held], "o", color=color, ms=4)
            ax.set_title(f"H={heads} L={context} BLOCK_H={bh}", fontsize=10)
            ax.set_xlabel("batch")
            ax.set_ylabel("µs per call (split + combine)")
            ax.grid(alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7, title="TARGET_CTAS", title_fontsize=7)
    fig.suptitle(
        f"{cal.fingerprint}: measured (o: fitted, ●: held out) vs calibrated model (—) "
        "and the uncalibrated model scaled to µs (···)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_pick_loss(before: fit.Accuracy, after: fit.Accuracy, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.6))
    for acc, name, color, dx in ((before, "uncalibrated", "tab:red", -1.2), (after, "calibrated", "tab:blue", 1.2)):
        xs = [p["batch"] + dx for p in acc.picks]
        ys = [100 * p["loss"] for p in acc.picks]
        ax.plot(xs, ys, "o", ms=3.5, alpha=0.7, color=color, label=f"{name}: {acc.within:.0%} within 2%")
    ax.axhline(2, color="gray", lw=0.8, ls="--")
    ax.set_yscale("symlog", linthresh=2)
    ax.set_ylim(0, 100)
    ax.set_xlabel("batch (held-out cells; each dot one H, L, BLOCK_H)")
    ax.set_ylabel("loss of the pick vs measured best (%)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def tables(samples: list[fit.Sample], sweep: fit.Sweep, holdouts: list[str]) -> tuple[str, dict[str, Any]]:
    lines = [
        "| holdout | held-out cells | uncalibrated within 2% | mean loss | worst | "
        "calibrated within 2% | mean loss | worst | rank corr (unc → cal) | time error median / p90 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    raw: dict[str, Any] = {}
    for spec in holdouts:
        train, test = fit.split(samples, spec)
        cal = fit.fit(train, sweep)
        b, a = fit.score(test, sweep.sms, None), fit.score(test, sweep.sms, cal)
        te = fit.time_error(test, sweep.sms, cal)
        raw[spec] = {"before": b.as_json(), "after": a.as_json(), "time_error": te}
        lines.append(
            f"| {spec} | {a.cells} | {b.within:.1%} | {b.mean_loss:.2%} | {b.worst_loss:.1%} | {a.within:.1%} | "
            f"{a.mean_loss:.2%} | {a.worst_loss:.1%} | {b.median_rank_corr:.2f} → {a.median_rank_corr:.2f} | "
            f"{te['median']:.1%} / {te['p90']:.1%} |"
        )
    return "\n".join(lines), raw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="KERNEL.md plots and tables from recorded sweeps")
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--outdir", type=Path, default=Path("docs"))
    ap.add_argument("--holdout", default="alt-batch")
    args = ap.parse_args(argv)
    sweeps = [fit.load_sweep(p) for p in args.sweeps]
    samples = fit.merge(sweeps)
    train, test = fit.split(samples, args.holdout)
    cal = fit.fit(train, sweeps[0])
    test_batches = {s.batch for s in test}
    args.outdir.mkdir(parents=True, exist_ok=True)
    plot_predicted_vs_measured(samples, cal, test_batches, args.outdir / "kernel-pred-vs-measured.png")
    plot_predicted_vs_measured(samples, cal, test_batches, args.outdir / "kernel-pred-vs-measured-L2048.png", 2048)
    plot_pick_loss(fit.score(test, cal.sms, None), fit.score(test, cal.sms, cal), args.outdir / "kernel-pick-loss.png")
    table, _ = tables(samples, sweeps[0], [args.holdout, "L=4096", "H=128", "B>=96", "random:0.3:1"])
    print(table)
    print()
    print("all cells, fit on all:", fit.score(samples, cal.sms, fit.fit(samples, sweeps[0])).as_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
