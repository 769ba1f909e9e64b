"""SGLang's real router (sglang-router, pinned) in front of a 3-host lab: no request leaves this machine, and a
host drained through the router, restarted by systemd and put back loses no request under constant load. Every
knobfleet command here runs without -i: the running lab's default inventory must be the one `lab up --router`
wrote (with lab1..lab3 up, the checkout's inventories/lab has no router and nothing would drain)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from knobfleet.fleet.router import Outcome, Route, drain, readmit
from knobfleet.fleet.router_kinds import MonotonicClock, SGLangRouter, engine_inflight
from knobfleet.lab import loadgen
from knobfleet.lab.hostfiles import SERVICE
from knobfleet.lab.nspawn import Lab
from knobfleet.lab.router_lab import LabRouter, download_attempts
from tests.integration.conftest import (
    Fleet,
    addr,
    empty_panels,
    lab_path,
    restart_sh,
    signal_after,
    start_load,
    wait_engines,
)

N = 3  # three stand-ins behind the router: the rolling apply keeps two serving while one restarts


@pytest.fixture(scope="module")
def rfleet(lab_state: Path) -> Iterator[Fleet]:
    lab = Lab(lab_path(lab_state))
    lab.down()
    lab.up(N, router=True)
    wait_engines([lab.host(i).address for i in range(1, N + 1)])
    yield Fleet(lab, None, [f"lab{i}" for i in range(1, N + 1)])
    lab.down()


def removed_and_added(log: str) -> list[tuple[str, str]]:
    """("out", worker URL or "") and ("in", "") in the order the router's own log shows a worker removed and one
    registered and marked healthy again. sglang-router 0.3.2 logs "Removed worker URL"; SMG 1.13 logs its removal
    workflow (``definition_id=worker_removal``, after "Draining 1 worker(s) for 5s before removal") without the
    URL; both log "Activated 1 [of 1] worker(s)" on the way back."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", log)  # the routers colour their log: keys and values apart
    by_url = "Removed worker http" in text
    out = []
    for line in text.splitlines():
        removed = re.search(r"Removed worker (http://127\.\d+\.\d+\.\d+:\d+)", line)
        if removed:
            out.append(("out", removed.group(1)))
        elif not by_url and "definition_id=worker_removal" in line and "Workflow started" in line:
            out.append(("out", ""))
        elif re.search(r"Activated \d+ (?:of \d+ )?worker\(s\)", line):
            out.append(("in", ""))
    return out


def router_log(fleet: Fleet) -> str:
    return LabRouter(fleet.lab.dir).log.read_text(errors="replace")


def test_router_fronts_every_engine_from_a_local_tokenizer(rfleet: Fleet) -> None:
    router = SGLangRouter(LabRouter(rfleet.lab.dir).url)
    workers = router.list_workers()
    urls = rfleet.lab.worker_urls([rfleet.lab.host(i) for i in range(1, N + 1)])
    assert sorted(w.url for w in workers) == sorted(urls)
    assert all(w.healthy and w.id for w in workers)
    assert router.detect() == "0.3"
    model = rfleet.lab.router_model_dir()
    assert model and (Path(model) / "tokenizer.json").is_file()
    log = router_log(rfleet)
    assert f"Loading tokenizer '{model}'" in log.replace("\x1b", "")  # loaded from the local dir, by name
    assert download_attempts(log) == []
    listen = rfleet.lab.dir / "inventory" / "group_vars" / "all" / "router.yml"
    assert f"knob_serve_model_path: {model}" in listen.read_text()


