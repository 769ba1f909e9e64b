"""Pure: what the restarts a change causes will cost, from what each host's earlier starts cost.

Every start knobfleet causes is measured on the host (knob_ready, module_utils/knob_startup.py) and appended to the
service's ledger as an event ``start``: the old engine's stop, the start to ready, its phases, the generation's
profile and the engine version. ``plan`` and ``apply`` price the restarts they are about to cause from those
entries, before they ask to proceed:

- per host: the restarts, and the measured stop + start (the median of the host's last ``LAST`` starts of the same
  profile on the same engine version; else of the same engine version; else of any profile: the basis is named);
  ``unmeasured`` where the host's ledger has no start;
- the expected wall time: batch by batch (the capacity guard's batch size), the slowest host of each batch plus the
  rollout's own time per batch (the Ansible run, the drain and the checks: measured by this controller's last real
  apply, ``overhead_s``);
- the capacity out of service: the sum over the hosts of their stop + start, in host-minutes.

A host with no history is never given a guessed figure: the totals then say how many hosts they leave out."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

LAST = 5  # starts a host's estimate is the median of


@dataclass(frozen=True)
class Measured:
    stop_s: float | None  # median of the restarts' stops (None: only first starts measured)
    start_s: float  # median start to ready
    n: int  # starts it is the median of
    basis: str  # which starts: "this profile on this engine version", "this engine version", "any profile"
    phases: dict[str, float] = field(default_factory=dict)  # median seconds per phase the log showed

    @property
    def seconds(self) -> float:
        """What one restart takes the host out of service for: the stop, then the start to ready."""
        return (self.stop_s or 0.0) + self.start_s

    def as_json(self) -> dict[str, Any]:
        return {
            "stop_s": self.stop_s,
            "start_s": self.start_s,
            "seconds": round(self.seconds, 3),
            "n": self.n,
            "basis": self.basis,
            "phases": self.phases,
        }


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


def starts(ledger: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ledger's measured starts, oldest first (entries written by an older knobfleet, or damaged, are not)."""
    return [e for e in ledger if isinstance(e, Mapping) and e.get("event") == "start" and _num(e.get("start_s"))]


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def measured(
    ledger: Sequence[Mapping[str, Any]], profile: str | None, engine_version: str | None, last: int = LAST
) -> Measured | None:
    """The host's restart as its ledger measured it (see the module's doc), or None: unmeasured."""
    every = starts(ledger)
    choices = (
        ("this profile on this engine version",
         lambda e: e.get("profile") == profile and e.get("engine_version") == engine_version),
        ("this engine version", lambda e: engine_version is not None and e.get("engine_version") == engine_version),
        ("any profile", lambda e: True),
    )  # fmt: skip
    for basis, pick in choices:
        chosen = [e for e in every if pick(e)][-last:]
        if not chosen:
            continue
        stops = [s for e in chosen if (s := _num(e.get("stop_s"))) is not None]
        per_phase: dict[str, list[float]] = {}
        for e in chosen:
            for p in e.get("phases") or []:
                if isinstance(p, Mapping) and isinstance(p.get("phase"), str) and _num(p.get("s")) is not None:
                    per_phase.setdefault(p["phase"], []).append(float(p["s"]))
        return Measured(
            stop_s=_median(stops) if stops else None,
            start_s=_median([float(e["start_s"]) for e in chosen]),
            n=len(chosen),
            basis=basis,
            phases={k: _median(v) for k, v in per_phase.items()},
        )
    return None


@dataclass(frozen=True)
class HostCost:
    host: str
    batch: int  # 1-based
    restarts: int
    measured: Measured | None

    def as_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "batch": self.batch,
            "restarts": self.restarts,
            "measured": self.measured.as_json() if self.measured else None,
            "unmeasured": self.measured is None,
        }


@dataclass(frozen=True)
class Cost:
    hosts: list[HostCost]
    batches: int
    overhead_s: float | None  # the rollout's own time per batch, from this controller's last real apply
    wall_s: float | None  # the expected wall time; None when no restarting host is measured
    host_minutes: float  # capacity out of service, over the measured hosts
    unmeasured: list[str]

    @property
    def restarts(self) -> int:
        return sum(h.restarts for h in self.hosts)

    def as_json(self) -> dict[str, Any]:
        return {
            "restarts": self.restarts,
            "batches": self.batches,
            "overhead_s": self.overhead_s,
            "wall_s": self.wall_s,
            "host_minutes": self.host_minutes,
            "unmeasured": self.unmeasured,
            "hosts": [h.as_json() for h in self.hosts],
        }

    def lines(self) -> list[str]:
        """The cost as ``plan`` and ``apply`` state it before anything changes."""
        if not self.hosts:
            return ["restarts: none (nothing to change)"]
        out = [f"restarts: {self.restarts} on {len(self.hosts)} host(s), in {self.batches} batch(es)"]
        for h in self.hosts:
            m = h.measured
            if m is None:
                out.append(f"  {h.host} (batch {h.batch}): unmeasured (no start in its ledger yet)")
                continue
            stop = f"stop {m.stop_s:.1f}s + " if m.stop_s is not None else ""
            phases = ", ".join(f"{k} {v:.1f}s" for k, v in m.phases.items())
            out.append(
                f"  {h.host} (batch {h.batch}): {stop}start {m.start_s:.1f}s = {m.seconds:.1f}s out of service "
                f"(median of {m.n}, {m.basis})" + (f"; phases: {phases}" if phases else "")
            )
        if self.wall_s is None:
            out.append("expected time: unmeasured (no host has a measured start yet)")
        else:
            over = (
                f", {self.overhead_s:.0f}s a batch for the rollout itself"
                if self.overhead_s is not None
                else ", the rollout's own time per batch unmeasured (no real apply from here yet)"
            )
            left = f"; leaves out {len(self.unmeasured)} unmeasured host(s)" if self.unmeasured else ""
            out.append(
                f"expected time: {_clock(self.wall_s)} ({self.batches} batch(es){over}); capacity out of service: "
                f"{self.host_minutes:.1f} host-minutes{left}"
            )
        return out


