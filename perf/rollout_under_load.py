"""A rolling `apply-profile --serial 1` through a fleet under traffic: what the clients see.

Boots N lab hosts (stand-in engines) behind SGLang's real router (`lab up --router`), sends constant load through
the router (`knobfleet.lab.loadgen`: long streams and plain completions, 256 tokens, 8 requests/s), and rolls a
changed knob across every host one at a time. It prints:

- failed / truncated requests (every outcome that is not ok);
- p50 / p99 TTFT before, during and after the rollout;
- capacity lost: worker-seconds out of the router (not listed, or listed unhealthy), and worker-seconds the
  engines themselves were not ready (health not 200) -- the physical minimum of a restart.

Modes (``--mode``):

- ``baseline``: the rollout WITHOUT router integration -- the inventory's ``knob_router_url`` is emptied, so the
  router keeps routing to an engine that restarts. The reason the feature exists.
- ``steps``: this script drives the router steps itself around one ``apply --limit HOST`` per host: drain
  (``fleet.router.drain``: out of the router, in-flight requests to 0), apply, readmit (back, healthy).
- ``integrated``: plain ``apply --serial 1`` with the router vars in the inventory, for when the rollout itself
  drives the steps.

``--engine-drain off`` starts the stand-ins with SGLANG_FORCE_SHUTDOWN=1 (they abort in-flight requests on
SIGTERM, as vLLM does with its default --shutdown-timeout 0); ``on`` (default) drains like SGLang.

``--bare`` needs no lab (and no lab lock): the engines are stand-in processes on 127.0.0.1 ports behind the
real router, and the rollout is a SIGTERM + start of each in turn (no apply); ``baseline`` then restarts them
as they are, ``steps`` drains each through the router first and readmits it after.

Raw results (one JSON per run, with every request's record) go to
perf/results/rollout_under_load-<mode>-drain-<on|off>[-bare].json.
Usage: python perf/rollout_under_load.py [--mode baseline|steps|integrated] [--hosts 4] [--rate 8] [--bare]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _lab import KNOBFLEET, REPO, table

sys.path.insert(0, str(REPO / "python"))
from knobfleet.fleet.router import Route, drain, readmit
from knobfleet.fleet.router_kinds import MonotonicClock, SGLangRouter, engine_inflight
from knobfleet.lab import loadgen
from knobfleet.lab.hostfiles import LabHost
from knobfleet.lab.nspawn import Lab
from knobfleet.lab.router_lab import LabRouter, download_attempts

RESULTS = REPO / "perf" / "results"
PROFILES = ("ctas512", "ctas768")  # a changed knob: SGLANG_SM120_MMA_TARGET_CTAS
SETTLE_S = 8.0  # load before and after the rollout


class Sampler(threading.Thread):
    """Every 0.2 s: which workers the router lists healthy, which engines answer 200 on /health."""

    def __init__(self, router: str, workers: list[str]) -> None:
        super().__init__(daemon=True)
        self.router = SGLangRouter(router, timeout=2.0)
        self.workers = workers
        self.stop = threading.Event()
        self.samples: list[tuple[float, set[str], set[str]]] = []

    def run(self) -> None:
        while not self.stop.wait(0.2):
            t = time.monotonic()
            try:
                listed = {w.url for w in self.router.list_workers() if w.healthy}
            except Exception:
                listed = set()
            ready = set()
            for w in self.workers:
                try:
                    with urllib.request.urlopen(w + "/health", timeout=1) as r:
                        if r.status == 200:
                            ready.add(w)
                except OSError:
                    pass
            self.samples.append((t, listed, ready))

    def seconds(self, a: float, b: float) -> tuple[float, float]:
        """(worker-seconds out of the router, worker-seconds not ready) between monotonic times a and b."""
        out = down = 0.0
        for (t0, listed, ready), (t1, _, _) in zip(self.samples, self.samples[1:], strict=False):
            if a <= t0 < b:
                out += (t1 - t0) * sum(w not in listed for w in self.workers)
                down += (t1 - t0) * sum(w not in ready for w in self.workers)
        return out, down


def inventory_for(mode: str, lab: Lab, dest: Path) -> Path:
    """The lab's inventory; for ``baseline`` a copy with ``knob_router_url`` emptied."""
    inv = lab.dir / "inventory"
    if mode != "baseline":
        return inv
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(inv, dest)
    router_yml = dest / "group_vars" / "all" / "router.yml"
    text = router_yml.read_text()
    router_yml.write_text(
        "\n".join('knob_router_url: ""' if ln.startswith("knob_router_url:") else ln for ln in text.splitlines()) + "\n"
    )
    return dest


