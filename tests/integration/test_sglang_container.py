"""Real SGLang 0.5.23 in a podman container on a lab host (issue 55): the cached install (its venv, its model and
the Python its venv was made from) mounted read-only into the lab's small local image (built from files, loaded at
boot: nothing is pulled), started by a hand-written `podman run` unit. knobfleet adopts that unit as generation 0,
applies a profile whose serve script execs `podman run` of the image by ID with the install's mounts, verifies the
engine from /proc of the container's process (not the podman client, the unit's main process), records the start
and its phases from the unit's journal, and `rollback --to 0` brings the hand-written unit back. Each real SGLang
start is 1-2 minutes here, so the module keeps to two restarts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from knobfleet.lab import sglang_install
from knobfleet.lab.hostfiles import SGLANG_SCRIPT_PATH, SGLANG_SERVICE
from knobfleet.lab.nspawn import Lab
from tests.integration.conftest import Fleet, lab_path
from tests.integration.test_sglang import healthy, in_sync, kf


@pytest.fixture(scope="module")
def cfleet(lab_state: Path) -> Iterator[Fleet]:
    lab = Lab(lab_path(lab_state))
    lab.down()
    first = lab.host(1).name  # the lab's own name for its first host
    hosts = [s.name for s in lab.up(1, runtime="podman", sglang=(first,))]
    assert healthy(hosts, 400), "the hand-written podman unit's SGLang never became healthy"
    yield Fleet(lab, None, hosts)
    lab.down()


def test_real_sglang_in_a_container_is_verified_from_proc_and_rolled_back_to_the_hand_written_unit(
    cfleet: Fleet, tmp_path: Path
) -> None:
    host = cfleet.hosts[0]
    inst = sglang_install.layout()
    applied = kf(cfleet, "apply", "sglang-tiny", "--limit", host, "--yes", "--json")
    assert applied.returncode == 0, applied.stdout[-2000:] + applied.stderr[-2000:]
    assert json.loads(applied.stdout)["hosts"][0]["status"] == "applied"
    script = cfleet.ssh(host, f"cat {SGLANG_SCRIPT_PATH}").stdout
    assert "/usr/bin/podman" in script and "--pull=never" in script and "sha256:" in script, script
    assert f"--volume={inst.root}:{inst.root}:ro" in script, script  # the cached install, read-only
    in_sync(cfleet, host)

    kf(cfleet, "drift", "--limit", host, "--save-probes", str(tmp_path), check=True)
    doc = json.loads((tmp_path / f"{host}.json").read_text())
    rt = doc["runtime"]
    assert rt["kind"] == "podman" and rt["running"] and rt["image_id"].startswith("sha256:")
    assert rt["pid"] != rt["client_pid"] == int(doc["unit_props"]["MainPID"])  # the engine, not the podman client
    engine = next(p for p in doc["processes"] if p["pid"] == rt["pid"])
    assert engine["cmdline"][:3] == [str(inst.python), "-m", "sglang.launch_server"], engine["cmdline"]
    assert engine["env"]["SGLANG_USE_CPU_ENGINE"] == "1" and engine["env"]["HF_HUB_OFFLINE"] == "1"

    hist = json.loads(kf(cfleet, "history", "--json", "--limit", host, check=True).stdout)["hosts"][0]
    starts = [e for e in hist["ledger"] if e.get("event") == "start"]
    assert starts, hist["ledger"]
    phases = [p["phase"] for p in starts[-1]["phases"]]
    assert "weights" in phases, starts[-1]  # read from the unit's journal, as for SGLang under a serve script
    print(f"real SGLang in podman: start {starts[-1]['start_s']}s, phases {starts[-1]['phases']}")

    zero = kf(cfleet, "rollback", "--limit", host, "--to", "0", "--yes")
    assert zero.returncode == 0, zero.stdout + zero.stderr
    in_sync(cfleet, host)
    unit = cfleet.ssh(host, f"cat /etc/systemd/system/{SGLANG_SERVICE}.service").stdout
    assert "ExecStart=/usr/bin/podman run --rm --name sglang-tiny" in unit, unit  # the hand-written unit again
