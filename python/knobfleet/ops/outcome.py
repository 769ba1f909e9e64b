"""What a rollout decided or did on one host (``HostOutcome``), on its own so that the rollout (ops/apply.py) and the
engine groups' rules (ops/ranks.py) share it without importing each other. Plain data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from knobfleet.live.verify import Finding

Status = Literal["applied", "unchanged", "failed", "refused", "not-run", "pending", "in-sync", "rolled-back"]
IN_SYNC = "already in sync: checked with one probe, no Ansible run"


@dataclass
class HostOutcome:
    host: str
    status: Status
    batch: int
    generation: int | None = None
    previous: int | None = None
    restarted: bool = False
    main_pid: int | None = None
    ready_s: float | None = None
    restart_s: float | None = None  # systemctl restart: the old engine's stop and the new one's fork
    message: str = ""
    actions: list[str] = field(default_factory=list)  # what apply does (or did) on the host
    # What the live rule found: before the change in a plan or a refusal, after it for an applied host.
    findings: list[Finding] = field(default_factory=list)
    seen: dict[str, str] = field(default_factory=dict)  # knobs worth showing, as the engine has them
    diffs: list[dict[str, Any]] = field(default_factory=list)
    knob_changes: list[str] = field(default_factory=list)
    lock: dict[str, Any] | None = None
    changed_tasks: int = 0
    committed: bool = False  # the run changed files or restarted the engine: a failure must be restored
    died: bool = False  # the on-host install died before it reported: restored, its lock (this run's) broken
    restored: Any = None  # RestoreOutcome when a failure was rolled back
    group: str = ""  # the engine group this host is a rank of ("dsv4-a rank 0"): restarts with its group
    dropped: int | None = None  # --force-restart: requests still in flight when its drain timed out
    startup: dict[str, Any] | None = None  # what the engine's start cost: stop, start, phases (knob_startup)
    cost: dict[str, Any] | None = None  # a plan's price of the restart it would cause (ops/restart_cost.py)
    # a plan's: why the compile cache will be cold after the restart (plan.cache_cold, compile_cache.invalidations)
    cache_cold: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "host": self.host,
            "status": self.status,
            "batch": self.batch,
            "generation": self.generation,
            "previous": self.previous,
            "restarted": self.restarted,
            "main_pid": self.main_pid,
            "ready_s": self.ready_s,
            "restart_s": self.restart_s,
            "message": self.message,
            "actions": self.actions,
            "changed_tasks": self.changed_tasks,
        }
        if self.restored is not None:
            out["restored"] = self.restored.as_json()
        if self.group:
            out["group"] = self.group
        if self.dropped is not None:
            out["dropped"] = self.dropped
        if self.startup is not None:
            out["startup"] = self.startup
        if self.cost is not None:
            out["cost"] = self.cost
        if self.cache_cold:
            out["compile_cache"] = {"cold": self.cache_cold}
        out["live"] = {"ok": not self.findings, "findings": [f.as_json() for f in self.findings], "seen": self.seen}
        if self.knob_changes or self.diffs:
            out["knob_changes"] = self.knob_changes
            out["diffs"] = [{"path": d.get("path"), "diff": d.get("diff")} for d in self.diffs]
        return out
