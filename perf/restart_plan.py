"""Restarts priced in (issue #57): what `plan` says a rollout will take, against what it then takes, on a running lab.

Every restart knobfleet causes is measured on the host (systemd's timestamps, the first health 200, the engine's
start-up phases from the unit's journal) and kept in the service's ledger (docs/RESTARTS.md). This script, given a
lab that is up (``--lab-id``; every command runs with ``KNOBFLEET_LAB`` set to it):

1. applies the ``--warmup`` profiles in turn (``--serial``), so that every host has measured starts in its ledger
   and the controller has measured the rollout's own time per batch (the apply of the last warm-up profile);
2. for each ``--target`` profile: runs ``plan PROFILE --serial N`` (the text, then ``--json``: the expected wall
   time and each host's priced restart), then ``apply PROFILE --serial N --yes --json`` timed on this clock, and
   prints plan against measured: the whole rollout (plan / measured, and the plan's error relative to the measured
   time, as tests/integration/test_restarts.py judges it) and each host's stop + start as planned against the one
   its apply measured (measured / plan);
3. prints ``history`` (each host's last five starts, with the phases read from its journal).

Each apply's per-host start (kind, stop, start to ready, phases, compile cache cold/warm/off) is printed as it
happens, with the load average and the memory available before and after, and every command runs under a timeout.

Usage (real SGLang 0.5.23 on three lab hosts; the stand-in's DSv4 profiles do not start on real SGLang):
  nice -n 19 .venv/bin/knobfleet lab up --id rs -n 3 --sglang lab1,lab2,lab3
  nice -n 19 .venv/bin/python perf/restart_plan.py --lab-id rs \\
      --warmup sglang-tiny,sglang-sched --target sglang-tiny,sglang-sched
  nice -n 19 .venv/bin/knobfleet lab down --id rs
On the stand-in lab, the defaults: --warmup default,ctas512 --target ctas768 (tests/integration/test_restarts.py).

On a 2-core machine, real SGLang's idle schedulers busy-poll (~0.45 core each) and starve the host that restarts:
starts then take 90-133 s instead of 25-30 s. For starts as they are on a quiet host, add ``sleep-on-idle: true`` to
``knob_serve_host_args`` in the lab's ``inventory/group_vars/sglang.yml`` and put it on every host with a first
warm-up profile of another name (a copy of sglang-tiny renamed), so that no target is priced from those starts.
Results: perf/results/restart_plan_sglang.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import time
from typing import Any

from _lab import KNOBFLEET, table


class Lab:
    def __init__(self, lab_id: str, timeout: int) -> None:
        self.env = {**os.environ, "KNOBFLEET_LAB": lab_id}
        self.lab_id = lab_id
        self.timeout = timeout

    def run(
        self, *args: str, ok: tuple[int, ...] = (0,), show: bool = True
    ) -> tuple[subprocess.CompletedProcess[str], float]:
        cmd = f"KNOBFLEET_LAB={self.lab_id} knobfleet {shlex.join(args)}"
        print(f"\n$ {cmd}", flush=True)
        started = time.monotonic()
        # its own session: a command past its timeout is stopped with everything it started (ansible, ssh)
        with subprocess.Popen(
            [*KNOBFLEET, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env,
            start_new_session=True,
        ) as child:  # fmt: skip
            try:
                out, err = child.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGTERM)
                out, err = child.communicate()
                raise SystemExit(
                    f"{cmd}: no answer after {self.timeout}s, stopped\n{out[-4000:]}\n{err[-4000:]}"
                ) from None
        proc = subprocess.CompletedProcess(child.args, child.returncode, out, err)
        took = time.monotonic() - started
        if proc.returncode not in ok:
            raise SystemExit(
                f"{cmd} exited {proc.returncode} after {took:.1f}s:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
            )
        if show:
            print(proc.stdout.rstrip())
            if proc.stderr.strip():
                print(proc.stderr.rstrip())
        print(f"[exit {proc.returncode}, {took:.1f}s on this clock]", flush=True)
        return proc, took


def machine() -> str:
    from pathlib import Path

    load = Path("/proc/loadavg").read_text().split()[:3]
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    avail = next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:"))
    return f"load {' '.join(load)}, memory available {avail / 2**20:.1f} GiB"


def phases(startup: dict[str, Any]) -> str:
    return ", ".join(f"{p['phase']} {p['s']:.2f}s" for p in startup.get("phases") or []) or "(none)"


def apply(lab: Lab, profile: str, serial: str) -> tuple[dict[str, Any], float]:
    print(f"[before: {machine()}]")
    proc, took = lab.run("apply", profile, "--serial", serial, "--yes", "--json", show=False)
    print(f"[after: {machine()}]")
    doc: dict[str, Any] = json.loads(proc.stdout)
    if proc.stderr.strip():
        print(proc.stderr.rstrip())
    rows = []
    for h in doc["hosts"]:
        s = h.get("startup") or {}
        rows.append(
            [h["host"], h["status"], h.get("batch", "-"), s.get("kind", "-"), s.get("stop_s"), s.get("pre_s"),
             s.get("start_s"), s.get("cache", "-"), phases(s)]
        )  # fmt: skip
    print(table(["host", "status", "batch", "start", "stop s", "pre s", "start s", "cache", "phases"], rows))
    print(f"apply {profile}: wall {took:.1f}s on this clock, {doc.get('wall_s')}s as apply reports it")
    return doc, took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab-id", default=os.environ.get("KNOBFLEET_LAB"), required="KNOBFLEET_LAB" not in os.environ)
    ap.add_argument("--warmup", default="default,ctas512", help="profiles applied first, comma-separated")
    ap.add_argument("--target", default="ctas768", help="profiles planned then applied, comma-separated")
    ap.add_argument("--serial", default="1")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds any one command may take")
    args = ap.parse_args()
    lab = Lab(args.lab_id, args.timeout)
    began = time.monotonic()
    print(f"restart_plan: lab {args.lab_id}, warm-up {args.warmup}, targets {args.target}, --serial {args.serial}; "
          f"{machine()}")  # fmt: skip

    for profile in filter(None, args.warmup.split(",")):
        apply(lab, profile, args.serial)

    summary = []
    for i, profile in enumerate(filter(None, args.target.split(",")), 1):
        lab.run("plan", profile, "--serial", args.serial, ok=(0, 2))
        proc, _ = lab.run("plan", profile, "--serial", args.serial, "--json", ok=(0, 2), show=False)
        cost = json.loads(proc.stdout).get("cost") or {}
        print(json.dumps(cost, indent=1))
        doc, took = apply(lab, profile, args.serial)
        outcome = {h["host"]: h for h in doc["hosts"]}
        rows = []
        slowest: dict[int, float] = {}
        for h in cost.get("hosts") or []:
            m = h.get("measured") or {}
            s = outcome.get(h["host"], {}).get("startup") or {}
            real = (s.get("stop_s") or 0.0) + s["start_s"] if isinstance(s.get("start_s"), int | float) else None
            if real is not None:
                slowest[h["batch"]] = max(slowest.get(h["batch"], 0.0), real)
            said = m.get("seconds")
            rows.append(
                [h["host"], h["batch"], said, m.get("n"), m.get("basis"), f"{real:.2f}" if real is not None else "-",
                 f"{real / said:.2f}" if real is not None and said else "-"]
            )  # fmt: skip
        print(
            table(
                ["host", "batch", "plan stop+start s", "of n", "basis", "measured stop+start s", "measured/plan"], rows
            )
        )
        planned = cost.get("wall_s")
        if slowest and cost.get("overhead_s") is not None:
            per = (took - sum(slowest.values())) / len(slowest)
            print(f"rollout's own time per batch: plan {cost['overhead_s']:.1f}s, this apply {per:.1f}s")
        # as tests/integration/test_restarts.py judges it: the plan's error relative to the measured time
        ratio, error = (f"{planned / took:.2f}", f"{(planned - took) / took:+.0%}") if planned else ("-", "-")
        print(
            f"run {i} ({profile}): plan said {planned}s for {cost.get('restarts')} restart(s) in "
            f"{cost.get('batches')} batch(es), the apply took {took:.1f}s (plan / measured {ratio}, error {error})"
        )
        summary.append([i, profile, cost.get("restarts"), cost.get("batches"), planned, f"{took:.1f}", ratio, error])

    lab.run("history")
    print()
    print(table(["run", "profile", "restarts", "batches", "plan s", "measured s", "plan/measured", "error"], summary))
    print(f"restart_plan: {time.monotonic() - began:.0f}s in all; {machine()}")


if __name__ == "__main__":
    main()
