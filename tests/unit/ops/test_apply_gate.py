"""``apply --gate`` as a step of each batch (ops/apply_gate.py), and ``--rollback-fleet`` through the drain path
(ops/restores.py), on the fake ``Hosts`` door and an in-memory router: a rejected host is judged while out of its
router, restored before it is put back, and the rollout stops at its batch; the earlier batches' hosts go back one
at a time, each drained first. (The routed gate used to judge after every batch had been applied, and to restore
every rejected host at once without a drain: 86 of 14,222 requests lost on the lab.)"""

# ruff: noqa: F811
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rollout_fakes import FakeHosts, Host
from test_ranks import grouped
from test_routing import hosts, router  # noqa: F401  (router: the fixture, its name reused by the tests)

from knobfleet.fleet.hostvars import HostVars
from knobfleet.ops.apply import apply
from knobfleet.ops.precheck import Options
from knobfleet.ops.steps import Slots
from knobfleet.profiles.store import ProfileStore
from tests.unit.fleet.test_router import MemRouter


@pytest.fixture
def profile(profiles_dir: Path):  # type: ignore[no-untyped-def]
    return ProfileStore(profiles_dir).resolve("ctas512")


@dataclass(frozen=True)
class Verdict:
    host: str
    passed: bool
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host, "passed": self.passed, "reason": self.reason}


class Judge:
    """The gate's judge: what each host's verdict is, and what the router held while it judged."""

    def __init__(self, router: MemRouter | None, reject: set[str], raises: set[str] | None = None) -> None:
        self.router, self.reject, self.raises = router, reject, raises or set()
        self.judged: list[str] = []
        self.out_while_judged: dict[str, bool] = {}

    def __call__(self, hv: Any) -> Verdict:
        self.judged.append(hv.host)
        if self.router is not None:
            self.out_while_judged[hv.host] = f"http://{hv.listen_host}:30000" not in self.router.workers
        if hv.host in self.raises:
            raise OSError("bench client: connection refused")
        return Verdict(hv.host, hv.host not in self.reject, "C48 -14.0%" if hv.host in self.reject else "ok")


def routed_events(router: MemRouter) -> list[str]:
    return [c for c in router.calls if c != "list"]


def test_a_rejected_first_batch_is_restored_while_drained_and_the_rest_is_never_touched(
    profile: Any, router: MemRouter
) -> None:
    """`apply nosplit --gate --serial 1` on routed hosts: the first host is judged out of its router, rejected,
    restored, put back; the other hosts are never touched."""
    hv = hosts(3)
    door = FakeHosts({h.host: Host() for h in hv})
    judge = Judge(router, reject={"h1"})
    report = apply(profile, hv, door, Options(serial="1", gate=judge))  # type: ignore[arg-type]
    assert [(o.host, o.status) for o in report.hosts] == [("h1", "failed"), ("h2", "not-run"), ("h3", "not-run")]
    assert report.hosts[0].message == "gate rejected: C48 -14.0%"
    assert report.hosts[0].restored is not None and report.hosts[0].restored.ok
    assert door.hosts["h1"].current == 3 and door.hosts["h1"].status[4] == "failed"
    assert judge.judged == ["h1"] and judge.out_while_judged == {"h1": True}
    assert [line for line in door.log if line.startswith("play")] == ["play apply.yml h1", "play restore.yml h1"]
    assert routed_events(router) == ["remove http://127.0.1.1:30000", "add http://127.0.1.1:30000"]
    assert door.hosts["h2"].current == door.hosts["h3"].current == 3
    assert report.exit_code == 1 and [g.as_json()["passed"] for g in report.gates] == [False]
    assert report.as_json()["gate"] == [{"host": "h1", "passed": False, "reason": "C48 -14.0%"}]


def test_a_passing_gate_judges_each_host_out_of_its_router_and_applies_them_all(
    profile: Any, router: MemRouter
) -> None:
    hv = hosts(3)
    door = FakeHosts({h.host: Host() for h in hv})
    judge = Judge(router, reject=set())
    report = apply(profile, hv, door, Options(serial="1", gate=judge))  # type: ignore[arg-type]
    assert [o.status for o in report.hosts] == ["applied"] * 3
    assert judge.judged == ["h1", "h2", "h3"] and all(judge.out_while_judged.values())
    assert sorted(router.workers) == [f"http://127.0.1.{i}:30000" for i in range(1, 4)]
    assert report.exit_code == 0 and [g.passed for g in report.gates] == [True] * 3


