"""``--via`` is honoured by apply end to end (the CLI, the pre-check, the playbook, the restore's verify): ``--via
ansible`` opens no ssh fast-path connection, ``--via local`` opens none and runs the playbook with a local
connection. Ansible itself is replaced by a recorder; the local probe really runs here."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from knobfleet import cli
from knobfleet.fleet import runner
from knobfleet.fleet.runner import RunRequest, RunResult
from knobfleet.fleet.transports import local, ssh

UNIT_INVENTORY = Path(__file__).parents[1] / "data" / "inventory_v1"


@pytest.fixture
def no_ssh(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every ssh process the fast path would start (speculative ones included), recorded and refused."""
    started: list[list[str]] = []

    def launch(argv: list[str], source: bytes) -> Any:
        started.append(argv)
        raise OSError(errno.EPERM, "refused by the test")

    monkeypatch.setattr(ssh, "_launch", launch)
    return started


@pytest.fixture
def plays(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[RunRequest]:
    """ansible-playbook, replaced: every host applies a new generation that gets ready."""
    got: list[RunRequest] = []

    def run_playbook(req: RunRequest) -> RunResult:
        got.append(req)
        result = RunResult(req.run_id or "r", 0, "successful", {}, tmp_path, 0.0)
        for host in req.hosts:
            hr = result.host(host)
            hr.ok = 3
            hr.results = {
                "begin": {"generation": 1},
                "commit": {"changed": True, "generation": 2, "previous": 1, "actions": ["install", "restart"]},
                "ready": {"main_pid": 7, "ready_s": 0.2, "done": ["restart"]},
                "finish": {},
            }
        return result

    monkeypatch.setattr(runner, "run_playbook", run_playbook)
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    return got


def test_apply_via_ansible_opens_no_ssh_connection(profiles_dir: Path, no_ssh, plays) -> None:  # type: ignore[no-untyped-def]
    rc = cli.run(["apply", "ctas512", "-i", str(UNIT_INVENTORY), "--via", "ansible", "--yes", "--json"])
    assert rc == 0
    assert no_ssh == []
    assert [r.playbook for r in plays] == ["apply.yml"]
    assert "ansible_connection" not in plays[0].trusted_vars  # Ansible reaches the hosts its own way
    # the same command through ssh probes over ssh first (the recorder above sees it)
    assert cli.run(["apply", "ctas512", "-i", str(UNIT_INVENTORY), "--via", "ssh", "--yes", "--json"]) == 0
    assert sorted(argv[-2] for argv in no_ssh) == ["127.0.1.1", "127.0.1.2", "127.0.1.3"]


def local_inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "inventory"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        json.dumps({"all": {"hosts": {"localhost": {"ansible_connection": "local"}}}}), encoding="utf-8"
    )
    script = tmp_path / "serve.sh"
    (inv / "group_vars" / "all" / "main.yml").write_text(
        json.dumps(
            {
                "ansible_python_interpreter": os.path.realpath(sys.executable),
                "knob_serve_service": "knobfleet-unit-test-absent",
                "knob_serve_script_path": str(script),
                "knob_serve_unit_dir": str(tmp_path),
                "knob_serve_state_root": str(tmp_path / "host-state"),
                "knob_serve_listen_host": "127.0.0.1",
                "knob_serve_port": 9,
            }
        ),
        encoding="utf-8",
    )
    return inv


def test_apply_via_local_opens_no_connection_at_all(
    profiles_dir: Path, tmp_path: Path, no_ssh, plays, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    ran: list[list[str]] = []
    real = local.subprocess.run

    def run(cmd: list[str], **kw: Any) -> Any:
        ran.append(cmd)
        return real(cmd, **kw)

    monkeypatch.setattr(local.subprocess, "run", run)
    inv = local_inventory(tmp_path)
    rc = cli.run(["apply", "ctas512", "-i", str(inv), "--via", "local", "--yes", "--json"])
    assert rc == 0
    assert no_ssh == []
    assert [c[:2] for c in ran] == [[os.path.realpath(sys.executable), "-I"]]  # the pre-check's probe, here
    assert [r.playbook for r in plays] == ["apply.yml"]
    assert plays[0].trusted_vars["ansible_connection"] == "local"  # Ansible opens no connection either


def test_via_local_refuses_a_host_that_is_not_this_machine(profiles_dir: Path, no_ssh, plays, capsys) -> None:  # type: ignore[no-untyped-def]
    rc = cli.run(["apply", "ctas512", "-i", str(UNIT_INVENTORY), "--via", "local", "--yes"])
    assert rc == 64
    assert plays == [] and no_ssh == []
    assert capsys.readouterr().err.splitlines()[-1] == (
        "--via local: lab1: not this machine (127.0.1.1) (and 2 more) cannot be reached that way as Ansible "
        "reaches it; use --via auto (falls back to the playbook) or --via ansible"
    )


def test_a_read_after_a_change_reaches_hosts_the_named_transport_cannot(tmp_path: Path) -> None:
    from knobfleet.errors import UsageError
    from knobfleet.fleet.hosts import Hosts
    from knobfleet.fleet.hostvars import HostVars

    become = [HostVars(host="h1", connection={"ansible_become": "yes"})]
    assert Hosts(tmp_path, "ssh").reaching(become).via == "auto"  # the playbook stands in, as apply's pre-check did
    assert Hosts(tmp_path, "ssh").reaching([HostVars(host="h2")]).via == "ssh"
    with pytest.raises(UsageError, match="--via local: h2: not this machine"):
        Hosts(tmp_path, "local").reaching([HostVars(host="h2", listen_host="10.1.1.1")])
