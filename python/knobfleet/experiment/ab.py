"""Use cases: bench (a sweep on the current or a given profile) and ab (an interleaved A/B experiment)."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet import paths
from knobfleet.errors import ApplyFailed, KnobfleetError
from knobfleet.experiment import stats
from knobfleet.experiment.bench.run import BenchSpec, errors, run_bench, throughput
from knobfleet.experiment.design import Decision, Settings, decide, order
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.runner import Event
from knobfleet.profiles.model import Profile

if TYPE_CHECKING:
    from knobfleet.progress import Rounds

TIME_SCALE_ENV = "SGLANG_SIM_TIME_SCALE"


def time_scale(hv: HostVars, profile: Profile | None) -> float | None:
    """The lab stand-in's time scale on this host (the profile's env over the host's), None on a real engine.
    Every decode step takes ``scale`` times the modelled GPU's time, so tok/s are 1/scale times the GPU's."""
    raw = (profile.env_strings() if profile is not None else {}).get(TIME_SCALE_ENV, hv.host_env.get(TIME_SCALE_ENV))
    try:
        scale = float(raw) if raw is not None else None
    except ValueError:
        return None
    return scale if scale is not None and scale > 0 else None


def time_scale_note(scale: float | None) -> str | None:
    """One line for bench/ab output when the lab's time scale multiplies throughput (None otherwise)."""
    if scale is None or scale == 1:
        return None
    return (
        f"note: {TIME_SCALE_ENV}={scale:g} on this lab host: tok/s are {1 / scale:.3g}x the modelled GPU's "
        f"(divide by {1 / scale:.3g} to compare with GPU numbers); ratios between profiles are unaffected"
    )


def round_found(d: Decision) -> str:
    """What the rounds so far say: the weighted estimate with its interval and each bucket's class."""
    if d.gain is None:
        return "no estimate yet"
    g = d.gain
    buckets = ", ".join(f"C{b} {_pct(iv.estimate)} {cls}" for b, (iv, cls) in sorted(d.buckets.items()))
    chance = f" · promotion chance {d.promote_chance:.0%}" if d.promote_chance is not None and not d.final else ""
    return f"weighted {_pct(g.estimate)} ({_pct(g.low)} … {_pct(g.high)}) · {buckets}{chance}"


def _pct(x: float) -> str:
    return f"{math.expm1(x) * 100:+.1f}%"


def round_next(d: Decision, r: int, s: Settings, a: Profile, b: Profile) -> str:
    """What happens after round ``r`` (0-based) given its decision."""
    if d.final:
        winner = b if d.verdict == "promote" else a
        verdict = {"promote": f"promote {b.name}", "keep": f"keep {a.name}"}.get(d.verdict, "inconclusive")
        return f"stop — {verdict}; {winner.name} stays live"
    nxt = order(r + 1)
    first = a if nxt[0] == "A" else b
    if d.rounds < s.min_rounds or "guardrail" in d.reason:
        why = d.reason
    else:
        why = (
            f"not certain yet: promotion needs the weighted low end above 0, keeping A a promotion chance "
            f"under {s.futility:.0%} or the high end below +{s.min_effect:.0%}"
        )
    return f"round {r + 2} ({''.join(nxt)}, {first.name} first) — {why}"


def results_path(host: str, profile: Profile) -> Path:
    return paths.state_dir() / "bench" / host / f"{profile.name}@{profile.version}-{profile.content_hash[7:19]}.json"


def store_results(host: str, profile: Profile, doc: dict[str, Any]) -> None:
    from knobfleet.ops.drift import write_atomic

    write_atomic(results_path(host, profile), json.dumps(doc))


def activate(
    profile: Profile,
    hv: HostVars,
    inventory: Path,
    on_event: Callable[[Event], None] | None,
    routed: bool = True,
) -> Any:
    """Apply ``profile`` on one host (no gate) and insist that it is live and verified; its ApplyReport (the
    host's measured start, ``hosts[0].startup``, prices the restart). ``routed=False``: the caller has taken the
    host out of its router already (the gate's own applies), so no drain and no re-add."""
    from knobfleet.ops.apply import apply
    from knobfleet.ops.steps import Slots

    rep = apply(profile, [hv], inventory, on_event=on_event, slots=None if routed else Slots())
    if rep.exit_code != 0:
        o = rep.hosts[0]
        restored = ""
        if o.restored is not None and o.restored.ok:
            restored = f"; restored generation {o.restored.generation}"
        raise ApplyFailed(f"{hv.host}: applying {profile.ref} failed: {o.message}{restored}")
    return rep


