"""The lab for integration tests: real systemd-nspawn hosts, real sshd, real Ansible.

Integration tests must run in CI. Where this machine truly cannot run them (not root, no
systemd-nspawn) they are skipped with a loud reason — except under CI (``CI`` set), where that is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from knobfleet import labid
from knobfleet.lab.nspawn import Lab

# The id of this session's lab: the shard runner (tools/shards.py) gives each shard its own; a plain pytest run is
# "it". The lab's slot, so its addresses, machine names and ports, are picked when it boots (knobfleet.lab.slots):
# the suite runs beside a demo lab, another shard's lab or another checkout's.
LAB_ID = labid.valid_id(os.environ.get("KNOBFLEET_TEST_LAB", "it"))


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
    os.environ[labid.ENV] = LAB_ID  # every knobfleet command the tests run means this session's lab
    yield state
    Lab(lab_path(state)).down()


def lab_path(state: Path) -> Path:
    """The folder of this session's lab in the state folder ``state``."""
    return labid.lab_dir(state, LAB_ID)


def session_lab() -> Lab:
    """This session's lab (its slot as it records it now)."""
    return Lab(lab_path(Path(os.environ["KNOBFLEET_STATE_DIR"])))


def ssh(lab: Lab, host: str, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """An independent check over SSH, not through knobfleet."""
    argv = lab.ssh_argv(lab.named(host), [command])
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=check)


@dataclass
class Fleet:
    lab: Lab
    inventory: Path | None  # None: every command runs without -i, on the default inventory the running lab gives
    hosts: list[str]

    def ssh(self, host: str, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return ssh(self.lab, host, command, check)

    def knobfleet(self, *args: str, check: bool = False, timeout: int = 300) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "knobfleet", *args]
        commands = ("apply", "plan", "render", "verify", "drift", "rollback", "history", "bench", "canary")
        if self.inventory is not None and args and args[0] in commands:
            argv += ["-i", str(self.inventory)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"knobfleet {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc


def signal_after(args: list[str], delay: float, sig: int, timeout: int = 400) -> tuple[int, str, str, bool]:
    """``knobfleet ARGS`` with ``sig`` sent to the controller process alone (as `kill PID` or systemd's stop does)
    ``delay`` s after it started; (exit code, stdout, stderr, whether the signal was sent: not when it had ended)."""
    proc = subprocess.Popen([sys.executable, "-m", "knobfleet", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    sent = False
    try:
        proc.wait(delay)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, sig)
        sent = True
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err, sent


def wait_ready_sh(
    service: str, addr: str, port: int = 30000, path: str = "/health_generate", timeout_s: int = 60
) -> str:
    """Shell run on a lab host: poll (every 0.1 s, bounded) until ``service``'s engine answers 200 on its health
    path at the host's loopback address ``addr``; fails naming the service when it never does."""
    url = f"http://{addr}:{port}{path}"
    return (
        f"(for _ in $(seq {timeout_s * 10}); do curl -fs -o /dev/null {url} && exit 0; sleep 0.1; done; "
        f"echo '{service}: not ready after {timeout_s} s' >&2; exit 1)"
    )


def restart_sh(service: str, addr: str, **kw: Any) -> str:
    """Shell: restart ``service`` and wait until its engine at ``addr`` is ready (no fixed sleep)."""
    return f"systemctl restart {service} && {wait_ready_sh(service, addr, **kw)}"


def respawn_sh(service: str, addr: str, timeout_s: int = 60) -> str:
    """Shell: SIGKILL the engine's main process, then wait until systemd (Restart=on-failure) has started a new
    one and it is ready."""
    pid = f"$(systemctl show -p MainPID --value {service})"
    return (
        f"old={pid}; kill -9 $old; "
        f"(for _ in $(seq {timeout_s * 10}); do now={pid}; "
        f'[ "$now" != 0 ] && [ "$now" != "$old" ] && break; sleep 0.1; done) && {wait_ready_sh(service, addr)}'
    )


def addr(host: str) -> str:
    """A host's loopback address in this session's lab (lab3 -> 127.0.<block>.3)."""
    return session_lab().named(host).address


def touch_later_sh(path: str, seconds: int = 2) -> str:
    """Shell: give ``path`` an mtime ``seconds`` after now, so an edit is newer than the running process (and than
    systemd's loaded unit) without waiting for the clock: the rule compares in whole seconds."""
    return f'touch -d "@$(( $(date +%s) + {seconds} ))" {path}'


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every 0.1 s until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {timeout} s"
        time.sleep(0.1)


def wait_engines(addresses: list[str], timeout: float = 60) -> None:
    """Wait until every host's hand-managed engine answers its health URL (it starts with the host)."""
    import urllib.request

    deadline = time.monotonic() + timeout
    pending = list(addresses)
    while pending and time.monotonic() < deadline:
        for addr in list(pending):
            try:
                with urllib.request.urlopen(f"http://{addr}:30000/health_generate", timeout=2) as r:
                    if r.status == 200:
                        pending.remove(addr)
            except OSError:
                pass
        time.sleep(0.2)
    assert not pending, f"engines not ready after {timeout}s: {pending}"


def boot_fleet(lab_state: Path, n: int) -> Fleet:
    lab = Lab(lab_path(lab_state))
    lab.down()
    lab.up(n)
    wait_engines([lab.host(i).address for i in range(1, n + 1)])
    return Fleet(lab, lab.dir / "inventory", [f"lab{i}" for i in range(1, n + 1)])


@pytest.fixture(scope="module")
def fleet(lab_state: Path) -> Iterator[Fleet]:
    """A freshly booted 3-host lab for one test module (boot takes about a second)."""
    f = boot_fleet(lab_state, 3)
    yield f
    f.lab.down()


def empty_panels(prom: Any, *boards: str, window: str = "5m") -> list[str]:
    """The panels of the shipped dashboards ``boards`` (file names in monitoring/dashboards) none of whose queries
    returns data (a sample that is not NaN) from ``prom`` (a ``telemetry.prom.Prometheus``): the dashboard rot of a
    renamed metric, named by board, title and queries."""
    from knobfleet.telemetry import dashboards
    from tests.conftest import REPO

    empty = []
    for name in boards:
        board = json.loads((REPO / "monitoring" / "dashboards" / name).read_text())
        for panel in board["panels"]:
            got = [prom.query(dashboards.as_promql(t["expr"], window)) for t in panel["targets"]]
            if not any(s.value == s.value for samples in got for s in samples):
                empty.append(f"{name}: {panel['title']}: {[t['expr'] for t in panel['targets']]}")
    return empty


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under the shard runner, a failure's report goes to the shard's log as it happens (not only at the end of a
    shard that may run for half an hour)."""
    if report.failed and os.environ.get("KNOBFLEET_TEST_LAB", "").startswith("shard"):
        sys.stdout.write(f"\n===== FAILED {report.nodeid} ({report.when}) =====\n{report.longreprtext[-6000:]}\n")
        sys.stdout.flush()


def start_load(spec: Any) -> tuple[threading.Thread, list[Any], threading.Event]:
    """Constant load (``loadgen.run`` of ``spec``, a ``loadgen.LoadSpec``) in a thread, started and sending: the
    thread, the records it fills, and the event that stops it (join the thread after setting it)."""
    from knobfleet.lab import loadgen

    records: list[Any] = []
    started, stop = threading.Event(), threading.Event()
    load = threading.Thread(
        target=lambda: records.extend(loadgen.run(spec, on_start=lambda _t: started.set(), stop=stop))
    )
    load.start()
    assert started.wait(10), "the load never started"
    return load, records, stop
