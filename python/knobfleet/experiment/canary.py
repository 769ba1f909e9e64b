"""Pure: judge a canary on live traffic, window by window (``knobfleet canary``).

A canary subset runs the new profile and an equal baseline subset runs the current one, both restarted at the
same time so both are equally fresh (Kayenta's practice). Prometheus gives, per host and window (within one
process lifetime, so counters never reset inside a window):

- ``tput``: output tokens per request-second, ``rate(generation_tokens_total) / rate(e2e_request_latency_seconds_sum)``
  (the mean number of running requests by Little's law: higher is better; per running request so an uneven router
  split does not look like a faster engine, and exact where a sampled running gauge aliases with regular traffic);
- ``itl``: mean inter-token latency, ``rate(_sum) / rate(_count)`` (exact, unlike quantiles from buckets);
- ``ttft``: mean time to first token, the same way;
- ``errors`` and ``requests`` from the router.

Each window gives one paired observation per metric, x = ln(new side mean / current side mean), signed so that
positive is better. Hosts are never identical (a GPU a few percent slower, a noisy neighbour), so the same x also
carries the two subsets' own speed ratio. The default design cancels it with a **crossover**: after ``swap_after``
judged windows the subsets swap roles (the canaries go back to the current profile, the baseline takes the new one,
both restarted), and the change is judged on (mean x before the swap + mean x after it) / 2, in which the hosts'
ratio enters once with each sign. The change is measured twice, so the noise counts a quarter; the hosts' ratio
wandering between the periods (a random walk, read from the windows: ``walk_variance``) is carried into the
interval. A short **pre-period** first (both subsets on the current profile) checks the traffic and anchors the
first period's looks: before the swap the judge only looks for a rollback, on the difference-in-differences
against the pre-period, so a clearly worse profile never reaches the baseline hosts. ``design="did"`` judges the
difference-in-differences alone (the previous design; perf/canary_quality.py compares both).

The rule is ``ab``'s sequential rule (``experiment.stats``): after ``min_windows`` of a period, each metric's
interval uses a Bonferroni z over the looks still possible and over the metrics, so peeking every window keeps the
chance that an identical profile is rolled back as worse at most ``alpha`` overall:

- any metric significantly worse on the new profile (its interval entirely below 0) by more than ``min_effect``
  (its estimate below ln(1 - min_effect)), or a new-side error rate significantly above the current side's (engine
  side), or the router's error rate significantly above its pre-period rate, or the canaries' share of hung streams
  (probes that got a 200 and then no token for ``hang_s``: ``canary_probe``) significantly above the baseline's
  → **rollback** at once: a profile that is measurably worse on live traffic does not spread;
- after the swap, every metric's interval (at the promotion side's z, ``beta``) above ln(1 - max_regression): the
  canary is shown to be no worse than the margin on anything (non-inferiority) → **promote**;
- otherwise another window, up to ``max_windows`` in all; then **inconclusive** (the new profile is taken back: an
  unproven profile does not spread).

Without a pre-period in the DiD design (``pre=()``) the judge compares the subsets directly, which is only right
on identical hosts. Too little traffic in a window (fewer than ``min_requests`` per side) makes the window not
count, and the answer says how many requests there were and how many are needed. perf/canary_quality.py measures
the false-rollback rate of A/A canaries and the power against real changes at the lab's noise, on identical and on
uneven fleets.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from knobfleet.experiment import canary_guards as guards
from knobfleet.experiment import stats

METRICS: dict[str, bool] = {"tput": True, "itl": False, "ttft": False}  # name -> higher is better
PRIMARY = "tput"
MAX_PROBES = 32  # hung-stream probes per host and window (canary_probe)
MAX_HANG_S = 600.0
MAX_WARMUP_WINDOWS = 8  # windows a period may set aside while its engines warm up (canary_warm)
# The settings a canary's record keeps (besides its metrics).
RECORDED = ("max_regression", "min_effect", "min_windows", "max_windows", "alpha", "min_requests", "pre_windows",
            "design", "swap_after", "beta", "probes", "hang_s", "warmup_windows", "warmup_tol")  # fmt: skip


@dataclass(frozen=True)
class Settings:
    # The regression a canary must catch: promotion needs every metric shown better than -max_regression.
    max_regression: float = 0.05
    min_effect: float = 0.01  # a worse metric smaller than this is not a reason to roll back
    min_windows: int = 3
    max_windows: int = 16
    # The two error budgets, each over all looks: alpha, the chance that an identical profile is rolled back as
    # significantly worse (over the metrics too: any one metric can roll back); beta, the chance that a profile
    # max_regression worse on a metric is promoted (per metric: every metric must pass to promote).
    alpha: float = 0.005
    beta: float = 0.15
    # The share of each budget kept for the last look; the rest is split evenly over the looks before it, so an early
    # verdict needs a clear answer and the last look can decide with nearly the whole budget (O'Brien-Fleming's idea,
    # in its simplest form).
    final_share: float = 0.8
    min_requests: int = 20  # finished requests per side in a window for it to count
    # The design: "crossover" (the subsets swap roles after ``swap_after`` judged windows, so each host runs both
    # profiles and its own speed cancels within the run) or "did" (difference-in-differences against the pre-period
    # only). docs/TESTING.md has both designs' figures on uneven fleets.
    design: str = "crossover"
    swap_after: int = 6  # crossover: judged windows in the first period; the second has up to max_windows - this
    pre_windows: int = 3  # windows of the pre-period (both subsets on the current profile)
    # pseudo-windows of stats.PRIOR_SIGMA in the pooled sd of a difference-in-differences
    sigma_prior_weight: float = 4.0
    metrics: tuple[str, ...] = ("tput", "itl")  # ttft is queueing-dominated: report it, judge on it only if asked
    # Lag-1 correlation of consecutive windows, before the data say otherwise: a slow drift with time constant
    # ``drift_tau_s`` correlates windows of ``window_s`` by exp(-window_s / drift_tau_s) (0.37 for 60 s windows;
    # 0.61 for 30 s: shorter windows hold less independent information each). Kept in [0.3, 0.8].
    window_s: float = 60.0
    drift_tau_s: float = 60.0
    prior_weight: float = 8.0
    # The random walk of the hosts' speed ratio per window, before the data say otherwise (sd of one window's step),
    # and its weight in pseudo-lags (``walk_variance``).
    walk_prior: float = 0.003
    walk_prior_weight: float = 4.0
    # The hung-stream probes (experiment/canary_probe.py): streamed requests per host and window sent straight to each
    # engine, and the seconds without a token (the first included) after which a stream counts hung. 20 s is far
    # above a healthy engine's gap between tokens (its TTFT under load included) and far below the minutes a hung
    # request holds; 0 probes: none sent, nothing judged on them.
    probes: int = 8
    hang_s: float = 20.0
    # Warm engines only (canary_warm): a period's first window counts once the next agrees with it within the
    # tolerance; at most ``warmup_windows`` windows set aside per period (0: judge from the first window).
    warmup_windows: int = 2
    warmup_tol: float = 0.05

    @property
    def prior_rho(self) -> float:
        return min(0.8, max(0.3, math.exp(-self.window_s / self.drift_tau_s)))

    @property
    def crossover(self) -> bool:
        return self.design == "crossover"

    @property
    def second_windows(self) -> int:
        """The most judged windows of the crossover's second period."""
        return self.max_windows - self.swap_after

    def _looks(self, rollback: bool = True) -> int:
        """Looks at the data over a whole canary: in a crossover the first period looks for a rollback only (against
        the pre-period), and the second for either verdict."""
        if not self.crossover:
            return max(1, self.max_windows - self.min_windows + 1)
        second = max(1, self.second_windows - self.min_windows + 1)
        first = max(0, self.swap_after - self.min_windows + 1) if rollback and self.pre_windows else 0
        return first + second

    def _spent(self, budget: float, final: bool, rollback: bool = True) -> float:
        looks = self._looks(rollback)
        if looks == 1:
            return budget
        return budget * self.final_share if final else budget * (1 - self.final_share) / (looks - 1)

    def z(self, final: bool = False) -> float:
        """The rollback side's z at a look (the last, or one before it): alpha split over the metrics."""
        return stats.normal_quantile(1 - self._spent(self.alpha, final) / len(self.metrics))

    def z_promote(self, final: bool = False) -> float:
        """The promotion side's z at a look: beta, per metric."""
        return stats.normal_quantile(1 - self._spent(self.beta, final, rollback=False))

    def check(self) -> str | None:
        """None, or the one line saying which setting cannot work and what would."""
        if self.design not in ("crossover", "did"):
            return f"design {self.design!r}: use crossover or did"
        if not 0 <= self.probes <= MAX_PROBES or not 0 < self.hang_s <= MAX_HANG_S:
            return (
                f"probes {self.probes}, hang bound {self.hang_s:g}s: choose 0..{MAX_PROBES} probes per host and "
                f"window and a bound in (0, {MAX_HANG_S:g}] seconds"
            )
        if not 0 <= self.warmup_windows <= MAX_WARMUP_WINDOWS or not 0 < self.warmup_tol <= 0.5:
            return (
                f"warm-up: {self.warmup_windows} window(s) set aside at most, tolerance {self.warmup_tol:g}: "
                f"choose 0..{MAX_WARMUP_WINDOWS} windows (--warmup-windows; 0 judges from the first) and a "
                "tolerance in (0, 0.5]"
            )
        if self.crossover and self.second_windows < self.min_windows:
            return (
                f"max_windows {self.max_windows} leaves {self.second_windows} window(s) after the swap at "
                f"{self.swap_after}; the second period needs at least {self.min_windows} (raise --max-windows)"
            )
        return None


