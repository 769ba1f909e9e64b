"""Fault injection on the real lab: every failed change restores the last good generation, nothing is lost.

After each fault: the host is wholly on one generation (installed files = that generation's files, and
the live environ and cmdline agree with them), the ledger says so, generations needed for a way back are
still there, and the lock is free.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.conftest import Fleet, addr, respawn_sh, restart_sh, signal_after, wait_until

STATE = "/var/lib/knobfleet/sglang-dsv4-decode"
SCRIPT = "/root/serve_dsv4_decode.sh"
SVC = "sglang-dsv4-decode"


@pytest.fixture(scope="module")
def fault_profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("profiles")
    for name in ("base", "default", "ctas512", "ctas768", "blockh16"):
        shutil.copy(REPO / "profiles" / f"{name}.yaml", d)
    for fault in ("start", "never-ready", "after:4"):
        name = "fail-" + fault.replace(":", "-")
        (d / f"{name}.yaml").write_text(
            f"name: {name}\nversion: 1\nextends: ctas768\nallow_unknown: [SGLANG_SIM_FAIL]\n"
            f'env:\n  SGLANG_SIM_FAIL: "{fault}"\n'
        )
    return d


def host_state(fleet: Fleet, host: str) -> dict[str, Any]:
    """An independent look over SSH: current generation, its meta, installed vs stored files, live env."""
    out = fleet.ssh(
        host,
        f"""
        cur=$(readlink {STATE}/current); echo "CUR=$cur"; cat {STATE}/$cur/meta.json; echo
        echo "INSTALLED=$(sha256sum {SCRIPT} /etc/systemd/system/{SVC}.service | cut -c1-64 | tr '\\n' ' ')"
        pid=$(systemctl show -p MainPID --value {SVC}); echo "PID=$pid"
        echo "ACTIVE=$(systemctl is-active {SVC})"
        echo "ENV=$(tr '\\0' '\\n' < /proc/$pid/environ | grep '^SGLANG_SM120_MMA_TARGET_CTAS=' | cut -d= -f2)"
        echo "FAIL=$(tr '\\0' '\\n' < /proc/$pid/environ | grep -c '^SGLANG_SIM_FAIL=')"
        echo "LOCK=$(test -e {STATE}/lock && echo held || echo free)"
        echo "GENS=$(ls {STATE}/generations | tr '\\n' ' ')"
        echo "LEDGER=$(grep -v '"event": "start"' {STATE}/ledger.jsonl | tail -1)"
        echo "START=$(grep '"event": "start"' {STATE}/ledger.jsonl | tail -1)"
    """,
    ).stdout
    lines = out.splitlines()
    meta_text = "\n".join(lines[1 : lines.index(next(x for x in lines if x.startswith("INSTALLED=")))])
    kv = dict(x.split("=", 1) for x in lines if "=" in x and x.split("=", 1)[0].isupper())
    meta = json.loads(meta_text)
    return {
        "current": int(kv["CUR"].rsplit("/", 1)[1]),
        "meta": meta,
        "installed": kv["INSTALLED"].split(),
        "active": kv["ACTIVE"],
        "ctas": kv["ENV"],
        "fail_env": int(kv["FAIL"]),
        "lock": kv["LOCK"],
        "gens": [int(g) for g in kv["GENS"].split()],
        "ledger": json.loads(kv["LEDGER"]),  # the last transaction event (each measured start has its own line)
        "start": json.loads(kv["START"]) if kv.get("START") else None,
    }


def assert_wholly_on(fleet: Fleet, host: str, generation: int, ctas: str) -> dict[str, Any]:
    st = host_state(fleet, host)
    assert st["current"] == generation, st
    assert st["installed"] == [st["meta"]["files"]["script"]["sha256"], st["meta"]["files"]["unit"]["sha256"]]
    assert st["active"] == "active" and st["ctas"] == ctas and st["fail_env"] == 0
    assert st["lock"] == "free"
    verify = fleet.knobfleet("verify", "--json", "--limit", host)
    assert verify.returncode == 0, verify.stdout[-1500:]
    return st


def test_baseline(fleet: Fleet) -> None:
    fleet.knobfleet("apply", "ctas512", "--yes", check=True)
    for host in fleet.hosts:
        assert_wholly_on(fleet, host, 1, "512")


# The title of the role's readiness task, as an operator reads it in apply's error line.
TASK_READY = "Restart if the generation changed and wait for readiness (health 200, main process stable)"


@pytest.mark.parametrize(
    ("profile", "extra", "why"),
    [
        ("fail-start", [], "engine exited during start-up"),
        ("fail-never-ready", ["--readiness-timeout", "5"], "not ready after 5s"),
        # it dies 4 s after ready (it was 2 s: a readiness poll stalled that long on a loaded machine would read the
        # death as one during start-up)
        ("fail-after-4", ["--grace", "8"], "engine exited within 8s after becoming ready"),
    ],
)
def test_failed_start_restores_previous_generation(
    fleet: Fleet, fault_profiles: Path, profile: str, extra: list[str], why: str
) -> None:
    before = host_state(fleet, "lab1")
    proc = fleet.knobfleet("apply", str(fault_profiles / f"{profile}.yaml"), "--limit", "lab1", "--yes", *extra)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"error: lab1: {TASK_READY}: {why}" in proc.stdout
    assert "restored: lab1 is back on generation 0001 (ctas512@2), restarted, ready and verified" in proc.stdout
    st = assert_wholly_on(fleet, "lab1", 1, "512")  # the previous profile's knob is live again
    failed_gen = max(st["gens"])
    assert failed_gen > before["current"] and set(before["gens"]) <= set(st["gens"])
    meta = json.loads(fleet.ssh("lab1", f"cat {STATE}/generations/{failed_gen:04d}/meta.json").stdout)
    assert meta["status"] == "failed" and why in meta["reason"] and meta["profile"] == profile
    assert st["ledger"]["event"] == "restore" and st["ledger"]["generation"] == 1
    # the restore's own restart was measured and kept too, on the generation it put back
    assert st["start"]["kind"] == "restart" and st["start"]["generation"] == 1, st["start"]
    # measured like an apply's start: the engine's phases from the journal, the engine version from its probe
    assert [p["phase"] for p in st["start"]["phases"]][:1] == ["weights"], st["start"]
    assert st["start"]["engine_version"] == before["start"]["engine_version"], (st["start"], before["start"])


def test_a_foreign_dropin_is_refused_or_moved_into_the_backup(fleet: Fleet) -> None:
    dropin = f"/etc/systemd/system/{SVC}.service.d"
    fleet.ssh(
        "lab2",
        f"mkdir -p {dropin} && printf '[Service]\\nEnvironment=SGLANG_SM120_MMA_NSPLIT_MAX=4\\n' > "
        f"{dropin}/knobs.conf && systemctl daemon-reload",
    )
    before = host_state(fleet, "lab2")
    proc = fleet.knobfleet("apply", "ctas768", "--limit", "lab2", "--yes")
    assert proc.returncode == 1
    assert f"error: lab2: refused, nothing was changed: foreign drop-in {dropin}/knobs.conf changes the unit" in (
        proc.stdout
    )
    assert host_state(fleet, "lab2") == before  # same files, generation, lock, engine PID
    # policy remove: the drop-in goes into the new generation's backup; a rollback puts it back
    fleet.knobfleet("apply", "ctas768", "--limit", "lab2", "--yes", "--foreign-dropins", "remove", check=True)
    assert fleet.ssh("lab2", f"test -e {dropin}/knobs.conf", check=False).returncode != 0
    st = host_state(fleet, "lab2")
    assert "knobs.conf" in fleet.ssh("lab2", f"ls {STATE}/generations/{st['current']:04d}/dropins").stdout
    assert fleet.knobfleet("verify", "--limit", "lab2").returncode == 0
    fleet.knobfleet("rollback", "--limit", "lab2", "--yes", check=True)
    assert fleet.ssh("lab2", f"test -e {dropin}/knobs.conf", check=False).returncode == 0
    fleet.ssh("lab2", f"rm -r {dropin} && systemctl daemon-reload && {restart_sh(SVC, addr('lab2'))}")
    assert_wholly_on(fleet, "lab2", 1, "512")


def test_serial_rollout_stops_at_failing_batch_and_rollback_fleet(fleet: Fleet, tmp_path: Path) -> None:
    # lab2's host env makes every *new* generation crash at start; its previous generation restores fine.
    inv = tmp_path / "inv"
    shutil.copytree(fleet.inventory, inv)
    hosts_yml = (
        (inv / "hosts.yml")
        .read_text()
        .replace(
            f"          ansible_host: {addr('lab2')}\n",
            f"          ansible_host: {addr('lab2')}\n          knob_serve_host_env: {{SGLANG_SIM_GPU: rtx-pro-6000, "
            "SGLANG_SIM_STARTUP_S: '1.5', SGLANG_SIM_TIME_SCALE: '0.02', SGLANG_SIM_FAIL: start}\n",
        )
    )
    (inv / "hosts.yml").write_text(hosts_yml)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "knobfleet",
            "apply",
            "ctas768",
            "-i",
            str(inv),
            "--serial",
            "1",
            "--rollback-fleet",
            "--yes",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    status = {h["host"]: h["status"] for h in report["hosts"]}
    assert status == {"lab1": "rolled-back", "lab2": "failed", "lab3": "not-run"}, status
    assert host_state(fleet, "lab3")["current"] == 1  # untouched
    assert_wholly_on(fleet, "lab1", 1, "512")
    assert_wholly_on(fleet, "lab2", 1, "512")


def test_failed_restore_exits_3_with_manual_steps_and_touches_no_more_hosts(fleet: Fleet) -> None:
    # systemd's own manager environment makes the engine crash whatever generation runs: the restore
    # cannot succeed either (knobfleet's files are all fine, so nothing refuses the host up front).
    fleet.ssh("lab2", "systemctl set-environment SGLANG_SIM_FAIL=start")
    before3 = host_state(fleet, "lab3")
    proc = fleet.knobfleet("apply", "ctas768", "--limit", "lab2,lab3", "--serial", "1", "--yes")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "No further hosts were touched. Restore by hand:" in proc.stderr
    assert f"systemctl daemon-reload && systemctl restart {SVC}.service" in proc.stderr
    assert host_state(fleet, "lab3")["current"] == before3["current"]
    st = host_state(fleet, "lab2")
    assert st["current"] == 1 and st["lock"] == "free"  # files are back on the old generation
    fleet.ssh("lab2", f"systemctl unset-environment SGLANG_SIM_FAIL && {restart_sh(SVC, addr('lab2'))}")
    assert_wholly_on(fleet, "lab2", 1, "512")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_killed_controller_leaves_a_breakable_lock(fleet: Fleet) -> None:
    argv = [
        sys.executable,
        "-m",
        "knobfleet",
        "apply",
        "ctas768",
        "-i",
        str(fleet.inventory),
        "--limit",
        "lab3",
        "--yes",
    ]
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while fleet.ssh("lab3", f"test -e {STATE}/lock", check=False).returncode != 0:
        assert time.monotonic() < deadline, "the apply never took the lock"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # the controller and its ansible-playbook die mid-apply
    proc.wait()
    wait_until(lambda: not group_alive(proc.pid), 30, "the killed apply's processes (ssh, ansible) to go")
    again = fleet.knobfleet("apply", "ctas512", "--limit", "lab3", "--yes")
    assert again.returncode == 1
    assert "error: lab3: refused, nothing was changed: lock held by root (run " in again.stdout
    assert "no longer runs, so the lock is stale: re-run with --break-lock" in again.stdout
    fleet.knobfleet("apply", "ctas512", "--limit", "lab3", "--yes", "--break-lock", check=True)
    st = host_state(fleet, "lab3")
    assert st["ctas"] == "512" and st["lock"] == "free" and st["meta"]["profile"] == "ctas512"
    assert fleet.knobfleet("verify", "--limit", "lab3").returncode == 0


def test_rollback_refusals_change_nothing(fleet: Fleet) -> None:
    st = host_state(fleet, "lab1")
    failed = max(g for g in st["gens"] if g != st["current"])
    fleet.ssh("lab1", f"rm {STATE}/generations/{failed:04d}/serve_dsv4_decode.sh")
    proc = fleet.knobfleet("rollback", "--to", str(failed), "--limit", "lab1", "--yes")
    assert proc.returncode == 1
    assert f"generation {failed:04d}: {STATE}/generations/{failed:04d}/serve_dsv4_decode.sh was deleted" in proc.stdout
    assert "nothing was changed" in proc.stdout
    assert host_state(fleet, "lab1")["current"] == st["current"]
    fleet.ssh("lab1", f"echo '{{not json' > {STATE}/generations/0000/meta.json")
    hist = fleet.knobfleet("history", "--limit", "lab1")
    assert f"{STATE}/generations/0000/meta.json" in hist.stdout and "unreadable" in hist.stdout
    proc = fleet.knobfleet("rollback", "--to", "0", "--limit", "lab1", "--yes")
    assert proc.returncode == 1 and f"{STATE}/generations/0000/meta.json is unreadable" in proc.stdout
    assert host_state(fleet, "lab1")["current"] == st["current"]
    fleet.knobfleet("apply", "ctas768", "--limit", "lab1", "--yes", check=True)  # the way forward still works
    proc = fleet.knobfleet("rollback", "--limit", "lab1", "--yes")
    assert proc.returncode == 0, proc.stdout
    assert_wholly_on(fleet, "lab1", st["current"], "512")


def test_random_operation_sequences_keep_record_and_live_state_in_agreement(fleet: Fleet) -> None:
    seed = int(os.environ.get("KNOBFLEET_PROPERTY_SEED", "20261130"))
    rng = random.Random(seed)
    hosts = ["lab1", "lab2"]
    ops = ["apply-512", "apply-768", "apply-bh16", "rollback", "kill-engine", "hand-edit", "concurrent"]
    started = time.monotonic()
    for step in range(14):
        op, host = rng.choice(ops), rng.choice(hosts)
        if op.startswith("apply-"):
            prof = {"apply-512": "ctas512", "apply-768": "ctas768", "apply-bh16": "blockh16"}[op]
            fleet.knobfleet("apply", prof, "--limit", host, "--yes", check=True)
        elif op == "rollback":
            fleet.knobfleet("rollback", "--limit", host, "--yes")  # may be refused: no earlier good generation
        elif op == "kill-engine":
            fleet.ssh(host, respawn_sh(SVC, addr(host)))  # Restart=on-failure brings it back
        elif op == "hand-edit":
            fleet.ssh(host, f"sed -i 's/TARGET_CTAS=[0-9]*/TARGET_CTAS=640/' {SCRIPT} && {restart_sh(SVC, addr(host))}")
            assert fleet.knobfleet("verify", "--limit", host).returncode == 2  # detected
            fleet.knobfleet("apply", "ctas512", "--limit", host, "--yes", check=True)  # repaired
        else:
            argv = [sys.executable, "-m", "knobfleet", "apply", "-i", str(fleet.inventory), "--limit", host, "--yes"]
            a = subprocess.Popen([*argv, "ctas768"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            b = subprocess.Popen([*argv, "ctas512"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            codes = sorted([a.wait(300), b.wait(300)])
            a.communicate()
            b.communicate()
            assert codes in ([0, 0], [0, 1]), codes  # one may finish before the other starts
        for h in hosts:  # knobfleet's record matches the live process on every host, after every step
            res = fleet.knobfleet("verify", "--json", "--limit", h)
            assert res.returncode == 0, f"seed {seed} step {step} {op} on {host}: {res.stdout[-1500:]}"
    print(f"property run: seed {seed}, 14 steps, {time.monotonic() - started:.0f}s")


def container_init(fleet: Fleet, host: str) -> int:
    """PID (in this machine's namespace) of the lab host's systemd, the child of its nspawn."""
    nspawn = fleet.lab.pid(fleet.lab.named(host))
    assert nspawn is not None
    children = Path(f"/proc/{nspawn}/task/{nspawn}/children").read_text().split()
    return int(children[0])


def in_host(fleet: Fleet, host: str, command: str) -> subprocess.CompletedProcess[str]:
    """Run a command inside a lab host without SSH (nsenter into its namespaces)."""
    return subprocess.run(
        ["nsenter", "-t", str(container_init(fleet, host)), "-m", "-u", "-i", "-p", "--", "/bin/sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
    )


def cut_ssh(fleet: Fleet, host: str) -> None:
    """Stop the host's sshd and kill its remaining sshd sessions (ours, found by the host's cgroup)."""
    from knobfleet.lab.cgroups import cgroup_dirs, cgroup_pids

    assert in_host(fleet, host, "systemctl stop ssh.service ssh.socket").returncode == 0
    for pid in cgroup_pids(cgroup_dirs(fleet.lab.named(host))):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def test_ssh_cut_mid_rollout_stops_later_batches(fleet: Fleet) -> None:
    fleet.knobfleet("apply", "ctas512", "--yes", check=True)  # whatever earlier tests left, ctas768 is a change
    before = {h: host_state(fleet, h) for h in fleet.hosts}
    argv = [
        sys.executable,
        "-m",
        "knobfleet",
        "apply",
        "ctas768",
        "-i",
        str(fleet.inventory),
        "--serial",
        "1",
        "--yes",
        "--json",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while host_state(fleet, "lab1")["current"] == before["lab1"]["current"]:  # lab1's batch is running
        assert time.monotonic() < deadline and proc.poll() is None, "lab1 was never applied"
        time.sleep(0.2)
    cut_ssh(fleet, "lab2")  # SSH to lab2 goes away while the rollout is under way
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    status = {h["host"]: h["status"] for h in json.loads(out)["hosts"]}
    assert status == {"lab1": "applied", "lab2": "failed", "lab3": "not-run"}, status
    lab2 = next(h for h in json.loads(out)["hosts"] if h["host"] == "lab2")
    assert "unreachable" in lab2["message"]
    # lab2 is wholly on its old generation: read it from the host side, not over SSH
    root = fleet.lab.host_dir(fleet.lab.host(2)) / "root"
    assert os.readlink(root / STATE.lstrip("/") / "current") == f"generations/{before['lab2']['current']:04d}"
    assert not (root / STATE.lstrip("/") / "lock").exists()
    assert host_state(fleet, "lab3")["current"] == before["lab3"]["current"]
    assert in_host(fleet, "lab2", "systemctl start ssh.service").returncode == 0
    wait_until(lambda: fleet.ssh("lab2", "true", check=False).returncode == 0, 30, "lab2's sshd to accept again")
    fleet.knobfleet("apply", "ctas512", "--yes", check=True)
    for host in fleet.hosts:
        assert host_state(fleet, host)["ctas"] == "512"


def test_generations_out_of_space_is_a_clear_error_and_changes_nothing(fleet: Fleet) -> None:
    gens = f"{STATE}/generations"
    fleet.knobfleet("apply", "ctas512", "--limit", "lab3", "--yes", check=True)
    before = host_state(fleet, "lab3")
    # A tmpfs just big enough for the generations already there, holding a copy of them.
    setup = (
        f"cp -a {gens} /run/kf-gens && used=$(du -sk /run/kf-gens | cut -f1) && "
        f"mount -t tmpfs -o size=$((used + 4))k kf-small {gens} && cp -a /run/kf-gens/. {gens}/ && "
        "rm -r /run/kf-gens"
    )
    res = in_host(fleet, "lab3", setup)
    assert res.returncode == 0, res.stderr
    try:
        proc = fleet.knobfleet("apply", "ctas768", "--limit", "lab3", "--yes")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert (
            f"cannot store generation {max(before['gens']) + 1:04d} in {gens}: No space left on device" in proc.stdout
        )
        assert f"nothing was installed, generation {before['current']:04d} is still live" in proc.stdout
        assert "nothing was changed on lab3" in proc.stdout
        st = host_state(fleet, "lab3")
        assert st["current"] == before["current"] and st["installed"] == before["installed"]
        assert st["ctas"] == before["ctas"] and st["lock"] == "free"
    finally:
        assert in_host(fleet, "lab3", f"umount {gens}").returncode == 0
    assert_wholly_on(fleet, "lab3", before["current"], before["ctas"])


def test_rollback_to_an_adopted_space_separated_script_verifies(fleet: Fleet) -> None:
    """Generation 0 is the seed's hand-written script, in the style people write (`--host 127.0.1.2 --port 30000
    --tp 2`): the engine's report of its arguments is read with the engine's arity, so `rollback --to 0` verifies
    (it ended in exit 3, "engine reports host=127.0.1.2 but pid … was started with --host=true") and drift is
    clean."""
    host = "lab2"
    fleet.knobfleet("apply", "ctas512", "--yes", "--limit", host, check=True)
    script0 = fleet.ssh(host, f"cat {STATE}/generations/0000/serve_dsv4_decode.sh").stdout
    assert f"--host {addr(host)} --port 30000 --tp 2" in script0, script0
    proc = fleet.knobfleet("rollback", "--to", "0", "--limit", host, "--yes")
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0000" in proc.stdout and "verified" in proc.stdout, proc.stdout
    verify = fleet.knobfleet("verify", "--json", "--limit", host)
    assert verify.returncode == 0, verify.stdout[-1500:]
    drift = fleet.knobfleet("drift", "--json", "--limit", host)
    assert drift.returncode == 0, drift.stdout[-1500:]
    assert json.loads(drift.stdout)["hosts"][0]["generation"] == 0
    fleet.knobfleet("apply", "ctas512", "--yes", "--limit", host, check=True)  # back on a managed generation


CTAS_OF = {"ctas512": "512", "ctas768": "768", "fail-start": "768"}


def signalled(fleet: Fleet, args: list[str], delay: float, sig: int) -> tuple[int, str, str, bool]:
    """``knobfleet ARGS`` on lab1 and lab2 with ``sig`` sent to the controller alone ``delay`` s after it started
    (conftest.signal_after)."""
    return signal_after([*args, "-i", str(fleet.inventory), "--limit", "lab1,lab2", "--yes"], delay, sig, 300)


@pytest.mark.parametrize(
    ("command", "delay", "sig"),
    [
        ("apply ctas768", 1.0, signal.SIGTERM),
        ("apply ctas768", 3.0, signal.SIGINT),
        ("apply ctas768", 5.5, signal.SIGTERM),
        ("apply fail-start", 3.0, signal.SIGTERM),  # the failed start, or its restore, when the signal lands
        ("apply fail-start", 5.0, signal.SIGTERM),
        ("rollback", 2.5, signal.SIGTERM),
    ],
)
def test_a_signal_at_any_point_leaves_report_history_and_drift_agreeing_with_the_host(
    fleet: Fleet, fault_profiles: Path, command: str, delay: float, sig: int
) -> None:
    """SIGTERM or SIGINT to the controller at a sweep of moments of a serial apply over two hosts (a failing
    profile's included: the restore must not be skipped) and of a rollback. Afterwards each host is wholly on one
    good generation, its lock free, the live engine runs that generation's knobs, the report's word for each host
    matches it (applied: the new generation; anything else: the one it had), and drift finds the hosts in sync.
    Where the signal lands is printed (the report names the step); the assertions hold wherever it lands."""
    fleet.knobfleet("apply", "ctas512", "--limit", "lab1,lab2", "--yes", check=True)
    if command == "rollback":  # something to roll back from
        fleet.knobfleet("apply", "ctas768", "--limit", "lab1,lab2", "--yes", check=True)
    before = {h: host_state(fleet, h) for h in ("lab1", "lab2")}
    verb, *rest = command.split()
    target = [str(fault_profiles / f"{rest[0]}.yaml")] if rest == ["fail-start"] else rest
    extra = ["--serial", "1"] if verb == "apply" else []
    rc, out, err, sent = signalled(fleet, [verb, *target, *extra, "--json"], delay, sig)
    assert rc in ((130,) if sent else ()) + (0, 1), out[-2000:] + err[-2000:]
    report = {h["host"]: h for h in json.loads(out)["hosts"]} if out.strip().startswith("{") else {}
    said = {h: (r.get("status", r.get("ok")), r.get("message", "")) for h, r in report.items()}  # rollback: ok
    print(f"{command} + {signal.Signals(sig).name} at {delay}s (sent: {sent}): exit {rc}; {said}")
    for host in ("lab1", "lab2"):
        st = host_state(fleet, host)
        assert st["lock"] == "free" and st["active"] == "active" and st["fail_env"] == 0, (host, st)
        assert st["installed"] == [st["meta"]["files"]["script"]["sha256"], st["meta"]["files"]["unit"]["sha256"]]
        assert st["meta"].get("status") != "failed" and st["ctas"] == CTAS_OF[st["meta"]["profile"]], (host, st)
        if host in report and verb == "apply":
            status = report[host]["status"]
            if status == "applied":
                assert st["current"] > before[host]["current"] and st["meta"]["profile"] == rest[0], (host, st)
            else:
                assert st["current"] == before[host]["current"], (host, status, st)
    drift = fleet.knobfleet("drift", "--json", "--limit", "lab1,lab2")
    assert drift.returncode == 0, drift.stdout[-2000:]
