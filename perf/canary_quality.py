"""Decision quality of `knobfleet canary` at the lab's noise: false rollbacks of identical profiles (A/A) and the
power against real changes, from simulated canaries.

Each simulated host carries the stand-in's own noise process (python/knobfleet/lab/sim/model.py: a slow
Ornstein-Uhlenbeck drift of the log throughput, sd DEFAULT_NOISE, time constant DRIFT_TAU_S, plus per-step jitter),
integrated exactly over each window at the lab's time scale. A window's per-host throughput per running request is
the mean of that factor over the window; its mean ITL is the inverse with its own small timing jitter. The canary
judge (python/knobfleet/experiment/canary.py) sees only those per-window values, as it would from Prometheus.

    python perf/canary_quality.py [--runs 400] [--window 60] [--hosts 1]

Prints the A/A false-rollback rate (target <= 1%) and, per true change, how often the canary is rolled back /
promoted and after how many windows; the smallest change rolled back with >= 90% power (target <= 5%).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from knobfleet.experiment.canary import Settings, Window, judge
from knobfleet.lab.sim import model

TIME_SCALE = 0.25  # the lab's SGLANG_SIM_TIME_SCALE
DT_MODEL_S = 2.0


class Host:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.x = rng.gauss(0, model.DEFAULT_NOISE)  # stationary start

    def window(self, wall_s: float) -> float:
        """Mean throughput factor over one window (exact OU steps of DT_MODEL_S model seconds)."""
        steps = max(1, int(wall_s / TIME_SCALE / DT_MODEL_S))
        a = math.exp(-DT_MODEL_S / model.DRIFT_TAU_S)
        total = 0.0
        for _ in range(steps):
            self.x = a * self.x + math.sqrt(1 - a * a) * model.DEFAULT_NOISE * self.rng.gauss(0, 1)
            total += math.exp(self.x)
        # per-step jitter averages over the ~window/step decode steps; keep its residue
        jitter = model.JITTER / math.sqrt(steps * 50)
        return total / steps * math.exp(self.rng.gauss(0, jitter))


def one(effect: float, s: Settings, rng: random.Random, hosts: int, wall_s: float) -> tuple[str, int]:
    canary = [Host(rng) for _ in range(hosts)]
    baseline = [Host(rng) for _ in range(hosts)]
    windows: list[Window] = []
    for _ in range(s.max_windows):
        c = {f"c{i}": (1 + effect) * h.window(wall_s) for i, h in enumerate(canary)}
        b = {f"b{i}": h.window(wall_s) for i, h in enumerate(baseline)}
        itl_c = {k: 1 / v * math.exp(rng.gauss(0, 0.002)) for k, v in c.items()}
        itl_b = {k: 1 / v * math.exp(rng.gauss(0, 0.002)) for k, v in b.items()}
        windows.append(Window({"tput": c, "itl": itl_c}, {"tput": b, "itl": itl_b}, 200, 200))
        v = judge(windows, s)
        if v.final:
            return v.verdict, v.windows
    return "inconclusive", s.max_windows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400, help="simulated canaries per true change")
    ap.add_argument("--aa-runs", type=int, default=2000, help="simulated A/A canaries (the false-rollback rate)")
    ap.add_argument("--window", type=float, default=60.0, help="window length in wall seconds (default 60)")
    ap.add_argument("--hosts", type=int, default=1, help="canary hosts (and as many baseline hosts)")
    ap.add_argument("--seed", type=int, default=20261201)
    args = ap.parse_args()
    s = Settings()
    rng = random.Random(args.seed)
    print(
        f"canary decision quality: {args.aa_runs} simulated A/A canaries, {args.runs} per other change, "
        f"{args.hosts} canary + {args.hosts} "
        f"baseline host(s), {args.window:g} s windows at time scale {TIME_SCALE} (noise sd {model.DEFAULT_NOISE}, "
        f"drift tau {model.DRIFT_TAU_S:g} model s), windows {s.min_windows}..{s.max_windows}, alpha {s.alpha}, "
        f"regression limit {s.max_regression:.0%}"
    )
    print(f"{'true change':>11}  {'rollback':>8}  {'promote':>7}  {'inconcl.':>8}  {'windows (median)':>16}")
    smallest = None
    for effect in (0.0, -0.02, -0.03, -0.04, -0.05, -0.06, -0.08, -0.10, -0.45, +0.05):
        runs = args.aa_runs if effect == 0.0 else args.runs
        outcomes = [one(effect, s, rng, args.hosts, args.window) for _ in range(runs)]
        rate = {k: sum(o[0] == k for o in outcomes) / runs for k in ("rollback", "promote", "inconclusive")}
        med = statistics.median(o[1] for o in outcomes)
        print(
            f"{effect:>+10.0%}  {rate['rollback']:>8.1%}  {rate['promote']:>7.1%}  {rate['inconclusive']:>8.1%}  "
            f"{med:>16g}"
        )
        if effect < 0 and rate["rollback"] >= 0.9 and smallest is None:
            smallest = effect
        if effect == 0.0:
            false_rollback = rate["rollback"]
    half = 1.96 * math.sqrt(max(false_rollback * (1 - false_rollback), 1e-9) / args.aa_runs)
    print(
        f"A/A false-rollback rate: {false_rollback:.2%} (95% CI {max(0.0, false_rollback - half):.2%} to "
        f"{false_rollback + half:.2%}; target <= 1%)"
    )
    print(
        "smallest change rolled back with >= 90% power: "
        + (f"{smallest:+.0%} (target <= 5%)" if smallest is not None else "none of those tried")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