def experiment_lines(what: str, hosts: Mapping[str, Measured | None], restarts_each: int, why: str) -> list[str]:
    """What an experiment (``ab``, ``canary``) will cost in restarts, stated before it asks to proceed:
    ``restarts_each`` restarts on each host (``why`` says where they come from), priced at each host's measured
    restart."""
    total = restarts_each * len(hosts)
    out = [f"{what}: up to {total} restart(s), {restarts_each} on each of {len(hosts)} host(s) ({why})"]
    seconds = 0.0
    for host, m in hosts.items():
        if m is None:
            out.append(f"  {host}: unmeasured (no start in its ledger yet)")
            continue
        seconds += m.seconds * restarts_each
        out.append(
            f"  {host}: {m.seconds:.1f}s a restart (median of {m.n}, {m.basis}) = {_clock(m.seconds * restarts_each)}"
        )
    missing = [h for h, m in hosts.items() if m is None]
    if len(missing) < len(hosts):
        left = f" (leaves out {len(missing)} unmeasured host(s))" if missing else ""
        out.append(f"  restarts alone: {seconds / 60:.1f} host-minutes out of service{left}")
    return out


# Restarts a canary causes on each host of each subset, at most (experiment/canary_run.py): the canaries take the
# profile and the baseline restarts as fresh; a crossover swaps (both subsets restart again), and its verdict puts
# one subset back or onto the profile once more; a difference-in-differences canary has no swap, and a rollback
# puts the canaries back.
CANARY_RESTARTS = {"crossover": (3, 3), "did": (2, 1)}


def canary_lines(
    design: str, canaries: Mapping[str, Measured | None], baseline: Mapping[str, Measured | None]
) -> list[str]:
    """What a canary's design costs in restarts, and what the other design would cost, before it asks."""
    other = "did" if design == "crossover" else "crossover"
    c, b = CANARY_RESTARTS[design]
    out = experiment_lines(f"canary ({design}) canaries", canaries, c, "the profile, the swap, the verdict"
                           if design == "crossover" else "the profile, a rollback")  # fmt: skip
    out += experiment_lines(f"canary ({design}) baseline", baseline, b, "fresh restart, the swap, the verdict"
                            if design == "crossover" else "a fresh restart")  # fmt: skip
    oc, ob = CANARY_RESTARTS[other]
    mine, theirs = c * len(canaries) + b * len(baseline), oc * len(canaries) + ob * len(baseline)
    out.append(f"  the {other} design would cost up to {theirs} restart(s) instead of {mine}")
    return out


def _clock(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def price(
    batches: Sequence[Sequence[str]],
    restarting: set[str],
    ledgers: Mapping[str, Sequence[Mapping[str, Any]]],
    profile: str | None,
    versions: Mapping[str, str | None],
    overhead_s: float | None = None,
    restarts_each: int = 1,
) -> Cost:
    """The cost of restarting ``restarting`` (``restarts_each`` times each: an A/B restarts a host per arm and round)
    in ``batches`` (the rollout's order), from each host's ledger and its engine version."""
    hosts: list[HostCost] = []
    wall, minutes, seen = 0.0, 0.0, False
    n = 0
    for batch in batches:
        todo = [h for h in batch if h in restarting]
        if not todo:
            continue
        n += 1
        slowest = 0.0
        for host in todo:
            m = measured(ledgers.get(host) or [], profile, versions.get(host))
            hosts.append(HostCost(host, n, restarts_each, m))
            if m is not None:
                seen = True
                slowest = max(slowest, m.seconds)
                minutes += m.seconds * restarts_each / 60
        wall += (slowest + (overhead_s or 0.0)) * restarts_each
    unmeasured = [h.host for h in hosts if h.measured is None]
    return Cost(hosts, n, overhead_s, round(wall, 1) if seen else None, round(minutes, 2), unmeasured)
