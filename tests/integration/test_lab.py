"""Boot two lab hosts, check SSH with strict host keys, run the engine with systemd-run, tear down."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from knobfleet.errors import LabError
from knobfleet.lab.hostfiles import LabHost
from knobfleet.lab.nspawn import Lab, _port_open
from tests.integration.conftest import ssh


def wait_http(url: str, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return int(r.status)
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer 200 within {timeout}s")


def own_nspawn(state: Path) -> list[int]:
    """PIDs of systemd-nspawn processes whose root is under ``state`` (this lab's), not anyone else's."""
    pids = subprocess.run(["pgrep", "-x", "systemd-nspawn"], capture_output=True, text=True).stdout.split()
    mine = []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if any(a.startswith(b"--directory=" + str(state).encode()) for a in argv):
            mine.append(int(pid))
    return mine


def test_two_hosts_boot_run_engine_and_tear_down(lab_state: Path) -> None:
    lab = Lab(lab_state / "lab")
    started = time.monotonic()
    hosts = lab.up(2)
    assert len(own_nspawn(lab_state)) == 2
    assert [h.name for h in hosts] == ["lab1", "lab2"] and all(h.state == "running" for h in hosts)
    assert ssh(lab, "lab1", "hostname").stdout.strip() == "lab1"
    assert ssh(lab, "lab2", "hostname").stdout.strip() == "lab2"
    print(f"lab up -n 2: {time.monotonic() - started:.1f}s")

    # Strict host key checking: a known_hosts with another key refuses the connection.
    bad = lab_state / "bad_known_hosts"
    lines = lab.known_hosts.read_text().splitlines()
    bad.write_text(lines[1].replace("127.0.1.2", "127.0.1.1") + "\n")
    argv = lab.ssh_argv(LabHost(1), ["true"])
    argv[argv.index(f"UserKnownHostsFile={lab.known_hosts}")] = f"UserKnownHostsFile={bad}"
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in refused.stderr

    # Idempotent: a second `up` keeps the running hosts.
    pids = {h.name: h.pid for h in lab.status()}
    lab.up(2)
    assert {h.name: h.pid for h in lab.status()} == pids

    # Another checkout's lab (a state folder of its own) never touches these hosts: its `up` is refused before
    # anything changes, naming this lab and how to stop it; its `down` leaves them running (the same machine names
    # and cgroups: before 0.2.3, its `up` halted lab1 and left it mounted).
    other = Lab(lab_state / "other-checkout" / "lab")
    try:
        with pytest.raises(LabError, match=f"taken by the lab of another checkout \\({re.escape(str(lab.dir))}\\)"):
            other.up(1)
        (other.dir / "hosts" / "lab1").mkdir(parents=True)  # its own stale record of lab1 (a crashed run's)
    finally:
        other.down()  # (what a regression booted is not left behind)
    assert {h.name: h.pid for h in lab.status()} == pids and all(h.state == "running" for h in lab.status())
    assert not (other.dir / "hosts" / "lab1").exists() and any("left alone" in n for n in other.notes)

    # The stand-in engine under systemd-run, on its own port, with a knob in its environment.
    ssh(
        lab,
        "lab1",
        "systemctl stop sglang-dsv4-decode; systemd-run --unit=kf-test "
        "-E SGLANG_SM120_MMA_TARGET_CTAS=768 -E SGLANG_SIM_STARTUP_S=0.5 "
        "/usr/bin/python3 -m sglang_sim.launch_server --model-path /m --host 127.0.1.1 --port 30001 --tp 2",
    )
    assert wait_http("http://127.0.1.1:30001/health") == 200
    pgrep = ssh(lab, "lab1", "pgrep -f sglang::scheduler_TP1").stdout.split()
    assert len(pgrep) == 1
    # Like SGLang's schedulers, the worker renamed itself (setproctitle): its environ no longer shows the
    # start-up variables; the main process still does.
    environ = ssh(lab, "lab1", f"tr '\\0' '\\n' < /proc/{pgrep[0]}/environ").stdout.splitlines()
    assert "SGLANG_SM120_MMA_TARGET_CTAS=768" not in environ
    main = ssh(lab, "lab1", "systemctl show -p MainPID --value kf-test").stdout.strip()
    environ = ssh(lab, "lab1", f"tr '\\0' '\\n' < /proc/{main}/environ").stdout.splitlines()
    assert "SGLANG_SM120_MMA_TARGET_CTAS=768" in environ

    lab.down()
    # Only this lab's containers: another lab (a second state dir) may be running on the machine.
    assert not own_nspawn(lab_state), own_nspawn(lab_state)
    assert str(lab_state) not in Path("/proc/self/mounts").read_text()
    assert not any(_port_open(f"127.0.1.{i}", port) for i in (1, 2) for port in (22, 30000, 30001))
