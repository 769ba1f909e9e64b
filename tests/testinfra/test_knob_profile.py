"""Host checks for a knobfleet-managed engine, for users:

    pytest --hosts='ansible://all' --ansible-inventory=inventories/lab tests/testinfra

For every host: the service is enabled; the installed serve script and unit are root's with fixed modes;
and the host passes knobfleet's live-state rule against its current generation — the same rule (and the
same probe module) ``drift``, ``verify``, ``plan`` and ``apply`` use, so these checks cannot disagree with
them. ``knobfleet verify --testinfra`` runs these after its own probe.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from knobfleet.fleet.hostvars import HostVars, from_inventory_vars
from knobfleet.fleet.probe import probe_args
from knobfleet.live.verify import verify_host
from knobfleet.ops.drift import engine_rules


@pytest.fixture
def hv(host: Any, request: pytest.FixtureRequest) -> HostVars:
    """The host's knob_serve_* vars exactly as knobfleet reads them (templated through Ansible's inventory)."""
    from pathlib import Path

    from knobfleet.fleet.inventory import load_hosts

    inventory = request.config.getoption("ansible_inventory", None)
    name = host.backend.get_hostname()
    if inventory:
        return load_hosts(Path(inventory), name)[0]
    return from_inventory_vars(name, {}, "testinfra")


@pytest.fixture
def probe(host: Any, hv: HostVars) -> dict[str, Any]:
    # JSON arguments: a list value with spaces (the secret names) would split into stray words as key=value
    out = host.ansible("knob_probe", json.dumps(probe_args(hv)), check=False)
    doc: dict[str, Any] = out["probe"]
    return doc


def test_service_enabled(host: Any, hv: HostVars) -> None:
    assert host.service(hv.unit_name).is_enabled


def test_installed_files_are_roots_with_fixed_modes(host: Any, hv: HostVars) -> None:
    for path, mode in ((hv.script_path, 0o755), (hv.unit_path, 0o644)):
        f = host.file(path)
        assert f.exists and f.user == "root" and f.mode == mode, f"{path}: {f.user} {oct(f.mode)}"


def test_live_state_matches_the_current_generation(hv: HostVars, probe: dict[str, Any]) -> None:
    verdict = verify_host(hv.host, probe, None, engine_rules(hv, probe))
    assert verdict.status == "in_sync", verdict.error or "; ".join(f"{f.kind}: {f.message}" for f in verdict.findings)
