"""A host whose probe failed is never dropped: it is in drift's report (text, --json, --json-lines), in the exit
code (4 unreachable or error, 6 with drift too) and in the --prom textfile (``knobfleet_probe_success 0``).

Two boundaries are faked, each at the most public seam there is, so the tests do not depend on how the
transports are built inside:

- the whole command (``knobfleet drift``) over the SSH fast path, with a stand-in ``ansible_ssh_executable``
  (an inventory var) that answers per host address like a real ssh would: a recorded lab probe document,
  exit 255 with ssh's "Connection refused", or the module failing on the host (exit 1 and a traceback);
- the drift use case (ops/drift.py ``stream``) through a transport registered in ``transports.REGISTRY`` (the
  documented way to add one) whose ``run`` hands over outcomes with errors.
"""

from __future__ import annotations

import json
import shlex
import stat
from pathlib import Path
from typing import Any, ClassVar

import pytest

from knobfleet import cli, report_prom
from knobfleet.errors import EXIT_DRIFT, EXIT_DRIFT_AND_UNREACHABLE, EXIT_OK, EXIT_UNREACHABLE
from knobfleet.fleet import transports
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.readhost import plan_from_hostvars
from knobfleet.fleet.transports.base import Capabilities, HostFailure, Outcome
from knobfleet.live.verify import exit_code, summary
from knobfleet.ops import drift

CASES = Path(__file__).resolve().parents[1] / "live" / "verify_cases"
HOSTS = {"lab1": "127.0.1.1", "lab2": "127.0.1.2", "lab3": "127.0.1.3"}
PROBES = {"clean": CASES / "clean" / "probe.json", "drift": CASES / "sed_edit_without_restart" / "probe.json"}
STATUS = {"clean": "in_sync", "drift": "drift", "unreachable": "unreachable", "error": "error"}

# (what each host does, the exit code)
SCENARIOS: list[tuple[dict[str, str], int]] = [
    ({"lab1": "clean", "lab2": "unreachable", "lab3": "clean"}, EXIT_UNREACHABLE),
    ({"lab1": "clean", "lab2": "clean", "lab3": "error"}, EXIT_UNREACHABLE),
    ({"lab1": "unreachable", "lab2": "unreachable", "lab3": "unreachable"}, EXIT_UNREACHABLE),
    ({"lab1": "drift", "lab2": "unreachable", "lab3": "clean"}, EXIT_DRIFT_AND_UNREACHABLE),
    ({"lab1": "drift", "lab2": "clean", "lab3": "error"}, EXIT_DRIFT_AND_UNREACHABLE),
    ({"lab1": "clean", "lab2": "drift", "lab3": "clean"}, EXIT_DRIFT),  # the controls: nothing failed
    ({"lab1": "clean", "lab2": "clean", "lab3": "clean"}, EXIT_OK),
]
IDS = ["-".join(f"{h}:{w}" for h, w in s.items()) for s, _ in SCENARIOS]


