"""Decision quality of `knobfleet canary` at the lab's noise, on identical and on uneven fleets: false rollbacks of
identical profiles (A/A) and the power against real changes, from simulated canaries.

Each simulated engine carries the stand-in's own noise process (python/knobfleet/lab/sim/model.py: a slow
Ornstein-Uhlenbeck drift of the log throughput, sd DEFAULT_NOISE, time constant DRIFT_TAU_S, plus per-step jitter),
integrated exactly over each window at the lab's time scale, and drawn afresh when the engine restarts (as the
stand-in does). On an uneven fleet every host also has a fixed speed factor drawn uniformly from +-SPREAD (a
slower GPU of the same SKU, a noisy neighbour), which itself wanders by a random walk of WALK per window (thermals,
neighbours coming and going): that part is not cancelled by anything and is in the figures.

A canary runs as `knobfleet canary` runs it: a pre-period of ``pre_windows`` windows with both subsets on the
current profile, then both subsets restarted (the canaries on the new profile, the baseline on its current one),
then judged windows; in the crossover (the default design) after ``swap_after`` of them both subsets restart again
with their roles swapped (the hosts themselves keep their speeds), and judged windows follow until the verdict is
final. A window's per-host throughput per running request is the mean of the host's factor over the window; its
mean ITL is the inverse with its own small timing jitter. A throughput change scales tput only (the mutation-audit
case: a canary slower per request-second with the same ITL); an ITL change scales the ITL only. The judge
(python/knobfleet/experiment/canary.py) sees only those per-window values.

    python perf/canary_quality.py [--runs 500] [--aa-runs 2000] [--window 60] [--hosts 1]

Prints, for the crossover judge, the difference-in-differences judge before it and the cross-sectional judge
before that (no pre-period), on identical and on uneven fleets: the A/A false-rollback rate (target <= 1%), and
per true change how often the canaries are rolled back / promoted and after how many windows. Both error rates are
given both ways: a rollback verdict, and the canaries put back (a rollback or an inconclusive verdict: for an
identical profile an inconclusive verdict is a false rollback too, for a worse one it is a catch), and how often
the crossover swapped (the baseline hosts ran the change for a while: the crossover's exposure cost).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from knobfleet.experiment.canary import Settings, Window, judge
from knobfleet.lab.sim import model

TIME_SCALE = 0.25  # the lab's SGLANG_SIM_TIME_SCALE
DT_MODEL_S = 2.0
SPREAD = 0.10  # host speed factors drawn from 1 +- SPREAD
WALK = 0.003  # sd per window of the random walk of a host's speed factor


class Engine:
    """One engine process: the stand-in's drift, started stationary."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.x = rng.gauss(0, model.DEFAULT_NOISE)

    def window(self, wall_s: float) -> float:
        steps = max(1, int(wall_s / TIME_SCALE / DT_MODEL_S))
        a = math.exp(-DT_MODEL_S / model.DRIFT_TAU_S)
        total = 0.0
        for _ in range(steps):
            self.x = a * self.x + math.sqrt(1 - a * a) * model.DEFAULT_NOISE * self.rng.gauss(0, 1)
            total += math.exp(self.x)
        jitter = model.JITTER / math.sqrt(steps * 50)  # per-step jitter averages over the window's decode steps
        return total / steps * math.exp(self.rng.gauss(0, jitter))


class Host:
    def __init__(self, rng: random.Random, spread: float) -> None:
        self.rng = rng
        self.speed = 1 + rng.uniform(-spread, spread)
        self.walk = WALK if spread > 0 else 0.0
        self.engine = Engine(rng)

    def restart(self) -> None:
        self.engine = Engine(self.rng)

    def window(self, wall_s: float) -> float:
        self.speed *= math.exp(self.rng.gauss(0, self.walk)) if self.walk else 1.0
        return self.speed * self.engine.window(wall_s)


def _window(canary: list[Host], baseline: list[Host], rng: random.Random, wall_s: float, tput: float, itl: float):
    c = {f"c{i}": h.window(wall_s) for i, h in enumerate(canary)}
    b = {f"b{i}": h.window(wall_s) for i, h in enumerate(baseline)}
    itl_c = {k: (1 + itl) / v * math.exp(rng.gauss(0, 0.002)) for k, v in c.items()}
    itl_b = {k: 1 / v * math.exp(rng.gauss(0, 0.002)) for k, v in b.items()}
    c = {k: (1 + tput) * v for k, v in c.items()}
    return Window({"tput": c, "itl": itl_c}, {"tput": b, "itl": itl_b}, 200, 200)


def one(
    tput: float, itl: float, s: Settings, rng: random.Random, hosts: int, wall_s: float, spread: float, pre: bool
) -> tuple[str, int, bool]:
    """(verdict, windows counted, whether the baseline hosts ever ran the change: the crossover's swap happened)."""
    canary = [Host(rng, spread) for _ in range(hosts)]
    baseline = [Host(rng, spread) for _ in range(hosts)]
    before = [_window(canary, baseline, rng, wall_s, 0.0, 0.0) for _ in range(s.pre_windows)] if pre else []
    for h in canary + baseline:
        h.restart()
    windows: list[Window] = []
    first = s.swap_after if s.crossover else s.max_windows
    for _ in range(first):
        windows.append(_window(canary, baseline, rng, wall_s, tput, itl))
        v = judge(windows, s, before)
        if v.final:
            return v.verdict, v.windows, False
    if not s.crossover:
        return "inconclusive", s.max_windows, False
    for h in canary + baseline:  # the swap: the baseline runs the change, the canaries go back
        h.restart()
    crossed: list[Window] = []
    for _ in range(s.second_windows):
        crossed.append(_window(baseline, canary, rng, wall_s, tput, itl))
        v = judge(windows, s, before, crossed)
        if v.final:
            return v.verdict, v.windows, True
    return "inconclusive", s.max_windows, True


