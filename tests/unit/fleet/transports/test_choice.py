"""How ``transports.stream`` picks a transport and what it does with each outcome, with both registered
transports replaced by fakes in ``transports.REGISTRY`` (the documented extension point): ``auto`` takes the
fast one only when it reaches every host; a host whose python the fast path did not find is retried through
the other once the rest are done; every other outcome, failed or not, is handed over."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from knobfleet.errors import UsageError
from knobfleet.fleet import transports
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.transports.base import Capabilities, HostFailure, Job, ModuleCall, Outcome

HOSTS = [HostVars(host=h) for h in ("a", "b", "c")]
CALL = ModuleCall("knob_probe", "knob_probe", "probe", "probe.yml", "probe", {h.host: {} for h in HOSTS})
LOG: list[tuple[str, Any]] = []


class Fast:
    name: ClassVar[str] = "ssh"
    reads: ClassVar[frozenset[str]] = frozenset()
    caps: ClassVar[Capabilities] = Capabilities(quick=True, streams=True, warms_up=True, auto=True)
    refuse: ClassVar[set[str]] = set()
    no_python: ClassVar[set[str]] = set()

    def ineligible(self, hv: Any) -> str | None:
        return f"{hv.host}: ansible_become" if hv.host in self.refuse else None

    def warm_up(self, key: str, source: bytes, forks: int | None = None) -> None:
        return None

    def stop_warm(self) -> None:
        LOG.append(("stop_unused", None))

    def stream(self, job: Job) -> Iterator[Outcome]:
        LOG.append(("fast", ([h.host for h in job.hosts], job.forks)))
        for h in job.hosts:
            if h.host in self.no_python:
                yield Outcome(h.host, error=HostFailure("error", "python3 not found"), missing_python=True)
            elif h.host == "b":
                yield Outcome(h.host, error=HostFailure("unreachable", "refused"))
            else:
                yield Outcome(h.host, doc={"via": "fast"})


class Slow:
    name: ClassVar[str] = "ansible"
    reads: ClassVar[frozenset[str]] = frozenset()
    caps: ClassVar[Capabilities] = Capabilities(auto=True, fallback=True)

    def ineligible(self, hv: Any) -> str | None:
        return None

    def warm_up(self, key: str, source: bytes) -> None:
        return None

    def run(self, job: Job) -> dict[str, Outcome]:
        LOG.append(("slow", ([h.host for h in job.hosts], job.forks)))
        return {h.host: Outcome(h.host, doc={"via": "slow"}) for h in job.hosts}


def run(hosts: Sequence[Any], call: ModuleCall, inventory: Path, via: str = "auto", forks: int | None = None) -> Any:
    return transports.run(Job(hosts, call, inventory, forks=forks), via)


def stream(hosts: Sequence[Any], call: ModuleCall, inventory: Path, via: str = "auto", forks: int | None = None) -> Any:
    return transports.stream(Job(hosts, call, inventory, forks=forks), via)


@pytest.fixture(autouse=True)
def fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    LOG.clear()
    monkeypatch.setattr(Fast, "refuse", set())
    monkeypatch.setattr(Fast, "no_python", set())
    monkeypatch.setitem(transports.REGISTRY, "ssh", Fast())
    monkeypatch.setitem(transports.REGISTRY, "ansible", Slow())
    monkeypatch.setenv("KNOBFLEET_FORKS", "7")


def test_auto_takes_the_fast_path_when_it_reaches_every_host(tmp_path: Path) -> None:
    got = run(HOSTS, CALL, tmp_path)
    assert LOG == [("fast", (["a", "b", "c"], 7))]
    assert {h: (o.doc, o.error) for h, o in got.items()} == {
        "a": ({"via": "fast"}, None),
        "b": (None, HostFailure("unreachable", "refused")),
        "c": ({"via": "fast"}, None),
    }


def test_auto_falls_back_when_one_host_cannot_be_reached_the_fast_way(tmp_path: Path) -> None:
    Fast.refuse = {"c"}
    got = run(HOSTS, CALL, tmp_path, via="auto", forks=2)
    assert LOG == [("stop_unused", None), ("slow", (["a", "b", "c"], 2))]
    assert all(o.doc == {"via": "slow"} for o in got.values())


def test_a_host_without_python_is_retried_through_ansible_after_the_others(tmp_path: Path) -> None:
    Fast.no_python = {"a"}
    got = list(stream(HOSTS, CALL, tmp_path, forks=3))
    assert [o.host for o in got] == ["b", "c", "a"]
    assert got[-1].doc == {"via": "slow"} and not got[-1].missing_python
    assert LOG == [("fast", (["a", "b", "c"], 3)), ("slow", (["a"], 3))]


def test_naming_a_transport_that_cannot_reach_a_host_is_a_usage_error(tmp_path: Path) -> None:
    Fast.refuse = {"b", "c"}
    with pytest.raises(UsageError) as exc:
        run(HOSTS, CALL, tmp_path, via="ssh")
    assert str(exc.value) == (
        "--via ssh: b: ansible_become (and 1 more) cannot be reached that way as Ansible reaches it; "
        "use --via auto (falls back to the playbook) or --via ansible"
    )
    Fast.refuse = {"c"}
    with pytest.raises(UsageError, match=r"^--via ssh: c: ansible_become cannot be reached"):
        run(HOSTS, CALL, tmp_path, via="ssh")
    assert LOG == []


def test_an_unknown_transport_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^--via 'docker': expected one of auto, ssh, ansible, local$"):
        run(HOSTS, CALL, tmp_path, via="docker")


def test_naming_ansible_never_uses_the_fast_path(tmp_path: Path) -> None:
    run(HOSTS, CALL, tmp_path, via="ansible")
    assert LOG == [("stop_unused", None), ("slow", (["a", "b", "c"], 7))]
