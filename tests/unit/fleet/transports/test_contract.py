"""The contract every transport keeps (ssh, ansible, local: the same tests): what it declares, and that the same
module call gives the same document through each, one outcome per host, never an exception for a host's
failure. ssh runs through a stand-in ssh executable that runs the remote command here; ansible through
ansible-runner with a local connection; local as it ships."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from knobfleet.fleet import probe, transports
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.transports.base import Capabilities, Job, Outcome

NAMES = sorted(transports.REGISTRY)


@pytest.mark.parametrize("name", NAMES)
def test_a_transport_declares_what_it_reads_and_can_do(name: str) -> None:
    t = transports.REGISTRY[name]
    assert t.name == name
    assert isinstance(t.caps, Capabilities)
    assert isinstance(t.reads, frozenset) and all(v.startswith("ansible_") for v in t.reads)
    assert not t.caps.streams or callable(getattr(t, "stream", None))
    assert t.ineligible(HostVars(host="localhost", connection={"ansible_connection": "local"})) in (
        None,
        "localhost: ansible_connection=local",
    )
    reason = t.ineligible(HostVars(host="h1", connection={"ansible_connection": "winrm"}))
    assert reason is None or reason.startswith("h1: ")


def test_one_fallback_and_auto_never_picks_local() -> None:
    made = list(transports.REGISTRY.values())
    assert [t.name for t in made if t.caps.fallback] == ["ansible"]
    assert transports.choose([HostVars(host="localhost")], "auto").name == "ssh"
    assert transports.choose([HostVars(host="h", connection={"ansible_connection": "local"})], "auto").name == "ansible"


@pytest.mark.parametrize(
    ("via", "conns", "quick"),
    [
        ("auto", [{}], "ssh"),
        ("ssh", [{}], "ssh"),
        ("ssh", [{"ansible_become": "yes"}], None),  # not an error: the playbook decides
        ("ansible", [{}], None),
        ("local", [{"ansible_connection": "local"}], "local"),
        ("local", [{"ansible_host": "10.0.0.7"}], None),
        ("auto", [{"ansible_connection": "local"}], None),
    ],
)
def test_the_quick_transport_as_via_allows(via: str, conns: list[dict[str, str]], quick: str | None) -> None:
    hosts = [HostVars(host=f"h{i}", connection=c) for i, c in enumerate(conns)]
    got = transports.quick(hosts, via)
    assert (got.name if got else None) == quick


@pytest.mark.parametrize(
    ("conn", "why"),
    [
        ({"ansible_connection": "local"}, None),
        ({"ansible_host": "localhost"}, None),
        ({"ansible_host": "127.0.0.1"}, None),
        ({"ansible_host": "127.0.1.2"}, "h: not this machine (127.0.1.2)"),  # a lab container
        ({"ansible_host": "127.0.0.1", "ansible_port": "2222"}, "h: ansible_port (set ansible_connection: local "),
        ({"ansible_connection": "local", "ansible_become": "yes"}, "h: ansible_become"),
        ({"ansible_connection": "docker"}, "h: ansible_connection=docker"),
    ],
)
def test_local_reaches_only_this_machine(conn: dict[str, str], why: str | None) -> None:
    got = transports.REGISTRY["local"].ineligible(HostVars(host="h", connection=conn))
    assert got == why or (why is not None and got is not None and got.startswith(why))


def bare_host(tmp_path: Path, connection: dict[str, str]) -> HostVars:
    script = tmp_path / "serve.sh"
    script.write_text("#!/bin/bash\nexec true\n")
    return HostVars(
        host="localhost",
        script_path=str(script),
        unit_dir=str(tmp_path),
        state_root=str(tmp_path / "state"),
        service="knobfleet-unit-test-absent",
        listen_host="127.0.0.1",
        port=9,
        connection={"ansible_python_interpreter": os.path.realpath(sys.executable), **connection},
    )


def through(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Outcome, HostVars]:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "controller"))
    monkeypatch.setenv("PATH", os.environ["PATH"])  # the runner prepends its bin dir: put PATH back afterwards
    connection: dict[str, str] = {"ansible_connection": "local"}
    if name == "ssh":  # a stand-in ssh that runs the remote command here
        fake = tmp_path / "fake-ssh"
        fake.write_text('#!/bin/bash\nexec bash -c "${@: -1}"\n')
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
        connection = {"ansible_ssh_executable": str(fake)}
    hv = bare_host(tmp_path, connection)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {"localhost": hv.connection}}}))
    t = transports.REGISTRY[name]
    assert t.ineligible(hv) is None
    (out,) = t.run(Job([hv], probe.call([hv]), inventory, None, 4)).values()
    return out, hv


def shape(doc: dict[str, Any]) -> dict[str, Any]:
    """The parts of a bare host's probe that do not depend on when it ran."""
    return {k: doc[k] for k in ("files", "generations", "processes", "health", "dropins", "schema_version")}


@pytest.mark.parametrize("name", NAMES)
def test_the_same_call_gives_the_same_document_through_every_transport(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, hv = through(name, tmp_path, monkeypatch)
    assert out.error is None, out.error
    doc = shape(out.doc)
    assert doc["files"]["unit"] == {"path": f"{tmp_path}/knobfleet-unit-test-absent.service", "exists": False}
    assert doc["files"]["script"]["exists"] and doc["files"]["script"]["path"] == hv.script_path
    assert doc["generations"]["exists"] is False and doc["processes"] == [] and doc["health"] is None


@pytest.mark.parametrize("name", ["ssh", "local"])
def test_a_host_whose_module_fails_is_an_outcome_not_an_exception(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hv = bare_host(tmp_path, {"ansible_connection": "local"})
    hv = hv.model_copy(update={"connection": {**hv.connection, "ansible_python_interpreter": "/bin/false"}})
    if name == "ssh":
        fake = tmp_path / "fake-ssh"
        fake.write_text('#!/bin/bash\nexec bash -c "${@: -1}"\n')
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
        hv = hv.model_copy(
            update={"connection": {"ansible_ssh_executable": str(fake), "ansible_python_interpreter": "/bin/false"}}
        )
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "controller"))
    out = transports.REGISTRY[name].run(Job([hv], probe.call([hv]), tmp_path / "none", None, 1))["localhost"]
    assert out.doc is None and out.error is not None and out.error.kind == "error"
    assert out.error.message.startswith("the module failed on the host (exit 1)")
