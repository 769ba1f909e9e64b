"""apply-profile on the real lab: real Ansible, real systemd, checked independently over SSH."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from knobfleet.fleet.inventory import load_hosts
from knobfleet.lab.hostfiles import serve_script
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import render_host
from tests.integration.conftest import Fleet

STATE = "/var/lib/knobfleet/sglang-dsv4-decode"
UNIT = "/etc/systemd/system/sglang-dsv4-decode.service"


def main_pid(fleet: Fleet, host: str) -> str:
    return fleet.ssh(host, "systemctl show -p MainPID --value sglang-dsv4-decode").stdout.strip()


def start_time(fleet: Fleet, host: str, pid: str) -> str:
    return fleet.ssh(host, f"cut -d' ' -f22 /proc/{pid}/stat").stdout.strip()


def environ(fleet: Fleet, host: str, pid: str) -> list[str]:
    return fleet.ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines()


def cgroup_pids(fleet: Fleet, host: str) -> list[str]:
    cg = fleet.ssh(host, "systemctl show -p ControlGroup --value sglang-dsv4-decode").stdout.strip()
    out = fleet.ssh(
        host, f"cat /sys/fs/cgroup/systemd{cg}/cgroup.procs 2>/dev/null || cat /sys/fs/cgroup{cg}/cgroup.procs"
    ).stdout
    return out.split()


def tree_hash(fleet: Fleet, host: str) -> str:
    return fleet.ssh(
        host,
        f"cd / && find {STATE} /root/serve_dsv4_decode.sh "
        "/etc/systemd/system/sglang-dsv4-decode.service -type f -o -type l | sort | "
        f"xargs -d '\\n' sha256sum 2>/dev/null; readlink {STATE}/current",
    ).stdout


def test_first_apply_adopts_and_makes_the_knob_live(fleet: Fleet) -> None:
    pids_before = {h: main_pid(fleet, h) for h in fleet.hosts}
    proc = fleet.knobfleet("apply", "ctas512", "--yes", "--json", check=True)
    report = json.loads(proc.stdout)
    assert [h["status"] for h in report["hosts"]] == ["applied"] * 3
    for host in fleet.hosts:
        pid = main_pid(fleet, host)
        assert pid != pids_before[host]
        pids = cgroup_pids(fleet, host)
        assert len(pids) == 4, pids  # main + 2 schedulers + detokenizer
        assert "SGLANG_SM120_MMA_TARGET_CTAS=512" in environ(fleet, host, str(pid)), host
        for p in pids:  # the workers renamed themselves like SGLang's: title only, start-up env overwritten
            if p != str(pid):
                title = fleet.ssh(host, f"tr '\\0' '\\n' < /proc/{p}/cmdline").stdout.split()
                assert title[0].startswith("sglang::"), (host, p, title)
                assert "SGLANG_SM120_MMA_TARGET_CTAS=512" not in environ(fleet, host, p), (host, p)
        cmdline = fleet.ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/cmdline").stdout.splitlines()
        assert cmdline[:3] == ["/usr/bin/python3", "-m", "sglang_sim.launch_server"]
        for flag in ("--disable-overlap-schedule", "--tp-size=2", "--trust-remote-code", "--mem-fraction-static=0.85"):
            assert flag in cmdline
        # The hand-written script is generation 0, byte for byte.
        adopted = fleet.ssh(host, f"cat {STATE}/generations/0000/serve_dsv4_decode.sh").stdout
        assert adopted == serve_script(fleet.lab.named(host))
        meta0 = json.loads(fleet.ssh(host, f"cat {STATE}/generations/0000/meta.json").stdout)
        assert meta0["status"] == "adopted"
        meta1 = json.loads(fleet.ssh(host, f"cat {STATE}/current/meta.json").stdout)
        assert (meta1["generation"], meta1["status"], meta1["profile"]) == (1, "good", "ctas512")


def test_installed_files_are_byte_identical_to_render(fleet: Fleet) -> None:
    profile = ProfileStore().resolve("ctas512")
    for hv in load_hosts(fleet.inventory):
        r = render_host(profile, hv)
        got = fleet.ssh(hv.host, f"sha256sum {hv.script_path} {hv.unit_path}").stdout.split()
        assert got[0] == hashlib.sha256(r.script.encode()).hexdigest(), hv.host
        assert got[2] == hashlib.sha256(r.unit.encode()).hexdigest(), hv.host
        cli = fleet.knobfleet("render", "ctas512", "--host", hv.host, check=True).stdout
        assert cli == r.script


def test_second_apply_changes_nothing(fleet: Fleet) -> None:
    before = {h: (main_pid(fleet, h), tree_hash(fleet, h)) for h in fleet.hosts}
    starts = {h: start_time(fleet, h, before[h][0]) for h in fleet.hosts}
    # default: one fast probe per host finds all three in sync, and no playbook runs at all
    fast = json.loads(fleet.knobfleet("apply", "ctas512", "--yes", "--json", check=True).stdout)
    assert [h["status"] for h in fast["hosts"]] == ["unchanged"] * 3 and fast["run_ids"] == []
    assert all(h["message"].startswith("already in sync") and h["live"]["ok"] for h in fast["hosts"])
    # --via ansible: the role's own idempotent run agrees (changed=0 in Ansible's stats)
    proc = fleet.knobfleet("apply", "ctas512", "--yes", "--json", "--via", "ansible", check=True)
    report = json.loads(proc.stdout)
    assert [h["status"] for h in report["hosts"]] == ["unchanged"] * 3 and len(report["run_ids"]) == 1
    assert [h["changed_tasks"] for h in report["hosts"]] == [0, 0, 0]
    for doc in (fast, report):
        assert all(not h["restarted"] for h in doc["hosts"])
        assert [h["generation"] for h in doc["hosts"]] == [1, 1, 1]
        assert [h["main_pid"] for h in doc["hosts"]] == [int(before[h][0]) for h in fleet.hosts]
    for host in fleet.hosts:
        pid = main_pid(fleet, host)
        assert pid == before[host][0] and start_time(fleet, host, pid) == starts[host]
        assert fleet.ssh(host, f"ls {STATE}/generations").stdout.split() == ["0000", "0001"]


def test_only_hosts_that_need_it_go_through_ansible(fleet: Fleet) -> None:
    before = main_pid(fleet, "lab1")
    fleet.ssh("lab2", "sed -i 's/TARGET_CTAS=512/TARGET_CTAS=768/' /root/serve_dsv4_decode.sh")
    report = json.loads(fleet.knobfleet("apply", "ctas512", "--yes", "--json", check=True).stdout)
    by = {h["host"]: h for h in report["hosts"]}
    assert len(report["run_ids"]) == 1  # one playbook run, for lab2 alone
    assert by["lab1"]["message"].startswith("already in sync") and by["lab3"]["status"] == "unchanged"
    assert by["lab2"]["status"] == "applied" and by["lab2"]["restarted"] and by["lab2"]["live"]["ok"]
    assert main_pid(fleet, "lab1") == before


def test_check_diff_touches_nothing(fleet: Fleet) -> None:
    before = {h: (main_pid(fleet, h), tree_hash(fleet, h)) for h in fleet.hosts}
    proc = fleet.knobfleet("apply", "ctas768", "--check", "--diff")
    assert proc.returncode == 2, proc.stderr
    assert "SGLANG_SM120_MMA_TARGET_CTAS 512 → 768" in proc.stdout
    assert "-export SGLANG_SM120_MMA_TARGET_CTAS=512" in proc.stdout
    assert "+export SGLANG_SM120_MMA_TARGET_CTAS=768" in proc.stdout
    for host in fleet.hosts:
        assert (main_pid(fleet, host), tree_hash(fleet, host)) == before[host]
    plan = fleet.knobfleet("plan", "ctas512")
    assert plan.returncode == 0 and "3 in-sync" in plan.stdout


def test_a_stopped_engine_is_planned_and_started_without_a_new_generation(fleet: Fleet) -> None:
    fleet.ssh("lab1", "systemctl stop sglang-dsv4-decode")
    plan = fleet.knobfleet("plan", "ctas512", "--limit", "lab1")
    assert plan.returncode == 2 and "would start (service_inactive)" in plan.stdout, plan.stdout
    (h,) = json.loads(fleet.knobfleet("apply", "ctas512", "--limit", "lab1", "--yes", "--json").stdout)["hosts"]
    assert (h["status"], h["message"], h["restarted"]) == ("unchanged", "the engine was not running: started it", False)
    assert h["live"]["ok"] and h["generation"] == h["previous"]
    assert fleet.knobfleet("drift", "--limit", "lab1").returncode == 0


def test_a_staged_file_the_host_rejects_is_never_installed(fleet: Fleet) -> None:
    """The stage step validates on the host (bash -n here, made to fail by a `bash` earlier in PATH):
    the apply fails naming the validator, and nothing but the staging copy changes."""
    host = "lab3"
    pid = main_pid(fleet, host)
    installed = f"sha256sum /root/serve_dsv4_decode.sh {UNIT}; ls {STATE}/generations; readlink {STATE}/current"
    before = fleet.ssh(host, installed).stdout
    fake = "printf '#!/bin/sh\\necho \"line 9: syntax error near unexpected token\" >&2\\nexit 2\\n'"
    fleet.ssh(host, f"{fake} > /usr/local/bin/bash && chmod 755 /usr/local/bin/bash")
    try:
        proc = fleet.knobfleet("apply", "ctas768", "--limit", host, "--yes", "--json")
    finally:
        fleet.ssh(host, "rm -f /usr/local/bin/bash")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (h,) = json.loads(proc.stdout)["hosts"]
    assert h["status"] == "failed" and h.get("restored") is None
    assert h["message"] == (
        "Stage, validate and install the rendered serve script and unit (under the host lock): "
        "bash -n rejected the staged script: line 9: syntax error near unexpected token"
    )
    assert fleet.ssh(host, installed).stdout == before and main_pid(fleet, host) == pid
    assert fleet.ssh(host, f"test -e {STATE}/lock", check=False).returncode == 1  # released


def test_template_injection_is_written_literally(fleet: Fleet, tmp_path: Path) -> None:
    payload = "{{ lookup('pipe','touch /tmp/knobfleet-pwned') }}"
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "evil.yaml").write_text(
        'name: evil\nversion: 1\nenv:\n  KF_PAYLOAD: "' + payload + '"\n  SGLANG_OPT_USE_MULTI_STREAM_OVERLAP: 0\n'
    )
    proc = fleet.knobfleet("apply", str(d / "evil.yaml"), "--limit", "lab1", "--yes", check=True)
    assert "applied" in proc.stdout
    script = fleet.ssh("lab1", "cat /root/serve_dsv4_decode.sh").stdout
    assert f"export KF_PAYLOAD={shlex.quote(payload)}\n" in script
    assert f"KF_PAYLOAD={payload}" in environ(fleet, "lab1", main_pid(fleet, "lab1"))
    assert not Path("/tmp/knobfleet-pwned").exists()
    for host in fleet.hosts:
        assert fleet.ssh(host, "test -e /tmp/knobfleet-pwned", check=False).returncode == 1


def test_two_concurrent_applies_one_proceeds_one_fails_fast(fleet: Fleet) -> None:
    argv = [sys.executable, "-m", "knobfleet", "apply", "-i", str(fleet.inventory), "--limit", "lab2", "--yes"]
    a = subprocess.Popen([*argv, "ctas768"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    b = subprocess.Popen([*argv, "blockh16"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = [(p.wait(timeout=300), *p.communicate()) for p in (a, b)]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 1], results
    loser = next(r for r in results if r[0] == 1)
    assert "lab2: apply refused: locked by root (run " in loser[2]
    assert fleet.ssh("lab2", f"test -e {STATE}/lock", check=False).returncode == 1


@pytest.mark.parametrize("bad", ["SGLANG_SM120_MMA_TARGET_CTS: 512", "SGLANG_SM120_MMA_BLOCK_H: 7"])
def test_bad_profile_changes_nothing_anywhere(fleet: Fleet, tmp_path: Path, bad: str) -> None:
    d = tmp_path / "p"
    d.mkdir()
    (d / "bad.yaml").write_text(f"name: bad\nversion: 1\nenv:\n  {bad}\n")
    before = {h: tree_hash(fleet, h) for h in fleet.hosts}
    proc = fleet.knobfleet("apply", str(d / "bad.yaml"), "--yes")
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "bad.yaml: env.SGLANG_SM120_MMA_" in proc.stderr
    assert {h: tree_hash(fleet, h) for h in fleet.hosts} == before
