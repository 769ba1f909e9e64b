"""drift/verify over an engine group (ops/drift.py): each rank's verdict waits for the other ranks, then the
cross-rank findings land on the ranks concerned — also when each rank alone matches its own generation (here:
a different engine version, which no single host's rule can see). Hosts outside groups stream as before."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from knobfleet.fleet.hostvars import HostVars, attach_groups
from knobfleet.fleet.readhost import from_json, plan_from_hostvars, to_json
from knobfleet.fleet.transports.base import Outcome
from knobfleet.groups import from_json as group_of
from knobfleet.ops import drift

CLEAN = json.loads((Path(__file__).resolve().parents[1] / "live" / "verify_cases" / "clean" / "probe.json").read_text())
ADDR = {"lab1": "127.0.1.1", "lab2": "127.0.1.2", "lab3": "127.0.1.3"}


class Door:
    """Answers each host with its document, in the order given (rank 1 first: rank 0 answers last)."""

    def __init__(self, docs: dict[str, dict[str, Any]], order: list[str]) -> None:
        self.docs, self.order, self.inventory = docs, order, Path("/nonexistent")

    def stream(self, hosts: Sequence[Any], on_event: Any = None) -> Iterator[Outcome]:
        asked = {h.host for h in hosts}
        for h in self.order:
            if h in asked:
                yield Outcome(h, doc=self.docs[h])


def doc(version: str) -> dict[str, Any]:
    d = copy.deepcopy(CLEAN)
    d["engine_version"] = version
    return d


def plan() -> Any:
    hosts = [HostVars(host=h, address=a, version_file="/opt/VERSION") for h, a in ADDR.items()]
    decl = {"g": {"members": {"lab1": 0, "lab2": 1}}}
    return plan_from_hostvars(attach_groups(hosts, {h: decl for h in ADDR}, ADDR, "inv"))


def test_a_version_that_differs_between_ranks_is_a_group_finding_on_that_rank() -> None:
    door = Door({"lab1": doc("0.5.0"), "lab2": doc("0.4.9"), "lab3": doc("0.1")}, ["lab2", "lab3", "lab1"])
    got = list(drift.stream(plan(), door))  # type: ignore[arg-type]
    assert [v.host for v in got] == ["lab3", "lab1", "lab2"]  # lab3 alone streams at once; the group waits
    by = {v.host: v for v in got}
    assert by["lab1"].status == "in_sync" and by["lab3"].status == "in_sync"
    (f,) = by["lab2"].findings
    assert by["lab2"].status == "drift" and f.kind.value == "group_mismatch" and f.name == "engine version"
    assert (f.expected, f.actual) == ("0.5.0", "0.4.9")
    assert (
        f.message == "group g: rank 1 (lab2) runs engine version: rank 0 (lab1) has '0.5.0', rank 1 (lab2) has '0.4.9'"
    )


def test_ranks_that_agree_are_in_sync() -> None:
    door = Door({h: doc("0.5.0") for h in ADDR}, list(ADDR))
    assert {v.status for v in drift.stream(plan(), door)} == {"in_sync"}  # type: ignore[arg-type]


def test_the_cached_read_plan_keeps_the_groups() -> None:
    again = from_json(to_json(plan()))
    assert group_of(again.hosts[0].group) == group_of(plan().hosts[0].group) and again.hosts[2].group is None
