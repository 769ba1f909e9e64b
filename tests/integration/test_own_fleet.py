"""A fleet of one's own, as a new user gets it: the wheel and the knobfleet.serving collection built, installed
outside the repository (a fresh venv, a project-local collections path), `knobfleet init`, a profile written
there, applied to the lab with the knobfleet CLI and again with plain ansible-playbook and the installed
collection — both ending verified, both restoring the previous generation on a crashing apply
(SGLANG_SIM_FAIL=start makes the stand-in engine crash at start).

The project's own ansible.cfg carries the fleet-wide ssh settings (strict host keys, the lab's known_hosts),
and lab2 is reachable only through lab1 as a jump host: its inventory name ``lab2.jumponly`` resolves on lab1
(its /etc/hosts) and nowhere else, so both the playbook path and the SSH fast path must honour ProxyJump.
"""

from __future__ import annotations

import json
import os
import site
import socket
import subprocess
import sys
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from knobfleet import collection
from tests.conftest import REPO
from tests.integration.conftest import Fleet, addr, boot_fleet

JUMP_NAME = "lab2.jumponly"


@dataclass
class Installed:
    bin: Path
    project: Path
    env: dict[str, str]
    fleet: Fleet

    def run(self, *argv: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            list(argv), cwd=self.project, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        transcript = os.environ.get("OWN_FLEET_TRANSCRIPT")  # for docs/OWN_FLEET.md: the real output
        if transcript:
            with open(transcript, "a", encoding="utf-8") as fh:
                shown = " ".join(Path(argv[0]).name if i == 0 else a for i, a in enumerate(argv))
                fh.write(f"$ {shown}\n{proc.stdout}{proc.stderr}[exit {proc.returncode}]\n\n")
        return proc

    def knobfleet(self, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.bin / "knobfleet"), *args, timeout=timeout)

    def playbook(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(REPO / ".venv" / "bin" / "ansible-playbook"), *args, timeout=300)


def _lab_vars() -> dict[str, object]:
    data = yaml.safe_load((REPO / "inventories" / "lab" / "group_vars" / "all" / "main.yml").read_text())
    return {k: v for k, v in data.items() if k.startswith("knob_serve_") and k != "knob_serve_listen_host"}


def write_inventory(path: Path, fleet: Fleet, jump_cfg: Path, known_hosts: Path, fail: set[str] = frozenset()) -> None:
    """lab1 directly (ssh settings from the project's ansible.cfg); lab2 only through lab1."""
    common = _lab_vars()
    hosts: dict[str, dict[str, object]] = {
        "lab1": {"ansible_host": addr("lab1"), "knob_serve_listen_host": addr("lab1")},
        "lab2": {
            "ansible_host": JUMP_NAME,
            "knob_serve_listen_host": addr("lab2"),
            "ansible_ssh_common_args": f"-F {jump_cfg} -o ProxyJump=lab1-jump -o UserKnownHostsFile={known_hosts} "
            "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -o ConnectTimeout=10",
        },
    }
    for name, hv in hosts.items():
        if name in fail:
            env = dict(common["knob_serve_host_env"])  # type: ignore[call-overload]
            hv["knob_serve_host_env"] = {**env, "SGLANG_SIM_FAIL": "start"}
    doc = {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_python_interpreter": "/usr/bin/python3",
                "ansible_ssh_private_key_file": str(fleet.lab.key),
                **common,
            },
            "hosts": hosts,
        }
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.fixture(scope="module")
def installed(lab_state: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    work = tmp_path_factory.mktemp("own-fleet")
    dist = work / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("knobfleet-*.whl")
    os.environ["PATH"] = f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"
    tarball = collection.build_tarball(REPO, dist, work / "coll-build")
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    # Dependencies come from the test's own environment (no network needed); knobfleet itself from the wheel.
    deps = next(p for p in site.getsitepackages() if p.endswith("site-packages"))
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "zz_deps.pth").write_text(deps + "\n")

    fleet = boot_fleet(lab_state, 2)
    home = work / "home"
    home.mkdir()
    env = {
        "PATH": f"{env_dir / 'bin'}:{REPO / '.venv' / 'bin'}:/usr/bin:/bin:/usr/sbin:/sbin",
        "HOME": str(home),
        "KNOBFLEET_STATE_DIR": str(work / "kf-state"),
        "LANG": "C.UTF-8",
    }
    proj = work / "myfleet"
    init = subprocess.run(
        [str(env_dir / "bin" / "knobfleet"), "init", str(proj)], env=env, capture_output=True, text=True, cwd=work
    )
    assert init.returncode == 0, init.stderr
    # The collection, installed the way a user installs it, where the project's ansible.cfg looks (./collections).
    subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "ansible-galaxy"),
            "collection",
            "install",
            "-p",
            str(proj / "collections"),
            str(tarball),
        ],
        check=True,
        capture_output=True,
        env=env,
    )
    # lab2 only behind lab1: a name lab1 resolves, this machine does not; its host key under that name.
    fleet.ssh("lab1", f"echo '{addr('lab2')} {JUMP_NAME}' >> /etc/hosts")
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(JUMP_NAME, 22)
    known = proj / "known_hosts"
    lines = fleet.lab.known_hosts.read_text().splitlines()
    lab2_key = next(ln for ln in lines if ln.split()[0] in (addr("lab2"), f"[{addr('lab2')}]:22"))
    known.write_text("\n".join([*lines, f"{JUMP_NAME} {' '.join(lab2_key.split()[1:])}"]) + "\n")
    jump_cfg = proj / "jump_ssh_config"
    jump_cfg.write_text(
        f"Host lab1-jump\n  HostName {addr('lab1')}\n  User root\n  IdentityFile {fleet.lab.key}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n"
    )
    # The fleet-wide ssh settings live in the project's ansible.cfg, as a user keeps them.
    cfg = (proj / "ansible.cfg").read_text()
    cfg = cfg.replace(
        "# ssh_common_args = -o ProxyJump=bastion.example.internal",
        f"ssh_common_args = -o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes",
    )
    (proj / "ansible.cfg").write_text(cfg)
    write_inventory(proj / "inventories" / "hosts.yml", fleet, jump_cfg, known)
    write_inventory(proj / "inventories" / "crash.yml", fleet, jump_cfg, known, fail={"lab1", "lab2"})
    (proj / "profiles" / "fleetprof.yaml").write_text(
        "schema_version: 1\nname: fleetprof\nversion: 1\nengine: sglang\ndescription: my fleet's profile\n"
        "env:\n  SGLANG_OPT_USE_MULTI_STREAM_OVERLAP: 0\n  SGLANG_SM120_MMA_TARGET_CTAS: 512\n"
        "args:\n  tp-size: 2\n  max-running-requests: 96\n"
    )
    yield Installed(env_dir / "bin", proj, env, fleet)
    fleet.lab.down()


