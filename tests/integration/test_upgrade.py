"""An engine upgrade as knobfleet manages it, on the lab with two installs of the stand-in side by side.

Each of lab1 and lab2 gets a second install of the stand-in, /opt/sglang-0.5.22, whose launch flags come from the
real SGLang 0.5.22 catalog (profiles/catalogs/generated/sglang@0.5.22.yaml) and whose server info says 0.5.22; the
lab's own install is 0.5.23 (the pinned catalog). 0.5.23 removed ``--speculative-skip-dp-mlp-sync``: the 0.5.23
stand-in refuses it at start with argparse's "unrecognized arguments", as real SGLang would. Real Ansible, systemd
and sshd; the flow of an upgrade:

1. a profile pinned to 0.5.22 that uses the removed flag runs on both hosts (``knob_serve_launchers``);
2. the same knobs unpinned, applied to lab3 (running 0.5.23), are refused by the pre-check before any restart,
   naming the flag and the version that last had it;
3. ``profiles migrate --to sglang@0.5.23`` writes the next version: the flag left out, the pin moved;
4. the upgrade of lab1 alone (``--limit lab1``) is verified on 0.5.23 while lab2 stays on 0.5.22, and drift warns
   of the skew;
5. ``rollback`` brings lab1 back to its 0.5.22 launcher and the old flag, verified, and drift is in sync again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from knobfleet.lab.hostfiles import SIM_SITE, sim_flags
from tests.conftest import REPO
from tests.integration.conftest import Fleet

SVC = "sglang-dsv4-decode"
OLD = "/opt/sglang-0.5.22"
LAUNCHERS = {
    "0.5.22": ["/usr/bin/python3", f"{OLD}/launch_server.py"],
    "0.5.23": ["/usr/bin/python3", "-m", "sglang_sim.launch_server"],
}
REMOVED = "speculative-skip-dp-mlp-sync"
OLD_PROFILE = f"""\
# ctas512 on SGLang 0.5.22, with a flag 0.5.23 removed
name: up-old
version: 1
extends: ctas512
engine_version: "0.5.22"
args:
  {REMOVED}: true
