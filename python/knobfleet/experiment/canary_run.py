"""``knobfleet canary PROFILE``: a profile judged on live traffic through the router, then promoted or rolled back.

1. Every host must be behind a router and Prometheus must answer, before anything changes.
2. The pre-period: ``pre_windows`` windows with both subsets on the current profile: the traffic check (too little
   traffic ends the canary before anything changes, with one line giving the counts), the router's error rate
   before the change, and what the first period's looks for a rollback are judged against.
3. The first period: the canary subset gets the profile (through the drain path, one host at a time); an equal
   baseline subset is restarted on its current generation the same way, so both sides are equally fresh
   (Kayenta's practice). The judge looks only for a rollback here.
4. The swap (the crossover, the default design): after ``swap_after`` counted windows the canaries go back to their
   previous generation and the baseline takes the profile, both through the drain path. The second period's
   windows are judged on the crossover's estimate (``experiment.canary``), in which each host's own speed cancels.
   ``design="did"`` skips the swap and judges every window against the pre-period.
5. Each window, Prometheus gives each side's output tokens per request-second (the tokens generated over the
   time requests spent in flight, ``rate(e2e_sum)``: Little's law, exact over the window, where a sampled running
   gauge aliases with regular traffic) and mean inter-token latency (``rate(_sum)/rate(_count)``: exact means), and
   requests served, and the router's requests and errors; the canary's own probes (``canary_probe``) count each
   host's hung streams (a 200, then no token for ``hang_s``). A window in which a host of either side restarted (its
   finished-requests counter reset: ``resets()``, which every engine has; real SGLang exports no
   ``process_start_time_seconds``) does not count.
6. Promote: every host not yet on the profile gets it. Roll back (or inconclusive): the hosts on the profile (the
   canaries, or after the swap the baseline) go back to their previous generation. ``advisory``: neither; the hosts
   on the profile stay there and the report names the exact command for either decision. An interrupt (SIGINT,
   SIGTERM) after the canary apply takes the profile back from whichever hosts run it.

Every canary is kept as a record (``records.py``: windows, pre-period, estimate, interval, decision) under the
state folder, rewritten after each window, so ``history --canaries`` and ``report`` can read it later.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knobfleet.errors import KnobfleetError, UsageError
from knobfleet.experiment import running
from knobfleet.experiment.canary import RECORDED, Settings, Verdict, Window, judge, pre_period_shortfall
from knobfleet.experiment.canary_hosts import advice, split
from knobfleet.experiment.canary_probe import Pending
from knobfleet.experiment.canary_warm import Settle, summary
from knobfleet.experiment.canary_windows import measure
from knobfleet.fleet.hosts import Hosts
from knobfleet.fleet.hostvars import HostVars
from knobfleet.ops.apply import apply
from knobfleet.ops.apply_report import ApplyReport
from knobfleet.ops.precheck import Options
from knobfleet.profiles.model import Profile
from knobfleet.telemetry.prom import Prometheus


class PrePeriodTooQuiet(KnobfleetError):
    """The pre-period had too little traffic to measure the hosts; nothing was applied."""


@dataclass(frozen=True)
class CanaryOptions:
    hosts: int | None = None
    fraction: float | None = None
    window_s: float = 60.0
    settings: Settings = field(default_factory=Settings)
    serial: str = "1"
    advisory: bool = False  # judge and report, change nothing after the canary apply
    # Starts a window's hung-stream probes (canary_probe.start; the CLI's): None sends none (the unit tests' fakes)
    prober: Callable[[Sequence[HostVars], Settings], Pending | None] | None = None


@dataclass
class CanaryReport:
    profile: str
    canaries: list[str]
    baseline: list[str]
    verdict: Verdict
    windows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    canary_apply: ApplyReport | None = None
    followup: str = ""  # promoted to the rest | canaries rolled back | advisory: the command to run
    exit_code: int = 0
    pre: list[dict[str, Any]] = field(default_factory=list)  # the pre-period's windows, as ``windows``
    advisory: bool = False
    started: float = 0.0
    settings: Settings = field(default_factory=Settings)
    record: str = ""  # where the record is kept
    ran: dict[str, Any] = field(default_factory=dict)  # generations, engine_versions: what each side ran when judged
    warmup: list[Settle] = field(default_factory=list)  # each judged period's warm-up (canary_warm)

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
            "pre_period": self.pre,
            "windows_pre": v.pre,
            "advisory": self.advisory,
            "notes": self.notes,
            "followup": self.followup,
            "exit_code": self.exit_code,
            "started": self.started,
            "settings": {k: getattr(self.settings, k) for k in RECORDED} | {"metrics": list(self.settings.metrics)},
            "record": self.record,
            "warmup": summary(self.warmup),
            **self.ran,
            # the content the canaries ran (the report's "What ran"); none when the canary apply never happened
            "profile_hashes": (
                {self.profile: self.canary_apply.profile.content_hash} if self.canary_apply is not None else {}
            ),
        }


class RecordKeeper:
    """``keep`` for ``canary``: the record's path, chosen on the first call and told to the report; rewritten after."""

    def __init__(self) -> None:
        self.path: Path | None = None

    def __call__(self, r: CanaryReport) -> None:
        from knobfleet.experiment import records

        if self.path is None:
            self.path = records.new_path(r.profile, r.started)
            r.record = str(self.path)
        records.write(self.path, "canary", r.as_json())


