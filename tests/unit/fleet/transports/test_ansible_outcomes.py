"""The ``ansible`` transport through the transports' public entry (``transports.run`` / ``stream`` with
``via="ansible"``), with the playbook run faked at fleet/runner.py's ``run_playbook``: what the run is asked
for, and each host's outcome from what the run reports (unreachable, failed, no document, a document).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from knobfleet.fleet import runner, transports
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.runner import HostResult, RunRequest, RunResult
from knobfleet.fleet.transports.base import HostFailure, Job, ModuleCall, Outcome

HOSTS = [HostVars(host=h, address=f"127.0.1.{i}") for i, h in enumerate(("ok", "down", "failed", "nodoc", "odd"), 1)]
CALL = ModuleCall(
    role="knob_probe",
    module="knob_probe",
    function="probe",
    playbook="probe.yml",
    result_key="probe",
    args={hv.host: {"service": f"svc-{hv.host}"} for hv in HOSTS},
)


def run_result(requests: list[RunRequest]) -> Any:
    def fake(req: RunRequest) -> RunResult:
        requests.append(req)
        hosts = {
            "ok": HostResult("ok", ok=1, results={"probe": {"probe": {"schema_version": 1}}}),
            "down": HostResult(
                "down", unreachable=True, failures=[("Probe", "unreachable: ssh: connect to host: No route to host")]
            ),
            "failed": HostResult("failed", failed=1, failures=[("Probe the host", "MODULE FAILURE: boom")]),
            "nodoc": HostResult("nodoc", ok=1, results={"probe": {"changed": False}}),
            "odd": HostResult("odd", ok=1, results={"probe": {"probe": ["not", "a", "dict"]}}),
        }
        return RunResult("run-1", 2, "failed", hosts, Path("/nonexistent"), 0.1)

    return fake


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[RunRequest]:
    seen: list[RunRequest] = []
    monkeypatch.setattr(runner, "run_playbook", run_result(seen))
    return seen


def test_each_host_gets_the_outcome_its_run_reported(requests: list[RunRequest], tmp_path: Path) -> None:
    got = transports.run(Job(HOSTS, CALL, tmp_path / "inv", forks=3), via="ansible")
    assert list(got) == [hv.host for hv in HOSTS]
    assert got["ok"] == Outcome("ok", doc={"schema_version": 1})
    assert got["down"] == Outcome("down", error=HostFailure("unreachable", "ssh: connect to host: No route to host"))
    assert got["failed"] == Outcome("failed", error=HostFailure("error", "Probe the host: MODULE FAILURE: boom"))
    assert got["nodoc"] == Outcome("nodoc", error=HostFailure("error", "failed"))
    assert got["odd"] == Outcome("odd", error=HostFailure("error", "failed"))
    assert not any(o.missing_python for o in got.values())


def test_the_run_is_asked_for_every_host_with_its_own_arguments(requests: list[RunRequest], tmp_path: Path) -> None:
    transports.run(Job(HOSTS, CALL, tmp_path / "inv", forks=3), via="ansible")
    (req,) = requests
    assert (req.playbook, req.inventory, req.hosts) == (
        "probe.yml",
        tmp_path / "inv",
        ("ok", "down", "failed", "nodoc", "odd"),
    )
    assert req.unsafe_vars == {"knob_probe_args": {hv.host: {"service": f"svc-{hv.host}"} for hv in HOSTS}}
    assert req.trusted_vars == {} and req.forks == 3


@pytest.mark.parametrize(("hosts", "forks", "expected"), [(5, 50, 5), (5, 2, 2), (1, 8, 1), (2, None, 2)])
def test_forks_never_exceed_the_hosts(
    requests: list[RunRequest],
    tmp_path: Path,
    hosts: int,
    forks: int | None,
    expected: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KNOBFLEET_FORKS", "32")
    transports.run(Job(HOSTS[:hosts], CALL, tmp_path, forks=forks), via="ansible")
    assert requests[0].forks == expected


def test_the_ansible_transport_reaches_every_host() -> None:
    t = transports.REGISTRY["ansible"]
    assert t.name == "ansible"
    assert all(t.ineligible(hv) is None for hv in HOSTS)
    t.warm_up("key", b"source")  # nothing saved to start early: a no-op


def test_stream_hands_over_errors_too(requests: list[RunRequest], tmp_path: Path) -> None:
    got = list(transports.stream(Job(HOSTS, CALL, tmp_path), via="ansible"))
    assert sorted(o.host for o in got) == sorted(hv.host for hv in HOSTS)
    assert sum(o.error is not None for o in got) == 4