def test_drain_restart_readmit_under_load_drops_nothing(rfleet: Fleet) -> None:
    lr = LabRouter(rfleet.lab.dir)
    model = rfleet.lab.router_model_dir()
    assert model
    spec = loadgen.LoadSpec(lr.url, model, rate=8.0, max_requests=200, max_seconds=25.0, max_tokens=256)
    records: list[loadgen.Record] = []
    started = threading.Event()
    load = threading.Thread(target=lambda: records.extend(loadgen.run(spec, on_start=lambda _t: started.set())))
    load.start()
    try:
        assert started.wait(10)
        host = rfleet.lab.host(2)
        worker = f"http://{host.address}:30000"
        router = SGLangRouter(lr.url)
        clock = MonotonicClock()
        # requests are in flight on the host when it is drained: the load has run for a few seconds
        threading.Event().wait(5)
        inflight = engine_inflight(worker, "sglang")
        assert inflight() > 0, "no request in flight on the host: the drain would prove nothing"
        route = Route(host.name, router, worker, clock, inflight, drain_timeout_s=30)
        drained = drain(route)
        assert drained.outcome is Outcome.OK, drained.message
        assert drained.inflight == 0 and not drained.in_router
        rfleet.ssh(host.name, restart_sh(SERVICE, host.address))
        readmitted = readmit(route)
        assert readmitted.outcome is Outcome.OK, readmitted.message
        assert route.out == set()
    finally:
        load.join(timeout=200)
    summary = loadgen.summarize(records)
    bad = [(r.index, r.outcome, r.status, r.detail) for r in records if r.outcome != "ok"]
    assert summary["sent"] == len(records) >= 150
    assert bad == []
    assert sum(r.stream for r in records) >= 75  # half of them long streams
    assert all(w.healthy for w in router.list_workers())
    assert download_attempts(router_log(rfleet)) == []


def test_router_errors_are_typed_one_liners(rfleet: Fleet) -> None:
    lr = LabRouter(rfleet.lab.dir)
    router = SGLangRouter(lr.url)
    clock = MonotonicClock()
    stranger = "http://127.0.1.200:30000"
    out = drain(Route("labX", router, stranger, clock, engine_inflight(stranger, "sglang")))
    assert out.outcome is Outcome.UNKNOWN_WORKER and out.in_router
    assert "\n" not in out.message and stranger in out.message
    gone = SGLangRouter("http://127.0.0.1:9")  # the discard port: nothing listens there
    first = rfleet.lab.host(1)
    out = drain(Route(first.name, gone, f"http://{first.address}:30000", clock, lambda: 0))
    assert out.outcome is Outcome.UNREACHABLE and "knob_router_url" in out.message


def test_a_worker_left_out_is_drift_and_router_readd_puts_it_back(rfleet: Fleet) -> None:
    """What a killed rollout leaves: lab3's worker removed from the real router by hand. `drift` names it
    (out_of_router, exit 2) from the router's own list, `router status` shows it OUT, `router readd` puts it back
    once its engine answers, and drift is clean again."""
    router = SGLangRouter(LabRouter(rfleet.lab.dir).url)
    worker = f"http://{addr('lab3')}:30000"
    router.remove(worker)
    try:
        drifted = rfleet.knobfleet("drift", "--json")
        assert drifted.returncode == 2, drifted.stdout + drifted.stderr
        out = out_of_router(drifted.stdout)
        assert out == {"lab1": [], "lab2": [], "lab3": [f"{LabRouter(rfleet.lab.dir).url} does not list {worker} among "
                       "its 2 worker(s): it sends this host no traffic; `knobfleet router readd --limit lab3` puts "
                       "it back"]}, drifted.stdout  # fmt: skip
        status = rfleet.knobfleet("router", "status")
        assert status.returncode == 2 and "OUT: not listed" in status.stdout, status.stdout + status.stderr
    finally:
        readd = rfleet.knobfleet("router", "readd", "--yes")
    assert readd.returncode == 0 and "lab3: " in readd.stdout, readd.stdout + readd.stderr
    assert worker in {w.url for w in router.list_workers() if w.healthy}
    clean = rfleet.knobfleet("drift", "--json")
    assert out_of_router(clean.stdout) == {"lab1": [], "lab2": [], "lab3": []}, clean.stdout + clean.stderr


def out_of_router(drift_json: str) -> dict[str, list[str]]:
    """Each host's out_of_router messages in `drift --json` (the hosts' other findings depend on what ran before)."""
    hosts = json.loads(drift_json)["hosts"]
    return {h["host"]: [f["message"] for f in h["findings"] if f["kind"] == "out_of_router"] for h in hosts}


def test_a_rolling_apply_and_a_rollback_under_load_drop_no_request(rfleet: Fleet) -> None:
    rolling_apply_and_rollback(rfleet, by_url=True)


