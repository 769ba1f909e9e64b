"""Restarts measured and priced on the real lab (stand-in engines under real systemd, real Ansible): every restart
knobfleet causes is read on the host (systemd's timestamps, the first health 200, the phases the engine logs in
the unit's journal) and kept in the service's ledger; ``history`` shows it; ``plan`` prices the next rollout from
it, and the rollout then takes about that long."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tests.integration.conftest import Fleet

PHASES = ["weights", "memory_pool", "cuda_graph", "serving"]  # the stand-in logs SGLang 0.5.23's lines


def applied(fleet: Fleet, profile: str, *more: str) -> dict[str, object]:
    doc: dict[str, object] = json.loads(fleet.knobfleet("apply", profile, "--yes", "--json", *more, check=True).stdout)
    return doc


def test_each_restart_is_measured_kept_shown_and_priced(fleet: Fleet) -> None:
    first = applied(fleet, "ctas512", "--serial", "1")
    hosts = first["hosts"]
    assert isinstance(hosts, list) and [h["status"] for h in hosts] == ["applied"] * 3
    for h in hosts:
        s = h["startup"]
        assert s["kind"] == "restart" and s["stop_s"] is not None and s["start_s"] > 0, h
        assert [p["phase"] for p in s["phases"]] == PHASES, s
        # the stand-in spends 40% / 10% / 50% of its start-up in weights, memory pool and graph capture
        weights, pool, graph = (p["s"] for p in s["phases"][:3])
        assert pool < weights < graph + 0.5, s
        print(f"{h['host']}: stop {s['stop_s']}s, start {s['start_s']}s, phases {s['phases']}")

    shown = fleet.knobfleet("history", check=True).stdout
    assert shown.count("restarts, newest last:") == 3 and "cuda_graph" in shown and "ctas512@" in shown, shown
    ledger = json.loads(fleet.knobfleet("history", "--json", check=True).stdout)["hosts"][0]["ledger"]
    (start,) = [e for e in ledger if e.get("event") == "start"]
    assert start["profile"] == "ctas512" and start["generation"] >= 1 and start["run_id"], start
    page = Path(tempfile.mkdtemp()) / "restarts.html"  # the restarts plotted, as the report page has them
    fleet.knobfleet("history", "--report", str(page), check=True)
    text = page.read_text()
    assert "3 measured restart(s) on 3 of 3 host(s)" in text and "<svg" in text and "cuda_graph" in text, text[:800]

    plan = fleet.knobfleet("plan", "ctas768", "--serial", "1")
    assert plan.returncode == 2, plan.stdout + plan.stderr
    assert "restarts: 3 on 3 host(s), in 3 batch(es)" in plan.stdout, plan.stdout
    assert "expected time: " in plan.stdout and "a batch for the rollout itself" in plan.stdout, plan.stdout
    print(plan.stdout[plan.stdout.index("restarts:") :])
    print(shown[: shown.index("restarts, newest last:") + 400])
    cost = json.loads(fleet.knobfleet("plan", "ctas768", "--serial", "1", "--json").stdout)["cost"]
    assert cost["unmeasured"] == [] and cost["batches"] == 3 and cost["wall_s"] > 0, cost
    assert {h["measured"]["basis"] for h in cost["hosts"]} <= {"this engine version", "any profile"}, cost

    second = applied(fleet, "ctas768", "--serial", "1")
    measured = float(second["wall_s"])  # type: ignore[arg-type]
    error = abs(cost["wall_s"] - measured) / measured
    # printed, not asserted: a timing bound fails on a loaded machine (25.1% in the 0.2.6 fresh-clone run, beside
    # two real-SGLang labs); perf/restart_plan.py measures it (docs/RESTARTS.md: within 25% on real SGLang)
    print(f"plan said {cost['wall_s']:.1f}s for the 3-host rollout, it took {measured:.1f}s ({error:+.0%})")
    assert measured > 0 and cost["restarts"] == 3, (cost, measured)
