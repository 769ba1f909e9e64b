"""Engine groups in the rollout (ops/ranks.py through ops/apply.py, on the fake ``Hosts`` door): a group is one
restart unit, one failed rank restores the whole group, a group that would come up mismatched or that a --limit
cuts is refused before any play, and the role gets each rank's flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rollout_fakes import FakeHosts, Host

from knobfleet.errors import KnobfleetError
from knobfleet.fleet.hostvars import HostVars, attach_groups
from knobfleet.ops import ranks
from knobfleet.ops.apply import apply
from knobfleet.ops.outcome import HostOutcome
from knobfleet.ops.plan import batches
from knobfleet.ops.precheck import Options
from knobfleet.ops.steps import Slots
from knobfleet.profiles.store import ProfileStore

NAMES = ["h1", "h2", "h3", "h4"]
DECL = {"g1": {"members": {"h1": 0, "h2": 1}}, "g2": {"members": {"h3": 0, "h4": 1}}}


@pytest.fixture
def profile(profiles_dir: Path):  # type: ignore[no-untyped-def]
    return ProfileStore(profiles_dir).resolve("ctas512")


def grouped(names: list[str] = NAMES, decl: dict[str, Any] = DECL, **env: dict[str, str]) -> list[HostVars]:
    hosts = [
        HostVars(host=h, address=f"127.0.1.{i}", listen_host=f"127.0.1.{i}", host_env=env.get(h, {}))
        for i, h in enumerate(NAMES, start=1)
    ]
    every = {hv.host: hv.address for hv in hosts}
    return attach_groups([hv for hv in hosts if hv.host in names], dict.fromkeys(names, decl), every, "inv")


def fleet(**per_host: Host) -> FakeHosts:
    return FakeHosts({h: per_host.get(h, Host()) for h in NAMES})


def play_lines(door: FakeHosts) -> list[str]:
    return [line for line in door.log if line.startswith("play ")]


def test_serial_counts_groups_and_a_group_is_one_play(profile) -> None:  # type: ignore[no-untyped-def]
    door = fleet()
    report = apply(profile, grouped(), door, Options(serial="1"), slots=Slots())  # type: ignore[arg-type]
    assert play_lines(door) == ["play apply.yml h1,h2", "play apply.yml h3,h4"]
    assert [o.status for o in report.hosts] == ["applied"] * 4
    assert [o.group for o in report.hosts] == ["g1 rank 0", "g1 rank 1", "g2 rank 0", "g2 rank 1"]


def test_one_failed_rank_restores_every_rank_of_its_group(profile) -> None:  # type: ignore[no-untyped-def]
    door = fleet(h2=Host(fail_at="ready"))
    report = apply(profile, grouped(), door, Options(serial="1"), slots=Slots())  # type: ignore[arg-type]
    assert play_lines(door) == ["play apply.yml h1,h2", "play restore.yml h1,h2"]
    by = {o.host: o for o in report.hosts}
    assert by["h1"].status == by["h2"].status == "failed"
    assert "engine group g1: h2 failed" in by["h1"].message
    assert by["h3"].status == by["h4"].status == "not-run"
    assert door.hosts["h1"].current == door.hosts["h2"].current == 3  # both back on the previous generation


def test_the_role_gets_each_ranks_flags(profile) -> None:  # type: ignore[no-untyped-def]
    seen: list[Any] = []
    door = fleet()
    play = door.play

    def spy(req, hosts=()):  # type: ignore[no-untyped-def]
        seen.append(req.unsafe_vars.get("knob_serve_groups"))
        return play(req, hosts)

    door.play = spy  # type: ignore[method-assign]
    apply(profile, grouped(["h1", "h2"]), door, Options(), slots=Slots())  # type: ignore[arg-type]
    assert seen == [
        {
            "h1": {
                "name": "g1",
                "hosts": ["h1", "h2"],
                "args": {"nnodes": "2", "node-rank": "0", "dist-init-addr": "127.0.1.1:5000"},
            },
            "h2": {
                "name": "g1",
                "hosts": ["h1", "h2"],
                "args": {"nnodes": "2", "node-rank": "1", "dist-init-addr": "127.0.1.1:5000"},
            },
        }
    ]


def test_a_limit_that_cuts_a_group_is_refused_before_any_play(profile) -> None:  # type: ignore[no-untyped-def]
    door = fleet()
    with pytest.raises(KnobfleetError, match="group g1: --limit leaves out h2; a group restarts as a unit"):
        apply(profile, grouped(["h1", "h3", "h4"]), door, Options(), slots=Slots())  # type: ignore[arg-type]
    assert door.log == []


@pytest.mark.parametrize(
    ("env", "refused", "allowed"),
    [
        ({"h2": {"QUANT_CONFIG": "fp8"}}, True, False),  # set on one rank only
        ({"h1": {"QUANT_CONFIG": "fp8"}, "h2": {"QUANT_CONFIG": "int4"}}, True, False),
        ({"h1": {"NCCL_SOCKET_IFNAME": "eth0"}, "h2": {"NCCL_SOCKET_IFNAME": "ens5"}}, False, True),  # allow-listed
        ({"h2": {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}}, False, True),
    ],
)
def test_a_group_that_would_come_up_mismatched_is_refused_whole(profile, env, refused, allowed) -> None:  # type: ignore[no-untyped-def]
    door = fleet()
    report = apply(profile, grouped(["h1", "h2"], **env), door, Options(), slots=Slots())  # type: ignore[arg-type]
    statuses = [o.status for o in report.hosts]
    if refused:
        assert statuses == ["refused", "refused"] and play_lines(door) == []
        assert "engine group g1 would come up mismatched" in report.hosts[0].message
        assert "QUANT_CONFIG" in report.hosts[0].message
    else:
        assert statuses == ["applied", "applied"] and allowed


def test_batches_never_split_a_unit() -> None:
    units = [("a", "b"), ("c",), ("d", "e", "f")]
    hosts = [h for u in units for h in u]
    assert batches(hosts, "1", False, units) == [["a", "b"], ["c"], ["d", "e", "f"]]
    assert batches(hosts, "2", True, units) == [["a", "b"], ["c", "d", "e", "f"]]
    assert batches(hosts, "50%", False, units) == [["a", "b"], ["c"], ["d", "e", "f"]]
    assert batches(hosts, None, False, units) == [hosts]


def o(host: str, status: str, gen: int | None = 3) -> HostOutcome:
    return HostOutcome(host, status, 0, gen, gen, message=f"{host} {status}")  # type: ignore[arg-type]


def test_a_group_is_left_alone_only_when_every_rank_is_in_sync() -> None:
    groups = ranks.of(grouped())
    decided = {"h1": o("h1", "unchanged"), "h3": o("h3", "unchanged"), "h4": o("h4", "unchanged")}
    out = ranks.merge_decided(decided, groups, {})
    assert sorted(out) == ["h3", "h4"]  # h1 restarts with h2, which needs the change


def test_a_refused_rank_refuses_its_group() -> None:
    groups = ranks.of(grouped())
    out = ranks.merge_decided({"h1": o("h1", "refused")}, groups, {})
    assert out["h1"].message == "h1 refused"
    assert out["h2"].status == "refused"
    assert out["h2"].message == "engine group g1: h1 is refused (h1 refused); no rank of the group is touched"
    assert "h3" not in out


def test_after_play_fails_the_group_and_marks_every_rank_for_the_restore() -> None:
    groups = ranks.of(grouped(["h1", "h2"]))
    outs = {
        "h1": o("h1", "applied"),
        "h2": o("h2", "failed"),
    }
    ranks.after_play(outs, {}, groups, {})
    assert outs["h1"].status == "failed" and outs["h1"].committed
    assert outs["h1"].message == "engine group g1: h2 failed (h2 failed); every rank goes back"
