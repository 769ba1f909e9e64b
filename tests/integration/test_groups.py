"""Engine groups on the real lab: two 2-host multi-node engines (lab-g1 = lab1+lab2, lab-g2 = lab3+lab4; rank 0
serves the API, rank 1 joins it over TCP between the hosts' loopback addresses), applied, checked and broken on
purpose, each check made independently over SSH or HTTP.

- apply restarts each group as one unit (--serial 1 counts groups) and every rank's live /proc environ and
  cmdline carry its own flags;
- 21 single-rank mismatches (env knobs, flags, model path, engine version: in the inventory, in a package
  version file, by hand on a running rank) are all found, by `plan` (which refuses the group, changing nothing) or
  by `drift`; 4 allow-listed differences are not findings;
- a group whose rank 0 fails to come up goes back whole to its previous generation and serves again.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from knobfleet.lab.hostfiles import SERVICE, SIM_VERSION_FILE
from knobfleet.lab.nspawn import Lab
from tests.integration.conftest import Fleet, addr, lab_path, wait_until

HOSTS = ["lab1", "lab2", "lab3", "lab4"]
GROUP = {"lab1": ("lab-g1", 0), "lab2": ("lab-g1", 1), "lab3": ("lab-g2", 0), "lab4": ("lab-g2", 1)}
HEAD_HOST = {"lab-g1": "lab1", "lab-g2": "lab3"}
SCRIPT = "/root/serve_dsv4_decode.sh"
CTAS = "SGLANG_SM120_MMA_TARGET_CTAS"


def heads() -> dict[str, str]:
    """Each group's rank 0 address, in this session's lab."""
    return {group: addr(host) for group, host in HEAD_HOST.items()}


def server_info(head: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{head}:30000/get_server_info", timeout=5) as r:
        return dict(json.loads(r.read()))


def serving(head: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{head}:30000/health_generate", timeout=5) as r:
            return r.status == 200 and all(x["joined"] for x in server_info(head)["ranks"])
    except OSError:
        return False


def wait_groups(timeout: float = 90) -> None:
    for head in heads().values():
        wait_until(lambda head=head: serving(head), timeout, f"group with rank 0 {head} serving")  # type: ignore[misc]


@pytest.fixture(scope="module")
def gfleet(lab_state: Path) -> Iterator[Fleet]:
    lab = Lab(lab_path(lab_state))
    lab.down()
    lab.up(4, group_size=2)
    wait_groups()
    yield Fleet(lab, lab.dir / "inventory", HOSTS)
    lab.down()


def main_pid(f: Fleet, host: str) -> str:
    return f.ssh(host, f"systemctl show -p MainPID --value {SERVICE}").stdout.strip()


def live(f: Fleet, host: str) -> tuple[list[str], dict[str, str]]:
    pid = main_pid(f, host)
    argv = f.ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/cmdline").stdout.splitlines()
    env = dict(line.split("=", 1) for line in f.ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines())
    return argv, env


def test_the_lab_groups_run_as_multi_node_engines(gfleet: Fleet) -> None:
    for head in heads().values():
        assert [(r["rank"], r["joined"]) for r in server_info(head)["ranks"]] == [(1, True)]
    # a follower's health is SGLang's dummy server: 200 whatever the engine does, and no API behind it
    with urllib.request.urlopen(f"http://{addr('lab2')}:30000/health", timeout=5) as r:
        assert r.status == 200
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://{addr('lab2')}:30000/get_server_info", timeout=5)


def test_plan_shows_each_group_as_one_unit(gfleet: Fleet) -> None:
    proc = gfleet.knobfleet("plan", "ctas512")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "engine group lab-g1: lab1 (rank 0), lab2 (rank 1) — one unit, restarted together: pending" in proc.stdout
    assert "engine group lab-g2: lab3 (rank 0), lab4 (rank 1) — one unit" in proc.stdout


@pytest.mark.parametrize("command", ["apply", "rollback"])
def test_a_limit_with_one_rank_of_a_group_is_refused_changing_nothing(gfleet: Fleet, command: str) -> None:
    pids = {h: main_pid(gfleet, h) for h in HOSTS}
    args = ("apply", "ctas512") if command == "apply" else ("rollback",)
    proc = gfleet.knobfleet(*args, "--yes", "--limit", "lab2")
    assert proc.returncode not in (0, 2), proc.stdout + proc.stderr
    assert "group lab-g1: --limit leaves out lab1; a group restarts as a unit" in proc.stderr
    assert {h: main_pid(gfleet, h) for h in HOSTS} == pids


def test_apply_restarts_each_group_as_a_unit_with_each_ranks_flags(gfleet: Fleet) -> None:
    before = {h: main_pid(gfleet, h) for h in HOSTS}
    proc = gfleet.knobfleet("apply", "ctas512", "--yes", "--serial", "1", "--json", timeout=400)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [(h["host"], h["status"], h["batch"], h["group"]) for h in doc["hosts"]] == [
        ("lab1", "applied", 1, "lab-g1 rank 0"),
        ("lab2", "applied", 1, "lab-g1 rank 1"),
        ("lab3", "applied", 2, "lab-g2 rank 0"),
        ("lab4", "applied", 2, "lab-g2 rank 1"),
    ]
    for host in HOSTS:
        group, rank = GROUP[host]
        argv, env = live(gfleet, host)
        assert main_pid(gfleet, host) != before[host]
        assert env["SGLANG_SM120_MMA_TARGET_CTAS"] == "512"
        assert "--nnodes=2" in argv and f"--node-rank={rank}" in argv, argv
        assert f"--dist-init-addr={heads()[group]}:5000" in argv and f"--host={addr(host)}" in argv
    wait_groups()
    drift = gfleet.knobfleet("drift", "--json")
    assert drift.returncode == 0, drift.stdout + drift.stderr
    assert {h["status"] for h in json.loads(drift.stdout)["hosts"]} == {"in_sync"}


# --- mismatch injection -------------------------------------------------------------------------------------

BASE_ENV = yaml.safe_load((Path(__file__).parents[2] / "inventories/lab/group_vars/all/main.yml").read_text())[
    "knob_serve_host_env"
]
# (host, host vars, the name the finding carries); found by `plan`, which refuses the group and changes nothing
PLANNED = [
    ("lab2", {"knob_serve_host_env": {**BASE_ENV, "QUANT_CONFIG": "fp8"}}, "QUANT_CONFIG"),
    ("lab1", {"knob_serve_host_env": {**BASE_ENV, "SGLANG_ENABLE_TORCH_COMPILE": "1"}}, "SGLANG_ENABLE_TORCH_COMPILE"),
    ("lab4", {"knob_serve_host_env": {**BASE_ENV, "NCCL_ALGO": "Ring"}}, "NCCL_ALGO"),
    ("lab3", {"knob_serve_host_env": {**BASE_ENV, "TORCH_CUDA_ARCH_LIST": "12.0"}}, "TORCH_CUDA_ARCH_LIST"),
    ("lab2", {"knob_serve_host_env": {**BASE_ENV, "SGLANG_SIM_GPU": "h200"}}, "SGLANG_SIM_GPU"),
    ("lab4", {"knob_serve_host_env": {**BASE_ENV, "SGLANG_SIM_TIME_SCALE": "0.5"}}, "SGLANG_SIM_TIME_SCALE"),
    ("lab2", {"knob_serve_host_args": {"chunked-prefill-size": "4096"}}, "--chunked-prefill-size"),
    ("lab3", {"knob_serve_host_args": {"schedule-policy": "lpm"}}, "--schedule-policy"),
    ("lab1", {"knob_serve_host_args": {"kv-cache-dtype": "fp8_e5m2"}}, "--kv-cache-dtype"),
    ("lab4", {"knob_serve_host_args": {"page-size": "64"}}, "--page-size"),
    ("lab1", {"knob_serve_host_args": {"context-length": "8192"}}, "--context-length"),
    ("lab3", {"knob_serve_host_args": {"max-total-tokens": "65536"}}, "--max-total-tokens"),
    ("lab2", {"knob_serve_model_path": "/models/DeepSeek-V4-sim-int4"}, "model path"),
]
ALLOWED = [
    ("lab2", {"knob_serve_host_env": {**BASE_ENV, "NCCL_SOCKET_IFNAME": "eth1"}}),
    ("lab3", {"knob_serve_host_env": {**BASE_ENV, "GLOO_SOCKET_IFNAME": "eth2"}}),
    ("lab4", {"knob_serve_host_env": {**BASE_ENV, "CUDA_VISIBLE_DEVICES": "4,5,6,7"}}),
]


def host_vars(f: Fleet, host: str, data: dict[str, Any] | None) -> None:
    path = f.inventory / "host_vars" / f"{host}.yml"
    path.parent.mkdir(exist_ok=True)
    if data is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(yaml.safe_dump(data))


def plan_doc(f: Fleet) -> dict[str, Any]:
    proc = f.knobfleet("plan", "ctas768", "--json")
    return dict(json.loads(proc.stdout))


def group_findings(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (h["host"], f.get("name"))
        for h in doc["hosts"]
        for f in h.get("findings") or h.get("live", {}).get("findings") or []
        if f["kind"] in ("group_mismatch", "group_rank_down")
    ]


def settled_group_findings(f: Fleet, group: str, timeout: float = 60) -> list[tuple[str, str | None]]:
    """The group findings `drift` reports for ``group`` once every rank runs again (a rank restarted alone takes its
    rank 0 down with it, and systemd starts it again: until then its ranks read as down)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        doc = json.loads(f.knobfleet("drift", "--json").stdout)
        got = [
            (x["kind"], x.get("name"))
            for h in doc["hosts"]
            if GROUP[h["host"]][0] == group
            for x in h["findings"]
            if x["kind"].startswith("group_")
        ]
        others = [h["host"] for h in doc["hosts"] if GROUP[h["host"]][0] != group and h["status"] != "in_sync"]
        assert not others, f"the other group drifted too: {others}"
        if ("group_rank_down", None) not in got or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def test_every_single_rank_mismatch_is_found_and_allow_listed_ones_are_not(gfleet: Fleet) -> None:
    pids = {h: main_pid(gfleet, h) for h in HOSTS}
    found, missed = 0, []
    # 1. in the inventory: plan refuses the group (both ranks), names the knob, changes nothing
    for host, data, name in PLANNED:
        host_vars(gfleet, host, data)
        try:
            doc = plan_doc(gfleet)
        finally:
            host_vars(gfleet, host, None)
        group = GROUP[host][0]
        by = {h["host"]: h for h in doc["hosts"]}
        ranks = [h for h in HOSTS if GROUP[h][0] == group]
        if all(by[r]["status"] == "refused" for r in ranks) and name in by[ranks[0]]["message"]:
            found += 1
        else:
            missed.append((host, name, [by[r]["message"] for r in ranks]))
    for host, data in ALLOWED:  # allowed to differ: no refusal, no group finding
        host_vars(gfleet, host, data)
        try:
            doc = plan_doc(gfleet)
        finally:
            host_vars(gfleet, host, None)
        assert {h["status"] for h in doc["hosts"]} == {"pending"}, doc
        assert group_findings(doc) == []
    # 2. a package version file on one rank (each rank alone still matches its own generation): drift finds it,
    #    and plan refuses the group
    for host in ("lab2", "lab4", "lab1", "lab3"):
        gfleet.ssh(host, f"cp {SIM_VERSION_FILE} /root/VERSION.keep && echo 0.4.9-sim > {SIM_VERSION_FILE}")
        try:
            proc = gfleet.knobfleet("drift", "--json")
            got = [(h["host"], f.get("name")) for h in json.loads(proc.stdout)["hosts"] for f in h["findings"]]
            if proc.returncode == 2 and ("engine version" in {n for _, n in got}) and len(got) == 1:
                found += 1
            else:
                missed.append((host, "engine version (drift)", got))
            if host == "lab4":
                by = {h["host"]: h for h in plan_doc(gfleet)["hosts"]}
                if by["lab3"]["status"] == by["lab4"]["status"] == "refused":
                    found += 1
                else:
                    missed.append((host, "engine version (plan)", by["lab4"]["message"]))
        finally:
            gfleet.ssh(host, f"mv /root/VERSION.keep {SIM_VERSION_FILE}")
    assert {h: main_pid(gfleet, h) for h in HOSTS} == pids  # plan and drift changed nothing
    # 3. by hand on a running rank (an edit of its serve script, then a restart of that rank alone)
    edits = [
        ("lab2", "s/^export SGLANG_SM120_MMA_TARGET_CTAS=.*/export SGLANG_SM120_MMA_TARGET_CTAS=768/", CTAS),
        ("lab4", "s/--max-running-requests=128/--max-running-requests=64/", "--max-running-requests"),
        ("lab3", "s|^exec |export QUANT_CONFIG=fp8\\nexec |", "QUANT_CONFIG"),  # the quant config on the head only
    ]
    for host, sed, name in edits:
        gfleet.ssh(host, f"sed -i '{sed}' {SCRIPT} && systemctl restart {SERVICE}")
        got = settled_group_findings(gfleet, GROUP[host][0])
        if got == [("group_mismatch", name)]:
            found += 1
        else:
            missed.append((host, name, got))
        repair = gfleet.knobfleet("apply", "ctas512", "--yes", timeout=400)  # the group restarts as one
        assert repair.returncode == 0, repair.stdout + repair.stderr
        wait_groups()
    host_vars(gfleet, "lab2", {"knob_serve_host_env": {**BASE_ENV, "NCCL_SOCKET_IFNAME": "eth9"}})
    try:  # an allow-listed variable applied on one rank: the group comes up, and drift finds nothing
        applied = gfleet.knobfleet("apply", "ctas512", "--yes", timeout=400)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        wait_groups()
        clean = gfleet.knobfleet("drift", "--json")
        assert clean.returncode == 0 and group_findings(json.loads(clean.stdout)) == []
    finally:
        host_vars(gfleet, "lab2", None)
    print(f"mismatch injection: {found} found of {found + len(missed)}; missed: {missed}")
    assert not missed and found >= 20