@dataclass(frozen=True)
class Window:
    """One window's per-host values: metric -> host -> value; requests and errors per side."""

    canary: Mapping[str, Mapping[str, float]]
    baseline: Mapping[str, Mapping[str, float]]
    canary_requests: int
    baseline_requests: int
    canary_errors: int = 0
    baseline_errors: int = 0
    router_requests: int = 0  # every request the router answered in the window, and those it failed
    router_errors: int = 0
    # The hung-stream probes (canary_probe): streams each side's probes got (a 200 and its headers), and per host
    # those that then went without a token for the bound.
    canary_streams: int = 0
    baseline_streams: int = 0
    canary_hung: Mapping[str, int] = field(default_factory=dict)
    baseline_hung: Mapping[str, int] = field(default_factory=dict)


@dataclass
class Verdict:
    verdict: str  # continue | promote | rollback | inconclusive
    reason: str
    windows: int  # windows that counted
    skipped: int = 0
    intervals: dict[str, stats.Interval] = field(default_factory=dict)
    pre: int = 0  # pre-period windows the estimate is differenced against
    crossed: int = 0  # of ``windows``, those after the crossover's swap

    @property
    def final(self) -> bool:
        return self.verdict != "continue"


def _pct(x: float) -> str:
    return f"{(math.exp(x) - 1) * 100:+.1f}%"


