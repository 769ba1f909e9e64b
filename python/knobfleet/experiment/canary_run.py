"""``knobfleet canary PROFILE``: a profile judged on live traffic through the router, then promoted or rolled back.

1. Every host must be behind a router and Prometheus must answer, before anything changes.
2. The canary subset gets the profile (through the drain path, one host at a time); an equal baseline subset is
   restarted on its current generation the same way, so both sides are equally fresh (Kayenta's practice).
3. Window by window, Prometheus gives each side's output tokens per request-second (the tokens generated over the
   time requests spent in flight, ``rate(e2e_sum)``: Little's law, exact over the window, where a sampled running
   gauge aliases with regular traffic) and mean inter-token latency (``rate(_sum)/rate(_count)``: exact means), and
   requests served; ``experiment.canary.judge`` decides. A window
   in which a host of either side restarted (``process_start_time_seconds`` moved) does not count: counters reset
   there.
4. Promote: the rest of the fleet gets the profile. Roll back (or inconclusive): the canaries go back to their
   previous generation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from knobfleet.errors import UsageError
from knobfleet.experiment.canary import Settings, Verdict, Window, judge
from knobfleet.fleet.hosts import Hosts
from knobfleet.fleet.hostvars import HostVars
from knobfleet.ops.apply import ApplyReport, Options, apply
from knobfleet.profiles.model import Profile
from knobfleet.telemetry.prom import PromError, Prometheus

# Per engine: (output tokens counter, end-to-end latency histogram prefix, ITL histogram prefix, finished-requests
# counter). The time requests spent in flight per second, rate(e2e _sum), is the mean number running over the window
# (Little's law): a running-requests gauge sampled every scrape aliases with regular arrivals (in the lab, 8 requests/s
# and a 2 s scrape read one host 20% "slower" than an identical one, window after window).
SERIES = {
    "sglang": (
        "sglang:generation_tokens_total",
        "sglang:e2e_request_latency_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:num_requests_total",
    ),
    "vllm": (
        "vllm:generation_tokens_total",
        "vllm:e2e_request_latency_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_success_total",
    ),
}


@dataclass(frozen=True)
class CanaryOptions:
    hosts: int | None = None
    fraction: float | None = None
    window_s: float = 60.0
    settings: Settings = field(default_factory=Settings)
    serial: str = "1"


@dataclass
class CanaryReport:
    profile: str
    canaries: list[str]
    baseline: list[str]
    verdict: Verdict
    windows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    canary_apply: ApplyReport | None = None
    followup: str = ""  # promoted to the rest | canaries rolled back
    exit_code: int = 0

    def as_json(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "profile": self.profile,
            "canaries": self.canaries,
            "baseline": self.baseline,
            "verdict": v.verdict,
            "reason": v.reason,
            "windows_counted": v.windows,
            "windows_skipped": v.skipped,
            "intervals": {
                m: {"estimate": math.expm1(iv.estimate), "low": math.expm1(iv.low), "high": math.expm1(iv.high)}
                for m, iv in v.intervals.items()
            },
            "windows": self.windows,
            "notes": self.notes,
            "followup": self.followup,
            "exit_code": self.exit_code,
        }


def split(hosts: Sequence[HostVars], opts: CanaryOptions) -> tuple[list[HostVars], list[HostVars], list[HostVars]]:
    """Pure: (canaries, baseline, rest) — an equal canary and baseline subset, in inventory order."""
    unrouted = [hv.host for hv in hosts if not hv.router_url]
    if unrouted:
        raise UsageError(
            f"canary: {', '.join(unrouted[:3])} {'is' if len(unrouted) == 1 else 'are'} behind no router "
            "(knob_router_url): a canary is judged on live traffic through the router"
        )
    n = opts.hosts if opts.hosts is not None else max(1, math.floor(len(hosts) * (opts.fraction or 0.25)))
    if n < 1 or 2 * n > len(hosts):
        raise UsageError(
            f"canary: {n} canary host(s) need as many baseline hosts; {len(hosts)} selected (use --hosts N with "
            f"2N <= {len(hosts)})"
        )
    return list(hosts[:n]), list(hosts[n : 2 * n]), list(hosts[2 * n :])


def _engine(hv: HostVars) -> str:
    return hv.adapter().name if hv.adapter().name in SERIES else "sglang"


def window_values(
    prom: Prometheus, hosts: Sequence[HostVars], end: float, window_s: float
) -> tuple[dict[str, dict[str, float]], dict[str, float], dict[str, float]]:
    """Per host at ``end``: {metric: value} for tput and itl, requests finished, and the engine's start time."""
    w = f"{max(1, round(window_s))}s"
    values: dict[str, dict[str, float]] = {"tput": {}, "itl": {}}
    requests: dict[str, float] = {}
    started: dict[str, float] = {}
    for engine in sorted({_engine(hv) for hv in hosts}):
        tokens, e2e, itl, done = SERIES[engine]
        names = "|".join(hv.host for hv in hosts if _engine(hv) == engine)
        sel = f'{{host=~"{names}"}}'
        queries = {
            "tput": f"sum by (host) (rate({tokens}{sel}[{w}])) / sum by (host) (rate({e2e}_sum{sel}[{w}]))",
            "itl": f"sum by (host) (rate({itl}_sum{sel}[{w}])) / sum by (host) (rate({itl}_count{sel}[{w}]))",
            "requests": f"sum by (host) (increase({done}{sel}[{w}]))",
            "started": f'max by (host) (process_start_time_seconds{{job="engine",host=~"{names}"}})',
        }
        for key, expr in queries.items():
            for s in prom.query(expr, at=end):
                host = s.labels.get("host", "")
                if math.isnan(s.value) or math.isinf(s.value):
                    continue
                if key in values:
                    values[key][host] = s.value
                elif key == "requests":
                    requests[host] = s.value
                else:
                    started[host] = s.value
    return values, requests, started


