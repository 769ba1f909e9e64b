"""Noise models beyond the stand-in's, for perf/canary_quality.py (``--noise``).

Each model is applied per host and window on top of (or, for ``heavy``, in place of the shape of) the stand-in's
own noise that canary_quality.Engine integrates; ``standin`` adds nothing and draws nothing, so its figures are the
script's as before.

- ``correlated``: a host-level AR(1) of the log throughput that survives restarts (a neighbour's load, thermals):
  an Ornstein-Uhlenbeck process whose 60 s window means have lag-1 correlation ``rho`` and sd ``ar_sd``, averaged
  over each window of any length (a longer window averages more of it away, as it would);
- ``heavy``: the engine's window deviation of the log throughput times an independent scale sqrt((3 - 2) / chi2_3), a
  Gaussian scale mixture: exactly Student-t with 3 degrees of freedom at the same sd (the drift's correlation from
  window to window is kept on the Gaussian part, shrunk by E[scale]^2 = 0.64);
- ``step``: one host of the fleet, drawn at random, is ``step`` slower (-8%) from a window drawn uniformly over the
  longest canary (pre-period, every judged window, any windows set aside): a noisy neighbour arriving; the
  canary may be over before it arrives (the table says how often it did not);
- ``warmup``: after a restart an engine runs ``warm_tput`` slower (-6.6% throughput per request-second, so ITL is
  that much higher; TTFT +27% is not simulated, the judge does not judge ttft by default), the penalty decaying with
  requests served, exp(-n / (N/3)), N (uniform 50..100 per restart and host) the requests after which it is down
  to 5%; the host serves ``rate`` requests/s (the lab's 8/s over its 3 stand-ins), so a window's penalty is the
  mean over its requests. The pre-period's hosts are warm. ``aside`` windows after each restart are not judged
  (the rule the judge would need: canary.py has none); ``converged_after`` picks it by a convergence test;
- ``outliers``: a window with an episode (a GC pause, a network blip, a batch of huge prompts) of x0.5 or x1.5
  throughput, 2% of 60 s windows; an episode lasts 60 s, so a window of T s holds one with chance 2% * T / 60 and
  is moved by it over min(1, 60 / T) of its length.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

MODELS = ("standin", "correlated", "heavy", "step", "warmup", "outliers")
REF_WINDOW_S = 60.0  # the window length the models' figures are stated at


@dataclass(frozen=True)
class Noise:
    model: str = "standin"
    rho: float = 0.6  # correlated: lag-1 correlation of consecutive 60 s window means
    ar_sd: float = 0.02  # correlated: sd of a 60 s window mean of the log throughput (the stand-in's is ~1.9%)
    df: int = 3  # heavy: Student-t degrees of freedom (> 2)
    step: float = -0.08  # step: the speed change of the one host it hits
    warm_tput: float = 0.066  # warmup: throughput lost right after a restart
    warm_requests: tuple[float, float] = (50.0, 100.0)  # warmup: requests to converge (to 5% of the penalty)
    rate: float = 8 / 3  # warmup: requests per second per host
    outlier_p: float = 0.02  # outliers: share of 60 s windows with an episode
    outlier_factors: tuple[float, ...] = (0.5, 1.5)
    aside: int = 0  # windows after each restart that are not judged

    def describe(self) -> str:
        m = self.model
        if m == "correlated":
            return f"host AR(1) of log tput, lag-1 {self.rho:g} and sd {self.ar_sd:.1%} at 60 s windows, on top"
        if m == "heavy":
            return f"window deviations Student-t, {self.df} d.o.f., at the stand-in's sd"
        if m == "step":
            return f"one random host {self.step:+.0%} from a random window on"
        if m == "warmup":
            lo, hi = self.warm_requests
            return (
                f"after each restart tput -{self.warm_tput:.1%}, converging over {lo:g}..{hi:g} requests at "
                f"{self.rate:.2f} requests/s per host; {self.aside} window(s) after each restart set aside"
            )
        if m == "outliers":
            return f"{self.outlier_p:.0%} of 60 s windows x{' or x'.join(f'{f:g}' for f in self.outlier_factors)}"
        return "the stand-in's own (OU drift + jitter, drawn afresh at each restart)"


def _ou_shape(rho: float) -> float:
    """a = T / tau for which the means of an OU process over consecutive windows of length T correlate by rho."""
    lo, hi = 1e-6, 50.0
    for _ in range(200):  # bisection; the correlation falls from 1 to 0 as a grows
        a = (lo + hi) / 2
        r = (1 - math.exp(-a)) ** 2 / (2 * (a - 1 + math.exp(-a)))
        lo, hi = (a, hi) if r > rho else (lo, a)
    return (lo + hi) / 2


class HostNoise:
    """One host's extra noise: ``window`` maps the engine's window value to the host's, before its speed factor."""

    def __init__(self, noise: Noise, rng: random.Random) -> None:
        self.n, self.rng = noise, rng
        self.windows = 0
        self.step_at = 0  # the window from which this host is ``step`` slower (0: never)
        self.served = math.inf  # requests since the last restart: warm
        self.n0 = 1.0
        if noise.model == "correlated":
            a = _ou_shape(noise.rho)
            self.tau = REF_WINDOW_S / a
            self.sigma = noise.ar_sd * a / math.sqrt(2 * (a - 1 + math.exp(-a)))
            self.x = rng.gauss(0, self.sigma)

    def restart(self) -> None:
        if self.n.model == "warmup":
            self.served = 0.0
            self.n0 = self.rng.uniform(*self.n.warm_requests) / 3

    def window(self, value: float, wall_s: float) -> float:
        self.windows += 1
        m, n = self.n.model, self.n
        if m == "correlated":
            sub = max(4, round(wall_s / 5))
            c = math.exp(-wall_s / sub / self.tau)
            total = 0.0
            for _ in range(sub):
                self.x = c * self.x + math.sqrt(1 - c * c) * self.sigma * self.rng.gauss(0, 1)
                total += self.x
            value *= math.exp(total / sub)
        elif m == "heavy":
            value = math.exp(math.log(value) * math.sqrt((n.df - 2) / self.rng.gammavariate(n.df / 2, 2)))
        elif m == "warmup":
            served = n.rate * wall_s
            lost = (
                n.warm_tput
                * self.n0
                / served
                * (math.exp(-self.served / self.n0) - math.exp(-(self.served + served) / self.n0))
            )
            self.served += served
            value *= 1 - lost
        elif m == "outliers" and self.rng.random() < min(1.0, n.outlier_p * wall_s / REF_WINDOW_S):
            value *= 1 + (self.rng.choice(n.outlier_factors) - 1) * min(1.0, REF_WINDOW_S / wall_s)
        if self.step_at and self.windows >= self.step_at:
            value *= 1 + n.step
        return value


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, mid - half), min(1.0, mid + half)