def rolling_apply_and_rollback(rfleet: Fleet, by_url: bool) -> None:
    """The issue's bar: constant load through the real router (long streams in flight at every restart), a plain
    `apply ctas768 --yes` (no --serial: the capacity guard paces it, one worker out at a time) to every host, then
    a rollback of every host, both with router integration: 0 failed and 0 truncated requests out of every request
    sent; every host on its new generation and verified after the apply; the router's own log shows each worker
    taken out and put back; every worker healthy in the router at the end."""
    n = len(rfleet.hosts)
    lr = LabRouter(rfleet.lab.dir)
    model = rfleet.lab.router_model_dir()
    assert model
    before = len(router_log(rfleet))
    spec = loadgen.LoadSpec(lr.url, model, rate=8.0, max_requests=1400, max_seconds=150.0, max_tokens=256)
    records: list[loadgen.Record] = []
    started = threading.Event()
    load = threading.Thread(target=lambda: records.extend(loadgen.run(spec, on_start=lambda _t: started.set())))
    load.start()
    try:
        assert started.wait(10)
        threading.Event().wait(4)  # long streams are in flight everywhere before the first drain
        applied = rfleet.knobfleet("apply", "ctas768", "--yes", "--json", timeout=400)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        doc = json.loads(applied.stdout)
        assert [(h["status"], h["batch"]) for h in doc["hosts"]] == [("applied", b) for b in range(1, n + 1)]
        verified = rfleet.knobfleet("verify", "--json")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert {h["profile"] for h in json.loads(verified.stdout)["hosts"]} == {"ctas768"}
        rolled = rfleet.knobfleet("rollback", "--yes", timeout=400)
        assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    finally:
        load.join(timeout=260)
    summary = loadgen.summarize(records)
    bad = [(r.index, r.outcome, r.status, r.detail) for r in records if r.outcome != "ok"]
    print(f"rolling apply + rollback under load: {summary}")
    assert bad == []
    assert summary["sent"] == len(records) >= 800
    assert sum(r.stream for r in records) >= 300
    router = SGLangRouter(lr.url)
    urls = sorted(rfleet.lab.worker_urls([rfleet.lab.named(h) for h in rfleet.hosts]))
    assert sorted(w.url for w in router.list_workers() if w.healthy) == urls
    log = router_log(rfleet)[before:]
    assert download_attempts(log) == []
    events = removed_and_added(log)
    print(f"router log: {events}")
    # the apply and the rollback each took every worker out once and put it back, one at a time
    outs = [u for a, u in events if a == "out"]
    assert len(outs) == 2 * n and (not by_url or sorted(outs) == sorted(urls * 2)), events
    out_now = 0
    for action, _url in events:
        out_now = out_now + 1 if action == "out" else max(0, out_now - 1)
        assert out_now <= 1, events  # put back before the next one was taken out
    assert out_now == 0 and [a for a, _ in events].count("in") == len(outs), events


