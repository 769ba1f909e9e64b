"""The rollout's restarts priced (ops/restart_cost.py) from what the pre-check read, and the rollout's own time per
batch (the Ansible run, the drain, the checks) as this controller's last real apply measured it: kept per inventory
in the state folder, a hint only (a plan without it says so)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from knobfleet.errors import KnobfleetError, UsageError
from knobfleet.fleet.hostvars import HostVars
from knobfleet.ops import plan
from knobfleet.ops.outcome import HostOutcome
from knobfleet.ops.restart_cost import Cost, Measured, measured, price


def _file(inventory: Path) -> Path:
    import hashlib

    from knobfleet import paths

    key = hashlib.sha256(str(inventory.resolve()).encode()).hexdigest()[:16]
    return paths.state_dir() / "cache" / "rollout-overhead" / f"{key}.json"


def overhead(inventory: Path) -> float | None:
    """Seconds a batch of this inventory's last real apply took beyond its slowest host's stop and start."""
    try:
        value = json.loads(_file(inventory).read_text()).get("overhead_s")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) and 0 <= value < 86400 else None


def remember(inventory: Path, outcomes: Sequence[HostOutcome], wall_s: float) -> None:
    """After a real apply: its time beyond its restarts, per batch that restarted a host (kept only when every
    restarted host's start was measured)."""
    batches: dict[int, float] = {}
    for o in outcomes:
        if not o.restarted:
            continue
        s = o.startup or {}
        if not isinstance(s.get("start_s"), int | float):
            return
        took = float(s.get("stop_s") or 0.0) + float(s["start_s"])
        batches[o.batch] = max(batches.get(o.batch, 0.0), took)
    if not batches:
        return
    per = max(0.0, (wall_s - sum(batches.values())) / len(batches))
    path = _file(inventory)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"overhead_s": round(per, 2), "batches": len(batches)}))
        tmp.replace(path)
    except OSError:
        pass  # a hint only


def restarting(outcomes: dict[str, HostOutcome], hosts: Sequence[HostVars], check: bool) -> list[str]:
    """The hosts the rollout will restart, in order: in a plan those pending a restart, in an apply those the
    pre-check left to the playbook (in-sync and refused hosts are decided and not restarted)."""
    out = []
    for hv in hosts:
        o = outcomes.get(hv.host)
        if o is None:
            if not check:
                out.append(hv.host)
        elif o.status == "pending" and ("restart" in o.actions or not o.actions):
            out.append(hv.host)
    return out


def cost(
    hosts: Sequence[HostVars],
    outcomes: dict[str, HostOutcome],
    seen: dict[str, dict[str, Any]],
    profile: str,
    opts: Any,
    inventory: Path,
    units: Any = None,
) -> Cost:
    """The rollout's cost: its restarting hosts in the batches apply will run them in (the routers' capacity guard
    where ``--serial`` is not given), priced from the ledgers the pre-check read."""
    from knobfleet.ops.routing import paced_serial

    todo = restarting(outcomes, hosts, opts.check)
    try:
        serial = paced_serial(hosts, opts.serial, opts.canary)
    except UsageError:
        serial = opts.serial  # the rollout refuses it itself
    groups = plan.batches(todo, serial, opts.canary, units(todo) if units else None)
    return price(
        groups,
        set(todo),
        {h: v.get("ledger") or [] for h, v in seen.items()},
        profile,
        {h: v.get("engine_version") for h, v in seen.items()},
        overhead(inventory),
        # --gate: each judged host also runs the baseline and the profile once more (experiment/gate.py)
        restarts_each=3 if opts.gate is not None else 1,
    )


def host_restarts(hosts: Sequence[HostVars], door: Any, profile: str) -> dict[str, Measured | None]:
    """Each host's measured restart (``restart_cost.measured``) from one quick probe of its ledger; a host the
    probe does not answer, or that has no start yet, is unmeasured (None)."""
    try:
        outcomes = door.probe(list(hosts), quick=True)
    except (KnobfleetError, OSError):  # a price is advice: a probe that fails leaves the hosts unmeasured
        outcomes = {}
    out: dict[str, Measured | None] = {}
    for hv in hosts:
        o = outcomes.get(hv.host)
        doc = getattr(o, "doc", None) or {}
        package = doc.get("engine_package") or {}
        ledger = (doc.get("generations") or {}).get("ledger") or []
        out[hv.host] = measured(ledger, profile, package.get("version") or doc.get("engine_version"))
    return out
