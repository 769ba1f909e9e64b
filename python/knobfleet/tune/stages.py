"""The campaign's steps on real hosts: ``load-profile``, ``kernel bench`` (or a stored sweep), ``ab``, the
canary and the rollout, each the same code the commands of those names run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knobfleet import paths, safefile
from knobfleet.errors import KnobfleetError
from knobfleet.profiles.model import Profile
from knobfleet.tune.campaign import SweepRowError, json_kind, row_problem
from knobfleet.tune.space import Space


def default_prometheus() -> str:
    """The Prometheus a SPACE reads when its live stage names none: $KNOBFLEET_PROMETHEUS, else the lab's."""
    import os

    from knobfleet.lab.monitoring import prometheus_url

    return os.environ.get("KNOBFLEET_PROMETHEUS") or prometheus_url()


@dataclass
class HostStages:
    space: Space
    inventory: Path
    prometheus: str = ""  # "" = the live stage's, else default_prometheus()
    on_event: Any = None

    def _engine_host(self) -> Any:
        from knobfleet.ops import fleet

        hosts = fleet.hosts(self.inventory, None)
        hv = next((h for h in hosts if h.host == self.space.engine.host), None)
        if hv is None:
            raise KnobfleetError(
                f"{paths.display(Path(self.space.path))}: stages.engine.host: {self.space.engine.host!r} is not in "
                f"the inventory ({', '.join(h.host for h in hosts)})"
            )
        return hv

    def live_weights(self) -> dict[int, float]:
        from knobfleet.ops.telemetry import load_profile
        from knobfleet.telemetry.prom import Prometheus

        conc = list(self.space.engine.conc)
        prom = self.prometheus_url()
        result = load_profile(Prometheus(prom), conc, 600.0, 5.0, ".+")
        weights = {int(b): float(w) for b, w in result.profile.weights.items()}
        if sum(weights.values()) <= 0:
            raise KnobfleetError(
                f"traffic: live: no load in {prom} over the last 10 min at {conc}; give traffic weights"
            )
        return weights

    def prometheus_url(self) -> str:
        """The Prometheus this campaign reads: ``stages.live.prometheus``, else the one given, else the default."""
        return self.space.live.prometheus or self.prometheus or default_prometheus()

    def kernel_rows(self, ctas: list[int], block_h: list[int], batches: list[int]) -> list[dict[str, Any]]:
        from knobfleet.kernel import commands
        from knobfleet.kernel.grid import Grid

        k, m = self.space.kernel, self.space.model
        if k.sweep is not None:
            where = Path(k.sweep)
            if not where.is_absolute():
                where = Path(self.space.path).parent / where
            return read_sweep_rows(
                where,
                f"{paths.display(Path(self.space.path))}: stages.kernel.sweep",
                "point stages.kernel.sweep at the JSON `kernel bench --out` wrote",
            )
        assert k.host is not None
        grid = Grid(
            batches=tuple(batches),
            target_ctas=tuple(ctas),
            block_h=tuple(block_h),
            heads=(m.heads,),
            contexts=(m.context,),
        )
        summary = commands.kernel_bench(self.inventory, k.host, grid, k.budget_s, on_event=self.on_event)
        if summary.get("skipped"):
            raise KnobfleetError(f"stages.kernel.host: {k.host}: {summary.get('reason')}")
        out = summary.get("out")
        if not out:
            return []
        return read_sweep_rows(
            Path(str(out)),
            f"{paths.display(Path(self.space.path))}: stages.kernel.host {k.host}",
            "re-run the campaign (the kernel stage measures again)",
        )

    def ab(
        self,
        base: Profile,
        candidate: Profile,
        max_rounds: int,
        weights: dict[int, float],
        deadline_s: float | None = None,
    ) -> dict[str, Any]:
        from knobfleet.experiment import ab
        from knobfleet.experiment.bench.run import BenchSpec
        from knobfleet.experiment.design import Settings

        e = self.space.engine
        # the campaign's weights: the space's, or the live load's as measured at the start (kept in the record)
        settings = Settings(
            weights=weights,
            min_effect=e.min_effect,
            max_regression=e.max_regression,
            max_rounds=max_rounds,
            min_rounds=min(3, max_rounds),
        )
        spec = BenchSpec(conc=e.conc, n_mult=e.n_mult, max_tokens=e.max_tokens)
        folder = paths.state_dir() / "tune" / self.space.name / f"{time.strftime('%Y%m%dT%H%M%S')}-{candidate.name}"
        return ab.ab(
            base,
            candidate,
            self._engine_host(),
            self.inventory,
            settings,
            spec,
            folder,
            on_event=self.on_event,
            deadline=None if deadline_s is None else time.monotonic() + deadline_s,
        )

    def restore(self, base: Profile) -> None:
        from knobfleet.experiment.ab import activate

        activate(base, self._engine_host(), self.inventory, self.on_event)

    def canary(self, winner: Profile) -> dict[str, Any]:
        from knobfleet.experiment import canary_probe
        from knobfleet.experiment.canary_run import CanaryOptions, RecordKeeper, canary
        from knobfleet.ops import fleet
        from knobfleet.telemetry.prom import Prometheus

        live = self.space.live  # the same judge as `knobfleet canary`: hung-stream probes and warm-up included
        opts = CanaryOptions(hosts=live.hosts, window_s=live.window_s, settings=live.settings(),
                             advisory=live.advisory, prober=canary_probe.start)  # fmt: skip
        door = fleet.door(self.inventory)
        hosts = fleet.hosts(self.inventory, None)
        report = canary(winner, hosts, door, Prometheus(self.prometheus_url()), opts, keep=RecordKeeper())
        return report.as_json()

    def rollout(self, winner: Profile) -> dict[str, Any]:
        from knobfleet.ops import fleet
        from knobfleet.ops.apply import apply

        rep = apply(winner, fleet.hosts(self.inventory, None), self.inventory, on_event=self.on_event)
        return {"exit_code": rep.exit_code, "hosts": [o.host for o in rep.hosts]}