def converged_after(make_host: Callable[[], object], wall_s: float, restarts: int = 400, horizon: int = 8) -> tuple:
    """The warm-up set-aside by a convergence test: restart one host ``restarts`` times and follow it ``horizon``
    windows each; a window index is converged when its mean log throughput is within a quarter of one window's sd
    (pooled over the last half of the horizon, taken as the steady state) of the steady-state mean, and so is every
    later one. Returns (windows to set aside, that sd, each index's mean deviation from the steady state)."""
    rows: list[list[float]] = [[] for _ in range(horizon)]
    for _ in range(restarts):
        host = make_host()
        host.restart()  # type: ignore[attr-defined]
        for k in range(horizon):
            rows[k].append(math.log(host.window(wall_s)))  # type: ignore[attr-defined]
    means = [statistics.fmean(r) for r in rows]
    tail = rows[horizon // 2 :]
    steady = statistics.fmean(means[horizon // 2 :])
    sd = math.sqrt(sum(statistics.pvariance(r) for r in tail) / len(tail))
    dev = [m - steady for m in means]
    aside = 0
    for k in range(horizon // 2):
        if abs(dev[k]) >= sd / 4:
            aside = k + 1
    return aside, sd, dev


def calibrate(make_host: Callable[[], object], wall_s: float, hosts: int = 100, horizon: int = 40) -> str:
    """One warm host's window log throughput under a model: its sd about the host's own mean, lag-1 correlation and
    excess kurtosis, pooled over ``hosts`` hosts of ``horizon`` windows each (no restarts, no speed walk)."""
    res: list[float] = []
    num = 0.0
    for _ in range(hosts):
        host = make_host()
        xs = [math.log(host.window(wall_s)) for _ in range(horizon)]  # type: ignore[attr-defined]
        m = statistics.fmean(xs)
        res += [x - m for x in xs]
        num += sum((a - m) * (b - m) for a, b in itertools.pairwise(xs))
    var = statistics.fmean(r * r for r in res) * horizon / (horizon - 1)
    kurt = statistics.fmean(r**4 for r in res) / statistics.fmean(r * r for r in res) ** 2 - 3
    lag = num / (sum(r * r for r in res) or 1.0)
    return (
        f"one warm host's {wall_s:g} s window log tput over {hosts} x {horizon} windows: sd {math.sqrt(var):.2%}, "
        f"lag-1 {lag:+.2f}, excess kurtosis {kurt:+.1f}"
    )
