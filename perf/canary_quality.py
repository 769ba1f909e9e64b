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
    python perf/canary_quality.py --noise {standin,correlated,heavy,step,warmup,outliers,all} [--grid]

Prints, for the crossover judge, the difference-in-differences judge before it and the cross-sectional judge
before that (no pre-period), on identical and on uneven fleets: the A/A false-rollback rate (target <= 1%), and
per true change how often the canaries are rolled back / promoted and after how many windows. Both error rates are
given both ways: a rollback verdict, and the canaries put back (a rollback or an inconclusive verdict: for an
identical profile an inconclusive verdict is a false rollback too, for a worse one it is a catch), and how often
the crossover swapped (the baseline hosts ran the change for a while: the crossover's exposure cost).

``--noise`` puts production noise on top of the stand-in's (perf/canary_noise.py says how each model is built):
``correlated`` (a host-level AR(1) across windows and restarts), ``heavy`` (Student-t windows), ``step`` (a host
slowing by 8% mid-run), ``warmup`` (each restart starts slower; printed judged as today and with the first K windows
after each restart set aside, K by a convergence test), ``outliers`` (2% of windows x0.5 or x1.5); ``all`` runs
each. With a model other than the default only this judge's table on the uneven fleet is printed, with Wilson 95%
intervals on the two targets; ``--grid`` then also runs the A/A and the 5% throughput regression at more hosts per
side, longer windows, more pre-windows (and, for warmup, the set-aside), one setting changed at a time, and when
none of those is enough 2-3 hosts per side with 120-180 s windows, and says which settings make both targets hold.
"""

from __future__ import annotations

import argparse
import functools
import math
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from canary_noise import MODELS, HostNoise, Noise, calibrate, converged_after, wilson  # perf/ is on sys.path

from knobfleet.experiment.canary import Settings, Window, judge
from knobfleet.lab.sim import model

TIME_SCALE = 0.25  # the lab's SGLANG_SIM_TIME_SCALE
DT_MODEL_S = 2.0
SPREAD = 0.10  # host speed factors drawn from 1 +- SPREAD
WALK = 0.003  # sd per window of the random walk of a host's speed factor
STANDIN = Noise()  # the stand-in's own noise alone


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
    def __init__(self, rng: random.Random, spread: float, noise: Noise = STANDIN) -> None:
        self.rng = rng
        self.speed = 1 + rng.uniform(-spread, spread)
        self.walk = WALK if spread > 0 else 0.0
        self.engine = Engine(rng)
        self.noise = HostNoise(noise, rng)

    def restart(self) -> None:
        self.engine = Engine(self.rng)
        self.noise.restart()

    def window(self, wall_s: float) -> float:
        self.speed *= math.exp(self.rng.gauss(0, self.walk)) if self.walk else 1.0
        return self.speed * self.noise.window(self.engine.window(wall_s), wall_s)


def _window(canary: list[Host], baseline: list[Host], rng: random.Random, wall_s: float, tput: float, itl: float):
    c = {f"c{i}": h.window(wall_s) for i, h in enumerate(canary)}
    b = {f"b{i}": h.window(wall_s) for i, h in enumerate(baseline)}
    itl_c = {k: (1 + itl) / v * math.exp(rng.gauss(0, 0.002)) for k, v in c.items()}
    itl_b = {k: 1 / v * math.exp(rng.gauss(0, 0.002)) for k, v in b.items()}
    c = {k: (1 + tput) * v for k, v in c.items()}
    return Window({"tput": c, "itl": itl_c}, {"tput": b, "itl": itl_b}, 200, 200)


class Run:
    """One simulated canary's outcome."""

    def __init__(self, verdict: str, windows: int, swapped: bool, aside: int, stepped: bool) -> None:
        self.verdict, self.windows, self.swapped, self.aside, self.stepped = verdict, windows, swapped, aside, stepped


def one(
    tput: float,
    itl: float,
    s: Settings,
    rng: random.Random,
    hosts: int,
    wall_s: float,
    spread: float,
    pre: bool,
    noise: Noise = STANDIN,
) -> Run:
    """A canary run to its verdict; ``noise.aside`` windows after each restart run but are not judged."""
    canary = [Host(rng, spread, noise) for _ in range(hosts)]
    baseline = [Host(rng, spread, noise) for _ in range(hosts)]
    fleet = canary + baseline
    if noise.model == "step":  # one host of the fleet, from a window anywhere in the longest canary
        span = (s.pre_windows if pre else 0) + s.max_windows + 2 * noise.aside
        rng.choice(fleet).noise.step_at = rng.randint(1, span)
    aside = 0

    def restart(*sides: list[Host]) -> None:
        nonlocal aside
        for h in fleet:
            h.restart()
        for _ in range(noise.aside):  # warm-up windows, not judged
            _window(*sides, rng, wall_s, tput, itl)
            aside += 1

    def done(verdict: str, windows: int, swapped: bool) -> Run:
        stepped = any(h.noise.step_at and h.noise.windows >= h.noise.step_at for h in fleet)
        return Run(verdict, windows, swapped, aside, stepped)

    before = [_window(canary, baseline, rng, wall_s, 0.0, 0.0) for _ in range(s.pre_windows)] if pre else []
    restart(canary, baseline)
    windows: list[Window] = []
    first = s.swap_after if s.crossover else s.max_windows
    for _ in range(first):
        windows.append(_window(canary, baseline, rng, wall_s, tput, itl))
        v = judge(windows, s, before)
        if v.final:
            return done(v.verdict, v.windows, False)
    if not s.crossover:
        return done("inconclusive", s.max_windows, False)
    restart(baseline, canary)  # the swap: the baseline runs the change, the canaries go back
    crossed: list[Window] = []
    for _ in range(s.second_windows):
        crossed.append(_window(baseline, canary, rng, wall_s, tput, itl))
        v = judge(windows, s, before, crossed)
        if v.final:
            return done(v.verdict, v.windows, True)
    return done("inconclusive", s.max_windows, True)


CHANGES = [("A/A", 0.0, 0.0)] + [(f"tput {e:+.0%}", e, 0.0) for e in (-0.03, -0.04, -0.05, -0.08, -0.45, +0.05)]
CHANGES += [("ITL +5%", 0.0, 0.05), ("ITL +8%", 0.0, 0.08)]


def table(
    label: str,
    s: Settings,
    args: argparse.Namespace,
    spread: float,
    pre: bool,
    noise: Noise = STANDIN,
    changes: list[tuple[str, float, float]] = CHANGES,
    hosts: int | None = None,
    quiet: bool = False,
) -> dict[str, dict[str, float]]:
    rng = random.Random(args.seed)
    hosts = hosts or args.hosts
    say = (lambda *a: None) if quiet else print
    say(f"\n{label}")
    say(
        f"{'true change':>11}  {'rollback':>8}  {'promote':>7}  {'inconcl.':>8}  {'canaries back':>13}  {'windows':>7}"
        f"  {'swapped':>7}" + ("  set aside" if noise.aside else "") + ("  stepped" if noise.model == "step" else "")
    )
    out: dict[str, dict[str, float]] = {}
    for name, tput, itl in changes:
        runs = args.aa_runs if name == "A/A" else args.runs
        outcomes = [one(tput, itl, s, rng, hosts, s.window_s, spread, pre, noise) for _ in range(runs)]
        rate = {k: sum(o.verdict == k for o in outcomes) / runs for k in ("rollback", "promote", "inconclusive")}
        rate["back"] = rate["rollback"] + rate["inconclusive"]
        rate["swapped"] = sum(o.swapped for o in outcomes) / runs  # the baseline hosts ran the change for a while
        rate["aside"] = statistics.fmean(o.aside for o in outcomes)
        rate["stepped"] = sum(o.stepped for o in outcomes) / runs
        rate["runs"] = runs
        out[name] = rate
        med = statistics.median(o.windows for o in outcomes)
        say(
            f"{name:>11}  {rate['rollback']:>8.1%}  {rate['promote']:>7.1%}  {rate['inconclusive']:>8.1%}  "
            f"{rate['back']:>13.1%}  {med:>7g}  {rate['swapped']:>7.1%}"
            + (f"  {rate['aside']:>9.2f}" if noise.aside else "")
            + (f"  {rate['stepped']:>7.1%}" if noise.model == "step" else "")
        )
    if quiet:
        return out
    aa = out["A/A"]
    lo, hi = wilson(aa["rollback"] * aa["runs"], args.aa_runs)
    print(
        f"A/A rolled back as worse: {aa['rollback']:.2%} (95% CI {lo:.2%} to {hi:.2%}; target <= 1%); "
        f"{_targets(out)}; "
        f"canaries back at ITL +5%: {out['ITL +5%']['back']:.1%}; promoted at tput -5%: "
        f"{out['tput -5%']['promote']:.1%}, at ITL +5%: {out['ITL +5%']['promote']:.1%}"
    )
    return out


def _ci(rate: dict[str, float], key: str) -> str:
    lo, hi = wilson(rate[key] * rate["runs"], int(rate["runs"]))
    return f"{rate[key]:.2%} of {rate['runs']:g} (Wilson 95% {lo:.2%} to {hi:.2%})"


def _holds(out: dict[str, dict[str, float]]) -> bool:
    return out["A/A"]["back"] <= 0.01 and out["tput -5%"]["back"] >= 0.90


def _targets(out: dict[str, dict[str, float]]) -> str:
    return (
        f"A/A canaries back (rolled back or inconclusive): {_ci(out['A/A'], 'back')} (target <= 1%); "
        f"canaries back at tput -5%: {_ci(out['tput -5%'], 'back')} (target >= 90%): "
        + ("both hold" if _holds(out) else "NOT both")
    )


TARGET_CHANGES = [c for c in CHANGES if c[0] in ("A/A", "tput -5%")]


def grid(noise: Noise, s: Settings, args: argparse.Namespace) -> None:
    """The A/A and the 5% regression at larger settings, one changed at a time, then hosts x window length."""
    print(f"\ngrid ({noise.model}): A/A canaries back (target <= 1%), tput -5% back (target >= 90%)")
    rows: list[tuple[str, int, Settings, Noise]] = [("defaults", args.hosts, s, noise)]
    rows += [(f"{h} + {h} hosts", h, s, noise) for h in (2, 3, 4)]
    rows += [(f"{w:g} s windows", args.hosts, replace(s, window_s=w), noise) for w in (90.0, 120.0, 180.0)]
    rows += [(f"{p} pre-windows", args.hosts, replace(s, pre_windows=p), noise) for p in (5, 8)]
    if noise.model == "warmup":
        rows += [(f"{k} window(s) set aside", args.hosts, s, replace(noise, aside=k)) for k in (1, 2)]
    pairs = [(f"{h} + {h} hosts, {w:g} s", h, replace(s, window_s=w), noise) for h in (2, 3) for w in (120.0, 180.0)]
    held = False
    for i, (label, hosts, st, nz) in enumerate(rows + pairs):
        if i == len(rows) and held:
            break  # one setting changed at a time was enough: no pairs
        out = table(label, st, args, SPREAD, True, nz, TARGET_CHANGES, hosts, quiet=True)
        held |= _holds(out)
        extra = f", {out['A/A']['aside']:.2f} windows set aside per A/A canary" if nz.aside else ""
        print(f"  {label:>24}: {_targets(out)}{extra}")


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
    ap.add_argument("--noise", choices=[*MODELS, "all"], default="standin", help="noise model (canary_noise.py)")
    ap.add_argument("--rho", type=float, default=Noise.rho, help="correlated: lag-1 of 60 s windows")
    ap.add_argument("--ar-sd", type=float, default=Noise.ar_sd, help="correlated: sd of a 60 s window")
    ap.add_argument("--step", type=float, default=Noise.step, help="step: the one host's speed change")
    ap.add_argument("--outlier-p", type=float, default=Noise.outlier_p, help="outliers: share of 60 s windows")
    ap.add_argument("--rate", type=float, default=Noise.rate, help="warmup: requests/s per host")
    ap.add_argument("--aside", type=int, default=None, help="warmup: windows set aside (default: the test's)")
    ap.add_argument("--grid", action="store_true", help="also the settings grid for each noise model")
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
    if args.noise == "standin" and not args.grid:
        return standin(s, args)
    base = Noise(rho=args.rho, ar_sd=args.ar_sd, step=args.step, outlier_p=args.outlier_p, rate=args.rate)
    for name in MODELS if args.noise == "all" else (args.noise,):
        noise = replace(base, model=name)
        variants = [noise]
        one_host = functools.partial(Host, random.Random(args.seed), 0.0, noise)  # identical: no speed walk
        print(f"\nnoise {name}: {calibrate(one_host, s.window_s)}")
        if name == "warmup":
            k = args.aside
            if k is None:
                k, sd, dev = converged_after(one_host, s.window_s)
                print(
                    f"warm-up convergence test (400 restarts of one host, {s.window_s:g} s windows): mean log tput "
                    f"per window after a restart minus the steady state: {', '.join(f'{d:+.2%}' for d in dev)}; "
                    f"one window's sd {sd:.2%}; set aside while off by >= sd/4: {k} window(s) per restart"
                )
            variants.append(replace(noise, aside=k))
        for nz in variants:
            table(f"noise {name}: {nz.describe()}; uneven fleet, crossover (this judge):", s, args, SPREAD, True, nz)
        if args.grid:
            grid(noise, s, args)
    return 0


def standin(s: Settings, args: argparse.Namespace) -> int:
    """The stand-in's noise alone: this judge, the previous two, on uneven and identical fleets."""
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
