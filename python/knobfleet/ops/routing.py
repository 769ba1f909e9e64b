"""Router-aware rollouts: the drain and readmit steps of every host a router fronts, as the rollout's slots.

A host whose host vars name a router (``knob_router_url``, ``knob_router_kind``) is taken out of it before
anything changes on it (the slots' before steps: drain, then wait until its in-flight requests reach 0, bounded by
``knob_drain_timeout``), and put back once its new generation is ready and verified (the slot after: readmit, then
wait until the router lists it healthy). A failure undoes in reverse: the old generation is restored, then the
worker is put back, so a host is never left out of its router. The capacity guard (``knob_router_max_unavailable``)
refuses to take out more workers than allowed, or the last healthy one; that host fails with one line and stays
in service on its old generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from knobfleet.errors import UsageError
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.router import Route, drain, evict, readmit, settle
from knobfleet.fleet.router_kinds import route_of, stop_covers_drain
from knobfleet.ops.steps import Slots
from knobfleet.stepcore import PerHost


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
    routes: dict[str, Route] = {}
    for hv in hosts:
        route = route_of(hv, out, max_unavailable=max_unavailable, force_restart=force_restart)
        if route is not None:
            routes[hv.host] = route
    return None if not routes else route_slots(routes)


def route_slots(routes: dict[str, Route]) -> Slots:
    """The slots of the hosts ``routes`` covers, each step one line: the drain (undone by the re-add), then the
    wait until the router has let the worker go (SMG's draining state) before anything restarts; the re-add once
    the new generation is verified (undone by taking the worker out again). Hosts no route covers pass by."""
    return Slots(
        before=[
            PerHost("drain", lambda h: drain(routes[h]), lambda h: readmit(routes[h]), covers=routes),
            PerHost("settle", lambda h: settle(routes[h]), covers=routes),
        ],
        after=[PerHost("readmit", lambda h: readmit(routes[h]), lambda h: evict(routes[h]), covers=routes)],
    )


@dataclass(frozen=True)
class WorkerState:
    """One routed host as its router sees it: listed or not, healthy or not (``error``: the router's one line)."""

    host: str
    router: str
    worker: str
    listed: bool = False
    healthy: bool = False
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host, "router": self.router, "worker": self.worker, "listed": self.listed,
                "healthy": self.healthy, "error": self.error}  # fmt: skip


def worker_states(hosts: Sequence[HostVars]) -> list[WorkerState]:
    """Every routed host of ``hosts`` as its router lists it (each router read once), in the order given."""
    from knobfleet.fleet.router import RouterError, normalize_url
    from knobfleet.fleet.router_kinds import router_for

    listed: dict[str, dict[str, bool] | str] = {}
    for hv in hosts:
        if hv.router_url and hv.router_url not in listed:
            try:
                listed[hv.router_url] = {
                    w.url: w.healthy for w in router_for(hv.router_kind, hv.router_url).list_workers()
                }
            except RouterError as exc:
                listed[hv.router_url] = str(exc)
    out = []
    for hv in hosts:
        if not hv.router_url:
            continue
        got, worker = listed[hv.router_url], normalize_url(hv.base_url)
        if isinstance(got, str):
            out.append(WorkerState(hv.host, hv.router_url, worker, error=got))
        else:
            out.append(WorkerState(hv.host, hv.router_url, worker, worker in got, got.get(worker, False)))
    return out


def readd(hosts: Sequence[HostVars], engine_ready: Any = None) -> list[tuple[str, bool, str]]:
    """Put back every routed host of ``hosts`` its router does not list (what an interrupted rollout left out),
    one at a time, each only once its engine answers its health check: (host, ok, one line) per host out.
    Hosts already listed are left alone. ``engine_ready(hv)``: None when ready, else why not (default: HTTP)."""
    ready = engine_ready or _engine_ready
    by_name = {hv.host: hv for hv in hosts}
    done: list[tuple[str, bool, str]] = []
    for state in worker_states(hosts):
        if state.error is not None:
            done.append((state.host, False, state.error))
            continue
        if state.listed:
            continue
        hv = by_name[state.host]
        why = ready(hv)
        if why is not None:
            done.append(
                (hv.host, False, f"not put back: its engine is not ready ({why}); fix it first (knobfleet verify)")
            )
            continue
        route = route_of(hv, set())
        assert route is not None  # routed: worker_states lists only hosts with a router
        result = readmit(route)
        done.append((hv.host, result.ok, result.message))
    return done


def _engine_ready(hv: HostVars) -> str | None:
    from knobfleet.deadline_http import exchange

    try:
        status, _ = exchange(hv.health_url, timeout_s=10.0, max_body=1 << 16)
    except (OSError, ValueError) as exc:
        return f"{hv.health_url}: {exc.strerror or exc}" if isinstance(exc, OSError) else f"{hv.health_url}: {exc}"
    return None if status == 200 else f"{hv.health_url}: HTTP {status}"