@dataclass
class Spent:
    """Where an A/B's time went: each round's wall time, and the restarts' own (measured by knob_ready)."""

    rounds: list[float] = field(default_factory=list)
    restarts: int = 0
    restart_s: float = 0.0
    unmeasured: int = 0  # restarts without a measured start
    stopped: str = ""  # why no further round started (the deadline)
    warmup: dict[str, int] = field(default_factory=lambda: {"A": 0, "B": 0})  # requests set aside per arm
    unconverged: int = 0  # buckets whose warm-up reached its bound before the engine converged

    def warmed(self, arm: str, doc: dict[str, Any]) -> None:
        """A bench run's warm-up (bench/client.py warm_up): the requests set aside, and the buckets it left
        unconverged."""
        for b in doc.get("buckets") or []:
            self.warmup[arm] = self.warmup.get(arm, 0) + int(b.get("warmup") or 0)
            if (b.get("warmup_detail") or {}).get("converged") is False:
                self.unconverged += 1

    def restart(self, rep: Any) -> None:
        took = restart_seconds(rep)
        self.restarts += 1
        if took is None:
            self.unmeasured += 1
        else:
            self.restart_s += took

    def out_of_time(self, deadline: float | None) -> bool:
        """Whether another round (the longest so far), then the winner's activation (half a round: one of its two
        applies, its bench time not needed), would end after ``deadline``."""
        if deadline is None or not self.rounds:
            return False
        need = max(self.rounds) * 1.5
        left = deadline - time.monotonic()
        if left >= need:
            return False
        self.stopped = (
            f"stopped before round {len(self.rounds) + 1}: the budget has {max(left, 0):.0f}s left and a round "
            f"took up to {max(self.rounds):.0f}s here"
        )
        return True

    def as_json(self) -> dict[str, Any]:
        return {
            "round_s": self.rounds,
            "restarts": self.restarts,
            "restart_s": round(self.restart_s, 1),
            "unmeasured_restarts": self.unmeasured,
            "stopped": self.stopped or None,
            "warmup_requests": self.warmup,
            "warmup_unconverged": self.unconverged,
        }


def restart_seconds(rep: Any) -> float | None:
    """What an activation's restart took the host out of service for (stop + start to ready, as knob_ready
    measured it), None where nothing restarted or nothing was measured."""
    o = rep.hosts[0] if rep is not None and rep.hosts else None
    s = (o.startup or {}) if o is not None and o.restarted else {}
    return float(s.get("stop_s") or 0.0) + float(s["start_s"]) if isinstance(s.get("start_s"), int | float) else None


@dataclass(frozen=True)
class BucketStat:
    concurrency: int
    mean: float
    low: float | None
    high: float | None
    runs: list[float]


def summarise_runs(docs: list[dict[str, Any]]) -> list[BucketStat]:
    per: dict[int, list[float]] = {}
    for doc in docs:
        for c, v in throughput(doc).items():
            per.setdefault(c, []).append(v)
    out = []
    for c, xs in sorted(per.items()):
        m = statistics.mean(xs)
        if len(xs) > 1:
            from knobfleet.experiment.stats import mean_interval_95

            low, high = mean_interval_95(xs)  # Student-t: at 3 runs the normal 1.96 is 2.2x too narrow
            out.append(BucketStat(c, m, low, high, xs))
        else:
            out.append(BucketStat(c, m, None, None, xs))
    return out


def bench(
    profile: Profile | None,
    hv: HostVars,
    inventory: Path,
    spec: BenchSpec,
    repeats: int,
    on_event: Callable[[Event], None] | None = None,
    status: Rounds | None = None,
) -> dict[str, Any]:
    if profile is not None:
        if status is not None:
            status.start(1, f"applying {profile.name}")
        activate(profile, hv, inventory, on_event)
    docs: list[dict[str, Any]] = []
    for i in range(repeats):
        if status is not None:
            status.start(i + 1, "benchmarking")
        docs.append(run_bench([hv], inventory, spec, on_event=on_event)[hv.host])
        if status is not None:
            nxt = f"run {i + 2}" if i + 1 < repeats else "done: the summary"
            status.done(i + 1, runs_found(docs), nxt)
    if profile is not None:
        store_results(hv.host, profile, {"runs": docs})
    buckets = summarise_runs(docs)
    return {
        "host": hv.host,
        "profile": profile.ref if profile else None,
        "repeats": repeats,
        "buckets": [b.__dict__ for b in buckets],
        "errors": sum(errors(d) for d in docs),
        "runs": [[_line(b) for b in d.get("buckets") or []] for d in docs],
        # Built-in client: "knobfleet"; the engine's own tool: its name, the engine version and settings it saw.
        "tool": docs[0].get("tool", "knobfleet") if docs else "knobfleet",
        "engine_version": docs[0].get("engine_version") if docs else None,
        "settings": docs[0].get("settings") if docs else None,
        "time_scale": time_scale(hv, profile),
    }


