"""Use case: run the bench client on hosts through roles/knob_bench and return its JSON per host."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knobfleet.errors import KnobfleetError
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.runner import Event, RunRequest, new_run_id, run_playbook

RESULT_STEP = "ansible.builtin.slurp"  # the module that reads the result back (results are keyed by module)


@dataclass(frozen=True)
class BenchSpec:
    conc: tuple[int, ...] = (48, 64, 80, 96)
    n_mult: int = 4
    max_tokens: int = 256
    warmup: int | None = None
    seed: int = 0
    timeout_s: int = 1800
    cons_prompts: int = 16
    cons_repeats: int = 2


class BenchError(KnobfleetError):
    """The bench client could not run or returned nothing."""


def run_bench(
    hosts: list[HostVars],
    inventory: Path,
    spec: BenchSpec,
    *,
    consistency: bool = False,
    on_event: Callable[[Event], None] | None = None,
) -> dict[str, dict[str, Any]]:
    run_id = new_run_id()
    client = Path(__file__).with_name("client.py")
    result = run_playbook(
        RunRequest(
            playbook="bench.yml",
            inventory=inventory,
            limit=",".join(hv.host for hv in hosts),
            trusted_vars={
                "knob_bench_conc": ",".join(map(str, spec.conc)),
                "knob_bench_n_mult": spec.n_mult,
                "knob_bench_max_tokens": spec.max_tokens,
                "knob_bench_warmup": spec.warmup,
                "knob_bench_seed": spec.seed,
                "knob_bench_timeout_s": spec.timeout_s,
                "knob_bench_consistency": consistency,
                "knob_bench_cons_prompts": spec.cons_prompts,
                "knob_bench_cons_repeats": spec.cons_repeats,
                "knob_bench_run_id": run_id,
                "knob_bench_client_src": str(client),
            },
            forks=min(len(hosts), 64),
            on_event=on_event,
            run_id=run_id,
        )
    )
    out: dict[str, dict[str, Any]] = {}
    for hv in hosts:
        hr = result.host(hv.host)
        res = hr.results.get(RESULT_STEP, {})
        if not hr.success or "content" not in res:
            raise BenchError(f"{hv.host}: bench failed: {hr.first_failure()}")
        out[hv.host] = json.loads(base64.b64decode(res["content"]))
    return out


def throughput(doc: dict[str, Any]) -> dict[int, float]:
    return {int(b["concurrency"]): float(b["agg_tok_s"]) for b in doc.get("buckets") or []}


def errors(doc: dict[str, Any]) -> int:
    return sum(int(b.get("errors", 0)) for b in doc.get("buckets") or [])
