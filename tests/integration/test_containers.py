"""Engines in containers (the runtime seam, #55) on a real podman lab and a real docker lab, every test on both:
`lab up --runtime podman|docker` runs each stand-in in a container of a local image (built from files, loaded at
boot: nothing is pulled), started by a hand-written `podman run`/`docker run` unit, behind the real router.
knobfleet applies profiles whose serve script execs the runtime's `run` of the image by ID, verifies the engine from
/proc of the container's process as the runtime names it, finds what was run by hand, restores the previous image
and run line, and brings back the hand-written unit."""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from knobfleet.lab import labruntime
from knobfleet.lab.hostfiles import SERVICE
from knobfleet.lab.nspawn import Lab
from tests.integration.conftest import Fleet, lab_path, wait_engines
from tests.integration.test_router import rolling_apply_and_rollback

N = 3


@pytest.fixture(scope="module", params=labruntime.CONTAINER_RUNTIMES)
def pfleet(lab_state: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """A lab of N hosts whose stand-ins run in containers of ``request.param`` (podman, then docker)."""
    lab = Lab(lab_path(lab_state))
    lab.down()
    hosts = [lab.named(s.name) for s in lab.up(N, router=True, runtime=request.param)]
    wait_engines([h.address for h in hosts])
    yield Fleet(lab, None, [h.name for h in hosts])
    lab.down()


def runtime_of(fleet: Fleet) -> str:
    """The container runtime the fleet's lab runs its stand-ins with."""
    return labruntime.recorded(fleet.lab.dir)


def probe(fleet: Fleet, host: str, tmp: Path) -> dict[str, Any]:
    fleet.knobfleet("drift", "--limit", host, "--save-probes", str(tmp), "--json")
    doc: dict[str, Any] = json.loads((tmp / f"{host}.json").read_text())
    return doc


def findings(fleet: Fleet, host: str) -> list[str]:
    doc = json.loads(fleet.knobfleet("drift", "--limit", host, "--json").stdout)
    return [f["kind"] for f in doc["hosts"][0]["findings"]]


def test_a_rolling_apply_and_a_rollback_of_containerized_engines_under_load_drop_no_request(pfleet: Fleet) -> None:
    """Constant load through the real router while every container host gets a new generation and is rolled back, one
    at a time, each drained first: 0 failed requests (the router test's bar: 800 or more sent)."""
    rolling_apply_and_rollback(pfleet, by_url=True)


def test_a_container_host_is_verified_from_its_containers_process_and_hand_runs_are_found(
    pfleet: Fleet, tmp_path: Path
) -> None:
    host, runtime = pfleet.hosts[-1], runtime_of(pfleet)
    first = pfleet.knobfleet("apply", "ctas512", "--limit", host, "--yes", "--json", timeout=300)
    assert first.returncode == 0, first.stdout[-1500:] + first.stderr[-1500:]
    pfleet.knobfleet("apply", "ctas768", "--limit", host, "--yes", check=True, timeout=300)
    verified = pfleet.knobfleet("verify", "--limit", host, "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["hosts"][0]["findings"] == []
    doc = probe(pfleet, host, tmp_path / "p1")
    rt = doc["runtime"]
    assert rt["kind"] == runtime and rt["image_id"] == labruntime.image_id() and rt["running"]
    assert rt["pid"] != rt["client_pid"] == int(doc["unit_props"]["MainPID"])  # the engine, not the runtime's client
    engine = next(p for p in doc["processes"] if p["pid"] == rt["pid"])
    assert engine["cmdline"][:3] == ["/usr/bin/python3", "-m", "sglang_sim.launch_server"]
    assert engine["env"]["SGLANG_SM120_MMA_TARGET_CTAS"] == "768"  # read from /proc on the host
    assert len(doc["processes"]) >= 3  # its workers too

    # By hand: the unit stopped and the container started from another image, with another knob value.
    env = {k: v for k, v in engine["env"].items() if k.startswith("SGLANG_")} | {"SGLANG_SM120_MMA_TARGET_CTAS": "256"}
    never = ["--pull=never"] if runtime == "docker" else []  # docker's default pulls a missing image
    by_hand = shlex.join(
        [runtime, "run", "-d", "--rm", f"--name={SERVICE}", "--network=host", *never, *labruntime.RUN_OPTIONS[runtime],
         *[f"--env={k}={v}" for k, v in sorted(env.items())], "localhost/knobfleet-sim:2", *engine["cmdline"]]
    )  # fmt: skip
    stop = f"systemctl stop {SERVICE}; {runtime} rm --force {SERVICE} >/dev/null"
    pfleet.ssh(host, f"{stop}; {by_hand} >/dev/null; sleep 4")
    assert findings(pfleet, host) == ["service_inactive", "container_outside_unit", "image_mismatch", "env_mismatch"]
    repaired = pfleet.knobfleet("apply", "ctas768", "--limit", host, "--yes", timeout=300)
    assert repaired.returncode == 0, repaired.stdout[-1500:] + repaired.stderr[-1500:]
    assert findings(pfleet, host) == []

    # rollback: the previous generation's run line (ctas512, the same image), then the hand-written unit
    pfleet.knobfleet("rollback", "--limit", host, "--yes", check=True, timeout=300)
    assert probe(pfleet, host, tmp_path / "p2")["processes"][0]["env"]["SGLANG_SM120_MMA_TARGET_CTAS"] == "512"
    pfleet.knobfleet("rollback", "--limit", host, "--to", "0", "--yes", check=True, timeout=300)
    unit = pfleet.ssh(host, f"systemctl cat {SERVICE}").stdout
    assert f"ExecStart=/usr/bin/{runtime} run --rm --name" in unit and "localhost/knobfleet-sim:1" in unit
    assert findings(pfleet, host) == []


def test_an_image_that_is_not_on_the_host_is_refused_before_anything_stops(pfleet: Fleet, tmp_path: Path) -> None:
    host = pfleet.hosts[1]
    pfleet.knobfleet("apply", "ctas512", "--limit", host, "--yes", check=True, timeout=300)
    before = probe(pfleet, host, tmp_path / "p1")["runtime"]["pid"]
    inv = tmp_path / "inventory"
    shutil.copytree(pfleet.lab.dir / "inventory", inv)
    missing = labruntime.build_image("localhost/knobfleet-sim:3", "3")[1]  # built here, never loaded there
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / f"{host}.yml").write_text(f"knob_serve_image: {missing}\n")
    proc = pfleet.knobfleet("apply", "ctas768", "-i", str(inv), "--limit", host, "--yes", timeout=300)
    assert proc.returncode == 1, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert f"runs image {missing}, but no image {missing} on this host: nothing is pulled" in proc.stdout + proc.stderr
    assert probe(pfleet, host, tmp_path / "p2")["runtime"]["pid"] == before  # nothing stopped
    assert findings(pfleet, host) == []
