"""A campaign's stages without hosts: the stand-in engine's model as the engine, with the lab's noise (seeded).

``SimStages`` answers what ``tune/run.py`` asks of hosts: ``ab`` runs the real sequential rule
(``experiment.design.decide``) over AB/BA rounds whose per-bucket throughputs are the stand-in's noise-free
model times a slow drift shared by the buckets and white noise per bucket (6.5% run to run in all, as
perf/decision_quality.py); ``kernel_rows`` is the model's attention cost with 2% noise per cell; ``canary`` judges
the true weighted effect with the live noise of a window. Used by tests/unit/tune and perf/tune_quality.py. Never
by a campaign on real hosts."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from knobfleet import waves
from knobfleet.experiment.design import Settings, decide, order
from knobfleet.lab.sim import model
from knobfleet.profiles.model import Profile

SIGMA = 0.065
SIGMA_WHITE = 0.015
SIGMA_DRIFT = math.sqrt(SIGMA**2 - SIGMA_WHITE**2)
TAU = 20.0


def knobs_of(profile: Profile) -> waves.KernelKnobs:
    return waves.KernelKnobs.from_env({k: v for k, v in profile.env.items() if k in waves.DEFAULTS})


@dataclass
class SimStages:
    weights: dict[int, float]
    sms: int = 188
    seed: int = 0
    max_tokens: int = 256
    scale: dict[str, float] = field(default_factory=dict)  # profile name -> extra factor (a crash: 0)
    inconsistent: set[str] = field(default_factory=set)  # profile names whose outputs diverge under load
    live: dict[int, float] | None = None
    restart_s: float = 0.0  # what each simulated restart costs (an A/B restarts twice a round, once more at its end)
    calls: list[str] = field(default_factory=list)
    on_call: Any = None  # called with the step's name before it runs (tests interrupt here)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.drift = 0.0
        self.current: str | None = None
        self.base: Profile | None = None

    def _call(self, what: str) -> None:
        self.calls.append(what)
        if self.on_call is not None:
            self.on_call(what)

    def true_tok_s(self, profile: Profile, batch: int) -> float:
        return model.aggregate_tok_s(batch, knobs_of(profile), self.sms, self.max_tokens) * self.scale.get(
            profile.name, 1.0
        )

    def live_weights(self) -> dict[int, float]:
        self._call("live_weights")
        return dict(self.live or self.weights)

    def kernel_rows(self, ctas: list[int], block_h: list[int], batches: list[int]) -> list[dict[str, Any]]:
        self._call("kernel")
        self.kernel_asked = (list(ctas), list(block_h), list(batches))
        rows = []
        for b in batches:
            for c in ctas:
                for bh in block_h:
                    k = waves.KernelKnobs(c, bh)
                    us = waves.step_cost(b, k, self.sms) * 1000 * math.exp(self.rng.gauss(0, 0.02))
                    rows.append(
                        {"batch": b, "target_ctas": c, "block_h": bh, "heads": 64, "context": 4096, "total_us": us}
                    )
        return rows

    def _run(self, profile: Profile, conc: list[int]) -> dict[int, float]:
        a = math.exp(-1 / TAU)
        self.drift = a * self.drift + math.sqrt(1 - a * a) * self.rng.gauss(0, SIGMA_DRIFT)
        return {c: self.true_tok_s(profile, c) * math.exp(self.drift + self.rng.gauss(0, SIGMA_WHITE)) for c in conc}

    def ab(
        self,
        base: Profile,
        candidate: Profile,
        max_rounds: int,
        weights: dict[int, float],
        deadline_s: float | None = None,  # the simulation takes no time
    ) -> dict[str, Any]:
        from knobfleet.errors import KnobfleetError
        from knobfleet.experiment import stats

        self._call(f"ab {candidate.name}")
        self.base = base
        if self.scale.get(candidate.name, 1.0) <= 0:
            self.current = base.name
            raise KnobfleetError(f"sim: applying {candidate.ref} failed: the engine exited at start")
        # each candidate's A/B has its own seeded machine: an A/B redone after an interruption sees the same runs
        self.rng = random.Random(f"{self.seed}-{candidate.name}-{max_rounds}")
        self.drift = 0.0
        s = Settings(weights=weights, max_rounds=max_rounds, min_rounds=min(3, max_rounds))
        conc = sorted(weights)
        per: dict[int, list[float]] = {c: [] for c in conc}
        d = decide(per, s)
        for r in range(max_rounds):
            got = {}
            for arm in order(r):
                self.current = candidate.name if arm == "B" else base.name
                got[arm] = self._run(candidate if arm == "B" else base, conc)
            for c in conc:
                per[c].append(stats.log_ratio(got["A"][c], got["B"][c]))
            d = decide(per, s)
            if d.final:
                break
        verdict = d.verdict if d.final else "inconclusive"
        self.current = candidate.name if verdict == "promote" else base.name
        g = d.gain

        def r1(x: float | None) -> float | None:
            return None if x is None else math.expm1(x)

        return {
            "verdict": verdict,
            "reason": d.reason,
            "rounds": d.rounds,
            "weighted_gain": {
                "estimate": r1(g.estimate) if g else None,
                "low": r1(g.low) if g else None,
                "high": r1(g.high) if g else None,
            },
            "buckets": [],
            "consistency": {"A": "pass", "B": "fail" if candidate.name in self.inconsistent else "pass"},
            "wall_s": 0.0,
            "spent": {"restarts": 2 * d.rounds + 1, "restart_s": round((2 * d.rounds + 1) * self.restart_s, 1)},
        }

    def restore(self, base: Profile) -> None:
        self._call("restore")
        self.current = base.name

    def true_gain(self, base: Profile | None, winner: Profile) -> float:
        assert base is not None, "the canary comes after the engine stage's A/Bs"
        total = sum(self.weights.values())
        return sum(
            w / total * math.log(self.true_tok_s(winner, c) / self.true_tok_s(base, c)) for c, w in self.weights.items()
        )

    def canary(self, winner: Profile) -> dict[str, Any]:
        self._call("canary")
        self.rng = random.Random(f"{self.seed}-canary-{winner.name}")
        est = self.true_gain(self.base, winner) + self.rng.gauss(0, 0.02)
        verdict = "promote" if est - 2 * 0.02 > -0.03 else "rollback"
        return {"verdict": verdict, "reason": f"sim: live estimate {math.expm1(est):+.1%}"}

    def rollout(self, winner: Profile) -> dict[str, Any]:
        self._call("rollout")
        return {"exit_code": 0, "hosts": ["sim"]}
