"""Use case: run the bench client on hosts through roles/knob_bench and return its JSON per host."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from knobfleet.errors import KnobfleetError
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.runner import Event, RunRequest, RunResult, new_run_id, run_playbook

RESULT_STEP = "ansible.builtin.slurp"  # the module that reads the result back (results are keyed by module)


@dataclass(frozen=True)
class BenchSpec:
    conc: tuple[int, ...] = (48, 64, 80, 96)
    n_mult: int = 4
    max_tokens: int = 256
    warmup: int | None = None
    # warm up until converged, at most this many requests (client.py warm_up; 0: the fixed warm-up only)
    warmup_max: int = 128
    warmup_tol: float = 0.03
    seed: int = 0
    timeout_s: int = 1800
    cons_prompts: int = 16
    cons_repeats: int = 2
    # builtin: knobfleet's client (bench/client.py); engine: the engine's own tool (catalog serve.bench)
    tool: Literal["builtin", "engine"] = "builtin"
    input_len: int = 128


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
    if spec.tool == "engine":
        if consistency:
            raise BenchError(
                "the consistency check is knobfleet's own: run it with the built-in client (--tool builtin)"
            )
        return _run_engine_tool(hosts, inventory, spec, run_id, on_event)
    client = Path(__file__).with_name("client.py")
    result = _bench_playbook(
        hosts,
        inventory,
        {
            "knob_bench_conc": ",".join(map(str, spec.conc)),
            "knob_bench_n_mult": spec.n_mult,
            "knob_bench_max_tokens": spec.max_tokens,
            "knob_bench_warmup": spec.warmup,
            "knob_bench_warmup_max": spec.warmup_max,
            "knob_bench_warmup_tol": spec.warmup_tol,
            "knob_bench_seed": spec.seed,
            "knob_bench_timeout_s": spec.timeout_s,
            "knob_bench_consistency": consistency,
            "knob_bench_cons_prompts": spec.cons_prompts,
            "knob_bench_cons_repeats": spec.cons_repeats,
            "knob_bench_run_id": run_id,
            "knob_bench_client_src": str(client),
        },
        run_id,
        on_event,
    )
    out: dict[str, dict[str, Any]] = {}
    for hv in hosts:
        hr = result.host(hv.host)
        res = hr.results.get(RESULT_STEP, {})
        if not hr.success or "content" not in res:
            raise BenchError(f"{hv.host}: bench failed: {hr.first_failure()}")
        out[hv.host] = json.loads(base64.b64decode(res["content"]))
    return out


def _bench_playbook(
    hosts: list[HostVars],
    inventory: Path,
    trusted: dict[str, Any],
    run_id: str,
    on_event: Callable[[Event], None] | None,
) -> RunResult:
    """playbooks/bench.yml (roles/knob_bench) on ``hosts`` with ``trusted`` vars."""
    return run_playbook(
        RunRequest(
            playbook="bench.yml",
            inventory=inventory,
            hosts=tuple(hv.host for hv in hosts),
            trusted_vars=trusted,
            forks=min(len(hosts), 64),
            on_event=on_event,
            run_id=run_id,
        )
    )


def tool_vars(hv: HostVars, spec: BenchSpec, run_id: str) -> dict[str, Any]:
    """What roles/knob_bench needs to run ``hv``'s engine's own benchmark: the rendered argv per bucket."""
    eng = hv.adapter()
    if eng.bench is None:
        raise BenchError(
            f"{hv.host}: engine {eng.name} has no bench tool in its catalog (serve.bench); "
            "use the built-in client (--tool builtin) or add serve.bench to the catalog overlay"
        )
    runs = eng.bench_runs(
        hv.launcher,
        hv.model_path,
        hv.listen_host,
        hv.port,
        conc=spec.conc,
        n_mult=spec.n_mult,
        input_len=spec.input_len,
        output_len=spec.max_tokens,
        seed=spec.seed,
        result_dir="{result_dir}",  # the host's knob_bench_dir, filled in there by the module
        run_id=run_id,
    )
    return {
        "name": eng.bench.name,
        "runs": runs,
        "result_format": eng.bench.result,
        "env": dict(eng.bench.env),
        "version_url": hv.base_url + eng.bench.version_path if eng.bench.version_path else "",
        "version_key": eng.bench.version_key,
        "info_url": hv.base_url + eng.info_path if eng.info_path else "",
        "secret": list(hv.secrets()),
    }


def _run_engine_tool(
    hosts: list[HostVars],
    inventory: Path,
    spec: BenchSpec,
    run_id: str,
    on_event: Callable[[Event], None] | None,
) -> dict[str, dict[str, Any]]:
    from knobfleet.experiment.bench.tool import document

    per_host = {hv.host: tool_vars(hv, spec, run_id) for hv in hosts}
    trusted = {"knob_bench_tool_by_host": per_host, "knob_bench_timeout_s": spec.timeout_s, "knob_bench_run_id": run_id}
    result = _bench_playbook(hosts, inventory, trusted, run_id, on_event)
    out: dict[str, dict[str, Any]] = {}
    for hv in hosts:
        hr = result.host(hv.host)
        res = hr.results.get("bench_tool", {})
        if not hr.success or "runs" not in res:
            raise BenchError(f"{hv.host}: {per_host[hv.host]['name']} failed: {hr.first_failure()}")
        doc = document(res, per_host[hv.host]["name"], spec.max_tokens)
        doc["argv"] = [r["argv"] for r in per_host[hv.host]["runs"]]
        out[hv.host] = doc
    return out


def throughput(doc: dict[str, Any]) -> dict[int, float]:
    return {int(b["concurrency"]): float(b["agg_tok_s"]) for b in doc.get("buckets") or []}


def errors(doc: dict[str, Any]) -> int:
    return sum(int(b.get("errors", 0)) for b in doc.get("buckets") or [])