CHANGES = [("A/A", 0.0, 0.0)] + [(f"tput {e:+.0%}", e, 0.0) for e in (-0.03, -0.04, -0.05, -0.08, -0.45, +0.05)]
CHANGES += [("ITL +5%", 0.0, 0.05), ("ITL +8%", 0.0, 0.08)]


def table(label: str, s: Settings, args: argparse.Namespace, spread: float, pre: bool) -> dict[str, dict[str, float]]:
    rng = random.Random(args.seed)
    print(f"\n{label}")
    print(
        f"{'true change':>11}  {'rollback':>8}  {'promote':>7}  {'inconcl.':>8}  {'canaries back':>13}  {'windows':>7}"
        f"  {'swapped':>7}"
    )
    out: dict[str, dict[str, float]] = {}
    for name, tput, itl in CHANGES:
        runs = args.aa_runs if name == "A/A" else args.runs
        outcomes = [one(tput, itl, s, rng, args.hosts, args.window, spread, pre) for _ in range(runs)]
        rate = {k: sum(o[0] == k for o in outcomes) / runs for k in ("rollback", "promote", "inconclusive")}
        rate["back"] = rate["rollback"] + rate["inconclusive"]
        rate["swapped"] = sum(o[2] for o in outcomes) / runs  # the baseline hosts ran the change for a while
        rate["runs"] = runs
        out[name] = rate
        med = statistics.median(o[1] for o in outcomes)
        print(
            f"{name:>11}  {rate['rollback']:>8.1%}  {rate['promote']:>7.1%}  {rate['inconclusive']:>8.1%}  "
            f"{rate['back']:>13.1%}  {med:>7g}  {rate['swapped']:>7.1%}"
        )
    aa = out["A/A"]["rollback"]
    half = 1.96 * math.sqrt(max(aa * (1 - aa), 1e-9) / args.aa_runs)
    print(
        f"A/A rolled back as worse: {aa:.2%} (95% CI {max(0.0, aa - half):.2%} to {aa + half:.2%}; target <= 1%); "
        f"A/A canaries back (rolled back or inconclusive): {out['A/A']['back']:.1%}; "
        f"canaries back at tput -5%: {out['tput -5%']['back']:.1%}, at ITL +5%: {out['ITL +5%']['back']:.1%} "
        f"(target >= 90%); promoted at tput -5%: {out['tput -5%']['promote']:.1%}, at ITL +5%: "
        f"{out['ITL +5%']['promote']:.1%}"
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500, help="simulated canaries per true change")
    ap.add_argument("--aa-runs", type=int, default=2000, help="simulated A/A canaries (the false-rollback rate)")
    ap.add_argument("--window", type=float, default=60.0, help="window length in wall seconds (default 60)")
    ap.add_argument("--hosts", type=int, default=1, help="canary hosts (and as many baseline hosts)")
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--quick", action="store_true", help="only the uneven fleet with the pre-period")
    ap.add_argument("--walk", type=float, default=WALK, help=f"sd per window of a host's speed walk ({WALK})")
    ap.add_argument("--pre-windows", type=int, default=Settings.pre_windows)
    ap.add_argument("--swap-after", type=int, default=Settings.swap_after)
    ap.add_argument("--max-windows", type=int, default=Settings.max_windows)
    args = ap.parse_args()
    s = Settings(window_s=args.window, pre_windows=args.pre_windows, swap_after=args.swap_after,
                 max_windows=args.max_windows)  # fmt: skip
    globals()["WALK"] = args.walk  # Host reads it
    print(
        f"canary decision quality: {args.aa_runs} simulated A/A canaries, {args.runs} per other change, "
        f"{args.hosts} canary + {args.hosts} baseline host(s), {args.window:g} s windows at time scale {TIME_SCALE} "
        f"(noise sd {model.DEFAULT_NOISE}, drift tau {model.DRIFT_TAU_S:g} model s), pre-period {s.pre_windows}, "
        f"swap after {s.swap_after}, windows {s.min_windows}..{s.max_windows}, alpha {s.alpha}, beta {s.beta}, "
        "last look's share "
        f"{s.final_share:.0%}, regression a canary must catch {s.max_regression:.0%}; "
        f"uneven: host factors 1 +- {SPREAD:.0%}, random walk {WALK:.1%} per window"
    )
    did = replace(s, design="did", pre_windows=8)  # the previous judge, with the pre-period it was tuned for
    table("uneven fleet, crossover (this judge):", s, args, SPREAD, True)
    if not args.quick:
        table("uneven fleet, difference-in-differences against 8 pre-period windows (the previous judge):", did,
              args, SPREAD, True)  # fmt: skip
        table("uneven fleet, no pre-period (the judge before it):", replace(did, pre_windows=0), args, SPREAD, False)
        table("identical hosts, crossover (this judge):", s, args, 0.0, True)
        table("identical hosts, no pre-period (the judge before it, as first published):", did, args, 0.0, False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