def fake_ssh(tmp_path: Path, behaviour: dict[str, str]) -> Path:
    """An ``ssh`` that reads the module from stdin, ignores it, and answers for the address it was given (the
    argument before the remote command) as the host in ``behaviour`` would."""
    lines = ["#!/bin/bash", "cat >/dev/null", 'case "${@: -2:1}" in']
    for host, what in behaviour.items():
        addr = HOSTS[host]
        if what in PROBES:
            body = f"cat {shlex.quote(str(PROBES[what]))}"
        elif what == "unreachable":
            body = f"echo 'ssh: connect to host {addr} port 22: Connection refused' >&2; exit 255"
        else:
            body = "echo 'Traceback (most recent call last):' >&2; echo 'OSError: probe exploded' >&2; exit 1"
        lines.append(f"  {addr}) {body} ;;")
    lines += ['  *) echo "unexpected host $*" >&2; exit 99 ;;', "esac"]
    exe = tmp_path / "fake-ssh"
    exe.write_text("\n".join(lines) + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def inventory(tmp_path: Path, ssh: Path) -> Path:
    inv = tmp_path / "inventory"
    inv.mkdir(exist_ok=True)
    hosts = "".join(
        f"    {h}:\n      ansible_host: {a}\n      ansible_ssh_executable: {ssh}\n" for h, a in HOSTS.items()
    )
    (inv / "hosts.yml").write_text("all:\n  hosts:\n" + hosts)
    return inv


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Controller state (ControlMaster dir, read-path cache, speculative-start plans) in the test's temp dir."""
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    for var in ("KNOBFLEET_INVENTORY", "KNOBFLEET_LIMIT", "KNOBFLEET_VIA", "KNOBFLEET_FORKS", "ANSIBLE_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def drift_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, behaviour: dict[str, str], *fmt: str
) -> tuple[int, str, str]:
    inv = inventory(tmp_path, fake_ssh(tmp_path, behaviour))
    code = cli.run(["drift", "-i", str(inv), "--via", "ssh", "--prom", str(tmp_path / "drift.prom"), *fmt])
    out, _ = capsys.readouterr()
    return code, out, (tmp_path / "drift.prom").read_text()


def prom_success(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        if line.startswith("knobfleet_probe_success{"):
            host = line.split('host="', 1)[1].split('"', 1)[0]
            out[host] = int(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.parametrize(("behaviour", "code"), SCENARIOS, ids=IDS)
def test_drift_json_reports_every_host_whatever_its_probe_did(
    isolated: Path, capsys: pytest.CaptureFixture[str], behaviour: dict[str, str], code: int
) -> None:
    got, out, prom = drift_cli(capsys, isolated, behaviour, "--json")
    doc = json.loads(out)
    assert [h["host"] for h in doc["hosts"]] == list(HOSTS)
    assert {h["host"]: h["status"] for h in doc["hosts"]} == {h: STATUS[w] for h, w in behaviour.items()}
    assert got == code
    broken = sum(w in ("unreachable", "error") for w in behaviour.values())
    assert doc["summary"]["hosts"] == 3
    assert doc["summary"]["unreachable"] + doc["summary"]["error"] == broken
    assert prom_success(prom) == {h: 0 if w in ("unreachable", "error") else 1 for h, w in behaviour.items()}
    for h in doc["hosts"]:
        if behaviour[h["host"]] == "unreachable":
            assert "Connection refused" in h["error"]
        elif behaviour[h["host"]] == "error":
            assert "the module failed on the host (exit 1): OSError: probe exploded" in h["error"]


def test_drift_text_and_json_lines_name_the_unreachable_host(
    isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    behaviour = {"lab1": "clean", "lab2": "unreachable", "lab3": "error"}
    code, out, _ = drift_cli(capsys, isolated, behaviour)
    assert code == EXIT_UNREACHABLE
    rows = {
        line.split()[0]: line.split()[1] for line in out.splitlines() if line.split()[:1] and line.split()[0] in HOSTS
    }
    assert rows == {"lab1": "in_sync", "lab2": "unreachable", "lab3": "error"}
    assert out.splitlines()[-1] == "3 hosts: 1 in sync, 0 drifted, 1 unreachable, 1 error"
    code, out, _ = drift_cli(capsys, isolated, behaviour, "--json-lines")
    assert code == EXIT_UNREACHABLE
    objs = [json.loads(line) for line in out.splitlines()]
    assert sorted(o["host"] for o in objs[:-1]) == sorted(HOSTS)
    assert objs[-1]["summary"]["unreachable"] == 1 and objs[-1]["summary"]["error"] == 1


# --- the use case through a registered transport ---------------------------------------------------------


class ScriptedTransport:
    """A transport without ``stream``: ``run`` answers every host at once from a script of outcomes."""

    name: ClassVar[str] = "scripted"
    reads: ClassVar[frozenset[str]] = frozenset()
    caps: ClassVar[Capabilities] = Capabilities()  # runs every host at once; chosen only by name (--via)
    script: ClassVar[dict[str, Outcome]] = {}

    def ineligible(self, hv: Any) -> str | None:
        return None

    def warm_up(self, key: str, source: bytes) -> None:
        return None

    def run(self, job: Any) -> dict[str, Outcome]:
        assert job.call.module == "knob_probe" and job.call.function == "probe"
        return {hv.host: self.script[hv.host] for hv in job.hosts}


def outcome(host: str, what: str) -> Outcome:
    if what in PROBES:
        return Outcome(host, doc=json.loads(PROBES[what].read_text()))
    if what == "unreachable":
        return Outcome(host, error=HostFailure("unreachable", "ssh: connect to host: No route to host"))
    return Outcome(host, error=HostFailure("error", "the module failed on the host (exit 1): boom"))


@pytest.mark.parametrize(("behaviour", "code"), SCENARIOS, ids=IDS)
def test_the_drift_use_case_keeps_every_outcome_a_transport_hands_over(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, behaviour: dict[str, str], code: int
) -> None:
    monkeypatch.setitem(transports.REGISTRY, "scripted", ScriptedTransport())
    monkeypatch.setattr(transports, "VIA", (*transports.VIA, "scripted"))
    monkeypatch.setattr(ScriptedTransport, "script", {h: outcome(h, w) for h, w in behaviour.items()})
    plan = plan_from_hostvars([HostVars(host=h, address=a) for h, a in HOSTS.items()])
    verdicts = list(drift.stream(plan, isolated / "inventory", via="scripted"))
    assert sorted(v.host for v in verdicts) == sorted(HOSTS)
    assert {v.host: v.status for v in verdicts} == {h: STATUS[w] for h, w in behaviour.items()}
    assert exit_code(verdicts) == code
    s = summary(verdicts)
    assert s["unreachable"] == sum(w == "unreachable" for w in behaviour.values())
    assert s["error"] == sum(w == "error" for w in behaviour.values())
    assert prom_success(report_prom.prometheus(verdicts)) == {
        h: 0 if w in ("unreachable", "error") else 1 for h, w in behaviour.items()
    }
