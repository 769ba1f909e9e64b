"""The canary use case end to end with fakes of its boundaries (a ``Hosts`` door, an in-memory router, a
Prometheus answering per-host window values): the subsets, the verdict driving promote or rollback, windows
with a restarted host or a missing metric not counted, and refusals before anything changes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from knobfleet.errors import UsageError
from knobfleet.experiment.canary import Settings
from knobfleet.experiment.canary_hosts import split
from knobfleet.experiment.canary_run import CanaryOptions, PrePeriodTooQuiet, canary
from knobfleet.fleet import router_kinds
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.transports.base import Outcome
from knobfleet.profiles.store import ProfileStore
from knobfleet.telemetry.prom import Sample
from tests.unit.fleet.test_router import MemRouter
from tests.unit.ops.rollout_fakes import CLEAN, FakeHosts, Host

ROUTER = "http://127.0.0.1:30080"


@pytest.fixture
def profile(profiles_dir: Path):  # type: ignore[no-untyped-def]
    return ProfileStore(profiles_dir).resolve("ctas512")


def hosts(n: int, routed: bool = True) -> list[HostVars]:
    return [
        HostVars(
            host=f"h{i}", listen_host=f"127.0.1.{i}", port=30000, router_url=ROUTER if routed else None,
            drain_timeout_s=5, timeout_stop_s=60,
        )
        for i in range(1, n + 1)
    ]  # fmt: skip


class Door(FakeHosts):
    def probe(self, hosts: Any, on_event: Any = None, *, quick: bool = False) -> dict[str, Outcome]:
        doc = json.loads(CLEAN.read_text())
        return {hv.host: Outcome(hv.host, doc=doc) for hv in hosts}


@dataclass
class FakeProm:
    """tput per host: a host at ``ratio`` of the others while ``on_new(host)`` says it runs the profile (the canary
    h1, and after a crossover's swap the baseline h2), h1 at ``host`` (its own hardware) throughout; ITL the
    inverse (or scaled by ``itl``)."""

    ratio: float
    restarts: dict[str, float] = field(default_factory=dict)  # counter resets per window (an engine restart)
    missing: set[str] = field(default_factory=set)
    queries: list[str] = field(default_factory=list)
    host: float = 1.0
    itl: float | None = None  # the canary's ITL factor once changed (None: the inverse of ratio)
    requests: float = 300.0
    router: tuple[float, float] = (0.0, 0.0)  # (requests, errors) per window before the change
    router_after: tuple[float, float] | None = None
    on_new: Any = lambda host: host == "h1"

    def ready(self) -> bool:
        return True

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        self.queries.append(expr)
        out = []
        for i, h in enumerate(("h1", "h2", "h3", "h4"), start=1):
            if h in self.missing:
                continue
            now = self.on_new(h)
            effect = self.ratio if now else 1.0
            base = 100.0 * (self.host if h == "h1" else 1.0) * (1 + 0.003 * ((len(self.queries) + i) % 3))
            tput = base * effect
            if expr.startswith("max by (host) (resets("):
                out.append(Sample({"host": h}, self.restarts.get(h, 0.0)))
                continue
            if expr.startswith("sum(increase(smg_"):
                changed = any(self.on_new(x) for x in ("h1", "h2", "h3", "h4"))
                total, errors = self.router_after if changed and self.router_after else self.router
                return [Sample({}, errors if "status_code" in expr else total)]
            if "generation_tokens_total" in expr:
                v = tput
            elif "inter_token_latency" in expr:
                v = 1 / tput if self.itl is None or not now else self.itl / base
            elif "num_requests_total" in expr:
                v = self.requests
            else:
                raise AssertionError(f"unexpected query {expr}")
            out.append(Sample({"host": h}, v))
        return out


@pytest.fixture
def router(monkeypatch: pytest.MonkeyPatch) -> MemRouter:
    mem = MemRouter({f"http://127.0.1.{i}:30000": True for i in range(1, 5)}, url=ROUTER)
    monkeypatch.setattr(router_kinds, "router_for", lambda kind, url: mem)
    monkeypatch.setattr(router_kinds, "engine_inflight", lambda url, engine: lambda: 0)
    # the drain's and re-add's polls answer at once here (an in-memory router): no real sleep between them, which
    # kept each canary ~1 s longer (and mutation testing of the canary, whose mutants run these tests, minutes)
    monkeypatch.setattr(router_kinds.MonotonicClock, "sleep", lambda self, seconds: None)
    return mem


def runs_profile(door: Door, host: str) -> bool:
    """Whether ``host``'s last play was an apply (it runs the profile) rather than a restore."""
    plays = [line.split() for line in door.log if line.startswith("play ")]
    mine = [p[1] for p in plays if host in p[2].split(",")]
    return bool(mine) and mine[-1] == "apply.yml"


def run(
    profile: Any,
    prom: FakeProm,
    n: int = 4,
    advisory: bool = False,
    kept: list[dict[str, Any]] | None = None,
    sleep: Any = lambda s: None,
    settings: Settings | None = None,
    fail: dict[str, str] | None = None,
    in_sync: bool = False,
) -> tuple[Any, Door]:
    hv = hosts(n)
    door = Door(
        {
            h.host: Host(1, status={1: "good"}, in_sync=True) if in_sync else Host(fail_at=(fail or {}).get(h.host))
            for h in hv
        }
    )  # an in-sync host runs the probe document's generation (1)
    prom.on_new = lambda h: runs_profile(door, h)
    clock = iter(float(t) for t in range(1000, 100000, 60))
    report = canary(
        profile, hv, door, prom,  # type: ignore[arg-type]
        CanaryOptions(hosts=1, window_s=60, settings=settings or Settings(), advisory=advisory),
        sleep=sleep, clock=lambda: next(clock),
        keep=(lambda r: kept.append(json.loads(json.dumps(r.as_json())))) if kept is not None else None,
    )  # fmt: skip
    return report, door


def test_a_clearly_worse_canary_is_rolled_back(profile: Any, router: MemRouter) -> None:
    report, door = run(profile, FakeProm(0.55))
    assert report.verdict.verdict == "rollback" and report.exit_code == 1
    assert report.canaries == ["h1"] and report.baseline == ["h2"]
    assert "play restore.yml h1" in door.log and report.followup.startswith("canaries rolled back")
    assert "play apply.yml h3" not in " ".join(door.log)  # the rest never got it


def test_a_clearly_better_canary_is_promoted_to_the_rest(profile: Any, router: MemRouter) -> None:
    report, door = run(profile, FakeProm(1.2))
    assert report.verdict.verdict == "promote" and report.exit_code == 0
    assert any(line.startswith("play apply.yml") and "h3" in line for line in door.log)
    assert all(h in router.workers for h in (f"http://127.0.1.{i}:30000" for i in range(1, 5)))


def test_windows_with_a_restarted_host_or_a_missing_metric_do_not_count(profile: Any, router: MemRouter) -> None:
    prom = FakeProm(0.55, restarts={"h2": 1})  # h2's engine keeps "restarting": every window spans it
    with pytest.raises(PrePeriodTooQuiet, match=r"pre-period: 0 of 3 windows measured \(h2 restarted during"):
        run(profile, prom)
    with pytest.raises(
        PrePeriodTooQuiet,
        match=r"pre-period: 0 of 3 windows measured \(metric missing on h2 \(tput, itl\): an engine without",
    ):
        run(profile, FakeProm(0.55, missing={"h2"}))


def test_a_slow_host_cancels_whichever_side_it_is_on(profile: Any, router: MemRouter) -> None:
    """The uneven-fleet bug: an identical profile with the canary host 8% slower read as 8% worse; the pre-period
    measures the host, so the verdict is on the change alone. (A 5% margin: at the default 3% the prior sd alone
    keeps 4 + 12 quiet windows from proving non-inferiority.)"""
    wide = Settings(max_regression=0.05)
    report, _ = run(profile, FakeProm(1.0, host=0.92), settings=wide)
    assert report.verdict.verdict == "promote", report.verdict.reason
    assert abs(report.verdict.intervals["tput"].estimate) < 0.01
    report, _ = run(profile, FakeProm(1.0, host=1 / 0.92), settings=wide)  # the slow host in the baseline
    assert report.verdict.verdict == "promote"
    report, _ = run(profile, FakeProm(0.95, host=1 / 0.92), settings=wide)  # 5% worse next to a slow baseline
    assert report.verdict.verdict == "rollback" and report.exit_code == 1


def test_a_canary_slower_per_request_second_with_the_same_itl_is_rolled_back(profile: Any, router: MemRouter) -> None:
    """The mutation-audit survivor: throughput per request-second 17% lower, ITL unchanged: tput alone decides."""
    report, _ = run(profile, FakeProm(0.83, itl=1.0))
    assert report.verdict.verdict == "rollback", report.verdict.reason
    assert report.verdict.reason.startswith("tput is -17.0% on the canaries")


def test_a_quiet_pre_period_applies_nothing_and_says_the_counts(profile: Any, router: MemRouter) -> None:
    with pytest.raises(PrePeriodTooQuiet) as exc:
        run(profile, FakeProm(1.0, requests=7))
    assert str(exc.value) == (
        "canary ctas512: pre-period: too little traffic to measure the hosts: the canaries finished 7/7/7 "
        "and the baseline 7/7/7 requests in 3 window(s); each side needs 20 per window in at least 2 "
        "windows (a longer --window, or more traffic); nothing was applied"
    )


def test_the_router_error_rate_is_a_guardrail(profile: Any, router: MemRouter) -> None:
    report, _ = run(profile, FakeProm(1.0, router=(800, 1), router_after=(800, 40)))
    assert report.verdict.verdict == "rollback"
    assert report.verdict.reason == (
        "the router failed 40 of 800 requests (5.00%) while the canaries served, against 3 of 2400 (0.12%) before "
        "the change"
    )


def test_advisory_judges_and_changes_nothing_after_the_canary_apply(profile: Any, router: MemRouter) -> None:
    kept: list[dict[str, Any]] = []
    report, door = run(profile, FakeProm(0.55), advisory=True, kept=kept)
    assert report.verdict.verdict == "rollback" and report.exit_code == 1
    assert not any(line.startswith("play restore.yml h1") for line in door.log)  # h1 stays on the profile
    assert report.followup == (
        "advisory: the canaries (h1) left on ctas512@2; the judge would roll back (rollback): "
        "`knobfleet rollback --limit h1 --yes`; to promote instead: `apply-profile ctas512 --yes`"
    )
    report, door = run(profile, FakeProm(1.2), advisory=True)
    assert report.verdict.verdict == "promote" and report.verdict.crossed >= 3
    # the canary apply, the baseline's fresh restart, the crossover's swap; nothing after the verdict
    assert [line for line in door.log if line.startswith("play ")] == [
        "play apply.yml h1", "play restore.yml h2", "play restore.yml h1", "play apply.yml h2",
    ]  # fmt: skip
    assert report.followup == (
        "advisory: the baseline (h2) left on ctas512@2; the judge would promote: `apply-profile ctas512 --yes "
        "--limit h1,h3,h4`; to roll back instead: `knobfleet rollback --limit h2 --yes`"
    )
    # the record: rewritten after each window, the last one final and complete
    assert [len(k["pre_period"]) for k in kept[:3]] == [1, 2, 3]
    last = kept[-1]
    assert last["verdict"] == "rollback" and last["advisory"] and last["windows_pre"] == 3
    assert last["intervals"]["tput"]["high"] < 0 and len(last["windows"]) == last["windows_counted"]


def test_an_interrupt_while_judging_rolls_the_canaries_back(profile: Any, router: MemRouter) -> None:
    from knobfleet.ops.interrupts import Interrupted

    calls = {"n": 0}

    def sleep(_s: float) -> None:
        calls["n"] += 1
        if calls["n"] == Settings().pre_windows + 2:  # the second judged window
            raise KeyboardInterrupt

    with pytest.raises(Interrupted) as exc:
        run(profile, FakeProm(1.0), sleep=sleep)
    assert str(exc.value).startswith("knobfleet: canary ctas512 interrupted: canaries rolled back to their previous")
    assert exc.value.report.exit_code == 130


def test_refusals_change_nothing(router: MemRouter) -> None:
    with pytest.raises(UsageError, match=r"^canary: h1, h2 are behind no router"):
        split(hosts(2, routed=False), CanaryOptions(hosts=1))
    with pytest.raises(UsageError, match=r"^canary: 2 canary host\(s\) need as many baseline hosts; 3 selected"):
        split(hosts(3), CanaryOptions(hosts=2))
    assert router.calls == []


def test_window_queries_divide_tokens_by_the_time_requests_spent_in_flight() -> None:
    """A mutation-audit survivor: the throughput divided by the wrong quantity (requests finished, or the running
    gauge) promoted a canary 17% slower per request-second. The queries are pinned, per engine, to the catalog's
    series: tokens / rate(e2e _sum) (Little's law), ITL as rate(_sum) / rate(_count)."""
    from knobfleet.experiment.canary_windows import window_values

    prom = FakeProm(1.0)
    window_values(prom, hosts(2), 1000.0, 15.0)  # type: ignore[arg-type]

    def of(name: str) -> str:  # both spellings: colons, and OpenMetrics' escaping=underscores (real SGLang)
        return f'{{__name__=~"sglang:{name}|sglang_{name}", host=~"h1|h2"}}'

    assert prom.queries == [
        f"sum by (host) (rate({of('generation_tokens_total')}[15s])) / "
        f"sum by (host) (rate({of('e2e_request_latency_seconds_sum')}[15s]))",
        f"sum by (host) (rate({of('inter_token_latency_seconds_sum')}[15s])) / "
        f"sum by (host) (rate({of('inter_token_latency_seconds_count')}[15s]))",
        f"sum by (host) (increase({of('num_requests_total')}[15s]))",
        f"max by (host) (resets({of('num_requests_total')}[15s]))",
    ]


@pytest.mark.exhaustive
@pytest.mark.parametrize("ratio", [0.55, 1.2], ids=["rolled-back", "promoted"])
def test_a_signal_anywhere_in_a_canary_ends_in_the_state_it_reports(
    profile: Any, router: MemRouter, ratio: float
) -> None:
    """The signal handler's code run at ~80 points of a whole canary (pre-period, canary apply, judged windows,
    then the rollback or the promotion), traced over ops/ and experiment/: every run ends with no host locked and
    every worker in its router; interrupted, the canary runs its previous generation (or the report's promotion
    says the fleet has the profile); never a canary left on the profile with nothing saying so."""
    from knobfleet.ops import interrupts
    from tests.unit.signal_at import signal_at

    def once(k: int) -> tuple[Door, Any, str, int, str]:
        router.workers = {f"http://127.0.1.{i}:30000": True for i in range(1, 5)}
        hv = hosts(4)
        door = Door({h.host: Host() for h in hv})
        prom = FakeProm(ratio)
        prom.on_new = lambda h: runs_profile(door, h)
        clock = iter(float(t) for t in range(1000, 100000, 60))
        how = "done"
        report: Any = None
        with signal_at(k, ("ops", "experiment")) as tracer:
            try:
                report = canary(profile, hv, door, prom, CanaryOptions(hosts=1, window_s=60, settings=Settings()),  # type: ignore[arg-type]
                                sleep=lambda s: None, clock=lambda: next(clock))  # fmt: skip
            except interrupts.Interrupted as exc:
                report, how = exc.report, "interrupted"
            except KeyboardInterrupt:
                how = "raw"
        return door, report, how, tracer.n, tracer.at

    once(10**9)  # imports what a canary imports: the count below is the same whatever ran before this test
    _, _, how, total, _ = once(10**9)  # the lines a whole canary runs: the points are spread over them
    assert how == "done" and total > 500
    problems = []
    for k in range(1, total, max(1, total // 80)):
        door, report, how, _, at = once(k)
        where = f"line {k}, {at} ({how})"
        if any(h.lock for h in door.hosts.values()):
            problems.append(f"{where}: a host is locked")
        if len(router.workers) != 4:
            problems.append(f"{where}: workers {sorted(router.workers)}")
        on_profile = runs_profile(door, "h1") or runs_profile(door, "h2")  # the canary, or the swapped baseline
        if how == "raw" and on_profile:
            problems.append(f"{where}: a raw interrupt left the canary on the profile: {door.log}")
        if how == "interrupted" and on_profile and "promoted" not in str(getattr(report, "followup", "")):
            problems.append(
                f"{where}: interrupted, the canary is on the profile: {getattr(report, 'followup', report)}"
            )
    assert problems == [], "\n".join(problems[:8])


def test_the_crossover_swaps_the_subsets_then_promotes_to_the_hosts_not_yet_on_the_profile(
    profile: Any, router: MemRouter
) -> None:
    """An identical profile with the canary host 8% slower: the first period cannot promote (the hosts' speeds are
    not cancelled yet), the swap puts h1 back and h2 on the profile, and the promotion skips h2."""
    report, door = run(profile, FakeProm(1.0, host=0.92))
    assert report.verdict.verdict == "promote" and report.verdict.crossed >= 3, report.verdict.reason
    assert abs(report.verdict.intervals["tput"].estimate) < 0.01
    plays = [line for line in door.log if line.startswith("play ")]
    assert plays[:4] == ["play apply.yml h1", "play restore.yml h2", "play restore.yml h1", "play apply.yml h2"]
    assert plays[4:] == ["play apply.yml h1", "play apply.yml h3", "play apply.yml h4"]  # one at a time, never h2
    rows = report.as_json()["windows"]
    assert [r["crossed"] for r in rows] == [False] * 6 + [True] * (len(rows) - 6)
    assert any(n.startswith("swap after 6 windows: canaries rolled back to their previous generation: h1=")
               for n in report.notes)  # fmt: skip


def test_a_change_shown_worse_after_the_swap_is_taken_back_from_the_baseline(profile: Any, router: MemRouter) -> None:
    report, door = run(profile, FakeProm(0.96, host=1 / 0.92))  # 4% worse, next to a slow baseline host
    assert report.verdict.verdict == "rollback" and report.verdict.crossed >= 1, report.verdict.reason
    assert report.followup.startswith("baseline (on the profile since the swap) rolled back to their previous")
    assert not runs_profile(door, "h1") and not runs_profile(door, "h2")
    assert not any("h3" in line for line in door.log)


def test_an_interrupt_after_the_swap_takes_the_profile_back_from_the_baseline(profile: Any, router: MemRouter) -> None:
    from knobfleet.ops.interrupts import Interrupted

    calls = {"n": 0}

    def sleep(_s: float) -> None:
        calls["n"] += 1
        if calls["n"] == Settings().pre_windows + Settings().swap_after + 2:  # the second window after the swap
            raise KeyboardInterrupt

    with pytest.raises(Interrupted) as exc:
        run(profile, FakeProm(1.0), sleep=sleep)
    assert str(exc.value).startswith("knobfleet: canary ctas512 interrupted: hosts on the profile rolled back to")
    assert "h2=" in str(exc.value) and exc.value.report.exit_code == 130


def test_settings_that_leave_no_second_period_are_refused_before_anything_changes(
    profile: Any, router: MemRouter
) -> None:
    with pytest.raises(
        UsageError, match=r"^canary: max_windows 6 leaves 0 window\(s\) after the swap at 6; the second"
    ):
        run(profile, FakeProm(1.0), settings=Settings(max_windows=6))
    assert router.calls == []


def test_a_swap_whose_apply_fails_ends_inconclusive_with_nothing_on_the_profile(
    profile: Any, router: MemRouter
) -> None:
    report, door = run(profile, FakeProm(1.0), fail={"h2": "restart"})  # h2's engine does not start on the profile
    assert report.verdict.verdict == "inconclusive" and report.exit_code == 2
    assert report.verdict.reason == "the swap's apply to h2 failed (restored)"
    assert not runs_profile(door, "h1") and not runs_profile(door, "h2")
    assert len(router.workers) == 4  # every worker back in its router


def test_an_a_a_canary_already_in_sync_restarts_every_host_so_both_sides_stay_equally_fresh(
    profile: Any, router: MemRouter
) -> None:
    """`canary default` on hosts already running default: the applies change nothing, so the canary restarts the
    canary with the baseline at the start and both at the swap; otherwise the crossover would compare two hosts
    that never restarted with their own labels swapped, and cancel by construction."""
    report, door = run(profile, FakeProm(1.0, host=0.92, on_new=lambda h: False), in_sync=True)
    assert report.verdict.verdict == "promote", report.verdict.reason
    plays = [line for line in door.log if line.startswith("play ")]
    assert plays[:6] == [
        "play apply.yml h1", "play restore.yml h1", "play restore.yml h2",  # the canary apply, both fresh
        "play apply.yml h2", "play restore.yml h1", "play restore.yml h2",  # the swap's apply, both fresh again
    ]  # fmt: skip
    assert "swap after 6 windows: canaries rolled back to their previous generation: none had changed" in report.notes


@dataclass
class ColdProm(FakeProm):
    """Every engine slower after any play (a restart), by ``penalty`` in the first window and less in each of the
    next ``cold`` - 1: the published shape of a restarted engine, worse until it has served its first requests."""

    door: Any = None
    cold: int = 1
    penalty: float = 0.15
    seen: int = 0
    since: int = 99

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        out = super().query(expr, at)
        if "generation_tokens_total" in expr:  # once per window, first: a play since the last window restarted
            n = len(self.door.log)
            self.since, self.seen = (0 if n != self.seen else self.since + 1), n
        if self.since < self.cold and ("generation_tokens_total" in expr or "inter_token_latency" in expr):
            slow = self.penalty * (self.cold - self.since) / self.cold
            f = 1 - slow if "generation" in expr else 1 / (1 - slow)
            out = [Sample(s.labels, s.value * f) for s in out]
        return out


def run_cold(profile: Any, cold: int, settings: Settings) -> tuple[Any, dict[str, Any]]:
    hv = hosts(4)
    door = Door({h.host: Host() for h in hv})
    prom = ColdProm(1.0, door=door, cold=cold)
    prom.on_new = lambda h: runs_profile(door, h)
    clock = iter(float(t) for t in range(1000, 100000, 60))
    report = canary(profile, hv, door, prom, CanaryOptions(hosts=1, window_s=60, settings=settings),  # type: ignore[arg-type]
                    sleep=lambda s: None, clock=lambda: next(clock))  # fmt: skip
    return report, json.loads(json.dumps(report.as_json()))


def test_windows_of_engines_still_warming_up_are_set_aside_and_the_record_says_so(
    profile: Any, router: MemRouter
) -> None:
    report, rec = run_cold(profile, 1, Settings())
    assert report.verdict.verdict == "promote"  # an A/A, judged on warm windows only
    aside = rec["warmup"]["set_aside"]
    assert len(aside) == 2 and rec["warmup"]["unconverged_periods"] == 0  # the first window of each period
    rows = {r["window"]: r for r in rec["windows"]}
    assert rec["warmup"]["requests"] == sum(sum(rows[k]["requests"].values()) for k in aside) > 0
    for k in aside:
        assert rows[k]["skipped"].startswith("warming up: ") and "h1 itl -15.0%" in rows[k]["skipped"]
        assert "tput +17.6%" in rows[k]["skipped"]  # the next window, warm, against this cold one
    counted = [r for r in rec["windows"] if "skipped" not in r]
    assert counted and all(min(r["values"]["tput"].values()) > 99 for r in counted)  # none cold
    assert rec["settings"]["warmup_windows"] == 2 and rec["settings"]["warmup_tol"] == 0.05
    assert any(n.startswith("warm-up: window(s) ") for n in rec["notes"])


def test_engines_that_never_settle_are_judged_after_the_bound_and_the_record_says_not_converged(
    profile: Any, router: MemRouter
) -> None:
    report, rec = run_cold(profile, 99, Settings())  # slow after a restart, and recovering 0.15% a window
    # a level that holds from window to window counts: the rule judges stability, not an absolute level, which it
    # cannot know on a new profile
    assert rec["warmup"]["windows"] == 0 and report.verdict.verdict == "promote"
    report, rec = run_cold(profile, 2, Settings(warmup_windows=1))
    assert rec["warmup"]["unconverged_periods"] == 2 and rec["warmup"]["windows"] == 2
    assert any("not settled within 1" in n for n in rec["notes"])


def test_warm_up_0_judges_from_the_first_window(profile: Any, router: MemRouter) -> None:
    _, rec = run_cold(profile, 1, Settings(warmup_windows=0))
    assert rec["warmup"] == {"windows": 0, "requests": 0, "unconverged_periods": 0, "set_aside": []}
    assert not any("warmup" in r for r in rec["windows"])
