"""The campaign's steps on real hosts: ``load-profile``, ``kernel bench`` (or a stored sweep), ``ab``, the
canary and the rollout, each the same code the commands of those names run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knobfleet import paths
from knobfleet.errors import KnobfleetError
from knobfleet.profiles.model import Profile
from knobfleet.tune.space import Space

DEFAULT_PROMETHEUS = "http://127.0.0.1:19090"


@dataclass
class HostStages:
    space: Space
    inventory: Path
    prometheus: str = DEFAULT_PROMETHEUS
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
        result = load_profile(Prometheus(self.prometheus), conc, 600.0, 5.0, ".+")
        weights = {int(b): float(w) for b, w in result.profile.weights.items()}
        if sum(weights.values()) <= 0:
            raise KnobfleetError(
                f"traffic: live: no load in {self.prometheus} over the last 10 min at {conc}; give traffic weights"
            )
        return weights

    def kernel_rows(self, ctas: list[int], block_h: list[int], batches: list[int]) -> list[dict[str, Any]]:
        import json

        from knobfleet import safefile
        from knobfleet.kernel import commands
        from knobfleet.kernel.grid import Grid

        k, m = self.space.kernel, self.space.model
        if k.sweep is not None:
            where = Path(k.sweep)
            if not where.is_absolute():
                where = Path(self.space.path).parent / where
            try:
                doc = json.loads(safefile.read_text(where, 32 * 1024 * 1024, "kernel sweep"))
            except (safefile.FileRefused, ValueError) as exc:
                raise KnobfleetError(f"{paths.display(Path(self.space.path))}: stages.kernel.sweep: {exc}") from None
            rows = doc.get("results") if isinstance(doc, dict) else None
            if not isinstance(rows, list):
                raise KnobfleetError(
                    f"{paths.display(where)}: not a `kernel bench` sweep (no results); point stages.kernel.sweep "
                    "at the JSON `kernel bench --out` wrote"
                )
            return [r for r in rows if isinstance(r, dict)]
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
        doc = json.loads(Path(str(out)).read_text(encoding="utf-8")) if out else {}
        return list(doc.get("results") or [])

    def ab(self, base: Profile, candidate: Profile, max_rounds: int, weights: dict[int, float]) -> dict[str, Any]:
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
            base, candidate, self._engine_host(), self.inventory, settings, spec, folder, on_event=self.on_event
        )

    def restore(self, base: Profile) -> None:
        from knobfleet.experiment.ab import activate

        activate(base, self._engine_host(), self.inventory, self.on_event)

    def canary(self, winner: Profile) -> dict[str, Any]:
        from knobfleet.experiment.canary import Settings
        from knobfleet.experiment.canary_run import CanaryOptions, RecordKeeper, canary
        from knobfleet.ops import fleet
        from knobfleet.telemetry.prom import Prometheus

        live = self.space.live
        settings = Settings(max_windows=live.max_windows, pre_windows=live.pre_windows)
        opts = CanaryOptions(hosts=live.hosts, window_s=live.window_s, settings=settings, advisory=live.advisory)
        door = fleet.door(self.inventory)
        hosts = fleet.hosts(self.inventory, None)
        report = canary(winner, hosts, door, Prometheus(live.prometheus or self.prometheus), opts, keep=RecordKeeper())
        return report.as_json()

    def rollout(self, winner: Profile) -> dict[str, Any]:
        from knobfleet.ops import fleet
        from knobfleet.ops.apply import apply

        rep = apply(winner, fleet.hosts(self.inventory, None), self.inventory, on_event=self.on_event)
        return {"exit_code": rep.exit_code, "hosts": [o.host for o in rep.hosts]}
