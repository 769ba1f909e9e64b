"""Rollout efficiency on a real engine: how much of an `apply` is vLLM's own start-up.

One lab host runs real vLLM (CPU build, tiny model, eager). Each run flips it between vllm-tiny and
vllm-seqs8, so every apply installs a new generation and restarts the engine. For every run it records the
apply's wall time (the CLI end to end: render, pre-check probe, ansible-runner, restart, readiness, live check)
and the engine's own start-to-ready time as the role measured it (restart until /health answers 200), and prints
efficiency = engine start-to-ready / apply wall (target >= 0.85: knobfleet costs at most 15% on top).
Usage: python perf/vllm_rollout.py [--repeats 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request

from _lab import KNOBFLEET, REPO, med, table

sys.path.insert(0, str(REPO / "python"))
from knobfleet.lab.nspawn import Lab

PROFILES = ("vllm-seqs8", "vllm-tiny")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args()
    lab = Lab()
    lab.down()
    lab.up(1, ("lab1",))
    inv = lab.dir / "inventory"
    health = f"http://{lab.host(1).address}:8000/health"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(health, timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(1)
    rows, walls, readies, stops = [], [], [], []
    try:
        for i in range(args.repeats):
            profile = PROFILES[i % 2]
            started = time.monotonic()
            proc = subprocess.run(
                [*KNOBFLEET, "apply", profile, "-i", str(inv), "--yes", "--json"],
                capture_output=True,
                text=True,
                timeout=900,
            )
            wall = time.monotonic() - started
            if proc.returncode != 0:
                raise SystemExit(f"apply {profile} failed:\n{proc.stdout}\n{proc.stderr}")
            (host,) = json.loads(proc.stdout)["hosts"]
            # The engine's own time: its restart (the old process's graceful stop + the new one's fork, as
            # systemctl restart took) and its start-up until /health answers 200 (ready_s, measured by the role).
            stop = float(host.get("restart_s") or 0.0)
            ready = stop + float(host["ready_s"])
            walls.append(wall)
            readies.append(ready)
            stops.append(stop)
            rows.append([i + 1, profile, f"{wall:.1f}", f"{stop:.1f}", f"{ready:.1f}", f"{ready / wall:.2f}"])
    finally:
        lab.down()
    heads = ["run", "profile", "apply wall s", "engine stop (restart) s", "engine stop + start-to-ready s"]
    print(table([*heads, "efficiency"], rows))
    print(
        f"median: apply {med(walls):.1f} s, engine {med(readies):.1f} s (of it the old engine's stop "
        f"{med(stops):.1f} s), efficiency {med(readies) / med(walls):.2f} (target >= 0.85); knobfleet's own share "
        f"{med(walls) - med(readies):.1f} s; counting the stop as knobfleet's: "
        f"{(med(readies) - med(stops)) / med(walls):.2f}"
    )


if __name__ == "__main__":
    main()