def test_canary_on_an_uneven_fleet_judges_the_change_not_the_hosts(rfleet: Fleet) -> None:
    """Router, Prometheus and constant load, one host made 8% slower from outside (`lab speed`, a host-level file
    the stand-in reads, as a slower GPU): an identical profile is not rolled back with the slow host as the canary,
    nor as the baseline; `canary nosplit --advisory` (split-K off: far slower at the lab's small batches) is judged
    a rollback and left in place (history and the router's worker list show nothing more changed) until the
    printed rollback; drift stays in sync on the slow host; no request fails; each canary leaves its record. (The
    judge's own promote/rollback actions are held by tests/unit/experiment/test_canary_run.py.)"""
    from knobfleet.lab import monitoring
    from knobfleet.telemetry.promconfig import Target

    monitoring.start_for_lab(rfleet.lab, [Target("router", LabRouter(rfleet.lab.dir).metrics_address, "router")])
    lr = LabRouter(rfleet.lab.dir)
    model = rfleet.lab.router_model_dir()
    assert model
    spec = loadgen.LoadSpec(lr.url, model, rate=8.0, max_requests=14000, max_seconds=1500.0, max_tokens=256)
    records: list[loadgen.Record] = []
    started = threading.Event()
    stop = threading.Event()
    load = threading.Thread(
        target=lambda: records.extend(loadgen.run(spec, on_start=lambda _t: started.set(), stop=stop))
    )
    load.start()
    # the crossover at lab size: 2 pre-period windows, 3 before the swap, at most 3 after it, of 30 s each (at
    # 15 s the stand-in's drift, 30 s time constant and redrawn at each restart, makes a window mostly noise)
    common = ["--hosts", "1", "--window", "30s", "--pre-windows", "2", "--swap-after", "3", "--max-windows", "6",
              "--yes", "--json"]  # fmt: skip
    verdicts: dict[str, dict[str, object]] = {}
    try:
        assert started.wait(10)
        rfleet.knobfleet("apply", "default", "--yes", check=True, timeout=400)
        slow = rfleet.lab.set_host_speed("lab1", 0.92)
        assert slow == 0.92 and rfleet.lab.host_speed("lab1") == 0.92
        drift = rfleet.knobfleet("drift", "--json")
        assert drift.returncode == 0, drift.stdout  # the host's speed is nothing knobfleet manages
        threading.Event().wait(8)  # a few scrapes of every engine before the first canary
        for case, slow_host in (("slow canary", "lab1"), ("slow baseline", "lab2")):
            for name in ("lab1", "lab2"):
                rfleet.lab.set_host_speed(name, 0.92 if name == slow_host else 1.0)
            same = rfleet.knobfleet("canary", "default", *common, timeout=600)
            doc = json.loads(same.stdout)
            if doc["verdict"] == "rollback":
                # an A/A is falsely rolled back rarely at 30 s windows (simulated, docs/TESTING.md), more often
                # with a loaded machine's stalls: a second, independent A/A must not be, which a judge that reads
                # the slow host as the change would fail every time (both roll back: ~0.01% by chance)
                print(f"{case}: A/A rolled back once: {doc['reason']}; judging a second A/A")
                same = rfleet.knobfleet("canary", "default", *common, timeout=600)
                doc = json.loads(same.stdout)
            verdicts[case] = doc
            assert doc["verdict"] in ("promote", "inconclusive"), same.stdout + same.stderr
            assert doc["windows_pre"] >= 2 and doc["canaries"] == ["lab1"] and doc["baseline"] == ["lab2"]
            # what the warm-up rule set aside after the restarts, kept in the record (canary_warm)
            assert set(doc["warmup"]) == {"windows", "requests", "unconverged_periods", "set_aside"}, doc["warmup"]
            print(f"{case}: warm-up set aside {doc['warmup']}")
            # the estimate itself is noisy at 30 s windows (the fresh-clone CI run read -11.0%, interval -21.5% to
            # +0.9%, not rolled back): the verdict is what must hold; the record and the output keep the numbers
            print(f"{case}: {doc['verdict']} tput {doc['intervals']['tput']}")
        textfile = monitoring.textfile_dir(rfleet.lab.dir) / "knobfleet-canary.prom"
        advisory = rfleet.knobfleet("canary", "nosplit", "--advisory", "--prom", str(textfile), *common, timeout=600)
        doc = json.loads(advisory.stdout)
        assert advisory.returncode == 1 and doc["verdict"] == "rollback", advisory.stdout + advisory.stderr
        assert doc["advisory"] and doc["intervals"]["tput"]["high"] < 0
        canary_board_has_data(doc, rfleet.lab.dir)
        # far slower: rolled back in the first period, before the swap, so the canary is the one left on it
        assert doc["followup"].startswith("advisory: the canaries (lab1) left on nosplit"), doc["followup"]
        assert "`knobfleet rollback --limit lab1 --yes`" in doc["followup"]
        assert not any(w.get("crossed") for w in doc["windows"]), doc["windows"]
        hist = json.loads(rfleet.knobfleet("history", "--json").stdout)["hosts"]
        on = {h["host"]: next(g["profile"] for g in h["generations"] if g["number"] == h["current"]) for h in hist}
        assert on == {"lab1": "nosplit", "lab2": "default", "lab3": "default"}, hist
        assert all(w.healthy for w in SGLangRouter(lr.url).list_workers())
        back = rfleet.knobfleet("rollback", "--limit", "lab1", "--yes", timeout=400)
        assert back.returncode == 0, back.stdout + back.stderr
        listed = rfleet.knobfleet("history", "--canaries")
        assert listed.returncode == 0 and listed.stdout.count(" default ") >= 2 and "(advisory)" in listed.stdout
        verified = rfleet.knobfleet("verify", "--json")
        assert verified.returncode == 0, verified.stdout
        assert {h["profile"] for h in json.loads(verified.stdout)["hosts"]} == {"default"}
    finally:
        for name in ("lab1", "lab2"):
            rfleet.lab.set_host_speed(name, 1.0)
        stop.set()
        load.join(timeout=120)
        monitoring.stop(rfleet.lab.dir)
    print({k: (v["verdict"], v["intervals"]) for k, v in verdicts.items()})
    bad = [(r.index, r.outcome, r.status, r.detail) for r in records if r.outcome != "ok"]
    assert bad == []
    assert all(w.healthy for w in SGLangRouter(lr.url).list_workers())


