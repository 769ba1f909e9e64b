"""The lab for integration tests: real systemd-nspawn hosts, real sshd, real Ansible.

Integration tests must run in CI. Where this machine truly cannot run them (not root, no
systemd-nspawn) they are skipped with a loud reason — except under CI (``CI`` set), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from knobfleet.lab.hostfiles import LabHost
from knobfleet.lab.nspawn import Lab, _port_open


def _cannot_run() -> str | None:
    if os.geteuid() != 0:
        return "integration tests need root (systemd-nspawn, mounts)"
    if not shutil.which("systemd-nspawn"):
        return "systemd-nspawn is missing: apt-get install -y systemd-container (make test does this)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _cannot_run()
    if reason is None:
        return
    if os.environ.get("CI"):
        raise pytest.UsageError(f"CI must run the integration tests, but {reason}")
    marker = pytest.mark.skip(reason=f"LOUD SKIP: {reason}")
    for item in items:
        item.add_marker(marker)
    print(f"\n!!! SKIPPING INTEGRATION TESTS: {reason} !!!\n")


@pytest.fixture(scope="session")
def lab_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("knobfleet-state")
    os.environ["KNOBFLEET_STATE_DIR"] = str(state)
    for i in range(1, 4):
        if _port_open(f"127.0.1.{i}", 22):
            pytest.fail(f"127.0.1.{i}:22 is taken (a lab is already up?); run `knobfleet lab down` first")
    yield state
    Lab(state / "lab").down()


def ssh(lab: Lab, host: str, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """An independent check over SSH, not through knobfleet."""
    argv = lab.ssh_argv(LabHost(int(host.removeprefix("lab"))), [command])
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=check)