@dataclass
class _OnProfile:
    """Which hosts the canary has put on the profile and not yet taken back (host -> the generation it got), so an
    interrupt anywhere, and any verdict but promote, takes exactly those back to ``before``."""

    before: dict[str, int | None]
    hosts: dict[str, int] = field(default_factory=dict)
    fresh: set[str] = field(default_factory=set)  # restarted by the last apply that reached them
    moved: set[str] = field(default_factory=set)  # restarted by a restore back to ``before`` (``_roll_back``)

    def took(self, applied: ApplyReport) -> None:
        for o in applied.hosts:
            if o.generation is not None and o.generation != self.before.get(o.host):
                self.hosts[o.host] = o.generation
            if o.restarted:
                self.fresh.add(o.host)
            else:
                self.fresh.discard(o.host)

    def restarted(self, host: str) -> bool:
        return host in self.fresh


def canary(
    profile: Profile,
    hosts: list[HostVars],
    door: Hosts,
    prom: Prometheus,
    opts: CanaryOptions,
    on_window: Callable[[int, Verdict, dict[str, Any]], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
    keep: Callable[[CanaryReport], None] | None = None,
) -> CanaryReport:
    """The whole canary (module docstring). ``keep`` stores the report as it grows (the record)."""
    from dataclasses import replace

    from knobfleet.ops.history import history

    s = replace(opts.settings, window_s=opts.window_s)  # the correlation prior follows the window length
    if s.check() is not None:
        raise UsageError(f"canary: {s.check()}")
    opts = replace(opts, settings=s)
    canaries, baseline, rest = split(hosts, opts)
    if not prom.ready():
        prom.query("up")  # the one-line "Prometheus unreachable" error, before anything changes
    before = {h.host: h.current for h in history(canaries + baseline, door)}
    current = {h.host: before[h.host] for h in baseline}
    missing = [h for h, gen in current.items() if gen is None]
    if missing:
        raise UsageError(f"canary: baseline host {missing[0]} has no current generation to restart on")
    report = CanaryReport(
        profile.name,
        [h.host for h in canaries],
        [h.host for h in baseline],
        Verdict("continue", "", 0),
        advisory=opts.advisory,
        started=clock(),
        settings=s,
    )
    save = keep or (lambda _r: None)
    pre = _pre_period(profile, canaries, baseline, prom, opts, report, sleep, clock, save)
    from knobfleet.ops import interrupts

    on = _OnProfile(before)
    try:  # from the apply on, a signal anywhere takes the profile back (between two lines here too)
        with interrupts.deferred(keep=True):  # the apply and knowing it happened are one step: a signal waits for it
            applied = apply(profile, canaries, door, Options(serial=opts.serial))
            on.took(applied)
            report.canary_apply = applied
            if applied.exit_code != 0:
                why = "; ".join(f"{o.host}: {o.message}" for o in applied.hosts if o.status in ("failed", "refused"))
                report.verdict = Verdict("rollback", f"the canary apply failed ({why or 'see its hosts'}); the hosts "
                                         "were restored", 0, pre=len(pre))  # fmt: skip
                report.exit_code = applied.exit_code
                save(report)
        if applied.exit_code != 0:
            return report
        report.ran = running.sides(canaries + baseline, door)  # what each side runs while it is judged
        interrupts.checkpoint()  # a signal during the apply: the canaries go back now
        run = _Judging(profile, door, prom, opts, report, pre, on_window, sleep, clock, save)
        verdict = run.first_period(canaries, baseline, on)
        if s.crossover and not verdict.final:
            verdict = run.second_period(canaries, baseline, on)
    except KeyboardInterrupt:
        if not on.hosts:  # nothing on the profile (the apply restored its hosts itself, or never ran)
            raise
        who = "canaries" if all(h in {c.host for c in canaries} for h in on.hosts) else "hosts on the profile"
        back = _roll_back(profile, canaries + baseline, on, door, "interrupted", who)
        report.verdict = Verdict("inconclusive", "interrupted", report.verdict.windows, pre=len(pre))
        report.followup = back
        report.exit_code = 130
        save(report)
        raise interrupts.Interrupted(f"knobfleet: canary {profile.name} interrupted: {back}", report) from None
    with interrupts.deferred():  # the verdict's action runs to its end (the promotion's apply has its own steps)
        _act(profile, verdict, (canaries, baseline, rest), on, door, opts, report, save)
        return report


def _pre_period(
    profile: Profile,
    canaries: list[HostVars],
    baseline: list[HostVars],
    prom: Prometheus,
    opts: CanaryOptions,
    report: CanaryReport,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
    save: Callable[[CanaryReport], None],
) -> list[Window]:
    """The pre-period's counted windows; ``PrePeriodTooQuiet`` (nothing applied) when too few count, saying why."""
    s = opts.settings
    pre: list[Window] = []
    measured_since = clock()
    for k in range(1, s.pre_windows + 1):
        probes = opts.prober(canaries + baseline, s) if opts.prober else None
        sleep(opts.window_s)
        row, window = measure(prom, canaries, baseline, k, clock(), opts.window_s, measured_since, probes)
        row["pre"] = True
        report.pre.append(row)
        if window is None:
            report.notes.append(f"pre-period window {k}: {row['skipped']}; not counted")
        else:
            pre.append(window)
        save(report)
    short = pre_period_shortfall(pre, s)
    if len(pre) < min(2, s.pre_windows):
        # windows that could not be measured at all (a missing metric, a restart, Prometheus): say why
        why = "; ".join(str(r["skipped"]) for r in report.pre if "skipped" in r) or "no window could be measured"
        short = f"pre-period: {len(pre)} of {s.pre_windows} windows measured ({why}); nothing was applied"
    if short is not None:
        report.verdict = Verdict("inconclusive", short, 0, pre=len(pre))
        save(report)
        raise PrePeriodTooQuiet(f"canary {profile.name}: {short}")
    return pre


def _act(
    profile: Profile,
    verdict: Verdict,
    sides: tuple[list[HostVars], list[HostVars], list[HostVars]],
    on: _OnProfile,
    door: Hosts,
    opts: CanaryOptions,
    report: CanaryReport,
    save: Callable[[CanaryReport], None],
) -> None:
    """The verdict's action (advice only, with --advisory): promote rolls the profile out to every host not yet on
    it; anything else takes it back from the hosts that run it. Run inside a deferred section: it runs to its end."""
    from knobfleet.ops import interrupts

    canaries, baseline, rest = sides
    report.verdict = verdict
    running = [h for h in canaries + baseline if h.host in on.hosts]  # after a crossover's swap: the baseline
    others = [h for h in canaries + baseline + rest if h.host not in on.hosts]
    who = "canaries" if all(h in canaries for h in running) else "baseline (on the profile since the swap)"
    if opts.advisory:
        report.followup = advice(profile, verdict, running, others, f"the {who.split(' (')[0]}")
        report.exit_code = {"promote": 0, "rollback": 1}.get(verdict.verdict, 2)
    elif verdict.verdict == "promote":
        report.followup = f"promoted: {profile.name} rolled out to the rest of the fleet"
        try:
            done = apply(profile, others, door, Options(serial=opts.serial)) if others else None
        except interrupts.Interrupted as exc:  # the rollout to the rest says what it did; the canaries keep it
            names = ", ".join(h.host for h in running)
            report.followup = (f"promoted: {names} run {profile.name}; the rollout to the rest was "
                               f"interrupted ({exc}); `knobfleet history` shows each host")  # fmt: skip
            report.exit_code = 130
            save(report)
            raise interrupts.Interrupted(f"knobfleet: canary {profile.name} {report.followup}", report) from None
        report.exit_code = done.exit_code if done else 0
    else:
        report.followup = _roll_back(profile, canaries + baseline, on, door, verdict.verdict, who)
        report.exit_code = 1 if verdict.verdict == "rollback" else 2  # a rejected profile; undecided, as ab
    save(report)


class _Judging:
    """The judged windows: the first period (or the whole of a ``did`` canary), then a crossover's swap and second."""

    def __init__(
        self,
        profile: Profile,
        door: Hosts,
        prom: Prometheus,
        opts: CanaryOptions,
        report: CanaryReport,
        pre: list[Window],
        on_window: Callable[[int, Verdict, dict[str, Any]], None] | None,
        sleep: Callable[[float], None],
        clock: Callable[[], float],
        save: Callable[[CanaryReport], None],
    ) -> None:
        self.profile, self.door, self.prom, self.opts, self.report = profile, door, prom, opts, report
        self.pre, self.on_window, self.sleep, self.clock, self.save = pre, on_window, sleep, clock, save
        self.first: list[Window] = []
        self.k = 0  # windows measured, both periods (the report's numbering)

    def first_period(self, canaries: list[HostVars], baseline: list[HostVars], on: _OnProfile) -> Verdict:
        """The baseline restarted on its current generation, as fresh as the canaries (and a canary the apply left
        running, already in sync, restarted too), then windows until a verdict, the swap (a crossover's
        ``swap_after`` counted windows) or ``max_windows``."""
        fresh = [h for h in canaries if not on.restarted(h.host)] + baseline
        self._restart(fresh, on, "restarted on its current generation, as fresh as the other side")
        s = self.opts.settings
        enough = s.swap_after if s.crossover else s.max_windows
        verdict = self._windows(canaries, baseline, s.max_windows, lambda: len(self.first) >= enough, self.first)
        if not verdict.final and not s.crossover:
            verdict = self._unfinished(verdict)
        return verdict

    def _restart(self, hosts: list[HostVars], on: _OnProfile, why: str) -> None:
        """``hosts`` restarted on the generation each ran before the canary, through the drain path; a host that
        does not restart is a note (its windows then say whether they count)."""
        from knobfleet.ops import interrupts
        from knobfleet.ops.restores import restore_routed
        from knobfleet.ops.transaction import RestoreTarget

        reason = f"canary {self.profile.name}: {why}"
        targets = {h.host: RestoreTarget(on.before[h.host], reason, leave="", event="rollback") for h in hosts
                   if on.before.get(h.host) is not None}  # fmt: skip
        if not targets:
            return
        with interrupts.deferred(keep=True):  # never between a host's drain and its re-add
            restarted = restore_routed([h for h in hosts if h.host in targets], self.door, targets, False, None)
        interrupts.checkpoint()
        for o in restarted:
            if not o.ok:
                self.report.notes.append(f"{o.host} did not restart: {o.message}")

    def second_period(self, canaries: list[HostVars], baseline: list[HostVars], on: _OnProfile) -> Verdict:
        """The swap (the canaries back to their previous generation, the baseline onto the profile, each through
        the drain path; a host the swap did not restart, being already there, restarted as fresh), then windows
        judged on the crossover's estimate, the baseline now the new side."""
        from knobfleet.ops import interrupts

        s = self.opts.settings
        if len(self.first) < s.swap_after:
            return self._unfinished(self.report.verdict, f"{len(self.first)} of {s.swap_after} windows counted "
                                    "before the swap")  # fmt: skip
        with interrupts.deferred(keep=True):
            back = _roll_back(self.profile, canaries, on, self.door, "the crossover's swap")
            self.report.notes.append(f"swap after {len(self.first)} windows: {back}")
            swapped = apply(self.profile, baseline, self.door, Options(serial=self.opts.serial))
            on.took(swapped)
            self.save(self.report)
        interrupts.checkpoint()
        if swapped.exit_code != 0:
            bad = [o.host for o in swapped.hosts if o.status not in ("applied", "unchanged", "in-sync")]
            failed = ", ".join(bad) or "the baseline"
            return self._unfinished(self.report.verdict, f"the swap's apply to {failed} failed (restored)")
        stale = [h for h in canaries if h.host not in on.moved] + [h for h in baseline if not on.restarted(h.host)]
        self._restart(stale, on, "restarted at the crossover's swap, as fresh as the other side")
        second: list[Window] = []
        verdict = self._windows(baseline, canaries, s.max_windows, lambda: len(second) >= s.second_windows, second,
                                crossover=True)  # fmt: skip
        return verdict if verdict.final else self._unfinished(verdict)

    def _unfinished(self, last: Verdict, why: str = "") -> Verdict:
        return Verdict("inconclusive", why or last.reason or "no window could be judged", last.windows,
                       last.skipped, last.intervals, pre=len(self.pre), crossed=last.crossed)  # fmt: skip

    def _windows(
        self,
        new: list[HostVars],
        old: list[HostVars],
        attempts: int,
        done: Callable[[], bool],
        into: list[Window],
        crossover: bool = False,
    ) -> Verdict:
        """Windows, ``new`` on the profile and ``old`` not, judged after each, to a verdict, ``done()`` or ``attempts``
        (``crossover``: the second period, judged with the first)."""
        s, report = self.opts.settings, self.report
        fresh_since = self.clock()
        verdict = report.verdict
        settle = Settle(s.warmup_windows, s.warmup_tol)
        report.warmup.append(settle)
        for _ in range(attempts):
            probes = self.opts.prober(new + old, s) if self.opts.prober else None
            self.sleep(self.opts.window_s)
            self.k += 1
            row, window = measure(self.prom, new, old, self.k, self.clock(), self.opts.window_s, fresh_since, probes)
            row["crossed"] = crossover
            report.windows.append(row)
            if window is None:
                report.notes.append(f"window {self.k}: {row['skipped']}; not counted")
                self.save(report)
                continue
            into.extend(settle.offer(window, row))
            aside = [w for period in report.warmup for w in period.unjudged()]  # the guardrails count these too
            verdict = judge(self.first, s, self.pre, into, aside) if crossover else judge(into, s, self.pre, (), aside)
            row["interval"] = {  # the sequential estimate after this window (the report plots it against the bars)
                m: {"estimate": math.expm1(iv.estimate), "low": math.expm1(iv.low), "high": math.expm1(iv.high)}
                for m, iv in verdict.intervals.items()
            }
            report.verdict = verdict
            self.save(report)
            if self.on_window is not None:
                self.on_window(self.k, verdict, row)
            if verdict.final or done():
                break
        report.notes.extend(settle.close())
        return verdict


def _roll_back(
    profile: Profile, hosts: list[HostVars], on: _OnProfile, door: Hosts, why: str, who: str = "canaries"
) -> str:
    """The hosts of ``hosts`` that run the profile back to the generation each ran before (a host the apply found in
    sync changed nothing), each through the drain path; the text says which went back to what."""
    from knobfleet.ops import interrupts
    from knobfleet.ops.restores import restore_routed
    from knobfleet.ops.transaction import RestoreTarget

    targets = {
        hv.host: RestoreTarget(on.before[hv.host], f"canary {profile.name}: {why}")
        for hv in hosts
        if hv.host in on.hosts and on.before.get(hv.host) is not None
    }
    with interrupts.shielded(raise_at_end=False):  # a second Ctrl-C does not leave a host half restored
        back = restore_routed([h for h in hosts if h.host in targets], door, targets, False, None, finish=True)
    for o in back:
        if o.ok:
            on.hosts.pop(o.host, None)
            on.moved.add(o.host)
    failed = [o.host for o in back if not o.ok]
    text = f"{who} rolled back to their previous generation: " + (
        ", ".join(f"{o.host}={o.generation:04d}" if o.generation is not None else f"{o.host}=?" for o in back)
        or "none had changed"
    )
    if failed:
        text += (
            f"; {', '.join(failed)} could not be restored and may still run {profile.name} (see `knobfleet history`)"
        )
    return text
