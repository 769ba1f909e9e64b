"""The benchmark gate of ``apply --gate``: after a successful apply, the new profile must pass the
output-consistency check, serve without request errors, and lose no more than ``max_regression`` in any
bucket against the baseline profile's results (stored ones, or measured now). The rollout runs the gate as a
step of each batch (ops/apply_gate.py): a rejected host goes back to its previous generation before its batch is
put back in its routers, and the rollout stops there."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knobfleet.experiment.ab import activate, consistency, results_path, runs_found, store_results
from knobfleet.experiment.bench.run import BenchSpec, errors, run_bench, throughput
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.runner import Event
from knobfleet.profiles.model import Profile

if TYPE_CHECKING:
    from knobfleet.progress import Rounds


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
    status: Rounds | None = None,
) -> tuple[list[dict[str, Any]], str]:
    path = results_path(hv.host, baseline)
    if path.is_file():
        runs: list[dict[str, Any]] = json.loads(path.read_text())["runs"]
        if {c for d in runs for c in throughput(d)} >= set(spec.conc):
            return runs, "stored"
    if status is not None:
        status.limit = 2 * repeats  # the baseline's runs first, then the new profile's
        status.start(1, f"applying the baseline {baseline.name}")
    activate(baseline, hv, inventory, on_event, routed=False)  # the host is out of its router while judged
    runs = []
    for i in range(repeats):
        if status is not None:
            status.start(i + 1, f"benchmarking the baseline {baseline.name}")
        runs.append(run_bench([hv], inventory, spec, on_event=on_event)[hv.host])
        if status is not None:
            nxt = f"baseline run {i + 2}" if i + 1 < repeats else f"apply {new.name} again and benchmark it"
            status.done(i + 1, f"baseline {baseline.name}: " + runs_found(runs), nxt)
    store_results(hv.host, baseline, {"runs": runs})
    activate(new, hv, inventory, on_event, routed=False)
    return runs, "measured"


def gate_host(
    new: Profile,
    baseline: Profile,
    hv: HostVars,
    inventory: Path,
    spec: BenchSpec,
    repeats: int,
    on_event: Callable[[Event], None] | None = None,
    status: Rounds | None = None,
) -> GateResult:
    base_runs, source = baseline_runs(baseline, new, hv, inventory, spec, repeats, on_event, status)
    done = len(base_runs) if source == "measured" else 0
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
    new_runs: list[dict[str, Any]] = []
    for i in range(repeats):
        if status is not None:
            status.start(done + i + 1, f"benchmarking {new.name}")
        new_runs.append(run_bench([hv], inventory, spec, on_event=on_event)[hv.host])
        if status is not None:
            nxt = f"run {done + i + 2}" if i + 1 < repeats else "the verdict"
            status.done(done + i + 1, progress_found(base_runs, new_runs, new.gate.max_regression), nxt)
    store_results(hv.host, new, {"runs": new_runs})
    res.passed, res.reason, res.ratios = judge(base_runs, new_runs, new.gate.max_regression, baseline.ref, source)
    return res


def progress_found(base_runs: list[dict[str, Any]], new_runs: list[dict[str, Any]], limit: float) -> str:
    """The gate's view so far: each bucket's ratio to the baseline and whether it is beyond the limit."""
    old, cur = _means(base_runs), _means(new_runs)
    ratios = {c: cur[c] / old[c] - 1 for c in sorted(cur) if old.get(c)}
    n_err = sum(errors(d) for d in new_runs)
    shown = ", ".join(f"C{c} {r:+.1%}{' (beyond the limit)' if r < -limit else ''}" for c, r in ratios.items())
    return f"vs baseline {shown or 'no common bucket'}" + (f" · {n_err} request errors" if n_err else "")


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


def gate_judge(
    new: Profile,
    baseline: Profile,
    inventory: Path,
    spec: BenchSpec,
    repeats: int,
    on_event: Callable[[Event], None] | None = None,
    progress: bool = True,
) -> Callable[[HostVars], GateResult]:
    """``apply --gate``'s judge: the rollout calls it for each host of a batch that it left on ``new``, while the
    host is still out of its router (ops/apply_gate.py), and restores a rejected host before the batch is put back;
    the rollout stops there. Its own applies (a baseline measured now) therefore leave the routers alone. With
    ``progress``, each host's runs show on stderr (``progress.Rounds``: live on a terminal, else a line a run)."""
    from knobfleet.progress import Rounds

    def one(hv: HostVars) -> GateResult:
        status = Rounds(f"gate {hv.host} vs {baseline.name}", repeats, "run", at_most=False) if progress else None
        try:
            return gate_host(new, baseline, hv, inventory, spec, repeats, on_event, status)
        finally:
            if status is not None:
                status.close()

    return one
