"""Run ``knobfleet ab`` / ``bench`` through the real CLI against a fake host (no lab, no Ansible).

``python fake_lab.py ab ctas512 ctas768 …`` (or ``bench …``): the bench runner, the apply and the
consistency check of ``knobfleet.experiment.ab`` are replaced by a seeded in-process fake whose throughput per
profile and bucket is the stand-in's noise-free model (``lab/sim/model.py``) times a per-run noise factor; the
host is ``lab1`` with the lab's time scale. Everything else (argument parsing, the decision rule, progress,
output, reports) is the real code. Used by the pseudo-terminal and pipe tests of progress output.
"""

from __future__ import annotations

import math
import os
import random
import sys
from pathlib import Path
from typing import Any

from knobfleet import waves
from knobfleet.cli import bench as cli_bench
from knobfleet.experiment import ab
from knobfleet.fleet.hostvars import HostVars
from knobfleet.lab.sim import model

HV = HostVars(host="lab1", engine="sglang", host_env={"SGLANG_SIM_TIME_SCALE": "0.25"})
SMS = 188
STATE: dict[str, Any] = {"live": None, "rng": random.Random(int(os.environ.get("FAKE_LAB_SEED", "1")))}
NOISE = float(os.environ.get("FAKE_LAB_NOISE", "0.01"))


def tok_s(target_ctas: int, conc: int, max_tokens: int) -> float:
    return model.aggregate_tok_s(conc, waves.KernelKnobs(target_ctas=target_ctas), SMS, max_tokens) / 0.25


def fake_activate(profile: Any, hv: HostVars, inventory: Path, on_event: Any, routed: bool = True) -> None:
    STATE["live"] = profile


def fake_consistency(hv: HostVars, inventory: Path, spec: Any, on_event: Any) -> dict[str, Any]:
    return {"passed": True, "compared": 16, "diverged": 0, "loops": 0, "errors": 0, "divergences": []}


def fake_run_bench(hosts: list[HostVars], inventory: Path, spec: Any, **_: Any) -> dict[str, dict[str, Any]]:
    profile = STATE["live"]
    ctas = int(profile.env_strings().get("SGLANG_SM120_MMA_TARGET_CTAS", 256)) if profile is not None else 256
    rng: random.Random = STATE["rng"]
    common = rng.gauss(0, NOISE)
    buckets = []
    for c in spec.conc:
        v = tok_s(ctas, c, spec.max_tokens) * math.exp(common + rng.gauss(0, NOISE / 2))
        n = spec.n_mult * c
        buckets.append(
            {
                "concurrency": c,
                "n": n,
                "max_tokens": spec.max_tokens,
                "errors": 0,
                "tokens": n * spec.max_tokens,
                "wall_s": n * spec.max_tokens / v,
                "agg_tok_s": v,
                "per_req_tok_s": v / c,
                "latency": {"p50": 1.0},
            }
        )
    return {h.host: {"buckets": buckets, "tool": "knobfleet"} for h in hosts}


def install() -> None:
    ab.activate = fake_activate
    ab.consistency = fake_consistency
    ab.run_bench = fake_run_bench  # type: ignore[attr-defined]
    cli_bench._one_host = lambda args, what: (HV, Path("inventory"))
    from knobfleet.experiment import running

    running.on_hosts = lambda hosts, inventory: {}  # no host to read what ran from


if __name__ == "__main__":
    from knobfleet import cli

    install()
    sys.exit(cli.main(sys.argv[1:]))