def observation(w: Window, metric: str) -> float:
    """ln(canary / baseline) of the per-side mean, signed so that positive is better."""
    c, b = w.canary.get(metric, {}), w.baseline.get(metric, {})
    if not c or not b:
        raise ValueError(f"{metric}: no value on the {'canary' if not c else 'baseline'} side")
    cm, bm = sum(c.values()) / len(c), sum(b.values()) / len(b)
    if cm <= 0 or bm <= 0:
        raise ValueError(f"{metric}: values must be > 0 (canary {cm}, baseline {bm})")
    x = math.log(cm / bm)
    return x if METRICS[metric] else -x


def lag1(xs: Sequence[float]) -> float | None:
    """Lag-1 autocorrelation of ``xs`` (None with fewer than 3 values or no spread)."""
    if len(xs) < 3:
        return None
    m = sum(xs) / len(xs)
    den = sum((x - m) ** 2 for x in xs)
    if den <= 0:
        return None
    return sum((a - m) * (b - m) for a, b in itertools.pairwise(xs)) / den


def interval(xs: Sequence[float], z: float, s: Settings) -> stats.Interval:
    """``stats.interval`` with the sd inflated for the correlation between consecutive windows.

    Live traffic drifts slowly: a window that ran fast is followed by one that runs fast, so n windows hold less
    than n independent observations. With lag-1 autocorrelation rho the variance of the mean grows by about
    (1 + rho) / (1 - rho) (an AR(1) process). rho is measured from the windows, shrunk toward ``prior_rho`` by
    ``prior_weight`` pseudo-windows and kept in [0, 0.8], so a few lucky windows cannot make it look independent.
    """
    base = stats.interval(xs, z)
    r = lag1(xs)
    n = len(xs) - 1 if r is not None else 0
    rho = ((r or 0.0) * n + s.prior_rho * s.prior_weight) / (n + s.prior_weight)
    rho = min(0.8, max(0.0, rho))
    sigma = base.sigma * math.sqrt((1 + rho) / (1 - rho))
    half = z * sigma / math.sqrt(len(xs))
    return stats.Interval(base.estimate, base.estimate - half, base.estimate + half, len(xs), sigma)