def force_shutdown(inv: Path) -> None:
    """Engines that abort in-flight requests on SIGTERM: SGLANG_FORCE_SHUTDOWN=1 in every host's env."""
    import yaml

    main_yml = yaml.safe_load((inv / "group_vars" / "all" / "main.yml").read_text())
    env = {**main_yml["knob_serve_host_env"], "SGLANG_FORCE_SHUTDOWN": "1"}
    with open(inv / "group_vars" / "all" / "router.yml", "a", encoding="utf-8") as fh:
        fh.write(yaml.safe_dump({"knob_serve_host_env": env}, default_flow_style=False))


def apply(profile: str, inv: Path, *extra: str) -> None:
    proc = subprocess.run(
        [*KNOBFLEET, "apply", profile, "-i", str(inv), "--yes", *extra], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"apply {profile} {' '.join(extra)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )


def rollout(mode: str, profile: str, inv: Path, hosts: list[LabHost], router_url: str) -> list[dict[str, object]]:
    if mode in ("baseline", "integrated"):
        apply(profile, inv, "--serial", "1")
        return []
    router = SGLangRouter(router_url)
    clock = MonotonicClock()
    out: set[str] = set()
    steps: list[dict[str, object]] = []
    for h in hosts:
        worker = f"http://{h.address}:30000"
        route = Route(h.name, router, worker, clock, engine_inflight(worker, "sglang"), drain_timeout_s=30, out=out)
        res = drain(route)
        steps.append(asdict(res))
        if not res.ok:  # a failed drain has put its worker back itself
            raise SystemExit(f"{h.name}: drain failed: {res.message}")
        try:
            apply(profile, inv, "--limit", h.name)
        finally:
            back = readmit(route)
            steps.append(asdict(back))
        if not back.ok:
            raise SystemExit(f"{h.name}: readmit failed: {back.message}")
    return steps


class BareFleet:
    """Stand-in engines as local processes on 127.0.0.1 ports (no lab): start, stop (SIGTERM), restart."""

    def __init__(self, n: int, model: str, drain: bool) -> None:
        self.ports = [31201 + i for i in range(n)]
        self.model = model
        self.env = {**os.environ, "PYTHONPATH": str(REPO / "python"), "SGLANG_SIM_STARTUP_S": "1.5",
                    "SGLANG_SIM_TIME_SCALE": "0.25", "SGLANG_SIM_NOISE": "0"}  # fmt: skip
        if not drain:
            self.env["SGLANG_FORCE_SHUTDOWN"] = "1"
        self.procs = {p: self.start(p) for p in self.ports}
        for p in self.ports:
            self.ready(p)

    @property
    def workers(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def start(self, port: int) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "knobfleet.lab.sim.launch_server", "--model-path", self.model,
                "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        return subprocess.Popen(argv, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ready(self, port: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"stand-in on port {port}: not ready after {timeout:.0f}s")

    def restart(self, port: int) -> None:
        self.procs[port].send_signal(signal.SIGTERM)
        self.procs[port].wait(timeout=60)
        self.procs[port] = self.start(port)
        self.ready(port)

    def close(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            proc.wait(timeout=30)


def bare_rollout(mode: str, fleet: BareFleet, router_url: str) -> list[dict[str, object]]:
    router = SGLangRouter(router_url)
    clock = MonotonicClock()
    out: set[str] = set()
    steps: list[dict[str, object]] = []
    for port, worker in zip(fleet.ports, fleet.workers, strict=True):
        if mode == "steps":
            route = Route(str(port), router, worker, clock, engine_inflight(worker, "sglang"), 30, out=out)
            res = drain(route)
            steps.append(asdict(res))
            if not res.ok:  # a failed drain has put its worker back itself
                raise SystemExit(f"{worker}: drain failed: {res.message}")
        fleet.restart(port)
        if mode == "steps":
            back = readmit(Route(str(port), router, worker, clock, out=out))
            steps.append(asdict(back))
            if not back.ok:
                raise SystemExit(f"{worker}: readmit failed: {back.message}")
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("baseline", "steps", "integrated"), default="baseline")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate", type=float, default=8.0)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--engine-drain", choices=("on", "off"), default="on")
    ap.add_argument("--bare", action="store_true", help="stand-in processes on 127.0.0.1, no lab, no apply")
    ns = ap.parse_args()
    if ns.bare and ns.mode == "integrated":
        raise SystemExit("--bare: choose --mode baseline or steps (there is no apply to integrate)")
    lab = Lab()
    hosts: list[LabHost] = []  # the lab's, once `up` has claimed its slot (their addresses are the slot's)
    bare: BareFleet | None = None
    state = Path(tempfile.mkdtemp(prefix="knobfleet-rollout-")) if ns.bare else lab.dir
    lr = LabRouter(state, *((31200, 31209) if ns.bare else ()))  # a lab's is made again after `up` (its ports)
    try:
        if ns.bare:
            from knobfleet.lab import vllm_install

            model = str(vllm_install.ensure().model_dir)
            bare = BareFleet(ns.hosts, model, ns.engine_drain == "on")
            workers = bare.workers
            lr.start(workers)
        else:
            lab.down()
            lab.up(ns.hosts, router=True)
            hosts = [lab.host(i) for i in range(1, ns.hosts + 1)]
            lr = LabRouter(state)  # the ports of the slot `up` claimed
            model = lab.router_model_dir() or ""
            workers = lab.worker_urls(hosts)
            inv = inventory_for(ns.mode, lab, lab.dir / "inventory-baseline")
            if ns.engine_drain == "off":
                force_shutdown(inv)
            # Every host on a known generation first (no load yet): the measured rollout changes one knob on all.
            apply(PROFILES[1], inv, "--serial", "100%")
            lr.wait_healthy(workers)
        sampler = Sampler(lr.url, workers)
        sampler.start()
        spec = loadgen.LoadSpec(lr.url, model, rate=ns.rate, max_requests=100_000, max_seconds=900.0,
                                max_tokens=ns.max_tokens)  # fmt: skip
        stop = threading.Event()
        t0_box: list[float] = []
        records: list[loadgen.Record] = []
        load = threading.Thread(target=lambda: records.extend(loadgen.run(spec, t0_box.append, stop)))
        load.start()
        time.sleep(SETTLE_S)
        t_a = time.monotonic()
        if bare is not None:
            steps = bare_rollout(ns.mode, bare, lr.url)
        else:
            steps = rollout(ns.mode, PROFILES[0], inv, hosts, lr.url)
        t_b = time.monotonic()
        time.sleep(SETTLE_S)
        stop.set()
        load.join(timeout=300)
        sampler.stop.set()
        sampler.join(timeout=5)
        t0 = t0_box[0]
        windows = {"before": (0.0, t_a - t0), "during": (t_a - t0, t_b - t0), "after": (t_b - t0, 1e9)}
        summary = loadgen.summarize(records, windows)
        out_s, down_s = sampler.seconds(t_a, t_b + SETTLE_S)
        downloads = download_attempts(lr.log.read_text(errors="replace"))
    finally:
        if bare is not None:
            lr.stop()
            bare.close()
        else:
            lab.down()
    rows = []
    for w in ("before", "during", "after"):
        win: dict[str, Any] = summary[w]  # type: ignore[assignment]
        p50, p99 = win["ttft"]["p50_s"], win["ttft"]["p99_s"]
        rows.append([w, win["sent"], win["failed"], f"{(p50 or 0) * 1000:.0f}", f"{(p99 or 0) * 1000:.0f}"])
    bare_note = " (bare: no lab, no apply)" if ns.bare else ""
    print(f"rollout under load: mode={ns.mode}{bare_note} hosts={ns.hosts} rate={ns.rate}/s tokens={ns.max_tokens} "
          f"engine drain={ns.engine_drain}; rollout took {t_b - t_a:.1f}s")  # fmt: skip
    print(table(["window", "sent", "failed", "TTFT p50 ms", "TTFT p99 ms"], rows))
    print(f"requests: {summary['sent']} sent, {summary['ok']} ok, {summary['http_error']} HTTP errors, "
          f"{summary['connection_reset']} connection resets, {summary['truncated']} truncated streams, "
          f"{summary['timeout']} timeouts")  # fmt: skip
    print(f"capacity: {out_s:.1f} worker-s out of the router, {down_s:.1f} worker-s engines not ready "
          f"(physical minimum: the engines' own restart-to-ready)")  # fmt: skip
    print(f"router log download attempts: {len(downloads)}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    dest = RESULTS / f"rollout_under_load-{ns.mode}-drain-{ns.engine_drain}{'-bare' if ns.bare else ''}.json"
    dest.write_text(json.dumps({
        "mode": ns.mode, "bare": ns.bare, "hosts": ns.hosts, "rate": ns.rate, "max_tokens": ns.max_tokens,
        "engine_drain": ns.engine_drain, "rollout_s": t_b - t_a, "summary": summary,
        "worker_s_out_of_router": out_s, "worker_s_not_ready": down_s, "steps": steps,
        "download_attempts": downloads, "records": [asdict(r) for r in records],
    }, indent=1, sort_keys=True) + "\n")  # fmt: skip
    print(f"raw: {dest.relative_to(REPO)}")


if __name__ == "__main__":
    main()
