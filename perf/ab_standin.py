"""`knobfleet ab A B` replayed on the stand-in engine's own model, without servers (pure, seeded).

What the lab does, step by step, with python/knobfleet/lab/sim/model.py's numbers:

* a profile switch restarts the engine: a new process whose drift starts at 0 (``model.Drift``: an
  Ornstein-Uhlenbeck walk of the log step time, sd ``DEFAULT_NOISE``, correlation time ``DRIFT_TAU_S`` of
  model time, advanced only by decode steps, plus per-step jitter ``JITTER``);
* the first run of each arm is preceded by the consistency check (16 prompts serially at batch 1, then
  twice at once, 64 tokens: about 30 s of model time on the drift);
* a bench run is the built-in client's closed loop: per bucket C, ``n_mult`` waves of C requests of
  ``max_tokens`` tokens in lockstep, each step timed by ``model.step_seconds`` at the mean context;
* AB/BA rounds through ``design.decide`` exactly as ``experiment/ab.py`` runs them (the arm that ran last
  keeps its process, and its drift, into the next round).

Steps are simulated in blocks of ``BLOCK`` steps (exact OU over the block's model time, the block's jitter
averaged: sd JITTER/sqrt(BLOCK)); that changes the variance of a bucket's mean by well under 1%.

Usage: python perf/ab_standin.py [--trials 400] [--seed 7] [--a ctas512 --b ctas768] [--n-mult 4]
Prints the noise per round (sd of the per-bucket and weighted log-ratios), the verdicts and the
distribution of rounds to a decision, under the rule in knobfleet.experiment.design.
"""

from __future__ import annotations

import argparse
import functools
import math
import random
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from knobfleet import waves
from knobfleet.experiment import stats
from knobfleet.experiment.design import Decision, Settings, decide, order
from knobfleet.lab.sim import model

BLOCK = 32
WEIGHTS = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}
PROFILES = {"default": 256, "ctas256": 256, "ctas512": 512, "ctas768": 768}
CONSISTENCY_MODEL_S = 30.0  # the consistency check's decode steps before an arm's first bench run


@dataclass(frozen=True)
class Workload:
    conc: tuple[int, ...] = (48, 64, 80, 96)
    n_mult: int = 4
    max_tokens: int = 256


def bucket_blocks(conc: int, knobs: waves.KernelKnobs, sms: int, w: Workload) -> list[tuple[float, int]]:
    """(noise-free model seconds, steps) per block of one bucket: n_mult lockstep waves of max_tokens steps."""
    wave = [
        model.step_seconds(conc, knobs, sms, model.BASE_CONTEXT + i, model.engine_calibration({}))
        for i in range(w.max_tokens)
    ]
    blocks = [(sum(wave[i : i + BLOCK]), len(wave[i : i + BLOCK])) for i in range(0, len(wave), BLOCK)]
    return blocks * w.n_mult


@dataclass
class Process:
    """One engine process: its drift state (0 at start, like ``model.Drift``)."""

    rng: random.Random
    noise: float = model.DEFAULT_NOISE
    x: float = 0.0

    def advance(self, model_s: float) -> None:
        a = math.exp(-model_s / model.DRIFT_TAU_S)
        self.x = a * self.x + math.sqrt(1 - a * a) * self.noise * self.rng.gauss(0, 1)

    def timed(self, blocks: list[tuple[float, int]]) -> float:
        """Model seconds the blocks take under this process's drift (advancing it)."""
        total = 0.0
        for secs, steps in blocks:
            self.advance(secs)
            total += secs * math.exp(self.x + self.rng.gauss(0, model.JITTER / math.sqrt(steps)))
        return total


@dataclass
class Arm:
    name: str
    blocks: dict[int, list[tuple[float, int]]]
    tokens: dict[int, int]
    fresh: bool = True

    def bench(self, p: Process) -> dict[int, float]:
        """Aggregate tok/s per bucket (model time)."""
        if self.fresh:
            p.advance(CONSISTENCY_MODEL_S)
            self.fresh = False
        return {c: self.tokens[c] / p.timed(b) for c, b in self.blocks.items()}


@functools.cache
def _blocks(name: str, w: Workload) -> dict[int, list[tuple[float, int]]]:
    knobs = waves.KernelKnobs(target_ctas=PROFILES[name])
    sms = model.load_gpus()["rtx-pro-6000"]
    return {c: bucket_blocks(c, knobs, sms, w) for c in w.conc}


def arm(name: str, w: Workload) -> Arm:
    return Arm(name, _blocks(name, w), {c: w.n_mult * c * w.max_tokens for c in w.conc})


@dataclass
class Outcome:
    decision: Decision
    per_bucket: dict[int, list[float]] = field(default_factory=dict)
    model_s: float = 0.0  # decode model time of every bench run