"""


def main_pid(f: Fleet, host: str) -> str:
    return f.ssh(host, f"systemctl show -p MainPID --value {SVC}").stdout.strip()


def install_old(f: Fleet, host: str, flags_json: str) -> None:
    """A second stand-in install: the lab's package copied, its flags from the 0.5.22 catalog, VERSION 0.5.22+sim,
    and a launcher script that puts it first on sys.path (its cmdline is the launcher knobfleet renders)."""
    launch = (
        "import runpy, sys\n"
        f"sys.path.insert(0, {OLD!r})\n"
        "runpy.run_module('sglang_sim.launch_server', run_name='__main__', alter_sys=True)\n"
    )
    f.ssh(host, f"rm -rf {OLD} && mkdir -p {OLD} && cp -r {SIM_SITE} {OLD}/sglang_sim && "
                f"echo 0.5.22+sim > {OLD}/sglang_sim/VERSION")  # fmt: skip
    f.ssh(host, f"cat > {OLD}/launch_server.py <<'EOF'\n{launch}EOF")
    f.ssh(host, f"cat > {OLD}/sglang_sim/flags.json <<'EOF'\n{flags_json}EOF")


def drift(f: Fleet, limit: str) -> tuple[int, dict[str, Any]]:
    proc = f.knobfleet("drift", "--json", "--limit", limit)
    return proc.returncode, json.loads(proc.stdout)


def test_an_upgrade_refused_migrated_rolled_out_to_one_host_and_rolled_back(fleet: Fleet, tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for p in (REPO / "profiles").glob("*.yaml"):
        shutil.copy2(p, profiles / p.name)
    (profiles / "up-old.yaml").write_text(OLD_PROFILE)
    generated = yaml.safe_load((REPO / "profiles/catalogs/generated/sglang@0.5.22.yaml").read_text())
    overlay = yaml.safe_load((REPO / "profiles/catalogs/sglang.overlay.yaml").read_text())
    flags_json = sim_flags(generated, overlay)
    assert f'"{REMOVED}"' in flags_json
    for host in ("lab1", "lab2"):
        install_old(fleet, host, flags_json)
        assert fleet.inventory is not None
        (fleet.inventory / "host_vars").mkdir(exist_ok=True)
        (fleet.inventory / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump({"knob_serve_launchers": LAUNCHERS}))

    # 1. the pinned profile on both hosts: each launches its 0.5.22 install, with the flag 0.5.23 removed
    fleet.knobfleet("apply", str(profiles / "up-old.yaml"), "--limit", "lab1,lab2", "--yes", check=True)
    for host in ("lab1", "lab2"):
        cmdline = fleet.ssh(host, f"tr '\\0' ' ' < /proc/{main_pid(fleet, host)}/cmdline").stdout
        assert cmdline.startswith(f"/usr/bin/python3 {OLD}/launch_server.py ") and f"--{REMOVED}" in cmdline
    code, doc = drift(fleet, "lab1,lab2")
    assert code == 0 and doc["summary"]["engine_versions"] == {"0.5.22": ["lab1", "lab2"]}, doc

    # 2. the same knobs, unpinned (validated on 0.5.22, its fingerprint's version), on lab3 that runs 0.5.23
    fleet.knobfleet("apply", "ctas512", "--limit", "lab3", "--yes", check=True)
    before = main_pid(fleet, "lab3")
    unpinned = OLD_PROFILE.replace('engine_version: "0.5.22"\n', "fingerprint:\n  engine_version: sglang 0.5.22\n")
    (profiles / "up-unpinned.yaml").write_text(unpinned.replace("name: up-old", "name: up-unpinned"))
    proc = fleet.knobfleet("apply", str(profiles / "up-unpinned.yaml"), "--limit", "lab3", "--yes", "--json")
    host = json.loads(proc.stdout)["hosts"][0]
    assert proc.returncode == 1 and host["status"] == "refused", proc.stdout
    assert host["message"] == (
        "runs sglang 0.5.23 (the engine's server info): profile up-unpinned@1: args.speculative-skip-dp-mlp-sync: "
        "sglang 0.5.23 has no --speculative-skip-dp-mlp-sync: removed (last in sglang 0.5.22); drop it from the "
        "profile; nothing was changed"
    )
    assert main_pid(fleet, "lab3") == before  # refused before any restart

    # 3. migrate: the next version, valid on 0.5.23, the flag left out with a comment, the pin moved
    proc = fleet.knobfleet("profiles", "migrate", str(profiles / "up-old.yaml"), "--to", "sglang@0.5.23")
    assert proc.returncode == 0, proc.stderr
    assert f"args.--{REMOVED}: REMOVED in sglang 0.5.23" in proc.stdout
    text = (profiles / "up-old.yaml").read_text()
    assert 'engine_version: "0.5.23"' in text and f"  # {REMOVED}: true  # removed in sglang 0.5.23" in text

    # 4. the upgrade of lab1 alone: verified on 0.5.23 while lab2 stays on 0.5.22; drift warns of the skew
    lab2 = main_pid(fleet, "lab2")
    fleet.knobfleet("apply", str(profiles / "up-old.yaml"), "--limit", "lab1", "--yes", check=True)
    fleet.knobfleet("verify", "--limit", "lab1", check=True)
    code, doc = drift(fleet, "lab1,lab2")
    assert code == 0 and doc["summary"]["engine_versions"] == {"0.5.23": ["lab1"], "0.5.22": ["lab2"]}, doc
    assert doc["summary"]["engine_version_skew"] is True and main_pid(fleet, "lab2") == lab2
    proc = fleet.knobfleet("drift", "--limit", "lab1,lab2")
    assert "warning: engine version skew: 0.5.22 on lab2; 0.5.23 on lab1" in proc.stdout

    # 5. rollback: lab1 back on its 0.5.22 install and the old flag, verified; the fleet in sync on one version
    fleet.knobfleet("rollback", "--limit", "lab1", "--yes", check=True)
    cmdline = fleet.ssh("lab1", f"tr '\\0' ' ' < /proc/{main_pid(fleet, 'lab1')}/cmdline").stdout
    assert cmdline.startswith(f"/usr/bin/python3 {OLD}/launch_server.py ") and f"--{REMOVED}" in cmdline
    fleet.knobfleet("verify", "--limit", "lab1", check=True)
    code, doc = drift(fleet, "lab1,lab2")
    assert code == 0 and doc["summary"]["engine_versions"] == {"0.5.22": ["lab1", "lab2"]}, doc
