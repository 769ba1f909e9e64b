"""plan = what apply will do: ``plan_host`` (one probe + what was rendered → findings → actions) on the recorded
lab probes and on random mutations of them, and its agreement with drift (the same rule)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knobfleet.engines.adapter import engine
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.inventory import load_hosts
from knobfleet.live.verify import Declared, verify_host
from knobfleet.ops.plan import HostPlan, plan_host
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import render_host

CASES = Path(__file__).parents[1] / "live" / "verify_cases"
REPO = Path(__file__).resolve().parents[3]
# The recorded probes are of hosts running ctas512@1: plan against the profiles (and catalogs) of that time.
PROFILES_V1 = Path(__file__).parents[1] / "data" / "profiles_v1"
CLEAN = json.loads((CASES / "clean" / "probe.json").read_text())


@pytest.fixture(scope="module")
def lab1() -> HostVars:
    return load_hosts(Path(__file__).parents[1] / "data" / "inventory_v1", "lab1")[0]


def plan_for(doc: dict[str, Any], hv: HostVars, profile: str = "ctas512", policy: str = "fail") -> HostPlan:
    p = ProfileStore(PROFILES_V1).resolve(profile)
    return plan_host(doc, render_host(p, hv), Declared(p.name, p.version, p.content_hash), engine(), policy)


def test_freshly_applied_host_is_in_sync(lab1: HostVars) -> None:
    assert plan_for(CLEAN, lab1).actions == []
    declared_elsewhere = json.loads((CASES / "declared_profile_differs" / "probe.json").read_text())
    assert plan_for(declared_elsewhere, lab1).actions == []


# What apply does for each recorded fault, applying the profile the host already runs (ctas512).
# declared_profile_differs is a clean ctas512 host whose inventory declares another profile: applying
# ctas512 there has nothing to do.
EXPECTED_ACTIONS = {
    "access_not_recorded": [],
    "chmod_by_hand": ["install", "daemon-reload", "restart"],
    "chown_by_hand": ["install", "daemon-reload", "restart"],
    "clean": [],
    "completion_hangs": ["restart"],
    "declared_profile_differs": [],
    "corrupt_meta": ["install", "daemon-reload", "restart"],
    "dropin_environment": ["refuse"],
    "dropin_execstart": ["refuse"],
    "engine_not_answering": ["restart"],
    "engine_reports_other_env": ["restart"],
    "failed_current": [],  # reported; rollback repairs it, an apply of the same profile has nothing to change
    "interrupted_apply": ["refuse"],
    "script_deleted": ["install", "daemon-reload", "restart"],
    "script_without_exec": ["install", "daemon-reload", "restart"],
    "sed_edit_then_restart": ["install", "daemon-reload", "restart"],
    "sed_edit_without_restart": ["install", "daemon-reload", "restart"],
    "service_stopped": ["start"],
    "typo_knob_set_by_hand": ["install", "daemon-reload", "restart"],
    "unit_edited_without_reload": ["install", "daemon-reload", "restart"],
    "unmanaged_host": ["install", "daemon-reload", "restart"],
    "worker_stopped": ["restart"],
    "worker_zombie": ["restart"],
}


# Recorded on a podman lab host (`lab up --runtime podman`, the profiles of this checkout): planned against the same
# host vars, the lab's runtime vars included. Applying ctas512 to the host whose container was run by hand starts
# the unit, whose ExecStartPre removes the hand-run container (the lab test, tests/integration/test_containers.py).
PODMAN_ACTIONS = {
    "podman_clean": ("127.0.2.1", []),
    "podman_run_by_hand": ("127.0.2.2", ["start"]),
    "podman_restart_policy": ("127.0.2.1", []),  # the stored line's --restart: the rendered one has none
}


def test_every_case_has_its_expected_actions() -> None:
    assert set(EXPECTED_ACTIONS) | set(PODMAN_ACTIONS) == {p.name for p in CASES.iterdir() if p.is_dir()}


@pytest.mark.parametrize("case", sorted(PODMAN_ACTIONS))
def test_recorded_podman_case_actions(case: str) -> None:
    from knobfleet.lab import labruntime

    address, want = PODMAN_ACTIONS[case]
    base = load_hosts(REPO / "inventories" / "lab", "lab1")[0]
    hv = base.model_copy(update={"runtime": "podman", "image": labruntime.image_id(),
                                 "container_options": labruntime.OPTIONS, "listen_host": address})  # fmt: skip
    p = ProfileStore(REPO / "profiles").resolve("ctas512")
    doc = json.loads((CASES / case / "probe.json").read_text())
    got = plan_host(doc, render_host(p, hv), Declared(p.name, p.version, p.content_hash), engine(), "fail")
    assert got.actions == want


@pytest.mark.parametrize("case", sorted(EXPECTED_ACTIONS))
def test_recorded_case_actions(case: str, lab1: HostVars) -> None:
    doc = json.loads((CASES / case / "probe.json").read_text())
    assert plan_for(doc, lab1).actions == EXPECTED_ACTIONS[case]


def test_refusal_names_the_dropin_and_the_flag(lab1: HostVars) -> None:
    doc = json.loads((CASES / "dropin_environment" / "probe.json").read_text())
    p = plan_for(doc, lab1)
    assert p.refusal == (
        "foreign drop-in /etc/systemd/system/sglang-dsv4-decode.service.d/override.conf changes the unit; "
        "remove it, or set knob_serve_foreign_dropins: remove (--foreign-dropins remove) to move it into the "
        "new generation's backup"
    )
    assert plan_for(doc, lab1, policy="remove").actions == ["remove-dropin", "daemon-reload", "restart"]


def test_other_profile_or_changed_host_vars_are_pending(lab1: HostVars) -> None:
    p = plan_for(CLEAN, lab1, "ctas768")
    assert p.actions == ["install", "daemon-reload", "restart"]
    assert "SGLANG_SM120_MMA_TARGET_CTAS 512 → 768" in p.knob_changes
    moved = lab1.model_copy(update={"port": 30001})
    assert "--port 30000 → 30001" in plan_for(CLEAN, moved).knob_changes


# --- agreement with drift: the same rule, so plan says in-sync iff drift finds nothing -------------------


def _main(doc: dict[str, Any]) -> dict[str, Any]:
    pid = int(doc["unit_props"]["MainPID"])
    return next(p for p in doc["processes"] if p["pid"] == pid)


MUTATIONS = {
    "env value": lambda d, r: _main(d)["env"].__setitem__("SGLANG_SM120_MMA_TARGET_CTAS", str(r.randint(1, 999))),
    "env removed": lambda d, r: _main(d)["env"].pop("SGLANG_SM120_MMA_TARGET_CTAS", None),
    "env added": lambda d, r: d["processes"][r.randrange(len(d["processes"]))]["env"].__setitem__(
        "SGLANG_SM120_MMA_NSPLIT_MAX", "4"
    ),
    "argv": lambda d, r: _main(d)["cmdline"].append("--tp=2"),
    "reload": lambda d, r: d["unit_props"].__setitem__("NeedDaemonReload", "yes"),
    "dropin": lambda d, r: d["unit_props"].__setitem__("DropInPaths", "/etc/systemd/system/x.service.d/a.conf"),
    "stopped": lambda d, r: d["unit_props"].__setitem__("ActiveState", "inactive"),
    "unhealthy": lambda d, r: d.__setitem__("health", 503),
    "script edited": lambda d, r: d["files"]["script"].update(sha256="0" * 64, content="#!/bin/bash\n"),
    "unit edited": lambda d, r: d["files"]["unit"].update(sha256="1" * 64, content="[Unit]\n"),
    "stale": lambda d, r: d["files"]["script"].__setitem__("mtime", _main(d)["start_epoch"] + 60),
    "lock": lambda d, r: d["generations"].__setitem__("lock", {"run_id": "other", "operator": "x"}),
    "nothing": lambda d, r: None,
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from(sorted(MUTATIONS)), max_size=3), rnd=st.randoms(use_true_random=False))
def test_plan_in_sync_iff_drift_finds_nothing(lab1: HostVars, names: list[str], rnd: Any) -> None:
    doc = copy.deepcopy(CLEAN)
    for name in names:
        MUTATIONS[name](doc, rnd)
    plan = plan_for(doc, lab1)
    drift = verify_host("lab1", doc, None, engine().rules())
    assert (plan.actions == []) == (drift.findings == []), (names, plan.actions, drift.findings)
    assert {f.kind for f in plan.findings} == {f.kind for f in drift.findings}
