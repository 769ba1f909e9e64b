"""The apply use case's report (``ApplyReport``): every host's outcome, the runs and the exit code. On its own so
that the rollout (ops/apply.py), its steps (ops/apply_steps.py) and its restores (ops/apply_restore.py) build the
same one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from knobfleet.errors import EXIT_DRIFT, EXIT_ERROR, EXIT_OK
from knobfleet.ops.outcome import HostOutcome
from knobfleet.profiles.model import Profile


@dataclass
class ApplyReport:
    profile: Profile
    check: bool
    run_ids: list[str]
    hosts: list[HostOutcome]
    wall_s: float
    ansible_s: float
    gates: list[Any] = field(default_factory=list)  # apply --gate: each judged host's verdict, in order
    cost: Any = None  # ops/restart_cost.Cost: the restarts the rollout causes, priced before it started

    @property
    def exit_code(self) -> int:
        if any(h.status in ("failed", "refused") for h in self.hosts):
            return EXIT_ERROR
        if self.check:
            return EXIT_DRIFT if any(h.status == "pending" for h in self.hosts) else EXIT_OK
        return EXIT_OK

    def as_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile.name,
            "version": self.profile.version,
            "hash": self.profile.content_hash,
            "check": self.check,
            "run_ids": self.run_ids,
            "wall_s": round(self.wall_s, 3),
            "exit_code": self.exit_code,
            "hosts": [h.as_json() for h in self.hosts],
            **({"gate": [g.as_json() for g in self.gates]} if self.gates else {}),
            **({"cost": self.cost.as_json()} if self.cost is not None else {}),
        }
