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


def paced_serial(hosts: Sequence[HostVars], serial: str | None, canary: bool = False) -> str | None:
    """The rollout's batch size behind routers: the capacity guard's by default, like Kubernetes' maxUnavailable.

    With no ``--serial``, a batch holds at most as many hosts of one router as its ``knob_router_max_unavailable``
    allows (counted over the hosts of this rollout behind it), so hosts the guard would hold back wait for their
    turn instead of failing. An explicit ``--serial`` wins, unless one of its batches would take more workers of a
    router out than the guard allows: then it is refused before anything changes. Hosts behind no router: as given.
    """
    from knobfleet.fleet.router import max_out
    from knobfleet.ops import plan

    behind: dict[str, list[HostVars]] = {}
    for hv in hosts:
        if hv.router_url:
            behind.setdefault(hv.router_url, []).append(hv)
    if not behind:
        return serial
    limits = {}
    for url, members in behind.items():
        try:
            limits[url] = max_out(members[0].router_max_unavailable, len(members))
        except ValueError as exc:
            raise UsageError(f"{members[0].host}: knob_router_max_unavailable: {exc}") from None
    if serial is None:
        return str(min(limits.values()))
    router_of = {hv.host: hv.router_url for hv in hosts}
    for batch in plan.batches([hv.host for hv in hosts], serial, canary):
        for url, limit in limits.items():
            taken = [h for h in batch if router_of.get(h) == url]
            if len(taken) > limit:
                raise UsageError(
                    f"--serial {serial}: a batch would take {len(taken)} workers of {url} out at once "
                    f"({', '.join(taken[:3])}{', …' if len(taken) > 3 else ''}); its knob_router_max_unavailable "
                    f"allows {limit}: use --serial {limit}, or leave --serial out and the rollout follows the guard; "
                    "nothing was changed"
                )
    return serial


def router_slots(
    hosts: Sequence[HostVars], max_unavailable: str | None = None, force_restart: bool = False
) -> Slots | None:
    """The drain/readmit slots of the hosts routers front, or None when none is. A unit whose stop timeout does
    not cover the drain is refused before anything changes (one line per host, the first shown).
    ``force_restart``: a drain that times out restarts the engine anyway, counting the requests dropped."""
    problems = [p for hv in hosts if hv.router_url for p in [stop_covers_drain(hv)] if p]
    if problems:
        raise UsageError(problems[0] + (f" (and {len(problems) - 1} more host(s))" if len(problems) > 1 else ""))
    out: set[str] = set()  # the worker URLs this rollout has taken out (the capacity guard counts them)
    drains: dict[str, Any] = {}
    readmits: dict[str, Any] = {}
    for hv in hosts:
        pair = router_steps(hv, out, max_unavailable=max_unavailable, force_restart=force_restart)
        if pair is not None:
            drains[hv.host], readmits[hv.host] = pair
    if not drains:
        return None
    return Slots(before=[RouterSlot("drain", drains)], after=[RouterSlot("readmit", readmits)])
