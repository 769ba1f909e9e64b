"""Decision quality of `knobfleet ab`, measured by simulation (no servers; seeded).

Noise model, per run (one sweep over the concurrency buckets): log-throughput = true + D(t) + e, with
D a slow Ornstein-Uhlenbeck drift shared by all buckets (stationary sd SIGMA_DRIFT, correlation time
TAU runs) and e white noise per bucket (sd SIGMA_WHITE); sqrt(SIGMA_DRIFT^2 + SIGMA_WHITE^2) = 6.5%, the
run-to-run noise seen on a shared GPU. Three procedures decide between A and B:

* knobfleet ab: AB/BA rounds with the sequential rule of knobfleet.experiment.design (default budget);
* fixed 4 runs: A A B B (how it is usually done), pick the higher weighted mean;
* fixed 52 runs: A B A B … 26 per arm, pick the higher weighted mean.

Printed per scenario (true effect of B: +3%, 0 = A/A, -3%, and "cancel": the seed replay ctas768 vs
ctas512 on the stand-in's model, +1.4% / -4.4% / -0.5% / +2.2% at C48 / C64 / C80 / C96, weighted -0.8%):
correct decisions (for A/A: how often a switch to B is declared; for cancel: A kept), how often the rule
decided (promote or keep, not inconclusive: fixed procedures always pick), and the mean and p90 number of
runs. Targets: >= 95% correct at +3% with a mean <= 30 runs; A/A declares a switch in <= 5% of experiments.
Each trial's machine (its noise) is seeded by scenario and trial number, the same for every procedure, so
the rows compare procedures on the same machines (with and without the futility stop: paired).
Usage: python perf/decision_quality.py [--trials 2000] [--seed 7]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from knobfleet.experiment.design import Settings, decide, order

SIGMA = 0.065
SIGMA_WHITE = 0.015
SIGMA_DRIFT = math.sqrt(SIGMA**2 - SIGMA_WHITE**2)
TAU = 20.0
WEIGHTS = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}


class Machine:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.d = rng.gauss(0, SIGMA_DRIFT)
        self.a = math.exp(-1 / TAU)

    def run(self, effect: dict[int, float]) -> dict[int, float]:
        self.d = self.a * self.d + math.sqrt(1 - self.a**2) * SIGMA_DRIFT * self.rng.gauss(0, 1)
        return {b: math.log(800) + effect[b] + self.d + self.rng.gauss(0, SIGMA_WHITE) for b in WEIGHTS}


NONE = dict.fromkeys(WEIGHTS, 0.0)
CANCEL = {48: math.log1p(0.0139), 64: math.log1p(-0.0436), 80: math.log1p(-0.0045), 96: math.log1p(0.0217)}


def weighted(x: dict[int, float]) -> float:
    return sum(WEIGHTS[b] * v for b, v in x.items()) / sum(WEIGHTS.values())


def knobfleet_ab(rng: random.Random, effect: dict[int, float], futility: float | None = None) -> tuple[str, int, bool]:
    m = Machine(rng)
    s = Settings(weights=WEIGHTS) if futility is None else Settings(weights=WEIGHTS, futility=futility)
    per_bucket: dict[int, list[float]] = {b: [] for b in WEIGHTS}
    for r in range(s.max_rounds):
        res = {}
        for arm in order(r):
            res[arm] = m.run(effect if arm == "B" else NONE)
        for b in WEIGHTS:
            per_bucket[b].append(res["B"][b] - res["A"][b])
        d = decide(per_bucket, s)
        if d.final:
            return ("B" if d.verdict == "promote" else "A"), 2 * (r + 1), d.verdict != "inconclusive"
    return "A", 2 * s.max_rounds, False


def fixed(rng: random.Random, effect: dict[int, float], sequence: str) -> tuple[str, int, bool]:
    m = Machine(rng)
    runs: dict[str, list[float]] = {"A": [], "B": []}
    for arm in sequence:
        runs[arm].append(weighted(m.run(effect if arm == "B" else NONE)))
    return ("B" if statistics.mean(runs["B"]) > statistics.mean(runs["A"]) else "A"), len(sequence), True


PROCEDURES = {
    "knobfleet ab (sequential AB/BA)": knobfleet_ab,
    "  … without the futility stop": lambda rng, e: knobfleet_ab(rng, e, futility=0.0),
    "fixed 4 runs (AABB, higher mean)": lambda rng, e: fixed(rng, e, "AABB"),
    "fixed 52 runs (ABAB…, higher mean)": lambda rng, e: fixed(rng, e, "AB" * 26),
}
SCENARIOS = {
    "+3%": dict.fromkeys(WEIGHTS, math.log1p(0.03)),
    "A/A": NONE,
    "-3%": dict.fromkeys(WEIGHTS, math.log1p(-0.03)),
    "cancel": CANCEL,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    print(
        f"noise: sd {SIGMA:.1%} per run (drift {SIGMA_DRIFT:.2%}, tau {TAU:g} runs; white {SIGMA_WHITE:.1%}); "
        f"{args.trials} experiments per cell, seed {args.seed}"
    )
    header = (
        f"{'procedure':<36} {'true effect':>11} {'correct':>8} {'switch':>7} {'decided':>7} {'mean runs':>9} "
        f"{'p90 runs':>8}"
    )
    print(header)
    print("-" * len(header))
    for name, proc in PROCEDURES.items():
        for label, effect in SCENARIOS.items():
            picks, runs, decided = [], [], 0
            for i in range(args.trials):
                # one machine per trial, the same for every procedure: the comparisons are paired
                pick, n, final = proc(random.Random(f"{args.seed}-{label}-{i}"), effect)
                picks.append(pick)
                runs.append(n)
                decided += final
            switch = picks.count("B") / len(picks)
            correct = switch if label == "+3%" else (1 - switch)
            p90 = sorted(runs)[int(0.9 * len(runs)) - 1]
            print(
                f"{name:<36} {label:>11} {correct:>8.1%} {switch:>7.1%} {decided / args.trials:>7.1%} "
                f"{statistics.mean(runs):>9.1f} {p90:>8}"
            )


if __name__ == "__main__":
    main()