def _generation(inst: Installed, host: str) -> int:
    out = inst.fleet.ssh(host, "readlink /var/lib/knobfleet/sglang-dsv4-decode/current").stdout.strip()
    return int(out.rsplit("/", 1)[-1])


def _verify(inst: Installed) -> dict[str, object]:
    proc = inst.knobfleet("verify", "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return doc  # type: ignore[no-any-return]


def test_profiles_of_the_project_validate_and_plan_through_the_jump_host(installed: Installed) -> None:
    proc = installed.knobfleet("profiles", "validate")
    assert proc.returncode == 0, proc.stderr
    assert [ln.split()[1] for ln in proc.stdout.splitlines()] == ["fleetprof@1", "mybase@1"]
    plan = installed.knobfleet("plan", "fleetprof")
    assert plan.returncode == 2, plan.stdout + plan.stderr  # changes pending on both hosts
    assert "lab1:" in plan.stdout and "lab2:" in plan.stdout and "SGLANG_SM120_MMA_TARGET_CTAS" in plan.stdout


def test_cli_apply_ends_verified_and_restores_a_crashing_apply(installed: Installed) -> None:
    proc = installed.knobfleet("apply", "fleetprof")  # no terminal, no --yes: refused, nothing changed
    assert proc.returncode == 64 and "pass --yes" in proc.stderr
    proc = installed.knobfleet("apply", "fleetprof", "--yes", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("applied") >= 2
    doc = _verify(installed)
    assert {h["host"]: (h["status"], h["profile"]) for h in doc["hosts"]} == {  # type: ignore[index,union-attr]
        "lab1": ("in_sync", "fleetprof"),
        "lab2": ("in_sync", "fleetprof"),
    }
    before = {h: _generation(installed, h) for h in ("lab1", "lab2")}
    crash = installed.knobfleet("apply", "fleetprof", "--yes", "-i", "inventories/crash.yml", timeout=600)
    assert crash.returncode == 1, crash.stdout + crash.stderr
    assert "SGLANG_SIM_FAIL" in crash.stdout + crash.stderr or "exited" in crash.stdout + crash.stderr
    assert {h: _generation(installed, h) for h in ("lab1", "lab2")} == before  # restored
    _verify(installed)


def test_plain_ansible_playbook_with_the_installed_collection(installed: Installed) -> None:
    vars_file = installed.project / "fleetprof.vars.yml"
    proc = installed.knobfleet("render", "fleetprof", "--what", "vars")
    assert proc.returncode == 0, proc.stderr
    vars_file.write_text(proc.stdout)
    # A changed profile (another CTAS value) so the plain run installs a new generation.
    prof = installed.project / "profiles" / "fleetprof.yaml"
    prof.write_text(prof.read_text().replace("\nversion: 1", "\nversion: 2").replace(": 512", ": 768"))
    proc = installed.knobfleet("render", "fleetprof", "--what", "vars")
    assert proc.returncode == 0, proc.stderr
    vars_file.write_text(proc.stdout)
    before = {h: _generation(installed, h) for h in ("lab1", "lab2")}
    run = installed.playbook(
        "knobfleet.serving.apply", "-i", "inventories/hosts.yml", "-e", f"@{vars_file}", "-e", "knob_serial=1"
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "Verify the live engine runs the new generation" in run.stdout
    after = {h: _generation(installed, h) for h in ("lab1", "lab2")}
    assert all(after[h] > before[h] for h in after), (before, after)  # a new generation (numbers skip failed ones)
    doc = _verify(installed)
    assert all(h["profile"] == "fleetprof" and h["version"] == 2 for h in doc["hosts"])  # type: ignore[index,union-attr]
    # A crashing apply: the role itself restores the previous generation, restarts and verifies it.
    crash = installed.playbook("knobfleet.serving.apply", "-i", "inventories/crash.yml", "-e", f"@{vars_file}")
    assert crash.returncode != 0
    assert crash.stdout.count("restarted, ready, verified") >= 2, crash.stdout[-4000:]
    assert {h: _generation(installed, h) for h in ("lab1", "lab2")} == after
    _verify(installed)


def test_fast_path_reaches_the_jump_host_only_host(installed: Installed) -> None:
    proc = installed.knobfleet("drift", "--via", "ssh", "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    assert [h["status"] for h in doc["hosts"]] == ["in_sync", "in_sync"]
