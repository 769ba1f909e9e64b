"""Router-aware rollouts: the drain and readmit steps of every host a router fronts, as the rollout's slots.

A host whose host vars name a router (``knob_router_url``, ``knob_router_kind``) is taken out of it before
anything changes on it (slot-before: drain, then wait until its in-flight requests reach 0, bounded by
``knob_drain_timeout``), and put back once its new generation is ready and verified (slot-after: readmit, then
wait until the router lists it healthy). A failure undoes in reverse: the old generation is restored, then the
worker is put back, so a host is never left out of its router. The capacity guard (``knob_router_max_unavailable``)
refuses to take out more workers than allowed, or the last healthy one; that host fails with one line and stays
in service on its old generation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from knobfleet.errors import UsageError
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.router_kinds import router_steps, stop_covers_drain
from knobfleet.ops.steps import Slots


@dataclass(frozen=True)
class _NoRouter:
    """The result of a slot step on a host no router fronts: nothing to do."""

    ok: bool = True
    message: str = "no router"


@dataclass
class RouterSlot:
    """One slot step over every host: each host's own router step (drain or readmit), none for the others."""

    name: str
    steps: Mapping[str, Any]

    def do(self, host: str) -> Any:
        step = self.steps.get(host)
        return _NoRouter() if step is None else step.do()

    def undo(self, host: str) -> None:
        step = self.steps.get(host)
        if step is None:
            return
        result = step.undo()
        if not getattr(result, "ok", True):
            raise RuntimeError(getattr(result, "message", "failed"))


def router_slots(hosts: Sequence[HostVars], max_unavailable: str | None = None) -> Slots | None:
    """The drain/readmit slots of the hosts routers front, or None when none is. A unit whose stop timeout does
    not cover the drain is refused before anything changes (one line per host, the first shown)."""
    problems = [p for hv in hosts if hv.router_url for p in [stop_covers_drain(hv)] if p]
    if problems:
        raise UsageError(problems[0] + (f" (and {len(problems) - 1} more host(s))" if len(problems) > 1 else ""))
    out: set[str] = set()  # the worker URLs this rollout has taken out (the capacity guard counts them)
    drains: dict[str, Any] = {}
    readmits: dict[str, Any] = {}
    for hv in hosts:
        pair = router_steps(hv, out, max_unavailable=max_unavailable)
        if pair is not None:
            drains[hv.host], readmits[hv.host] = pair
    if not drains:
        return None
    return Slots(before=[RouterSlot("drain", drains)], after=[RouterSlot("readmit", readmits)])
