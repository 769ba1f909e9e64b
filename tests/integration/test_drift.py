"""Drift on the real lab: inject each fault over SSH, detect and name it, repair with apply, get a clean report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Fleet, addr, restart_sh, touch_later_sh

SVC = "sglang-dsv4-decode"
SCRIPT = "/root/serve_dsv4_decode.sh"
UNIT = f"/etc/systemd/system/{SVC}.service"
DROPIN = f"/etc/systemd/system/{SVC}.service.d/override.conf"
MAIN = f"$(systemctl show -p MainPID --value {SVC})"
RESTART = restart_sh(SVC, "{addr}")  # {addr}: filled in per host below

# (fault, shell command injected on the host, {kind: knob name or None}) — one row per fault.
FAULTS: list[tuple[str, str, dict[str, str | None]]] = [
    (
        "sed edit, no restart",
        f"sed -i 's/TARGET_CTAS=512/TARGET_CTAS=768/' {SCRIPT} && {touch_later_sh(SCRIPT)}",
        {"file_changed": None, "stale_process": None},
    ),
    (
        "sed edit, restarted",
        f"sed -i 's/TARGET_CTAS=512/TARGET_CTAS=768/' {SCRIPT} && {RESTART}",
        {"file_changed": None, "env_mismatch": "SGLANG_SM120_MMA_TARGET_CTAS"},
    ),
    (
        "drop-in Environment=",
        f"mkdir -p {DROPIN[:-14]} && printf '[Service]\\nEnvironment=SGLANG_SM120_MMA_NSPLIT_MAX=4\\n'"
        f" > {DROPIN} && systemctl daemon-reload && {RESTART}",
        {"dropin_present": None, "env_unexpected": "SGLANG_SM120_MMA_NSPLIT_MAX"},
    ),
    (
        "drop-in ExecStart=",
        f"mkdir -p {DROPIN[:-14]} && printf '[Service]\\nEnvironment=SGLANG_SM120_MMA_TARGET_CTAS=64\\n"
        "ExecStart=\\nExecStart=/usr/bin/python3 -m sglang_sim.launch_server --model-path /m --host {addr} "
        f"--port 30000\\n' > {DROPIN} && systemctl daemon-reload && {RESTART}",
        {
            "dropin_present": None,
            "env_mismatch": "SGLANG_SM120_MMA_TARGET_CTAS",
            "env_missing": "SGLANG_SM120_MMA_BLOCK_H",
            "argv_mismatch": None,
        },
    ),
    (
        "unit edited, no daemon-reload",
        f"echo '# tuned by hand' >> {UNIT} && {touch_later_sh(UNIT)}",
        {"daemon_reload_needed": None, "file_changed": None},
    ),
    ("script without exec", f"sed -i 's/^exec \\\\$/\\\\/' {SCRIPT} && {RESTART}", {"argv_mismatch": None}),
    (
        "typo'd knob set by hand",
        f"sed -i 's/^set -euo pipefail$/&\\nexport SGLANG_SM120_MMA_TARGET_CTS=768/' {SCRIPT} && {RESTART}",
        {"env_unexpected": "SGLANG_SM120_MMA_TARGET_CTS"},
    ),
    ("service stopped", f"systemctl stop {SVC}", {"service_inactive": None}),
    ("engine not answering", f"kill -STOP {MAIN}", {"not_ready": None}),
    ("script deleted", f"rm {SCRIPT}", {"file_missing": None}),
]


def drift(fleet: Fleet, *extra: str) -> tuple[int, dict[str, Any]]:
    proc = fleet.knobfleet("drift", "--json", *extra)
    assert proc.stderr == "" or proc.returncode in (2, 4, 6), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def by_host(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in report["hosts"]}


def test_unapplied_hosts_are_unmanaged(fleet: Fleet) -> None:
    code, report = drift(fleet)
    assert code == 2
    for h in report["hosts"]:
        assert h["status"] == "drift" and [f["kind"] for f in h["findings"]] == ["unmanaged"]


def test_clean_fleet_reports_exit_0(fleet: Fleet) -> None:
    fleet.knobfleet("apply", "ctas512", "--yes", check=True)
    code, report = drift(fleet)
    assert code == 0, report
    assert report["summary"]["in_sync"] == 3 and not report["summary"]["version_skew"]
    assert all(h["findings"] == [] and h["profile"] == "ctas512" for h in report["hosts"])


@pytest.mark.parametrize("start", range(0, len(FAULTS), 3))
def test_faults_are_detected_named_and_repaired(fleet: Fleet, start: int) -> None:
    batch = list(zip(fleet.hosts, FAULTS[start : start + 3], strict=False))
    for host, (_, command, _) in batch:
        fleet.ssh(host, command.replace("{addr}", addr(host)))
    code, report = drift(fleet)
    assert code == 2
    hosts = by_host(report)
    for host, (fault, _, kinds) in batch:
        found = hosts[host]["findings"]
        for kind, name in kinds.items():
            hits = [f for f in found if f["kind"] == kind]
            assert hits, f"{fault}: no {kind} on {host}: {found}"
            if name is not None:
                assert any(f.get("name") == name for f in hits), f"{fault}: {kind} does not name {name}: {hits}"
        for f in found:
            if f["kind"] in ("env_mismatch", "env_missing") and f.get("source") != "engine":
                assert f["pid"] and "expected" in f
    # repair: resume a stopped process, remove drop-ins, re-apply the declared profile
    for host, _ in batch:
        fleet.ssh(host, f"kill -CONT {MAIN} 2>/dev/null; rm -rf {DROPIN[:-14]}; systemctl daemon-reload", check=False)
    fleet.knobfleet("apply", "ctas512", "--yes", check=True)
    fleet.ssh("lab1", "true")
    code, report = drift(fleet)
    assert code == 0, json.dumps(report, indent=1)[:3000]


def test_declared_profile_and_unreachable_host(fleet: Fleet, tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    shutil.copytree(fleet.inventory, inv)
    hosts = (inv / "hosts.yml").read_text()
    hosts = hosts.replace("        lab3:\n", "        lab3:\n          knob_profile: ctas768\n")
    hosts += f"        lab9:\n          ansible_host: {addr('lab9')}\n"  # in this lab's block, not booted
    (inv / "hosts.yml").write_text(hosts)
    proc = subprocess.run(
        [sys.executable, "-m", "knobfleet", "drift", "--json", "-i", str(inv), "--prom", str(tmp_path / "kf.prom")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 6, proc.stderr
    report = by_host(json.loads(proc.stdout))
    assert report["lab9"]["status"] == "unreachable"
    (f,) = report["lab3"]["findings"]
    assert f["kind"] == "profile_mismatch" and f["expected"].startswith("ctas768@2")
    prom = (tmp_path / "kf.prom").read_text()
    assert 'knobfleet_drift_findings{host="lab3",kind="profile_mismatch"} 1' in prom
    assert 'knobfleet_probe_success{host="lab9"} 0' in prom
    assert 'knobfleet_profile_info{host="lab1",profile="ctas512",version="2",hash="sha256:' in prom


def test_verify_with_testinfra(fleet: Fleet) -> None:
    started = time.monotonic()
    proc = fleet.knobfleet("verify", "--testinfra", "--json")
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert json.loads(proc.stdout)["testinfra"]["passed"] is True
    fleet.ssh("lab2", f"sed -i 's/TARGET_CTAS=512/TARGET_CTAS=768/' {SCRIPT} && {restart_sh(SVC, addr('lab2'))}")
    proc = fleet.knobfleet("verify", "--testinfra", "--json", "--limit", "lab2")
    assert proc.returncode == 2 and json.loads(proc.stdout)["testinfra"]["passed"] is False
    fleet.knobfleet("apply", "ctas512", "--yes", "--limit", "lab2", check=True)
    print(f"verify --testinfra round trip: {time.monotonic() - started:.1f}s")


def test_fast_path_and_playbook_observe_the_same_state(fleet: Fleet) -> None:
    """The SSH fast path runs the role's probe module itself: its documents equal the playbook's."""
    from knobfleet.fleet.inventory import load_hosts
    from knobfleet.fleet.probe import probe

    hosts = load_hosts(fleet.inventory)
    fast = probe(hosts, fleet.inventory, via="ssh")
    slow = probe(hosts, fleet.inventory, via="ansible")
    for name in fleet.hosts:
        a, b = fast[name].doc, slow[name].doc
        assert isinstance(a, dict) and isinstance(b, dict), (a, b)
        for doc in (a, b):
            doc.pop("time"), doc.pop("probe_s")
            for state in (doc.get("server_info") or {}).get("internal_states") or []:
                state.pop("last_gen_throughput", None)  # /health_generate really generates: it moves
            for proc in doc.get("processes") or []:
                # running, sleeping or in a disk wait depends on the instant (an engine answering a request, a
                # loaded machine's I/O); stopped (T) and zombie (Z) are what the findings read, compared as they are
                if proc.get("state") in ("R", "D"):
                    proc["state"] = "S"
        diff = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
        assert not diff, f"{name}: fast path vs playbook: {diff}"
    # and from the command line, both ways give the same verdicts
    code_fast, rep_fast = drift(fleet, "--via", "ssh")
    code_slow, rep_slow = drift(fleet, "--via", "ansible")
    assert (code_fast, rep_fast) == (code_slow, rep_slow)


def main_pids(fleet: Fleet) -> dict[str, int]:
    return {h: int(fleet.ssh(h, f"systemctl show -p MainPID --value {SVC}").stdout) for h in fleet.hosts}


@pytest.mark.parametrize("start", range(0, len(FAULTS), 3))
def test_plan_apply_and_drift_agree_on_every_fault(fleet: Fleet, start: int) -> None:
    """One rule: plan finds what drift finds, apply does what plan said (restarts exactly where it said it
    would, never on a host it called in sync or refused), and afterwards drift finds nothing."""
    fleet.knobfleet("apply", "ctas512", "--yes", check=True)
    batch = list(zip(fleet.hosts, FAULTS[start : start + 3], strict=False))
    for host, (_, command, _) in batch:
        fleet.ssh(host, command.replace("{addr}", addr(host)))
    _, report = drift(fleet)
    drifted = {h["host"]: {f["kind"] for f in h["findings"]} for h in report["hosts"]}
    plan = json.loads(fleet.knobfleet("plan", "ctas512", "--json").stdout)
    planned = {h["host"]: h for h in plan["hosts"]}
    for host in fleet.hosts:
        kinds = {f["kind"] for f in planned[host]["live"]["findings"]}
        assert kinds == drifted[host], (host, kinds, drifted[host])
        assert (planned[host]["status"] == "in-sync") == (not drifted[host]), planned[host]
    before = main_pids(fleet)
    # refused hosts first: with the default policy nothing changes on them
    refused = [h for h in fleet.hosts if planned[h]["actions"] == ["refuse"]]
    if refused:
        proc = fleet.knobfleet("apply", "ctas512", "--yes", "--json", "--limit", ",".join(refused))
        assert proc.returncode == 1
        assert all(h["status"] == "refused" for h in json.loads(proc.stdout)["hosts"])
        assert {h: p for h, p in main_pids(fleet).items() if h in refused} == {h: before[h] for h in refused}
    applied = json.loads(fleet.knobfleet("apply", "ctas512", "--yes", "--json", "--foreign-dropins", "remove").stdout)
    after = main_pids(fleet)
    for h in applied["hosts"]:
        host, actions = h["host"], planned[h["host"]]["actions"]
        restarts = bool({"restart", "start"} & set(actions)) or "remove-dropin" in actions or actions == ["refuse"]
        assert h["status"] in ("applied", "unchanged"), h
        assert (after[host] != before[host]) == restarts, (host, actions, before[host], after[host])
    code, report = drift(fleet)
    assert code == 0, json.dumps(report, indent=1)[:3000]


def test_an_interrupted_apply_is_a_finding_until_the_lock_is_broken(fleet: Fleet) -> None:
    fleet.knobfleet("apply", "ctas512", "--yes", check=True)
    state = f"/var/lib/knobfleet/{SVC}"
    lock = '{"run_id": "20261130T000000-dead00", "operator": "ops", "since": "then", "controller": "gone:1"}'
    fleet.ssh("lab1", f"echo '{lock}' > {state}/lock")
    code, report = drift(fleet, "--limit", "lab1")
    assert code == 2 and [f["kind"] for f in report["hosts"][0]["findings"]] == ["interrupted_apply"]
    plan = json.loads(fleet.knobfleet("plan", "ctas512", "--json", "--limit", "lab1").stdout)
    assert plan["hosts"][0]["actions"] == ["refuse"] and "--break-lock" in plan["hosts"][0]["message"]
    before = main_pids(fleet)["lab1"]
    assert fleet.knobfleet("apply", "ctas512", "--yes", "--limit", "lab1").returncode == 1
    assert main_pids(fleet)["lab1"] == before
    fleet.knobfleet("apply", "ctas768", "--yes", "--limit", "lab1", "--break-lock", check=True)
    ledger = fleet.ssh("lab1", f"grep lock-broken {state}/ledger.jsonl").stdout
    assert "20261130T000000-dead00" in ledger
    assert drift(fleet, "--limit", "lab1")[0] == 0
    fleet.knobfleet("apply", "ctas512", "--yes", "--limit", "lab1", check=True)