def runs_found(docs: list[dict[str, Any]]) -> str:
    """Per bucket: the mean tok/s of the runs so far, with its 95% interval from two runs on; request errors."""
    parts = []
    for b in summarise_runs(docs):
        iv = f" ({b.low:.0f} … {b.high:.0f})" if b.low is not None and b.high is not None else ""
        parts.append(f"C{b.concurrency} {b.mean:.0f}{iv}")
    n_err = sum(errors(d) for d in docs)
    return "tok/s " + ", ".join(parts) + (f" · {n_err} request errors" if n_err else "")


def _line(b: dict[str, Any]) -> str:
    from knobfleet.experiment.bench.client import summary_line

    return summary_line(b)


def consistency(
    hv: HostVars, inventory: Path, spec: BenchSpec, on_event: Callable[[Event], None] | None
) -> dict[str, Any]:
    cons_spec = BenchSpec(
        conc=(max(spec.conc[0] // 4, 4),),
        max_tokens=min(spec.max_tokens, 64),
        timeout_s=spec.timeout_s,
        cons_prompts=spec.cons_prompts,
        cons_repeats=spec.cons_repeats,
    )
    doc = run_bench([hv], inventory, cons_spec, consistency=True, on_event=on_event)[hv.host]
    result: dict[str, Any] = doc["consistency"]
    return result


def ab(
    a: Profile,
    b: Profile,
    hv: HostVars,
    inventory: Path,
    settings: Settings,
    spec: BenchSpec,
    report_dir: Path,
    check_consistency: bool = True,
    on_event: Callable[[Event], None] | None = None,
    status: Rounds | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Rounds of AB / BA on one host until the sequential rule stops; leaves the winner applied. ``status``
    (if given) hears each round's start, each step and each round's result. ``deadline`` (a ``time.monotonic()``
    value: a budget's end): no round starts that the rounds measured so far say would end after it (with the
    winner's activation after it), and the document says so."""
    if a.content_hash == b.content_hash:
        raise KnobfleetError(f"ab: {a.ref} and {b.ref} are the same profile content; nothing to compare")
    profiles = {"A": a, "B": b}
    cons: dict[str, dict[str, Any] | None] = {"A": None, "B": None}
    errs = {"A": 0, "B": 0}
    runs: dict[str, dict[int, list[float]]] = {"A": {}, "B": {}}
    latency: dict[str, dict[int, dict[str, list[float | None]]]] = {"A": {}, "B": {}}
    per_bucket: dict[int, list[float]] = {c: [] for c in spec.conc}
    live: str | None = None
    started = time.monotonic()
    decision = Decision("continue", "not started", 0)
    spent = Spent()
    for r in range(settings.max_rounds):
        got: dict[str, dict[int, float]] = {}
        round_started = time.monotonic()
        if status is not None:
            status.start(r + 1, "".join(order(r)))
        for arm in order(r):
            name = f"{arm} ({profiles[arm].name})"
            if live != arm:
                if status is not None:
                    status.step(f"applying {name}")
                spent.restart(activate(profiles[arm], hv, inventory, on_event))
                live = arm
            if check_consistency and cons[arm] is None:
                if status is not None:
                    status.step(f"consistency check of {name}")
                cons[arm] = consistency(hv, inventory, spec, on_event)
            if status is not None:
                status.step(f"benchmarking {name}")
            doc = run_bench([hv], inventory, spec, on_event=on_event)[hv.host]
            spent.warmed(arm, doc)
            errs[arm] += errors(doc)
            got[arm] = throughput(doc)
            for c, v in got[arm].items():
                runs[arm].setdefault(c, []).append(v)
            for c, lat in latency_p50(doc).items():  # kept for the report: each run's median ITL, TTFT, e2e
                for m, lv in lat.items():
                    latency[arm].setdefault(c, {}).setdefault(m, []).append(lv)
        for c in spec.conc:
            if got["A"].get(c, 0) > 0 and got["B"].get(c, 0) > 0:
                per_bucket[c].append(stats.log_ratio(got["A"][c], got["B"][c]))
        b_cons_ok = cons["B"] is None or bool(cons["B"].get("passed"))
        decision = decide(per_bucket, settings, errors=errs["B"], consistency_ok=b_cons_ok)
        spent.rounds.append(round(time.monotonic() - round_started, 1))
        if _round_ends(decision, r, settings, spent, deadline, status, (a, b)):
            break
    if not decision.final:
        decision.verdict = "inconclusive"
    winner = "B" if decision.verdict == "promote" else "A"
    if live != winner:
        spent.restart(activate(profiles[winner], hv, inventory, on_event))
    doc = _document(
        a, b, hv.host, decision, settings, runs, cons, errs, profiles[winner].name, time.monotonic() - started
    )
    doc["spent"] = spent.as_json()
    doc["time_scale"] = time_scale(hv, a)
    doc["profile_hashes"] = {a.ref: a.content_hash, b.ref: b.content_hash}
    for bucket in doc["buckets"]:  # html_ab.latency_runs reads {"A": {"itl": [...], ...}, "B": {...}} in seconds
        c = bucket["concurrency"]
        bucket["latency"] = {arm: latency[arm].get(c, {}) for arm in ("A", "B")}
    write_reports(doc, report_dir)
    return doc


def _round_ends(
    decision: Decision,
    r: int,
    settings: Settings,
    spent: Spent,
    deadline: float | None,
    status: Rounds | None,
    pair: tuple[Profile, Profile],
) -> bool:
    """After round ``r``: whether the A/B stops (a final decision, the last round, or no time for another before
    ``deadline``), telling ``status`` what the round found and what comes next."""
    if not decision.final and r + 1 < settings.max_rounds and spent.out_of_time(deadline):
        decision.reason += f"; {spent.stopped}"
        decision.rounds = r + 1
        if status is not None:
            status.done(r + 1, round_found(decision), spent.stopped)
        return True
    last = decision.final or r + 1 >= settings.max_rounds
    if last and not decision.final:
        decision.verdict = "inconclusive"
    if status is not None:
        status.done(r + 1, round_found(decision), round_next(decision, r, settings, *pair))
    return last


def latency_p50(doc: dict[str, Any]) -> dict[int, dict[str, float | None]]:
    """Each bucket's median ITL, TTFT and end-to-end latency (seconds) of one bench run, as the bench client
    reports them (``itl``, ``ttft``, ``latency`` with ``p50``); a value the run lacks is None."""
    out: dict[int, dict[str, float | None]] = {}
    for b in doc.get("buckets") or []:
        row: dict[str, float | None] = {}
        for key, name in (("itl", "itl"), ("ttft", "ttft"), ("latency", "e2e")):
            v = (b.get(key) or {}).get("p50") if isinstance(b.get(key), dict) else None
            row[name] = float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
        out[int(b["concurrency"])] = row
    return out


def _document(
    a: Profile,
    b: Profile,
    host: str,
    d: Decision,
    s: Settings,
    runs: dict[str, dict[int, list[float]]],
    cons: dict[str, dict[str, Any] | None],
    errs: dict[str, int],
    winner: str,
    wall: float,
) -> dict[str, Any]:
    def r1(x: float | None) -> float | None:
        return None if x is None else round(math.exp(x) - 1, 5)

    buckets = []
    for c, (iv, cls) in sorted(d.buckets.items()):
        buckets.append(
            {
                "concurrency": c,
                "weight": s.weights.get(c, 0.0),
                "ratio": r1(iv.estimate),
                "low": r1(iv.low),
                "high": r1(iv.high),
                "class": cls,
                "a_mean": statistics.mean(runs["A"].get(c) or [0.0]),
                "b_mean": statistics.mean(runs["B"].get(c) or [0.0]),
                "runs": {"A": runs["A"].get(c, []), "B": runs["B"].get(c, [])},
            }
        )
    g = d.gain
    return {
        "a": a.ref,
        "b": b.ref,
        "host": host,
        "verdict": d.verdict,
        "winner": winner,
        "reason": d.reason,
        "rounds": d.rounds,
        "driver": d.driver,
        "wall_s": round(wall, 1),
        "weighted_gain": {
            "estimate": r1(g.estimate) if g else None,
            "low": r1(g.low) if g else None,
            "high": r1(g.high) if g else None,
        },
        "buckets": buckets,
        "consistency": {
            k: ("skipped" if v is None else "pass" if v.get("passed") else "fail") for k, v in cons.items()
        },
        "errors": errs,
        "settings": {
            "weights": {str(k): v for k, v in s.weights.items()},
            "min_effect": s.min_effect,
            "max_regression": s.max_regression,
            "max_rounds": s.max_rounds,
            "min_rounds": s.min_rounds,
            "alpha": s.alpha,
            "futility": s.futility,
        },
    }


def _cons(result: dict[str, Any] | None) -> str:
    return "skipped" if result is None else "pass" if result.get("passed") else "fail"


def write_reports(doc: dict[str, Any], directory: Path) -> None:
    from knobfleet.experiment import report
    from knobfleet.ops.drift import write_atomic

    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / "report.json", json.dumps(doc, indent=2))
    safe = dict(doc)
    safe["weighted_gain"] = {k: (v if v is not None else float("nan")) for k, v in doc["weighted_gain"].items()}
    write_atomic(directory / "report.md", report.markdown(safe))
    report.plot(doc, directory / "report.png")
    from knobfleet.experiment import html_ab

    write_atomic(directory / "report.html", html_ab.ab_page(doc))
