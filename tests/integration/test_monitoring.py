"""A real Prometheus in front of the lab: it scrapes every engine, each host's node_exporter and the controller's
drift textfile, and the shipped drift alert fires on a hand edit and resolves after the repair."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from knobfleet.lab import monitoring
from knobfleet.telemetry.prom import Prometheus
from tests.integration.conftest import Fleet, addr, boot_fleet, empty_panels, wait_until

SCRIPT = "/root/serve_dsv4_decode.sh"


@pytest.fixture(scope="module")
def watched(lab_state: Path) -> Iterator[tuple[Fleet, Prometheus]]:
    fleet = boot_fleet(lab_state, 2)
    monitoring.start_for_lab(fleet.lab)
    try:
        yield fleet, Prometheus(monitoring.prometheus_url(fleet.lab.dir))
    finally:
        fleet.lab.down()
        assert not monitoring.running(fleet.lab.dir)


def _up(prom: Prometheus) -> dict[tuple[str, str], float]:
    return {(s.labels["job"], s.labels.get("host", "-")): s.value for s in prom.query("up")}


def test_prometheus_scrapes_engines_nodes_and_the_controller(watched: tuple[Fleet, Prometheus]) -> None:
    _, prom = watched
    want = {("engine", "lab1"), ("engine", "lab2"), ("node", "lab1"), ("node", "lab2"), ("knobfleet", "-")}
    wait_until(lambda: {k for k, v in _up(prom).items() if v == 1} >= want, 30, "every target up")
    running = prom.query("sglang:num_running_reqs")
    assert {s.labels["host"] for s in running} == {"lab1", "lab2"}
    # node_exporter answers from inside each host (its own hostname), not this machine's
    names = {s.labels["host"]: s.labels.get("nodename") for s in prom.query("node_uname_info")}
    assert names == {"lab1": "lab1", "lab2": "lab2"}


def test_the_drift_alert_fires_on_a_hand_edit_and_resolves(watched: tuple[Fleet, Prometheus]) -> None:
    fleet, prom = watched
    textfile = monitoring.textfile_dir(fleet.lab.dir) / "knobfleet.prom"
    fleet.knobfleet("apply", "ctas512", "--yes", check=True)

    def drift_run() -> None:  # what the drift timer runs
        fleet.knobfleet("drift", "--prom", str(textfile))

    def alert_state() -> str | None:
        drift_run()
        found = [a for a in prom.alerts() if a.name == "KnobfleetDrift" and a.labels.get("host") == "lab2"]
        return found[0].state if found else None

    drift_run()
    wait_until(lambda: bool(prom.query("knobfleet_drift_last_run_timestamp_seconds")), 30, "drift textfile scraped")
    assert alert_state() is None
    # the drift series keep the host they are about (the scrape honours the textfile's labels)
    assert {s.labels["host"] for s in prom.query("knobfleet_probe_success")} == {"lab1", "lab2"}
    fleet.ssh("lab2", f"sed -i 's/TARGET_CTAS=512/TARGET_CTAS=640/' {SCRIPT}")
    started = time.monotonic()
    wait_until(lambda: alert_state() == "firing", 60, "KnobfleetDrift firing for lab2")
    fired_after = time.monotonic() - started
    assert not [a for a in prom.alerts() if a.labels.get("host") == "lab1"]
    fleet.knobfleet("apply", "ctas512", "--yes", "--limit", "lab2", check=True)
    wait_until(lambda: alert_state() is None, 60, "KnobfleetDrift resolved for lab2")
    print(f"drift alert fired {fired_after:.1f}s after the edit")


def test_load_profile_measures_where_the_live_load_is(watched: tuple[Fleet, Prometheus]) -> None:
    """A closed-loop load held at 60 then 76 requests in flight on lab1: the weights measured from Prometheus put
    at least 80% of the mass in the 48-80 band, as the campaign assumed."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    fleet, _ = watched
    started = time.time()
    client = REPO / "roles" / "knob_bench" / "files" / "client.py"
    subprocess.run(
        [sys.executable, str(client), "--url", f"http://{addr('lab1')}:30000", "--conc", "60,76", "--n-mult", "3",
         "--max-tokens", "256", "--warmup", "0", "--timeout", "120", "--out", "/dev/null"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    window = f"{int(time.time() - started) + 2}s"
    proc = fleet.knobfleet("load-profile", "--window", window, "--step", "1s", "--limit", "lab1", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    weights = {int(b): w for b, w in doc["weights"].items()}
    assert doc["engines"] == ["lab1"]
    assert weights[48] + weights[64] + weights[80] >= 0.8, doc
    text = fleet.knobfleet("load-profile", "--window", window, "--step", "1s", "--limit", "lab1")
    assert text.returncode == 0 and text.stdout.splitlines()[-1].startswith("--weights 48="), text.stdout
    print(text.stdout)


def test_every_shipped_dashboard_panel_returns_data_after_traffic(watched: tuple[Fleet, Prometheus]) -> None:
    """Each query of the stand-in's dashboard (it serves as SGLang 0.5.23) and of knobfleet's own, evaluated by
    the lab's real Prometheus after the load above (and a drift run for knobfleet's series): a panel whose query
    returns nothing fails with its title: the dashboard rot of a renamed metric."""
    fleet, prom = watched
    fleet.knobfleet("drift", "--prom", str(monitoring.textfile_dir(fleet.lab.dir) / "knobfleet.prom"))
    empty = empty_panels(prom, "sglang-0.5.23.json", "knobfleet.json")
    assert empty == [], "\n".join(empty)
