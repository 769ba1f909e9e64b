"""SMG (PyPI ``smg``, 1.13: the router SGLang users run today, formerly the SGLang Model Gateway) in front of a
3-host lab: the `sglang` router kind drives it unchanged. A plain rolling apply and a rollback under constant load
drop no request, SMG's own log shows each worker's removal (after its own 5 s drain) and activation one at a time,
and no download attempt is made (the tokenizer comes from a local directory, hub access off)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from knobfleet.fleet.router_kinds import SGLangRouter
from knobfleet.lab.nspawn import Lab
from knobfleet.lab.router_lab import LabRouter, download_attempts
from tests.integration.conftest import Fleet, lab_path, wait_engines
from tests.integration.test_router import N, rolling_apply_and_rollback, router_log


@pytest.fixture(scope="module")
def sfleet(lab_state: Path) -> Iterator[Fleet]:
    lab = Lab(lab_path(lab_state))
    lab.down()
    lab.up(N, router="smg")
    wait_engines([lab.host(i).address for i in range(1, N + 1)])
    yield Fleet(lab, None, [f"lab{i}" for i in range(1, N + 1)])
    lab.down()


def test_smg_fronts_every_engine_and_the_lab_says_which_router_it_runs(sfleet: Fleet) -> None:
    info = json.loads((sfleet.lab.dir / "router.json").read_text())
    assert (info["kind"], info["version"]) == ("smg", "1.13.0")
    router = SGLangRouter(LabRouter(sfleet.lab.dir).url)
    assert router.detect() == "0.3"  # the worker API of sglang-router >= 0.3: ids, 202 jobs
    urls = sfleet.lab.worker_urls([sfleet.lab.host(i) for i in range(1, N + 1)])
    assert sorted(w.url for w in router.list_workers() if w.healthy) == sorted(urls)
    status = json.loads(sfleet.knobfleet("lab", "status", "--json").stdout)
    services = {s["name"]: s["state"] for s in status["services"]}  # Prometheus too, where an earlier module ran it
    assert services["router (smg)"] == services["router metrics"] == "running", services
    assert download_attempts(router_log(sfleet)) == []


def test_a_rolling_apply_and_a_rollback_through_smg_drop_no_request(sfleet: Fleet) -> None:
    rolling_apply_and_rollback(sfleet, by_url=False)
