"""Host checks for a knobfleet-managed engine, for users:

    pytest --hosts='ansible://all' --ansible-inventory=inventories/lab tests/testinfra

For every host: the service is running and enabled, the installed serve script and unit match the
current knobfleet generation byte for byte, and every process of the unit carries the generation's
env vars; the main process's command line is the generation's exec line. ``knobfleet verify
--testinfra`` runs these after its own probe.
"""

from __future__ import annotations

import json
from typing import Any

import pytest


def _vars(host: Any) -> dict[str, Any]:
    try:
        return dict(host.ansible.get_variables())
    except Exception:  # not an ansible:// host
        return {}


@pytest.fixture
def svc(host: Any) -> dict[str, str]:
    v = _vars(host)
    service = str(v.get("knob_serve_service", "sglang-dsv4-decode"))
    state = f"{v.get('knob_serve_state_root', '/var/lib/knobfleet')}/{service}"
    return {
        "service": service,
        "script": str(v.get("knob_serve_script_path", "/root/serve_dsv4_decode.sh")),
        "unit": f"{v.get('knob_serve_unit_dir', '/etc/systemd/system')}/{service}.service",
        "state": state,
    }


@pytest.fixture
def meta(host: Any, svc: dict[str, str]) -> dict[str, Any]:
    current = host.file(f"{svc['state']}/current")
    assert current.is_symlink, f"{svc['state']}/current missing: knobfleet never applied a profile here"
    data: dict[str, Any] = json.loads(host.file(f"{svc['state']}/current/meta.json").content_string)
    return data


def _script_expectations(text: str) -> tuple[dict[str, str], list[str]]:
    from knobfleet.ops.plan import parse_script

    return parse_script(text)


def _unit_pids(host: Any, service: str) -> list[int]:
    cgroup = host.check_output(f"systemctl show -p ControlGroup --value {service}.service")
    out = host.check_output(
        f"cat /sys/fs/cgroup/systemd{cgroup}/cgroup.procs 2>/dev/null || cat /sys/fs/cgroup{cgroup}/cgroup.procs"
    )
    return [int(x) for x in out.split()]


def test_service_running_and_enabled(host: Any, svc: dict[str, str]) -> None:
    unit = host.service(f"{svc['service']}.service")
    assert unit.is_running
    assert unit.is_enabled


def test_installed_files_match_current_generation(host: Any, svc: dict[str, str], meta: dict[str, Any]) -> None:
    for key in ("script", "unit"):
        want = meta["files"][key]
        installed = host.file(want["path"])
        assert installed.exists, f"{want['path']} is missing"
        assert installed.sha256sum == want["sha256"], f"{want['path']} differs from generation {meta['generation']}"
        assert installed.user == "root"
    assert host.file(meta["files"]["script"]["path"]).mode == 0o755
    assert host.file(meta["files"]["unit"]["path"]).mode == 0o644


def test_every_process_runs_the_generation(host: Any, svc: dict[str, str], meta: dict[str, Any]) -> None:
    script = host.file(f"{svc['state']}/current/{meta['files']['script']['name']}").content_string
    env, argv = _script_expectations(script)
    main_pid = int(host.check_output(f"systemctl show -p MainPID --value {svc['service']}.service"))
    pids = _unit_pids(host, svc["service"])
    assert main_pid in pids
    for pid in pids:
        raw = host.file(f"/proc/{pid}/environ").content
        live = dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)
        wrong = {k: (v, live.get(k)) for k, v in env.items() if live.get(k) != v}
        assert not wrong, f"pid {pid}: expected vs live {wrong}"
    cmdline = host.file(f"/proc/{main_pid}/cmdline").content.split(b"\0")[:-1]
    assert [c.decode() for c in cmdline] == argv