def _pooled(groups: Sequence[Sequence[float]]) -> tuple[float, float | None, int]:
    """(sum of squares about each group's mean, pooled lag-1 autocorrelation, degrees of freedom)."""
    ss = num = 0.0
    df = pairs = 0
    for xs in groups:
        if not xs:
            continue
        m = sum(xs) / len(xs)
        ss += sum((x - m) ** 2 for x in xs)
        num += sum((a - m) * (b - m) for a, b in itertools.pairwise(xs))
        pairs += len(xs) - 1
        df += len(xs) - 1
    rho = num / ss if ss > 1e-12 and pairs >= 2 else None  # no spread (to rounding): no correlation to measure
    return ss, rho, df


def walk_variance(groups: Sequence[Sequence[float]], s: Settings) -> float:
    """The variance per window of a random walk in the hosts' speed ratio (thermals, neighbours coming and going):
    what no pre-period cancels, since the ratio the pre-period measured keeps moving. Read from the variogram within
    each period (a level shift between the periods does not enter): half the mean squared k-window difference grows
    by q/2 per window of lag on top of the stationary noise; the slope over lags 1..4 (least squares, every lag and
    period pooled) is shrunk toward ``walk_prior`` (``walk_prior_weight`` pseudo-lags) and never below 0."""
    lags: list[tuple[int, float]] = []
    for xs in groups:
        for k in range(1, min(5, len(xs))):
            diffs = [(xs[i + k] - xs[i]) ** 2 / 2 for i in range(len(xs) - k)]
            lags.extend((k, d) for d in diffs)
    q = 0.0
    if len({k for k, _ in lags}) >= 2:
        mk = sum(k for k, _ in lags) / len(lags)
        md = sum(d for _, d in lags) / len(lags)
        sxx = sum((k - mk) ** 2 for k, _ in lags)
        q = max(0.0, 2 * sum((k - mk) * (d - md) for k, d in lags) / sxx)
    n = len({k for k, _ in lags})
    w = s.walk_prior_weight
    return (q * n + s.walk_prior**2 * w) / (n + w)


def _pooled_sigma(groups: Sequence[Sequence[float]], s: Settings) -> float:
    """The sd of one window's observation, pooled from the residuals of each period (a host effect moves a period's
    mean, not its spread), shrunk toward ``stats.PRIOR_SIGMA`` (``sigma_prior_weight`` pseudo-windows) and floored
    as ``stats.shrunk_sigma`` does, then inflated for lag-1 autocorrelation (pooled within each period, shrunk
    toward ``prior_rho`` as in ``interval``)."""
    ss, r, df = _pooled(groups)
    w = s.sigma_prior_weight
    sigma = math.sqrt((w * stats.PRIOR_SIGMA**2 + ss) / (w + df))
    sigma = max(sigma, stats.FLOOR_SIGMA)
    pairs = sum(max(0, len(xs) - 1) for xs in groups) if r is not None else 0
    rho = ((r or 0.0) * pairs + s.prior_rho * s.prior_weight) / (pairs + s.prior_weight)
    rho = min(0.8, max(0.0, rho))
    return sigma * math.sqrt((1 + rho) / (1 - rho))