def test_a_host_already_on_the_profile_is_judged_too_and_goes_back_to_its_previous_good_generation(
    profile: Any,
) -> None:
    door = FakeHosts({"h1": Host(in_sync=True, status={2: "good", 3: "good"})})
    hv = [HostVars(host="h1", address="127.0.1.1", listen_host="127.0.1.1")]
    judge = Judge(None, reject={"h1"})
    report = apply(profile, hv, door, Options(gate=judge), slots=Slots())  # type: ignore[arg-type]
    assert judge.judged == ["h1"]
    assert report.hosts[0].status == "failed" and report.hosts[0].message == "gate rejected: C48 -14.0%"
    assert door.hosts["h1"].current == 3  # the previous good generation (the restore's None target)
    assert door.log.count("play restore.yml h1") == 1


def test_a_judge_that_cannot_judge_rejects(profile: Any, router: MemRouter) -> None:
    hv = hosts(2)
    door = FakeHosts({h.host: Host() for h in hv})
    report = apply(profile, hv, door, Options(serial="1", gate=Judge(router, set(), raises={"h1"})))  # type: ignore[arg-type]
    assert [o.status for o in report.hosts] == ["failed", "not-run"]
    assert report.hosts[0].message == "gate rejected: the gate could not judge it: bench client: connection refused"
    assert door.hosts["h1"].current == 3 and "http://127.0.1.1:30000" in router.workers


def test_an_engine_group_is_judged_on_its_head_and_a_rejection_restores_every_rank(profile: Any) -> None:
    door = FakeHosts({h: Host() for h in ("h1", "h2", "h3", "h4")})
    judge = Judge(None, reject={"h1"})
    report = apply(profile, grouped(), door, Options(serial="1", gate=judge), slots=Slots())  # type: ignore[arg-type]
    assert judge.judged == ["h1"]
    by = {o.host: o for o in report.hosts}
    assert by["h1"].status == by["h2"].status == "failed"
    assert by["h2"].message == "gate rejected: C48 -14.0% (on h1, the head of engine group g1)"
    assert door.hosts["h1"].current == door.hosts["h2"].current == 3
    assert by["h3"].status == by["h4"].status == "not-run"
    assert door.log.count("play restore.yml h1,h2") == 1, "restored once, by the gate's undo, not the play's too"


def test_rollback_fleet_takes_each_earlier_host_out_of_its_router_before_restoring_it(
    profile: Any, router: MemRouter
) -> None:
    hv = hosts(3)
    door = FakeHosts({"h1": Host(), "h2": Host(), "h3": Host(fail_at="ready")})
    during: list[str] = []
    door.during_play = lambda: during.append(",".join(sorted(router.workers)))
    report = apply(profile, hv, door, Options(serial="1", rollback_fleet=True))  # type: ignore[arg-type]
    assert [o.status for o in report.hosts] == ["rolled-back", "rolled-back", "failed"]
    assert all(door.hosts[h].current == 3 for h in ("h1", "h2", "h3"))
    events = routed_events(router)
    # h3's batch: drained, failed, restored, put back; then h1 and h2, each drained before its restore
    assert events[-4:] == [
        "remove http://127.0.1.1:30000",
        "add http://127.0.1.1:30000",
        "remove http://127.0.1.2:30000",
        "add http://127.0.1.2:30000",
    ]
    restores = [line for line in door.log if line.startswith("play restore.yml")]
    assert restores == ["play restore.yml h3", "play restore.yml h1", "play restore.yml h2"]
    assert during[-2:] == [
        "http://127.0.1.2:30000,http://127.0.1.3:30000",
        "http://127.0.1.1:30000,http://127.0.1.3:30000",
    ], "each earlier host was out of its router while its restore played"
    assert sorted(router.workers) == [f"http://127.0.1.{i}:30000" for i in range(1, 4)]
