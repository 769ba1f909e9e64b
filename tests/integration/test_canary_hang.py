"""Hung streams in a live canary (issue #57 item 5): two stand-ins behind SGLang's router, Prometheus and constant
load; the canary's profile makes half of lab1's streamed requests stop sending tokens (SGLANG_SIM_HANG) while every
status stays 200 and the engine's metrics look healthy. The canary's own probes see it, and it is rolled back for
hung streams, naming the host."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from knobfleet.fleet.router_kinds import SGLangRouter
from knobfleet.lab import loadgen
from knobfleet.lab.nspawn import Lab
from knobfleet.lab.router_lab import LabRouter
from tests.integration.conftest import Fleet, lab_path, start_load, wait_engines

N = 2  # one canary, one baseline
REPO = Path(__file__).resolve().parents[2]
HANG = """schema_version: 1
name: hang50
version: 1
extends: default
description: "The lab's stand-in only: half of the streamed requests stop sending tokens, status 200."
allow_unknown: [SGLANG_SIM_HANG, SGLANG_SIM_HANG_MAX_S]
env:
  SGLANG_SIM_HANG: 0.5
  SGLANG_SIM_HANG_MAX_S: 15
"""


@pytest.fixture(scope="module")
def hfleet(lab_state: Path) -> Iterator[Fleet]:
    lab = Lab(lab_path(lab_state))
    lab.down()
    lab.up(N, router=True)
    wait_engines([lab.host(i).address for i in range(1, N + 1)])
    yield Fleet(lab, None, [f"lab{i}" for i in range(1, N + 1)])
    lab.down()


def test_a_canary_whose_streams_hang_is_rolled_back_while_every_status_is_200(hfleet: Fleet, tmp_path: Path) -> None:
    from knobfleet.lab import monitoring
    from knobfleet.telemetry.promconfig import Target

    for name in ("default", "base"):  # the profile's extends chain, beside it (extends is read from its folder)
        shutil.copy(REPO / "profiles" / f"{name}.yaml", tmp_path / f"{name}.yaml")
    profile = tmp_path / "hang50.yaml"
    profile.write_text(HANG)
    lr = LabRouter(hfleet.lab.dir)
    monitoring.start_for_lab(hfleet.lab, [Target("router", lr.metrics_address, "router")])
    model = hfleet.lab.router_model_dir()
    assert model
    spec = loadgen.LoadSpec(lr.url, model, rate=8.0, max_requests=4000, max_seconds=400.0, max_tokens=64,
                            timeout_s=60.0)  # fmt: skip
    load, records, stop = start_load(spec)
    try:
        hfleet.knobfleet("apply", "default", "--yes", check=True, timeout=400)
        threading.Event().wait(8)  # a few scrapes of every engine before the canary
        # 16 probes a host and window, half of lab1's hanging: ~16 of 32 streams by the 2nd judged window is past
        # the rollback side's z (3.29 at these settings), before the swap after 3 windows could move the profile
        run = hfleet.knobfleet("canary", str(profile), "--hosts", "1", "--window", "10s", "--pre-windows", "2",
                               "--swap-after", "3", "--max-windows", "6", "--probes", "16", "--hang", "3s", "--yes",
                               "--json", timeout=600)  # fmt: skip
        assert run.stdout.startswith("{"), run.stdout + run.stderr
        doc = json.loads(run.stdout)
        print(f"verdict: {doc['verdict']}: {doc['reason']}")
        for w in doc["pre_period"] + doc["windows"]:
            print(f"window {w['window']}{' (pre)' if w.get('pre') else ''}: probes {w.get('probes')}, "
                  f"router {w.get('router')}, {w.get('skipped') or 'counted'}")  # fmt: skip
        assert run.returncode == 1 and doc["verdict"] == "rollback", run.stdout + run.stderr
        canary, baseline = hfleet.hosts  # `--hosts 1`: the lab's first host is the canary
        assert doc["reason"].startswith("hung streams: ") and f"on the canaries ({canary} " in doc["reason"], doc[
            "reason"
        ]
        assert "went 3s without a token, status 200, against 0 of" in doc["reason"]
        assert doc["followup"].startswith("canaries rolled back"), doc["followup"]
        assert (doc["settings"]["probes"], doc["settings"]["hang_s"]) == (16, 3.0)
        rows = doc["pre_period"] + doc["windows"]
        assert all(r["router"]["errors"] == 0 for r in rows if "router" in r)  # the router saw no 5xx: every 200
        assert all(p["hung"] == 0 for r in doc["pre_period"] for p in r["probes"].values())
        assert sum(r["probes"][canary]["hung"] for r in doc["windows"]) > 0
        assert all(r["probes"][baseline]["hung"] == 0 for r in doc["windows"])
        hist = json.loads(hfleet.knobfleet("history", "--json").stdout)["hosts"]
        on = {h["host"]: next(g["profile"] for g in h["generations"] if g["number"] == h["current"]) for h in hist}
        assert on == {canary: "default", baseline: "default"}, hist
    finally:
        stop.set()
        load.join(timeout=120)
        monitoring.stop(hfleet.lab.dir)
    outcomes = {k: sum(r.outcome == k for r in records) for k in loadgen.OUTCOMES}
    print(f"load: {len(records)} requests, {outcomes}")
    # a hung stream through the router ends cut or timed out, never with an error status
    assert [(r.index, r.outcome, r.status, r.detail) for r in records if r.outcome == "http_error"] == []
    assert all(w.healthy for w in SGLangRouter(lr.url).list_workers())
