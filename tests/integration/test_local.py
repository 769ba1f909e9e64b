"""``--via local``: knobfleet runs on the GPU server itself. Inside a lab host (its root is an overlay of this
machine's, so this checkout and its virtualenv are there), with an inventory of ``localhost`` only: apply a
profile (applied and verified), drift clean, a hand edit found, and no ssh connection made by knobfleet."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Fleet, addr, boot_fleet

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "/root/serve_dsv4_decode.sh"


@pytest.fixture(scope="module")
def one(lab_state: Path) -> Iterator[Fleet]:
    f = boot_fleet(lab_state, 1)
    yield f
    f.lab.down()


def inventory_yaml() -> str:
    """localhost only, with the lab's host vars (the engine listens on the host's own loopback address)."""
    lab_vars = (REPO / "inventories" / "lab" / "group_vars" / "all" / "main.yml").read_text()
    lab_vars = lab_vars.replace(
        'knob_serve_listen_host: "{{ ansible_host }}"', f"knob_serve_listen_host: {addr('lab1')}"
    )
    lab_vars = lab_vars.replace("ansible_python_interpreter: /usr/bin/python3", "")
    return lab_vars + "\nansible_connection: local\nansible_python_interpreter: /usr/bin/python3\n"


def knobfleet_here(fleet: Fleet, *args: str) -> tuple[int, str, str]:
    """``knobfleet ARGS --via local`` run inside lab1, as root, with its own state dir and a localhost inventory."""
    argv = [sys.executable, "-m", "knobfleet", *args, "--via", "local", "-i", "/tmp/kf-local/inventory"]
    cmd = (
        "mkdir -p /tmp/kf-local/inventory/group_vars/all && "
        "printf '%s\\n' 'all:' '  hosts:' '    localhost: {}' > /tmp/kf-local/inventory/hosts.yml && "
        f"printf '%s' {shlex.quote(inventory_yaml())} > /tmp/kf-local/inventory/group_vars/all/main.yml && "
        f"cd {shlex.quote(str(REPO))} && KNOBFLEET_STATE_DIR=/tmp/kf-local/state PATH=/usr/bin:/bin:/usr/sbin:/sbin "
        + " ".join(shlex.quote(a) for a in argv)
    )
    proc = fleet.ssh("lab1", cmd, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def test_apply_verify_and_drift_on_the_machine_itself(one: Fleet) -> None:
    rc, out, err = knobfleet_here(one, "apply", "ctas512", "--yes", "--json")
    assert rc == 0, out + err
    (host,) = json.loads(out)["hosts"]
    assert host["host"] == "localhost" and host["status"] == "applied" and host["live"]["ok"], host
    # what an independent look at the host sees: the profile's knob in the script, the engine up
    assert "ctas512" in one.ssh("lab1", f"cat {SCRIPT}").stdout
    rc, out, err = knobfleet_here(one, "drift", "--json")
    assert rc == 0, out + err
    assert json.loads(out)["hosts"][0]["status"] == "in_sync"
    # the same apply again: decided by the local pre-check, no playbook run
    rc, out, err = knobfleet_here(one, "apply", "ctas512", "--yes", "--json")
    assert rc == 0 and json.loads(out)["hosts"][0]["status"] == "unchanged", out + err
    one.ssh("lab1", f"echo '# edited by hand' >> {SCRIPT}")
    rc, out, err = knobfleet_here(one, "drift", "--json")
    assert rc == 2, out + err
    kinds = {f["kind"] for f in json.loads(out)["hosts"][0]["findings"]}
    assert "file_changed" in kinds
    # knobfleet made no ssh connection from inside the host: its control sockets were never created
    assert one.ssh("lab1", "ls /tmp/kf-local/state/cp 2>/dev/null | wc -l").stdout.strip() == "0"
