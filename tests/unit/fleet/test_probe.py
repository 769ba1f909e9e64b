"""The probe's options, the choice of transport, and the probe module's stdlib-only entry point."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

from knobfleet import paths
from knobfleet.errors import KnobfleetError
from knobfleet.fleet import probe, transports
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.transports import base
from knobfleet.fleet.transports import ssh as transport
from knobfleet.fleet.transports.sshrun import FunctionRun


def test_probe_args_are_the_roles_task_options(repo: Path) -> None:
    (task,) = yaml.safe_load((repo / "roles" / "knob_probe" / "tasks" / "main.yml").read_text())
    hv = HostVars(host="h", listen_host="127.0.1.4", port=30001, service="eng")
    args = probe.probe_args(hv)
    # every option but the fleet's marker key, which travels apart (ModuleCall.private: never in an argv or cache)
    assert set(task["knob_probe"]) == set(args) | set(probe.call().private) | {"version_file"}
    assert "version_file" not in args  # asked for only where the inventory names one
    versioned = hv.model_copy(update={"version_file": "/opt/e/VERSION"})
    assert probe.probe_args(versioned)["version_file"] == "/opt/e/VERSION"
    assert args["unit_path"] == "/etc/systemd/system/eng.service"
    assert args["state_dir"] == "/var/lib/knobfleet/eng"
    assert args["health_url"] == "http://127.0.1.4:30001/health_generate"
    assert args["info_url"] == "http://127.0.1.4:30001/get_server_info"


@pytest.mark.parametrize(
    ("via", "conns", "expected"),
    [
        ("auto", [{}, {}], "ssh"),
        ("auto", [{}, {"ansible_connection": "local"}], "ansible"),
        ("ansible", [{}, {}], "ansible"),
        ("ssh", [{}, {}], "ssh"),
    ],
)
def test_choose_via(via: str, conns: list[dict[str, str]], expected: str) -> None:
    hosts = [HostVars(host=f"h{i}", connection=c) for i, c in enumerate(conns)]
    assert transports.choose(hosts, via).name == expected


def test_via_ssh_refuses_hosts_it_cannot_reach_like_ansible() -> None:
    hosts = [HostVars(host="h1", connection={"ansible_become": "yes"}), HostVars(host="h2", connection={})]
    hosts.append(HostVars(host="h3", connection={"ansible_password": "<set>"}))
    with pytest.raises(KnobfleetError) as exc:
        transports.choose(hosts, "ssh")
    assert exc.value.exit_code == 64
    assert str(exc.value) == (
        "--via ssh: h1: ansible_become (and 1 more) cannot be reached that way as Ansible reaches it; "
        "use --via auto (falls back to the playbook) or --via ansible"
    )
    with pytest.raises(KnobfleetError, match=r"--via 'scp': expected one of auto, ssh, ansible"):
        transports.choose(hosts, "scp")


def test_probe_module_runs_without_ansible(tmp_path: Path) -> None:
    """The fast path's python3 -I has no ansible on its path: the module's probe() must not need it."""
    ssh = tmp_path / "fake-ssh"
    ssh.write_text('#!/bin/bash\nexec bash -c "${@: -1}"\n')
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    script = tmp_path / "serve.sh"
    script.write_text("#!/bin/bash\nexec true\n")
    hv = HostVars(
        host="h1",
        script_path=str(script),
        unit_dir=str(tmp_path),
        state_root=str(tmp_path / "state"),
        service="knobfleet-unit-test-absent",
        listen_host="127.0.0.1",
        port=9,
        connection={
            "ansible_ssh_executable": str(ssh),
            "ansible_python_interpreter": os.path.realpath(sys.executable),
        },
    )
    call = probe.call([hv])
    payload = base.bundle(call.source(), paths.module_utils_dir())
    out = transport.run_function([hv], FunctionRun(tmp_path / "cp", payload, "knob_probe", "probe", call.args))["h1"]
    assert out.error is None
    doc = out.doc
    assert doc["files"]["script"]["exists"] and doc["files"]["script"]["mode"] == "0644"
    assert doc["files"]["unit"] == {"path": f"{tmp_path}/knobfleet-unit-test-absent.service", "exists": False}
    assert doc["generations"]["exists"] is False and doc["processes"] == [] and doc["health"] is None