def canary_board_has_data(doc: dict[str, Any], lab_dir: Path) -> None:
    """The canary's textfile, scraped by the lab's Prometheus through the controller's node_exporter: the last
    interval it wrote is the one the canary printed, and every panel of knobfleet-canary.json returns data."""
    from knobfleet.lab import monitoring
    from knobfleet.telemetry.prom import Prometheus

    prom = Prometheus(monitoring.prometheus_url(lab_dir))
    want = doc["intervals"]["tput"]["high"]
    expr = 'knobfleet_canary_interval_high{profile="nosplit",metric="tput"}'
    deadline = time.monotonic() + 30
    while not [s for s in prom.query(expr) if s.value == pytest.approx(want, rel=1e-4)]:
        assert time.monotonic() < deadline, f"{expr} never read {want}: {prom.query(expr)}"
        time.sleep(1)
    verdicts = prom.query('knobfleet_canary_verdict{profile="nosplit"}')
    assert [s.labels["verdict"] for s in verdicts] == ["rollback"], verdicts
    empty = empty_panels(prom, "knobfleet-canary.json")
    assert empty == [], "\n".join(empty)


def _current_profiles(fleet: Fleet) -> dict[str, str]:
    hist = json.loads(fleet.knobfleet("history", "--json", check=True).stdout)["hosts"]
    return {h["host"]: next(g["profile"] for g in h["generations"] if g["number"] == h["current"]) for h in hist}


