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
from knobfleet.experiment.canary_run import CanaryOptions, canary, split
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
    """tput per host: canaries (h1) at ``ratio`` of the baseline (h2); ITL the inverse."""

    ratio: float
    started: dict[str, float] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)
    queries: list[str] = field(default_factory=list)

    def ready(self) -> bool:
        return True

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        self.queries.append(expr)
        out = []
        for i, h in enumerate(("h1", "h2", "h3", "h4"), start=1):
            if h in self.missing:
                continue
            tput = 100.0 * (self.ratio if h == "h1" else 1.0) * (1 + 0.003 * ((len(self.queries) + i) % 3))
            if "generation_tokens_total" in expr:
                v = tput
            elif "inter_token_latency" in expr:
                v = 1 / tput
            elif "num_requests_total" in expr:
                v = 300.0
            else:
                v = self.started.get(h, 0.0)
            out.append(Sample({"host": h}, v))
        return out


@pytest.fixture
def router(monkeypatch: pytest.MonkeyPatch) -> MemRouter:
    mem = MemRouter({f"http://127.0.1.{i}:30000": True for i in range(1, 5)}, url=ROUTER)
    monkeypatch.setattr(router_kinds, "router_for", lambda kind, url: mem)
    monkeypatch.setattr(router_kinds, "engine_inflight", lambda url, engine: lambda: 0)
    return mem


def run(profile: Any, prom: FakeProm, n: int = 4) -> tuple[Any, Door]:
    hv = hosts(n)
    door = Door({h.host: Host() for h in hv})
    clock = iter(float(t) for t in range(1000, 100000, 60))
    report = canary(
        profile, hv, door, prom, CanaryOptions(hosts=1, window_s=60, settings=Settings()),  # type: ignore[arg-type]
        sleep=lambda s: None, clock=lambda: next(clock),
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
    prom = FakeProm(0.55, started={"h2": 10**9})  # h2's engine keeps "restarting": every window spans it
    report, _ = run(profile, prom)
    assert report.verdict.verdict == "inconclusive" and report.verdict.windows == 0
    assert any("h2 restarted during the window" in n for n in report.notes)
    report, _ = run(profile, FakeProm(0.55, missing={"h2"}))
    assert report.verdict.verdict == "inconclusive"
    assert any("metric missing on h2" in n for n in report.notes)


def test_refusals_change_nothing(router: MemRouter) -> None:
    with pytest.raises(UsageError, match=r"^canary: h1, h2 are behind no router"):
        split(hosts(2, routed=False), CanaryOptions(hosts=1))
    with pytest.raises(UsageError, match=r"^canary: 2 canary host\(s\) need as many baseline hosts; 3 selected"):
        split(hosts(3), CanaryOptions(hosts=2))
    assert router.calls == []