def did_interval(post: Sequence[float], pre: Sequence[float], z: float, s: Settings) -> stats.Interval:
    """The difference-in-differences mean(post) - mean(pre), with an interval that carries both periods' noise
    (``_pooled_sigma``). The hosts' speed ratio also wanders between the periods: a random walk of variance q per
    window (``walk_variance``) adds q * (n_pre + n_post) / 3 to the variance of the difference of the two means."""
    if not post or not pre:
        raise ValueError("a difference-in-differences needs judged and pre-period windows")
    sigma = _pooled_sigma([post, pre], s)
    est = sum(post) / len(post) - sum(pre) / len(pre)
    var = sigma**2 * (1 / len(post) + 1 / len(pre)) + walk_variance([post, pre], s) * (len(pre) + len(post)) / 3
    half = z * math.sqrt(var)
    return stats.Interval(est, est - half, est + half, len(post), sigma)


def crossover_interval(first: Sequence[float], second: Sequence[float], z: float, s: Settings) -> stats.Interval:
    """The crossover's estimate: each period's observations are ln(new side / current side), with the subsets'
    roles swapped between the periods, so the hosts' own speed ratio enters the two means with opposite signs and
    their average (mean(first) + mean(second)) / 2 is the change alone. The change is measured twice, so the noise
    of the two means counts a quarter: sigma^2 (1/n1 + 1/n2) / 4, plus the walk of the hosts' ratio between the
    periods, q (n1 + n2) / 12 (``walk_variance``; the DiD's term, halved twice)."""
    if not first or not second:
        raise ValueError("a crossover needs windows from both periods")
    sigma = _pooled_sigma([first, second], s)
    est = (sum(first) / len(first) + sum(second) / len(second)) / 2
    n1, n2 = len(first), len(second)
    var = sigma**2 * (1 / n1 + 1 / n2) / 4 + walk_variance([first, second], s) * (n1 + n2) / 12
    half = z * math.sqrt(var)
    return stats.Interval(est, est - half, est + half, n1 + n2, sigma)


def counted(windows: Sequence[Window], s: Settings) -> list[Window]:
    """The windows with enough finished requests on both sides to count."""
    return [w for w in windows if min(w.canary_requests, w.baseline_requests) >= s.min_requests]


def pre_period_shortfall(pre: Sequence[Window], s: Settings) -> str | None:
    """None when the pre-period can anchor a verdict; else the one line saying why not, with the counts."""
    if len(counted(pre, s)) >= min(2, s.pre_windows):
        return None
    c = [w.canary_requests for w in pre]
    b = [w.baseline_requests for w in pre]
    return (
        f"pre-period: too little traffic to measure the hosts: the canaries finished {'/'.join(map(str, c)) or 0} "
        f"and the baseline {'/'.join(map(str, b)) or 0} requests in {len(pre)} window(s); each side needs "
        f"{s.min_requests} per window in at least {min(2, s.pre_windows)} windows (a longer --window, or more "
        "traffic); nothing was applied"
    )


def _at(se: stats.Interval, z: float) -> stats.Interval:
    """``se`` (an interval at z = 1: its half-width is the standard error) widened to ``z``."""
    half = z * (se.high - se.estimate)
    return stats.Interval(se.estimate, se.estimate - half, se.estimate + half, se.n, se.sigma)