@pytest.mark.parametrize(
    ("command", "delay", "signame"),
    [
        ("apply", 3.0, "SIGTERM"),  # the first host's drain or restart
        ("apply", 9.0, "SIGINT"),  # a later host, or between hosts
        ("rollback", 4.0, "SIGTERM"),
        ("canary", 30.0, "SIGTERM"),  # the canary apply, or its first judged window
    ],
)
def test_a_signal_behind_the_router_leaves_every_worker_back_and_the_report_true(
    rfleet: Fleet, command: str, delay: float, signame: str
) -> None:
    """Issue 40's fault test with the router in front: SIGTERM or SIGINT to the controller during a routed rolling
    apply, a routed rollback and a canary (Prometheus and constant load through the router). Afterwards the router
    lists every worker again and healthy, `drift` finds every host in sync (which includes "listed by its router",
    a free lock and no generation marked failed), each host the report calls applied runs the new profile and every
    other host the one it had, and a canary's interrupted canaries run the current profile again. (The same sweep at
    ~250 points of the handler's code, through fakes of the router and Prometheus: tests/unit/ops/
    test_rollout_anywhere.py and tests/unit/experiment/test_canary_run.py.)"""
    import signal

    from knobfleet.lab import monitoring
    from knobfleet.telemetry.promconfig import Target

    lr = LabRouter(rfleet.lab.dir)
    rfleet.knobfleet("apply", "default", "--yes", check=True, timeout=400)
    if command == "rollback":
        rfleet.knobfleet("apply", "ctas768", "--yes", check=True, timeout=400)
    before = _current_profiles(rfleet)
    records: list[loadgen.Record] = []
    stop = threading.Event()
    load = None
    if command == "canary":
        monitoring.start_for_lab(rfleet.lab, [Target("router", LabRouter(rfleet.lab.dir).metrics_address, "router")])
        model = rfleet.lab.router_model_dir()
        assert model
        spec = loadgen.LoadSpec(lr.url, model, rate=8.0, max_requests=2000, max_seconds=240.0, max_tokens=64)
        load = threading.Thread(target=lambda: records.extend(loadgen.run(spec, stop=stop)))
        load.start()
        threading.Event().wait(8)  # a few scrapes of every engine
    args = {
        "apply": ["apply", "ctas512", "--serial", "1"],
        "rollback": ["rollback"],
        "canary": ["canary", "ctas512", "--hosts", "1", "--window", "10s", "--pre-windows", "2", "--min-windows",
                   "2", "--swap-after", "2", "--max-windows", "4"],
    }[command]  # fmt: skip
    try:
        rc, out, err, sent = signal_after([*args, "--yes", "--json"], delay, getattr(signal, signame))
    finally:
        stop.set()
        if load is not None:
            load.join(timeout=120)
            monitoring.stop(rfleet.lab.dir)
    assert rc in ((130,) if sent else ()) + (0, 1, 2), out[-2000:] + err[-2000:]
    doc = json.loads(out) if out.strip().startswith("{") else {}
    print(f"{command} + {signame} at {delay}s (sent: {sent}): exit {rc}; {err.strip().splitlines()[-3:]}")
    now = _current_profiles(rfleet)
    if command == "apply":
        for h in doc.get("hosts", []):
            want = "ctas512" if h["status"] == "applied" else before[h["host"]]
            assert now[h["host"]] == want, (h, now)
    if command == "canary" and sent:
        assert now == before, (now, err[-2000:])  # interrupted: the canaries were put back
    router = SGLangRouter(lr.url)
    urls = sorted(rfleet.lab.worker_urls([rfleet.lab.host(i) for i in range(1, N + 1)]))
    deadline = time.monotonic() + 30  # a worker the interrupted run put back turns healthy at the router's check
    while sorted(w.url for w in router.list_workers() if w.healthy) != urls and time.monotonic() < deadline:
        time.sleep(1)
    assert sorted(w.url for w in router.list_workers() if w.healthy) == urls
    drift = rfleet.knobfleet("drift", "--json")
    assert drift.returncode == 0, drift.stdout[-3000:]
    assert [(r.index, r.outcome, r.status) for r in records if r.outcome != "ok"] == []


# Slower than `default` beyond any noise (the stand-in's wave model: -45..-57% at C16/C32), and an engine that aborts
# its requests in flight on SIGTERM, as vLLM does (no drain of its own): a restart that the router still sends
# requests to cuts them. The gate used to restore every rejected host at once, none drained: 86 of 14,222 lost.
SLOW_ABORTING = (
    "name: slowabort\nversion: 1\nextends: default\nallow_unknown: [SGLANG_SIM_DRAIN_TIMEOUT_S]\n"
    "env:\n  SGLANG_SM120_MMA_BLOCK_H: 64\n  SGLANG_SM120_MMA_TARGET_CTAS: 8\n  SGLANG_SIM_DRAIN_TIMEOUT_S: 0\n"
)


def _generations(fleet: Fleet, inventory: Path | None = None) -> dict[str, Any]:
    args = ["history", "--json"] + (["-i", str(inventory)] if inventory else [])
    doc = json.loads(fleet.knobfleet(*args, check=True).stdout)
    return {h["host"]: h["current"] for h in doc["hosts"]}


