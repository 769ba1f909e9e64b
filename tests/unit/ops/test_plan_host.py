"""apply's in-sync test (which hosts a no-change apply may leave alone), on recorded lab probes."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from knobfleet.apply import sync_problems
from knobfleet.drift import known_knobs
from knobfleet.hostvars import HostVars
from knobfleet.inventory import load_hosts
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import render_host

CASES = Path(__file__).parent / "verify_cases"
CLEAN = json.loads((CASES / "clean" / "probe.json").read_text())


@pytest.fixture
def lab1(repo: Path) -> HostVars:
    return load_hosts(repo / "inventories" / "lab", "lab1")[0]


def problems(doc: dict[str, Any], hv: HostVars, profile: str = "ctas512") -> list[str]:
    p = ProfileStore().resolve(profile)
    return sync_problems(doc, render_host(p, hv), p, known_knobs())


def test_freshly_applied_host_is_in_sync(lab1: HostVars) -> None:
    assert problems(CLEAN, lab1) == []
    declared_elsewhere = json.loads((CASES / "declared_profile_differs" / "probe.json").read_text())
    assert problems(declared_elsewhere, lab1) == []


# declared_profile_differs is a clean ctas512 host whose inventory declares another profile: applying
# ctas512 there has nothing to do, so it is the one recorded case that is rightly in sync.
FAULTS = sorted(p.name for p in CASES.iterdir() if p.is_dir() and p.name not in ("clean", "declared_profile_differs"))


@pytest.mark.parametrize("case", FAULTS)
def test_every_recorded_fault_needs_ansible(case: str, lab1: HostVars) -> None:
    doc = json.loads((CASES / case / "probe.json").read_text())
    assert problems(doc, lab1), f"{case}: a host with this fault must not be skipped"


def _set(path: list[str], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value

    return change


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (_set(["generations", "lock"], {"run_id": "r1", "operator": "ops"}), "host lock is held"),
        (_set(["unit_props", "UnitFileState"], "disabled"), "unit is disabled, not enabled"),
        (_set(["files", "unit", "sha256"], "0" * 64), "unit differs from the rendered one"),
        (_set(["unit_props", "MainPID"], "1"), "main process 1 not found in the unit's cgroup"),
    ],
)
def test_changed_hosts_are_not_in_sync(change: Callable[[dict[str, Any]], None], expected: str, lab1: HostVars) -> None:
    doc = copy.deepcopy(CLEAN)
    change(doc)
    assert expected in problems(doc, lab1)


def test_other_profile_or_changed_host_vars_are_not_in_sync(lab1: HostVars) -> None:
    assert problems(CLEAN, lab1, "ctas768")[:1] == ["script differs from the rendered one"]
    moved = lab1.model_copy(update={"port": 30001})
    assert "script differs from the rendered one" in problems(CLEAN, moved)