def judge(
    windows: Sequence[Window],
    s: Settings = Settings(),
    pre: Sequence[Window] = (),
    crossed: Sequence[Window] = (),
    guarded: Sequence[Window] = (),
) -> Verdict:
    """The verdict after ``windows`` (oldest first), differenced against the pre-period ``pre`` when given.

    In a crossover (``s.crossover``) ``windows`` are the first period's and ``crossed`` the second's, each window's
    canary side being the hosts on the new profile: before the swap the judge only looks for a rollback (against
    the pre-period); from the swap on it judges the crossover's estimate either way.

    ``intervals`` holds each metric's interval at the rollback side's z of this look (what a rollback is decided on
    and what reports show); promotion is decided on the same estimate and standard error at the promotion side's z.
    ``guarded``: windows set aside while the engines warm up (``canary_warm``): errors and hung streams count there.
    """
    judged, second, base = counted(windows, s), counted(crossed, s), counted(pre, s)
    every = [*guarded, *windows, *crossed]
    skipped = len(every) - len(judged) - len(second)
    first_period = s.crossover and not crossed
    if s.crossover:
        final = len(second) >= s.second_windows
        looked = len(second) if crossed else len(judged)
    else:
        final = len(judged) >= s.max_windows
        looked = len(judged)
    z, zp = s.z(final), s.z_promote(final)
    v = Verdict("continue", "", len(judged) + len(second), skipped, pre=len(base), crossed=len(second))
    excess = (
        guards.error_excess(every, z) or guards.router_excess(pre, every, z) or guards.hung_excess(every, z, s.hang_s)
    )
    if excess:
        v.verdict, v.reason = "rollback", excess
        return v
    if not judged or (crossed and not second):
        seen = crossed or windows
        last = seen[-1] if seen else None
        have = min(last.canary_requests, last.baseline_requests) if last else 0
        v.reason = f"too little traffic for a verdict: {have} requests in window, need {s.min_requests}"
        if last is None and guarded:
            v.reason = "no warm window yet: the engines are settling after the restart"
        ended = len(crossed) >= s.second_windows if s.crossover else len(windows) >= s.max_windows
        v.verdict = "inconclusive" if ended else "continue"
        return v
    obs = {m: ([observation(w, m) for w in judged], [observation(w, m) for w in second or base]) for m in s.metrics}
    if s.crossover and not first_period:
        se = {m: crossover_interval(a, b, 1.0, s) for m, (a, b) in obs.items()}
    elif base:
        se = {m: did_interval(a, b, 1.0, s) for m, (a, b) in obs.items()}
    else:  # no pre-period: the subsets compared directly (right on identical hosts only; in a crossover's first
        # period, a look for a clear rollback before the profile reaches the baseline)
        se = {m: interval(a, 1.0, s) for m, (a, _) in obs.items()}
    v.intervals = {m: _at(iv, z) for m, iv in se.items()}
    if looked < s.min_windows:
        v.reason = f"{looked} of at least {s.min_windows} windows" + (" after the swap" if crossed else "")
        return v
    return _decide(v, se, zp, final, first_period, s)


def _decide(
    v: Verdict, se: Mapping[str, stats.Interval], zp: float, final: bool, first_period: bool, s: Settings
) -> Verdict:
    """The look's rule on the intervals (``v.intervals`` at the rollback side's z, ``se`` at z = 1)."""
    floor = math.log1p(-s.min_effect)
    worse = [m for m, iv in v.intervals.items() if iv.high < 0 and iv.estimate < floor]
    if worse:
        m = worse[0]
        iv = v.intervals[m]
        v.verdict = "rollback"
        v.reason = (
            f"{m} is {_pct(iv.estimate)} on the canaries ({_pct(iv.low)} to {_pct(iv.high)}): significantly worse"
        )
        return v
    spread = ", ".join(f"{m} {_pct(iv.estimate)} ({_pct(iv.low)} to {_pct(iv.high)})" for m, iv in v.intervals.items())
    if first_period:  # no promotion before the swap: the hosts' own speeds are not cancelled yet
        v.reason = f"first period: {spread}"
        return v
    limit = math.log1p(-s.max_regression)
    shown = {m: _at(iv, zp) for m, iv in se.items()}
    if all(iv.low > limit for iv in shown.values()):
        primary = shown[s.metrics[0]]
        v.verdict = "promote"
        v.reason = (
            f"{s.metrics[0]} {_pct(primary.estimate)} (at least {_pct(primary.low)}) and every metric shown better "
            "than "
            f"the {s.max_regression:.0%} regression a canary must catch, after {v.windows} windows"
        )
        return v
    if final:
        v.verdict = "inconclusive"
        v.reason = "after {} windows: {}; not certain either way, so the canaries go back".format(
            v.windows, ", ".join(f"{m} {_pct(iv.estimate)}" for m, iv in v.intervals.items())
        )
        return v
    v.reason = spread
    return v
