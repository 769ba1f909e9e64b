"""The benchmark gate of ``apply --gate``: after a successful apply, the new profile must pass the
output-consistency check, serve without request errors, and lose no more than ``max_regression`` in any
bucket against the baseline profile's results (stored ones, or measured now). A rejected host goes back
to its previous generation through the transaction's restore path."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knobfleet.experiment.ab import activate, consistency, results_path, store_results
from knobfleet.experiment.bench.run import BenchSpec, errors, run_bench, throughput
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.runner import Event
from knobfleet.profiles.model import Profile


@dataclass
class GateResult:
    host: str
    passed: bool
    reason: str
    baseline: str
    baseline_source: str  # stored | measured
    ratios: dict[int, float] = field(default_factory=dict)
    consistency: str = "skipped"

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _means(docs: list[dict[str, Any]]) -> dict[int, float]:
    per: dict[int, list[float]] = {}
    for d in docs:
        for c, v in throughput(d).items():
            per.setdefault(c, []).append(v)
    return {c: statistics.mean(v) for c, v in per.items()}


def baseline_runs(
    baseline: Profile,
    new: Profile,
    hv: HostVars,
    inventory: Path,
    spec: BenchSpec,
    repeats: int,
    on_event: Callable[[Event], None] | None,
) -> tuple[list[dict[str, Any]], str]:
    path = results_path(hv.host, baseline)
    if path.is_file():
        runs: list[dict[str, Any]] = json.loads(path.read_text())["runs"]
        if {c for d in runs for c in throughput(d)} >= set(spec.conc):
            return runs, "stored"
    activate(baseline, hv, inventory, on_event)
    runs = [run_bench([hv], inventory, spec, on_event=on_event)[hv.host] for _ in range(repeats)]
    store_results(hv.host, baseline, {"runs": runs})
    activate(new, hv, inventory, on_event)
    return runs, "measured"


def gate_host(
    new: Profile,
    baseline: Profile,
    hv: HostVars,
    inventory: Path,
    spec: BenchSpec,
    repeats: int,
    on_event: Callable[[Event], None] | None = None,
) -> GateResult:
    base_runs, source = baseline_runs(baseline, new, hv, inventory, spec, repeats, on_event)
    res = GateResult(hv.host, False, "", baseline.ref, source)
    if new.gate.consistency:
        cons = consistency(hv, inventory, spec, on_event)
        res.consistency = "pass" if cons["passed"] else "fail"
        if not cons["passed"]:
            res.reason = (
                f"consistency check failed: {cons['diverged']} of {cons['compared']} outputs under load "
                f"differ from serial ({cons['loops']} loops)"
            )
            return res
    new_runs = [run_bench([hv], inventory, spec, on_event=on_event)[hv.host] for _ in range(repeats)]
    store_results(hv.host, new, {"runs": new_runs})
    res.passed, res.reason, res.ratios = judge(base_runs, new_runs, new.gate.max_regression, baseline.ref, source)
    return res


def judge(
    base_runs: list[dict[str, Any]], new_runs: list[dict[str, Any]], limit: float, baseline_ref: str, source: str
) -> tuple[bool, str, dict[int, float]]:
    """Pure: the gate's verdict on the new profile's benchmark runs against the baseline's — (passed, reason,
    per-bucket throughput ratio - 1). Any request error fails it; so does any bucket more than ``limit`` slower
    than the baseline (mean over the runs)."""
    n_err = sum(errors(d) for d in new_runs)
    if n_err:
        return False, f"{n_err} requests failed during the benchmark", {}
    old, cur = _means(base_runs), _means(new_runs)
    ratios = {c: cur[c] / old[c] - 1 for c in cur if old.get(c)}
    if not ratios:
        reason = (
            f"no bucket to compare with {baseline_ref} ({source} results): the runs share no concurrency with "
            f"throughput above zero; bench the baseline at the same --gate-conc"
        )
        return False, reason, ratios
    worst = min(ratios.items(), key=lambda kv: kv[1])
    if worst[1] < -limit:
        reason = (
            f"throughput at concurrency {worst[0]} is {worst[1]:+.1%} vs {baseline_ref} ({source} "
            f"results), beyond the {limit:.0%} regression limit"
        )
        return False, reason, ratios
    reason = (
        "consistent, no request errors, every bucket within "
        + f"{limit:.0%} of {baseline_ref} "
        + ("(" + ", ".join(f"C{c} {r:+.1%}" for c, r in sorted(ratios.items())) + ")")
    )
    return True, reason, ratios


def gate_rollout(
    new: Profile,
    baseline: Profile,
    hosts: list[HostVars],
    inventory: Path,
    result: Any,
    spec: BenchSpec,
    repeats: int,
    on_event: Callable[[Event], None] | None = None,
) -> list[GateResult]:
    """``apply --gate``: benchmark every host the apply left on ``new``; a rejected host is restored to its
    previous generation (through the transaction's restore) and its outcome in ``result`` says so."""
    from knobfleet.ops.transaction import RestoreFailed, RestoreTarget, restore

    by_name = {hv.host: hv for hv in hosts}
    gates, targets = [], {}
    for o in result.hosts:
        if o.status not in ("applied", "unchanged"):
            continue
        g = gate_host(new, baseline, by_name[o.host], inventory, spec, repeats, on_event)
        gates.append(g)
        if not g.passed:
            new_gen = o.generation is not None and o.generation != o.previous
            targets[o.host] = RestoreTarget(o.previous if new_gen else None, f"gate: {g.reason}", "failed", "restore")
    if targets:
        outcomes = restore(hosts, inventory, targets, on_event=on_event)
        broken = [r for r in outcomes if not r.ok]
        if broken:
            raise RestoreFailed(
                "\n".join(f"{r.host}: gate rejected the profile and the restore failed: {r.message}" for r in broken),
                broken,
            )
        restored = {r.host: r for r in outcomes}
        for o in result.hosts:
            if o.host in restored:
                o.status, o.restored = "failed", restored[o.host]
                o.message = "gate rejected: " + next(g.reason for g in gates if g.host == o.host)
    return gates
