"""SMG (PyPI ``smg``, 1.13: the router SGLang users run today, formerly the SGLang Model Gateway) in front of a
4-host lab: the `sglang` router kind drives it unchanged. A plain rolling apply and a rollback under constant load
drop no request, SMG's own log shows each worker's removal (after its own 5 s drain) and activation one at a time,
and no download attempt is made (the tokenizer comes from a local directory, hub access off). A rejected `--gate`
ends the rollout after its first batch: the first host judged out of SMG, restored, put back; the other three never
touched; no request lost (the issue's scenario: 4 hosts behind SMG, an engine that aborts in flight on SIGTERM)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from knobfleet.fleet.router_kinds import SGLangRouter
from knobfleet.lab.nspawn import Lab
from knobfleet.lab.router_lab import LabRouter, download_attempts
from tests.integration.conftest import Fleet, lab_path, start_load, wait_engines
from tests.integration.test_router import (
    SLOW_ABORTING,
    _generations,
    removed_and_added,
    rolling_apply_and_rollback,
    router_log,
)

N = 4  # the gate's scenario: one batch judged and rejected, three hosts never touched


@pytest.fixture(scope="module")
def sfleet(lab_state: Path) -> Iterator[Fleet]:
    lab = Lab(lab_path(lab_state))
    lab.down()
    lab.up(N, router="smg")
    wait_engines([lab.host(i).address for i in range(1, N + 1)])
    hosts = [f"lab{i}" for i in range(1, N + 1)]
    yield Fleet(lab, None, hosts)
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


def test_a_rejected_gate_on_4_hosts_behind_smg_ends_after_the_first_batch_and_drops_no_request(
    sfleet: Fleet, tmp_path: Path
) -> None:
    """`apply slowabort --gate --serial 1` under constant load through SMG: the first host is drained, judged (the
    gate's benches go straight to its engine), rejected, restored and put back; the rollout stops there, so the
    other three hosts keep their generation; SMG's log shows that one worker out and back in once; 0 failed
    requests. The engine aborts its requests in flight on SIGTERM, so any undrained restart would show."""
    import shutil
    import threading

    from knobfleet.lab import loadgen
    from knobfleet.lab.router_lab import LabRouter

    for parent in ("base", "default"):
        shutil.copy(Path(__file__).parents[2] / "profiles" / f"{parent}.yaml", tmp_path)
    (tmp_path / "slowabort.yaml").write_text(SLOW_ABORTING)
    first, *others = sfleet.hosts
    sfleet.knobfleet("apply", "default", "--yes", timeout=400, check=True)
    before_gens = _generations(sfleet)
    before = len(router_log(sfleet))
    model = sfleet.lab.router_model_dir()
    assert model
    spec = loadgen.LoadSpec(LabRouter(sfleet.lab.dir).url, model, rate=6.0, max_requests=2000, max_seconds=300.0,
                            max_tokens=256)  # fmt: skip
    load, records, stop = start_load(spec)
    try:
        threading.Event().wait(4)  # long streams in flight everywhere before the first drain
        gated = sfleet.knobfleet(
            "apply", str(tmp_path / "slowabort.yaml"), "--serial", "1", "--yes", "--json", "--gate", "--baseline",
            "default", "--gate-conc", "16,32", "--gate-n-mult", "2", "--gate-max-tokens", "32", timeout=500,
        )  # fmt: skip
    finally:
        stop.set()
        load.join(timeout=300)
    assert gated.returncode == 1, gated.stdout[-2000:] + gated.stderr[-2000:]
    doc = json.loads(gated.stdout)
    assert [(h["host"], h["status"]) for h in doc["hosts"]] == [(first, "failed")] + [(h, "not-run") for h in others]
    assert doc["hosts"][0]["message"].startswith("gate rejected: throughput at concurrency ")
    assert doc["hosts"][0]["restored"]["ok"] and doc["hosts"][0]["restored"]["profile"] == "default"
    assert [g["host"] for g in doc["gate"]] == [first] and not doc["gate"][0]["passed"]
    after = _generations(sfleet)
    assert {h: after[h] for h in others} == {h: before_gens[h] for h in others}  # never touched
    summary = loadgen.summarize(records)
    bad = [(r.index, r.outcome, r.status, r.detail) for r in records if r.outcome != "ok"]
    print(f"gate rejected on 4 hosts behind SMG, under load: {summary}")
    assert bad == [] and summary["sent"] == len(records) >= 250
    events = removed_and_added(router_log(sfleet)[before:])
    print(f"SMG log: {events}")
    assert [a for a, _ in events] == ["out", "in"], events  # the first host only: judged and restored in one drain
    verified = sfleet.knobfleet("verify", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert {h["profile"] for h in json.loads(verified.stdout)["hosts"]} == {"default"}
