"""``apply --gate`` over engine groups: the group's head is benchmarked once (its followers serve no API), and a
rejection sends every rank of the group back to its previous generation; hosts alone are gated as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from knobfleet.experiment import gate
from knobfleet.experiment.gate import GateResult, gate_rollout
from knobfleet.fleet.hostvars import HostVars, attach_groups
from knobfleet.ops.apply import HostOutcome
from knobfleet.ops.transaction import RestoreOutcome
from knobfleet.profiles.model import Profile

ADDR = {"h1": "127.0.1.1", "h2": "127.0.1.2", "h3": "127.0.1.3"}


class Result:
    def __init__(self, hosts: list[HostOutcome]) -> None:
        self.hosts = hosts


def run(monkeypatch: pytest.MonkeyPatch, passed: dict[str, bool]) -> tuple[list[str], dict[str, Any], Result]:
    hosts = attach_groups(
        [HostVars(host=h, address=a) for h, a in ADDR.items()],
        {h: {"g": {"members": {"h1": 0, "h2": 1}}} for h in ADDR},
        ADDR,
        "inv",
    )
    benched: list[str] = []
    restored: dict[str, Any] = {}

    def gate_host(new, baseline, hv, *a: Any, **k: Any) -> GateResult:  # type: ignore[no-untyped-def]
        benched.append(hv.host)
        return GateResult(hv.host, passed[hv.host], "slower at C64" if not passed[hv.host] else "ok", "b", "stored")

    def restore(hosts, inventory, targets, **k: Any) -> list[RestoreOutcome]:  # type: ignore[no-untyped-def]
        restored.update(targets)
        return [RestoreOutcome(h, True, t.to) for h, t in targets.items()]

    monkeypatch.setattr(gate, "gate_host", gate_host)
    monkeypatch.setattr("knobfleet.ops.transaction.restore", restore)
    result = Result([HostOutcome(h, "applied", 1, 4, 3) for h in ADDR])
    p = Profile(name="p", version=1, engine="sglang", env={}, args={})
    gate_rollout(p, p, hosts, Path("inv"), result, None, 1, progress=False)  # type: ignore[arg-type]
    return benched, restored, result


def test_a_group_is_benched_once_on_its_head(monkeypatch: pytest.MonkeyPatch) -> None:
    benched, restored, _ = run(monkeypatch, {"h1": True, "h3": True})
    assert benched == ["h1", "h3"] and restored == {}


def test_a_rejected_head_restores_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    _, restored, result = run(monkeypatch, {"h1": False, "h3": True})
    assert sorted(restored) == ["h1", "h2"] and all(t.to == 3 for t in restored.values())
    by = {o.host: o for o in result.hosts}
    assert by["h2"].status == "failed"
    assert by["h2"].message == "gate rejected: slower at C64 (on h1, the head of engine group g)"
    assert by["h3"].status == "applied"