def test_a_rank_that_fails_to_come_up_restores_the_whole_group(gfleet: Fleet) -> None:
    applied = gfleet.knobfleet("apply", "ctas512", "--yes", timeout=400)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_groups()
    meta = f"/var/lib/knobfleet/{SERVICE}/current/meta.json"
    before = {h: json.loads(gfleet.ssh(h, f"cat {meta}").stdout)["generation"] for h in ("lab1", "lab2")}
    host_vars(gfleet, "lab1", {"knob_serve_host_env": {**BASE_ENV, "SGLANG_SIM_FAIL": "start"}})
    try:
        # SGLANG_SIM_FAIL may differ between ranks in this test only (declared in the group's may_differ)
        groups_yml = gfleet.inventory / "group_vars" / "all" / "groups.yml"
        saved = groups_yml.read_text()
        decl = yaml.safe_load(saved)
        decl["knob_engine_groups"]["lab-g1"]["may_differ"] = ["SGLANG_SIM_FAIL"]
        groups_yml.write_text(yaml.safe_dump(decl))
        proc = gfleet.knobfleet("apply", "ctas768", "--yes", "--limit", "lab1,lab2", "--json", timeout=400)
    finally:
        host_vars(gfleet, "lab1", None)
        groups_yml.write_text(saved)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    by = {h["host"]: h for h in doc["hosts"]}
    assert by["lab1"]["status"] == by["lab2"]["status"] == "failed"
    assert "engine group lab-g1: lab1 failed" in by["lab2"]["message"]
    for h in ("lab1", "lab2"):
        assert by[h]["restored"]["ok"] and by[h]["restored"]["generation"] == before[h]
    wait_groups()
    after = gfleet.knobfleet("drift", "--json", "--limit", "lab1,lab2")
    assert after.returncode == 0, after.stdout + after.stderr
    for h in ("lab1", "lab2"):
        _, env = live(gfleet, h)
        assert env["SGLANG_SM120_MMA_TARGET_CTAS"] == "512"
