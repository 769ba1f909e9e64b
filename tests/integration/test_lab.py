"""Boot two lab hosts, check SSH with strict host keys, run the engine with systemd-run, tear down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from knobfleet import labid
from knobfleet.lab.nspawn import Lab
from knobfleet.lab.slots import REGISTRY
from tests.integration.conftest import lab_path, ssh, wait_engines


def port_open(address: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((address, port)) == 0


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
    lab = Lab(lab_path(lab_state))
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
    one, two = lab.host(1), lab.host(2)
    bad.write_text(lines[1].replace(two.address, one.address) + "\n")
    argv = lab.ssh_argv(one, ["true"])
    argv[argv.index(f"UserKnownHostsFile={lab.known_hosts}")] = f"UserKnownHostsFile={bad}"
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in refused.stderr

    # Idempotent: a second `up` keeps the running hosts.
    pids = {h.name: h.pid for h in lab.status()}
    lab.up(2)
    assert {h.name: h.pid for h in lab.status()} == pids

    # The stand-in engine under systemd-run, on its own port, with a knob in its environment.
    ssh(
        lab,
        "lab1",
        "systemctl stop sglang-dsv4-decode; systemd-run --unit=kf-test "
        "-E SGLANG_SM120_MMA_TARGET_CTAS=768 -E SGLANG_SIM_STARTUP_S=0.5 "
        f"/usr/bin/python3 -m sglang_sim.launch_server --model-path /m --host {one.address} --port 30001 --tp 2",
    )
    assert wait_http(f"http://{one.address}:30001/health") == 200
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
    assert not any(port_open(h.address, port) for h in (one, two) for port in (22, 30000, 30001))
    assert labid.read(lab.dir) is None  # its slot is given back


def other_checkout(state: Path, *args: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """``knobfleet ARGS`` as another checkout runs it: its own state folder, no lab named (KNOBFLEET_LAB unset)."""
    env = {k: v for k, v in os.environ.items() if k != labid.ENV}
    env["KNOBFLEET_STATE_DIR"] = str(state)
    proc = subprocess.run([sys.executable, "-m", "knobfleet", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    if check:
        assert proc.returncode == 0, f"knobfleet {' '.join(args)}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_two_checkouts_labs_run_side_by_side(lab_state: Path, tmp_path: Path) -> None:
    """Two labs up at once, from two checkouts: each in its own slot (addresses, machines, cgroups, ports), and
    apply, drift and lab down in one leave the other untouched."""
    lab = Lab(lab_path(lab_state))
    lab.up(2)
    wait_engines([lab.host(i).address for i in (1, 2)])
    mine = {h.name: h.pid for h in lab.status()}
    unit_before = ssh(lab, "lab1", "systemctl show -p MainPID,ExecMainStartTimestamp sglang-dsv4-decode").stdout
    other_state = tmp_path / "other-checkout-state"
    try:
        up = other_checkout(other_state, "lab", "up", "-n", "2")
        status = json.loads(other_checkout(other_state, "lab", "status", "--json").stdout)
        theirs = {h["name"]: h["address"] for h in status["hosts"]}
        assert set(theirs) == {"lab1", "lab2"}, up.stdout
        assert status["lab"]["slot"] != lab.identity.slot, (status["lab"], lab.identity)
        assert set(theirs.values()).isdisjoint({lab.host(i).address for i in (1, 2)}), (theirs, up.stdout)
        claim = json.loads((REGISTRY / f"slot-{status['lab']['slot']}.json").read_text())
        assert Path(claim["dir"]) == Path(status["lab"]["dir"]) and Path(claim["dir"]).is_relative_to(other_state)
        wait_engines(list(theirs.values()))

        # apply and drift in the other checkout reach its own hosts only
        other_checkout(other_state, "apply", "ctas512", "--yes")
        drift = json.loads(other_checkout(other_state, "drift", "--json").stdout)
        assert sorted(h["host"] for h in drift["hosts"]) == ["lab1", "lab2"]
        assert all(h["profile"] == "ctas512" and h["findings"] == [] for h in drift["hosts"]), drift
        # this lab: never applied to (no generation on its hosts), the same engines, still hand-managed
        assert ssh(lab, "lab1", "test -e /var/lib/knobfleet/sglang-dsv4-decode", check=False).returncode == 1
        assert ssh(lab, "lab1", "systemctl show -p MainPID,ExecMainStartTimestamp sglang-dsv4-decode").stdout == (
            unit_before
        )
        ours = subprocess.run([sys.executable, "-m", "knobfleet", "drift", "--json"], capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert {h["host"]: h["profile"] for h in json.loads(ours.stdout)["hosts"]} == {"lab1": None, "lab2": None}

        # lab down in the other checkout stops its own hosts only
        down = other_checkout(other_state, "lab", "down")
        assert "stopped 2 host(s)" in down.stdout, down.stdout
        assert not any(port_open(a, 22) for a in theirs.values())
    finally:
        other_checkout(other_state, "lab", "down", "--all", check=False)
    assert {h.name: h.pid for h in lab.status()} == mine and all(h.state == "running" for h in lab.status())
    assert all(port_open(lab.host(i).address, 22) for i in (1, 2))
    lab.down()
