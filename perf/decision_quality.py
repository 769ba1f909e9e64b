"""Decision quality of `knobfleet ab`, measured by simulation (no servers; seeded).

Noise model, per run (one sweep over the concurrency buckets): log-throughput = true + D(t) + e, with
D a slow Ornstein-Uhlenbeck drift shared by all buckets (stationary sd SIGMA_DRIFT, correlation time
TAU runs) and e white noise per bucket (sd SIGMA_WHITE); sqrt(SIGMA_DRIFT^2 + SIGMA_WHITE^2) = 6.5%, the
run-to-run noise seen on a shared GPU. Three procedures decide between A and B:

* knobfleet ab: AB/BA rounds with the sequential rule of knobfleet.experiment.design (default budget);
* fixed 4 runs: A A B B (how it is usually done), pick the higher weighted mean;
* fixed 52 runs: A B A B … 26 per arm, pick the higher weighted mean.

Printed per scenario (true effect of B: +3%, 0 = A/A, -3%): correct decisions (for A/A: how often a
switch to B is declared), and the mean and p90 number of runs. Targets: >= 95% correct at +3% with a
mean <= 30 runs; A/A declares a switch in <= 5% of experiments.
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

    def run(self, effect: float) -> dict[int, float]:
        self.d = self.a * self.d + math.sqrt(1 - self.a**2) * SIGMA_DRIFT * self.rng.gauss(0, 1)
        return {b: math.log(800) + effect + self.d + self.rng.gauss(0, SIGMA_WHITE) for b in WEIGHTS}


def weighted(x: dict[int, float]) -> float:
    return sum(WEIGHTS[b] * v for b, v in x.items()) / sum(WEIGHTS.values())


def knobfleet_ab(rng: random.Random, effect: float) -> tuple[str, int]:
    m, s = Machine(rng), Settings(weights=WEIGHTS)
    per_bucket: dict[int, list[float]] = {b: [] for b in WEIGHTS}
    for r in range(s.max_rounds):
        res = {}
        for arm in order(r):
            res[arm] = m.run(effect if arm == "B" else 0.0)
        for b in WEIGHTS:
            per_bucket[b].append(res["B"][b] - res["A"][b])
        d = decide(per_bucket, s)
        if d.final:
            return ("B" if d.verdict == "promote" else "A"), 2 * (r + 1)
    return "A", 2 * s.max_rounds


def fixed(rng: random.Random, effect: float, sequence: str) -> tuple[str, int]:
    m = Machine(rng)
    runs: dict[str, list[float]] = {"A": [], "B": []}
    for arm in sequence:
        runs[arm].append(weighted(m.run(effect if arm == "B" else 0.0)))
    return ("B" if statistics.mean(runs["B"]) > statistics.mean(runs["A"]) else "A"), len(sequence)


PROCEDURES = {
    "knobfleet ab (sequential AB/BA)": knobfleet_ab,
    "fixed 4 runs (AABB, higher mean)": lambda rng, e: fixed(rng, e, "AABB"),
    "fixed 52 runs (ABAB…, higher mean)": lambda rng, e: fixed(rng, e, "AB" * 26),
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
    header = f"{'procedure':<36} {'true effect':>11} {'correct':>8} {'switch':>7} {'mean runs':>9} {'p90 runs':>8}"
    print(header)
    print("-" * len(header))
    for name, proc in PROCEDURES.items():
        for effect in (0.03, 0.0, -0.03):
            rng = random.Random(f"{args.seed}-{name}-{effect}")
            picks, runs = [], []
            for _ in range(args.trials):
                pick, n = proc(rng, math.log1p(effect))
                picks.append(pick)
                runs.append(n)
            switch = picks.count("B") / len(picks)
            correct = switch if effect > 0 else (1 - switch)
            p90 = sorted(runs)[int(0.9 * len(runs)) - 1]
            label = "A/A" if effect == 0 else f"{effect:+.0%}"
            print(f"{name:<36} {label:>11} {correct:>8.1%} {switch:>7.1%} {statistics.mean(runs):>9.1f} {p90:>8}")


if __name__ == "__main__":
    main()