def experiment(rng: random.Random, a: str, b: str, s: Settings, w: Workload) -> Outcome:
    arms = {"A": arm(a, w), "B": arm(b, w)}
    per_bucket: dict[int, list[float]] = {c: [] for c in w.conc}
    live: str | None = None
    proc = Process(rng)
    out = Outcome(Decision("continue", "", 0), per_bucket)
    for r in range(s.max_rounds):
        got = {}
        for name in order(r):
            if live != name:
                proc, live = Process(rng), name  # a switch restarts the engine: fresh drift
            got[name] = arms[name].bench(proc)
        for c in w.conc:
            per_bucket[c].append(stats.log_ratio(got["A"][c], got["B"][c]))
        out.decision = decide(per_bucket, s)
        if out.decision.final:
            return out
    return out


def noise_per_round(a: str, b: str, w: Workload, trials: int, seed: int) -> dict[str, float]:
    """sd of one round's log-ratio per bucket and weighted, over many independent rounds (fresh processes)."""
    rng = random.Random(f"noise-{seed}")
    xs: dict[str, list[float]] = {str(c): [] for c in w.conc} | {"weighted": []}
    for _ in range(trials):
        arms = {"A": arm(a, w), "B": arm(b, w)}
        got = {k: v.bench(Process(rng)) for k, v in arms.items()}
        lr = {c: math.log(got["B"][c] / got["A"][c]) for c in w.conc}
        for c in w.conc:
            xs[str(c)].append(lr[c])
        xs["weighted"].append(sum(WEIGHTS[c] * lr[c] for c in w.conc) / sum(WEIGHTS[c] for c in w.conc))
    return {k: statistics.stdev(v) for k, v in xs.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--a", default="ctas512")
    ap.add_argument("--b", default="ctas768")
    ap.add_argument("--n-mult", type=int, default=4)
    ap.add_argument("--max-rounds", type=int, default=15)
    ap.add_argument("--futility", type=float, default=Settings(weights=WEIGHTS).futility)
    args = ap.parse_args()
    w = Workload(n_mult=args.n_mult)
    s = Settings(weights=WEIGHTS, max_rounds=args.max_rounds, futility=args.futility)
    a_arm, b_arm = arm(args.a, w), arm(args.b, w)
    free = {c: math.log(sum(x for x, _ in a_arm.blocks[c]) / sum(x for x, _ in b_arm.blocks[c])) for c in w.conc}
    wfree = sum(WEIGHTS[c] * free[c] for c in w.conc)
    run_s = sum(x for c in w.conc for x, _ in a_arm.blocks[c])
    print(
        f"{args.b} vs {args.a} on the stand-in model (noise off): "
        + ", ".join(f"C{c} {math.expm1(v):+.2%}" for c, v in free.items())
        + f"; weighted {math.expm1(wfree):+.2%} at weights {WEIGHTS}"
    )
    print(
        f"one bench run: {run_s:.0f} s of model time = {run_s * 0.25:.0f} s in the lab at time scale 0.25 "
        f"(n_mult {w.n_mult}); drift sd {model.DEFAULT_NOISE:.1%}, tau {model.DRIFT_TAU_S:.0f} s"
    )
    sd = noise_per_round(args.a, args.b, w, max(200, args.trials), args.seed)
    print("sd of one round's log-ratio: " + ", ".join(f"{k} {v:.2%}" for k, v in sd.items()))
    rng = random.Random(f"{args.seed}-{args.a}-{args.b}")
    verdicts: Counter[str] = Counter()
    rounds: list[int] = []
    reasons: Counter[str] = Counter()
    for _ in range(args.trials):
        o = experiment(rng, args.a, args.b, s, w)
        v = o.decision.verdict if o.decision.final else "inconclusive"
        verdicts[v] += 1
        rounds.append(o.decision.rounds)
        reasons[o.decision.reason.split(":")[0].split(" after")[0][:60]] += 1
    qs = statistics.quantiles(rounds, n=10)
    print(
        f"{args.trials} experiments (seed {args.seed}, max {s.max_rounds} rounds, futility {s.futility:g}): "
        + ", ".join(f"{k} {v / args.trials:.1%}" for k, v in sorted(verdicts.items()))
    )
    print(
        f"rounds to a decision: mean {statistics.mean(rounds):.1f}, median {statistics.median(rounds):g}, "
        f"p10 {qs[0]:g}, p90 {qs[-1]:g}, max {max(rounds)}; "
        f"share decided by round 5: {sum(r <= 5 for r in rounds) / len(rounds):.1%}, "
        f"by round 8: {sum(r <= 8 for r in rounds) / len(rounds):.1%}"
    )
    hist = Counter(rounds)
    print("histogram: " + " ".join(f"{k}:{hist[k]}" for k in sorted(hist)))
    for reason, n in reasons.most_common(4):
        print(f"  {n:5d} × {reason}")


if __name__ == "__main__":
    main()