SWEEP_MAX_BYTES = 32 * safefile.MIB


def read_sweep_rows(where: Path, field: str, fix: str) -> list[dict[str, Any]]:
    """The measured rows of a `kernel bench` sweep file, through the bounded reader and finite-number parser
    every JSON file of the operator's goes through (``safefile.read_text``, ``safefile.loads_json``: no FIFO or
    device, no ``NaN``/``Infinity``, no 5,000-digit number, no nesting past the parser), each row checked for
    what the ranking reads (``campaign.row_problem``). Anything else is one line (``campaign.SweepRowError``)
    naming the space file and its field, the sweep file, the bad field of the sweep, and ``fix``."""
    head = f"{field}: {paths.display(where)}"
    try:
        doc = safefile.loads_json(safefile.read_text(where, SWEEP_MAX_BYTES, "kernel sweep"), "kernel sweep")
    except safefile.FileRefused as exc:
        raise SweepRowError(f"{head}: {exc}; {fix}") from None
    if not isinstance(doc, dict):
        raise SweepRowError(f"{head}: {json_kind(doc)}, not a `kernel bench` sweep (an object); {fix}")
    if doc.get("skipped"):
        raise SweepRowError(f"{head}: skipped is {json_kind(doc['skipped'])}: the bench measured nothing; {fix}")
    rows = doc.get("results")
    if not isinstance(rows, list):  # an empty list is a bench that measured nothing: every candidate unmeasured
        what = "missing" if rows is None else json_kind(rows)
        raise SweepRowError(f"{head}: results is {what}, not a list of measured rows; {fix}")
    for i, row in enumerate(rows):
        problem = row_problem(row)
        if problem is not None:
            name, why = problem
            raise SweepRowError(f"{head}: results[{i}]{'.' + name if name else ''} {why}; {fix}")
    return rows