def canary(
    profile: Profile,
    hosts: list[HostVars],
    door: Hosts,
    prom: Prometheus,
    opts: CanaryOptions,
    on_window: Callable[[int, Verdict, dict[str, Any]], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> CanaryReport:
    from knobfleet.ops.history import _restore_routed, history
    from knobfleet.ops.transaction import RestoreTarget

    canaries, baseline, rest = split(hosts, opts)
    if not prom.ready():
        prom.query("up")  # the one-line "Prometheus unreachable" error, before anything changes
    before = {h.host: h.current for h in history(canaries + baseline, door)}
    current = {h.host: before[h.host] for h in baseline}
    missing = [h for h, gen in current.items() if gen is None]
    if missing:
        raise UsageError(f"canary: baseline host {missing[0]} has no current generation to restart on")
    report = CanaryReport(
        profile.name, [h.host for h in canaries], [h.host for h in baseline], Verdict("continue", "", 0)
    )
    applied = apply(profile, canaries, door, Options(serial=opts.serial))
    report.canary_apply = applied
    if applied.exit_code != 0:
        report.verdict = Verdict("rollback", "the canary apply failed (the hosts were restored)", 0)
        report.exit_code = applied.exit_code
        return report
    reason = f"canary {profile.name}: baseline restarted on its current generation, as fresh as the canaries"
    targets = {h: RestoreTarget(gen, reason, leave="", event="rollback") for h, gen in current.items()}
    restarted = _restore_routed(baseline, door, targets, False, None)
    if not all(o.ok for o in restarted):
        bad = next(o for o in restarted if not o.ok)
        report.notes.append(f"baseline {bad.host} did not restart: {bad.message}")
    fresh_since = clock()
    windows: list[Window] = []
    verdict = report.verdict
    for k in range(1, opts.settings.max_windows + 1):
        sleep(opts.window_s)
        end = clock()
        try:
            values, requests, started = window_values(prom, canaries + baseline, end, opts.window_s)
        except PromError as exc:
            report.notes.append(f"window {k}: {exc}")
            continue
        side = {"canary": [h.host for h in canaries], "baseline": [h.host for h in baseline]}
        absent = [h for names in side.values() for h in names if h not in values["tput"] or h not in values["itl"]]
        restarted_hosts = [h for h in side["canary"] + side["baseline"] if started.get(h, 0) > end - opts.window_s]
        row: dict[str, Any] = {"window": k, "end": end, "values": values, "requests": requests}
        if absent:
            row["skipped"] = f"metric missing on {', '.join(absent)} (an engine without --enable-metrics?)"
        elif restarted_hosts and end - opts.window_s >= fresh_since:
            row["skipped"] = f"{', '.join(restarted_hosts)} restarted during the window (counters reset)"
        report.windows.append(row)
        if "skipped" in row:
            report.notes.append(f"window {k}: {row['skipped']}; not counted")
            continue
        windows.append(
            Window(
                {m: {h: values[m][h] for h in side["canary"]} for m in ("tput", "itl")},
                {m: {h: values[m][h] for h in side["baseline"]} for m in ("tput", "itl")},
                round(sum(requests.get(h, 0.0) for h in side["canary"])),
                round(sum(requests.get(h, 0.0) for h in side["baseline"])),
            )
        )
        verdict = judge(windows, opts.settings)
        if on_window is not None:
            on_window(k, verdict, row)
        if verdict.final:
            break
    if not verdict.final:
        verdict = Verdict("inconclusive", verdict.reason or "no window could be judged", verdict.windows)
    report.verdict = verdict
    if verdict.verdict == "promote":
        report.followup = f"promoted: {profile.name} rolled out to the rest of the fleet"
        done = apply(profile, baseline + rest, door, Options(serial=opts.serial)) if baseline + rest else None
        report.exit_code = done.exit_code if done else 0
    else:
        # back to the generation each canary ran before (a canary the apply found in sync changed nothing)
        changed = [o.host for o in applied.hosts if o.generation is not None and o.generation != before.get(o.host)]
        why = f"canary {profile.name}: {verdict.verdict}"
        targets = {h: RestoreTarget(before[h], why) for h in changed if before.get(h) is not None}
        back = _restore_routed([h for h in canaries if h.host in targets], door, targets, False, None)
        report.followup = "canaries rolled back to their previous generation: " + (
            ", ".join(f"{o.host}={o.generation:04d}" if o.generation is not None else f"{o.host}=?" for o in back)
            or "none had changed"
        )
        report.exit_code = 1 if verdict.verdict == "rollback" else 2  # a rejected profile; undecided, as ab
    return report