def test_a_rejected_gate_and_rollback_fleet_under_load_drop_no_request(rfleet: Fleet, tmp_path: Path) -> None:
    """Under constant load through the router: `apply slowabort --gate --serial 1` ends after its first batch, lab1
    judged out of its router, rejected, restored, put back, lab2 and lab3 never touched; then `apply ctas768
    --serial 1 --rollback-fleet` where lab3's new generation crashes: lab3 restored, then lab1 and lab2 back one at a
    time, each drained first. 0 failed requests; the router's log shows every worker taken out and put back once
    per restart, never two out at once."""
    import shutil

    for parent in ("base", "default"):
        shutil.copy(Path(__file__).parents[2] / "profiles" / f"{parent}.yaml", tmp_path)
    (tmp_path / "slowabort.yaml").write_text(SLOW_ABORTING)
    inv = tmp_path / "inventory"  # the router lab's own inventory; lab3's every new generation crashes at start
    shutil.copytree(rfleet.lab.dir / "inventory", inv)
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / "lab3.yml").write_text(
        "knob_serve_host_env: {SGLANG_SIM_GPU: rtx-pro-6000, SGLANG_SIM_STARTUP_S: '1.5', "
        "SGLANG_SIM_TIME_SCALE: '0.25', SGLANG_SIM_FAIL: start}\n"
    )
    lr = LabRouter(rfleet.lab.dir)
    model = rfleet.lab.router_model_dir()
    assert model
    rfleet.knobfleet("apply", "default", "--yes", timeout=400, check=True)
    before_gens = _generations(rfleet)
    before = len(router_log(rfleet))
    spec = loadgen.LoadSpec(lr.url, model, rate=6.0, max_requests=3000, max_seconds=420.0, max_tokens=256)
    load, records, stop = start_load(spec)
    try:
        threading.Event().wait(4)  # long streams in flight everywhere before the first drain
        gate = ["--gate", "--baseline", "default", "--gate-conc", "16,32", "--gate-n-mult", "2",
                "--gate-max-tokens", "32"]  # fmt: skip
        gated = rfleet.knobfleet(
            "apply", str(tmp_path / "slowabort.yaml"), "--serial", "1", "--yes", "--json", *gate, timeout=500
        )
        assert gated.returncode == 1, gated.stdout[-2000:] + gated.stderr[-2000:]
        doc = json.loads(gated.stdout)
        assert [(h["host"], h["status"]) for h in doc["hosts"]] == [
            ("lab1", "failed"), ("lab2", "not-run"), ("lab3", "not-run")
        ], doc["hosts"]  # fmt: skip
        assert doc["hosts"][0]["message"].startswith("gate rejected: throughput at concurrency ")
        assert doc["hosts"][0]["restored"]["ok"] and doc["hosts"][0]["restored"]["profile"] == "default"
        assert [g["host"] for g in doc["gate"]] == ["lab1"] and not doc["gate"][0]["passed"]
        after_gate = _generations(rfleet)
        assert {h: after_gate[h] for h in ("lab2", "lab3")} == {h: before_gens[h] for h in ("lab2", "lab3")}
        fleet_back = rfleet.knobfleet(
            "apply", "ctas768", "-i", str(inv), "--serial", "1", "--rollback-fleet", "--yes", "--json", timeout=500
        )
        assert fleet_back.returncode == 1, fleet_back.stdout[-2000:] + fleet_back.stderr[-2000:]
        status = {h["host"]: h["status"] for h in json.loads(fleet_back.stdout)["hosts"]}
        assert status == {"lab1": "rolled-back", "lab2": "rolled-back", "lab3": "failed"}, status
    finally:
        stop.set()
        load.join(timeout=300)
    summary = loadgen.summarize(records)
    bad = [(r.index, r.outcome, r.status, r.detail) for r in records if r.outcome != "ok"]
    print(f"gate rejected + rollback-fleet under load: {summary}")
    assert bad == []
    assert summary["sent"] == len(records) >= 250
    verified = rfleet.knobfleet("verify", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert {h["profile"] for h in json.loads(verified.stdout)["hosts"]} == {"default"}
    router = SGLangRouter(lr.url)
    urls = sorted(rfleet.lab.worker_urls([rfleet.lab.host(i) for i in range(1, N + 1)]))
    assert sorted(w.url for w in router.list_workers() if w.healthy) == urls
    events = removed_and_added(router_log(rfleet)[before:])
    print(f"router log: {events}")
    # the gate's batch (lab1 once: its judging and its restore inside one drain), the rollout (lab1..lab3) and the
    # rollback-fleet (lab1, lab2): each out and back in before the next
    w = {f"lab{i}": f"http://{rfleet.lab.host(i).address}:30000" for i in range(1, N + 1)}
    assert [u for a, u in events if a == "out"] == [w["lab1"], w["lab1"], w["lab2"], w["lab3"], w["lab1"], w["lab2"]]
    out_now = 0
    for action, _url in events:
        out_now = out_now + 1 if action == "out" else max(0, out_now - 1)
        assert out_now <= 1, events
    assert out_now == 0 and [a for a, _ in events].count("in") == 6, events
