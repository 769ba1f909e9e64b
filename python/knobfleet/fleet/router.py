"""Taking a host's engine out of its router and putting it back: the pure core.

A production decode server sits behind a router. Before its engine restarts, the worker is removed from the
router (drain), its in-flight requests are waited out (read from the engine's own ``/metrics``), and after it
is ready again it is put back and waited on until the router reports it healthy. This module holds what that
needs without doing any I/O: the parsed router and engine documents, the typed outcome of each operation, the
capacity guard, and what a rollout does to one host's worker (``Route``: ``drain``, ``settle``, ``readmit``,
``evict``), driving a ``RouterKind`` (``fleet.router_kinds``: the HTTP side, one class per kind of router) with an
injected clock. Each returns a ``RouterResult``, the rollout's one ``StepResult`` with the router's outcome; the
rollout's steps are ``stepcore.PerHost`` over them (ops/routing.py).
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from knobfleet.errors import KnobfleetError
from knobfleet.stepcore import StepResult

# In-flight gauges per engine: running + queued requests (DESIGN: SGLang needs --enable-metrics; vLLM always).
_SAMPLE_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


class Outcome(enum.StrEnum):
    """What one router operation ended in. Everything but ``ok`` leaves the host in service, old generation."""

    OK = "ok"
    UNREACHABLE = "router_unreachable"
    REFUSED = "router_refused"
    UNKNOWN_WORKER = "unknown_worker"
    DRAIN_TIMEOUT = "drain_timeout"
    NOT_HEALTHY = "not_healthy"
    CAPACITY = "capacity"
    ENGINE_METRICS = "engine_metrics_unreadable"


class RouterError(KnobfleetError):
    """A router operation failed: ``outcome`` says how, the message is one line naming router, worker and fix."""

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class Generation(enum.StrEnum):
    """The router's worker API generation (sglang-router)."""

    V03 = "0.3"  # POST /workers -> 202 job; GET /workers lists id/url/is_healthy/load; DELETE /workers/{id}
    V02 = "0.2"  # POST /workers {url}; DELETE /workers/{quoted url}; GET /workers without ids


@dataclass(frozen=True)
class Worker:
    url: str
    healthy: bool
    id: str | None = None
    load: int | None = None


@dataclass(frozen=True, kw_only=True)
class RouterResult(StepResult):
    """What a drain, settle, re-add or its undo did on one host (``stepcore.StepResult``): the typed outcome, how
    long it took, the in-flight count seen last (drain) and whether the worker is in the router when it ends.
    ``ok`` is ``outcome is Outcome.OK`` (``routed`` builds it so)."""

    outcome: Outcome
    seconds: float = 0.0
    inflight: int | None = None
    in_router: bool = True
    forced: bool = False  # a drain that timed out, restarted anyway (--force-restart): ``inflight`` were dropped

    def __post_init__(self) -> None:
        if self.ok != (self.outcome is Outcome.OK):
            raise ValueError(f"{self.step} on {self.host}: ok={self.ok} disagrees with outcome {self.outcome}")


def routed(
    step: str,
    host: str,
    outcome: Outcome,
    message: str,
    seconds: float = 0.0,
    inflight: int | None = None,
    in_router: bool = True,
    forced: bool = False,
) -> RouterResult:
    return RouterResult(
        step=step,
        host=host,
        ok=outcome is Outcome.OK,
        message=message,
        outcome=outcome,
        seconds=seconds,
        inflight=inflight,
        in_router=in_router,
        forced=forced,
    )


def normalize_url(url: str) -> str:
    """``http://H:P/`` and ``http://H:P`` name the same worker."""
    return url.strip().rstrip("/")


def parse_workers(doc: Any) -> tuple[Generation, list[Worker]]:
    """``GET /workers`` of sglang-router: the generation it reveals and the workers. 0.3 lists ``id`` with each
    worker; 0.2 lists them without (or as plain URLs). ValueError on anything else."""
    if not isinstance(doc, dict) or not isinstance(doc.get("workers"), list):
        raise ValueError("expected a JSON object with a 'workers' list")
    out: list[Worker] = []
    ids = False
    for item in doc["workers"]:
        if isinstance(item, str):
            out.append(Worker(normalize_url(item), healthy=True))
            continue
        if not isinstance(item, dict) or not isinstance(item.get("url"), str):
            raise ValueError("each worker must be a URL or an object with a 'url'")
        wid = item.get("id")
        ids = ids or isinstance(wid, str)
        load = item.get("load")
        out.append(
            Worker(
                normalize_url(item["url"]),
                healthy=bool(item.get("is_healthy", True)),
                id=wid if isinstance(wid, str) else None,
                load=int(load) if isinstance(load, int | float) and not isinstance(load, bool) else None,
            )
        )
    return (Generation.V03 if ids or not out else Generation.V02), out


def parse_inflight(text: str, names: Sequence[str]) -> int:
    """Running + queued requests from an engine's Prometheus text (every label set summed of the gauges ``names``:
    the catalog's ``serve.metrics.running`` and ``queued``). ValueError when the engine exposes none of them (SGLang
    without --enable-metrics)."""
    escaped = {n.replace(":", "_") for n in names}  # an OpenMetrics answer with escaping=underscores (prom.series)
    total = 0.0
    seen = False
    for line in text.splitlines():
        m = _SAMPLE_RE.match(line)
        if m and (m.group(1) in names or m.group(1) in escaped):
            value = float(m.group(3))
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{m.group(1)} = {m.group(3)}: not a count")
            total += value
            seen = True
    if not seen:
        raise ValueError(f"none of {', '.join(names)} in the engine's /metrics")
    return round(total)


def max_out(max_unavailable: int | str, total: int) -> int:
    """``max_unavailable`` as a count of workers: ``2`` or ``"25%"`` (of ``total``, rounded down, at least 1)."""
    if isinstance(max_unavailable, bool):
        raise ValueError("max_unavailable must be a count or a percentage such as 25%")
    if isinstance(max_unavailable, int):
        count = max_unavailable
    else:
        text = str(max_unavailable).strip()
        if text.endswith("%"):
            try:
                pct = float(text[:-1])
            except ValueError:
                raise ValueError(f"max_unavailable {text!r}: not a percentage such as 25%") from None
            if not 0 < pct <= 100:
                raise ValueError(f"max_unavailable {text!r}: a percentage must be in (0, 100]")
            return max(1, math.floor(total * pct / 100))
        if not text.isdigit():
            raise ValueError(f"max_unavailable {text!r}: a count such as 1 or a percentage such as 25%")
        count = int(text)
    if count < 1:
        raise ValueError(f"max_unavailable {max_unavailable!r}: must be at least 1")
    return count


def capacity_refusal(
    workers: Iterable[Worker], out: Iterable[str], take: str, max_unavailable: int | str, router: str = "router"
) -> str | None:
    """Why taking ``take`` out of a router now is refused, or None when it is allowed. ``workers``: what the
    router lists; ``out``: URLs this rollout has taken out and not yet put back (listed or not). Pure."""
    listed = {w.url: w for w in workers}
    take = normalize_url(take)
    gone = {normalize_url(u) for u in out}
    total = len(set(listed) | gone | {take})
    limit = max_out(max_unavailable, total)
    if take in gone:
        return None  # already out: nothing more is taken
    if len(gone) + 1 > limit:
        return (
            f"{router}: taking {take} out would leave {len(gone) + 1} of {total} workers out; "
            f"max_unavailable is {max_unavailable} ({limit}): put {', '.join(sorted(gone))} back first"
        )
    healthy_left = [u for u, w in listed.items() if w.healthy and u != take and u not in gone]
    if not healthy_left:
        return f"{router}: {take} is the last healthy worker; taking it out would stop all traffic"
    return None


class RouterKind(Protocol):
    """One kind of router (``fleet.router_kinds``): list, remove and add workers by URL. Each method raises
    RouterError (typed outcome, one line) on failure."""

    url: str

    def list_workers(self) -> list[Worker]: ...

    def remove(self, worker_url: str) -> None: ...

    def add(self, worker_url: str) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


@dataclass
class Route:
    """One host's worker in its router, and the bounds of taking it out and putting it back: what ``drain``,
    ``settle``, ``readmit`` and ``evict`` act on. ``inflight`` reads the engine's running + queued count
    (``router_kinds.engine_inflight``; only the drain reads it); ``out`` is the rollout's shared set of worker
    URLs it has taken out (the capacity guard counts it)."""

    host: str
    router: RouterKind
    worker_url: str
    clock: Clock
    inflight: Callable[[], int] | None = None
    drain_timeout_s: float = 120.0  # the drain's wait for 0 in flight, and the settle's for the router to let go
    healthy_timeout_s: float = 120.0  # the re-add's wait for the router to list the worker healthy
    max_unavailable: int | str = 1
    poll_s: float = 0.25
    out: set[str] = field(default_factory=set)
    force: bool = False  # --force-restart: a drain that times out goes on, counting the requests it drops

    @property
    def url(self) -> str:
        return normalize_url(self.worker_url)

    def result(self, step: str, outcome: Outcome, message: str, t0: float, **kw: Any) -> RouterResult:
        return routed(step, self.host, outcome, message, self.clock.now() - t0, **kw)


def drain(r: Route) -> RouterResult:
    """Take the worker out of its router and wait until the engine has no request in flight, at most
    ``drain_timeout_s``. A drain that fails after the worker was taken out puts it back itself (a failed step is
    never undone by the rollout, and the engine still serves its old generation). Its undo is ``readmit``."""
    assert r.inflight is not None, "a drain reads the engine's in-flight count"
    t0 = r.clock.now()
    url = r.url
    try:
        workers = r.router.list_workers()
        if url not in {w.url for w in workers}:
            raise RouterError(
                Outcome.UNKNOWN_WORKER,
                f"{r.router.url}: {url} is not among its workers; add it to the router or fix knob_router_url",
            )
        reason = capacity_refusal(workers, r.out, url, r.max_unavailable, r.router.url)
        if reason:
            raise RouterError(Outcome.CAPACITY, reason)
        r.router.remove(url)
    except RouterError as exc:
        return r.result("drain", exc.outcome, str(exc), t0)
    r.out.add(url)
    last: int | None = None
    zeros = 0
    deadline = t0 + r.drain_timeout_s
    while True:
        try:
            last = r.inflight()
        except RouterError as exc:
            return _put_back(r, exc.outcome, str(exc), t0, None)
        zeros = zeros + 1 if last == 0 else 0
        if zeros >= 2:  # twice: a request the router dispatched just before the removal has arrived
            return r.result("drain", Outcome.OK, f"{url} out of {r.router.url}, 0 in flight", t0, inflight=last,
                            in_router=False)  # fmt: skip
        if r.clock.now() >= deadline and r.force:
            return r.result(
                "drain",
                Outcome.OK,
                f"{url}: {last} request(s) still in flight after the drain timeout ({r.drain_timeout_s:g}s); "
                f"restarted anyway (--force-restart): {last} dropped",
                t0,
                inflight=last,
                in_router=False,
                forced=True,
            )
        if r.clock.now() >= deadline:
            return _put_back(
                r,
                Outcome.DRAIN_TIMEOUT,
                f"{url}: {last} request(s) still in flight after the drain timeout "
                f"({r.drain_timeout_s:g}s); raise knob_drain_timeout or use --force-restart",
                t0,
                last,
            )
        r.clock.sleep(r.poll_s)


def _put_back(r: Route, outcome: Outcome, message: str, t0: float, inflight: int | None) -> RouterResult:
    """The failed drain's own undo: the failure, and whether putting the worker back worked."""
    back = readmit(r)
    if not back.ok:
        message += f"; putting it back failed too: {back.message}"
    return r.result("drain", outcome, message, t0, inflight=inflight, in_router=back.in_router)


def settle(r: Route) -> RouterResult:
    """Wait until the router no longer lists the worker its drain took out, at most ``drain_timeout_s``. SMG marks
    a removed worker ``draining`` and drops it only after its ``drain_settle_secs`` (5 s by default);
    sglang-router 0.3 removes it through a queued job. An engine that restarts faster than that would meet its old
    registration at the re-add: still listed (so not added again), never healthy, then dropped under the
    readmit's wait. No undo (the drain's undo puts the worker back)."""
    t0 = r.clock.now()
    url = r.url
    while True:
        try:
            listed = {w.url: w for w in r.router.list_workers()}.get(url)
        except RouterError as exc:
            return r.result("settle", exc.outcome, str(exc), t0, in_router=False)
        if listed is None:
            return r.result("settle", Outcome.OK, f"{url} gone from {r.router.url}", t0, in_router=False)
        if r.clock.now() >= t0 + r.drain_timeout_s:
            return r.result(
                "settle",
                Outcome.DRAIN_TIMEOUT,
                f"{url}: still listed by {r.router.url} {r.drain_timeout_s:g}s after its removal (SMG keeps a "
                "removed worker draining for its drain_settle_secs); lower that or raise knob_drain_timeout",
                t0,
            )
        r.clock.sleep(r.poll_s)


def readmit(r: Route) -> RouterResult:
    """Put the worker back into its router and wait until the router lists it healthy, at most
    ``healthy_timeout_s``. Its undo is ``evict``."""
    t0 = r.clock.now()
    url = r.url
    try:
        # SMG still lists a worker it is draining (removed, not yet dropped): that registration cannot turn
        # healthy, so the worker is added again once the router has dropped it
        stale = url in r.out and url in {w.url for w in r.router.list_workers() if not w.healthy}
        if not stale and url not in {w.url for w in r.router.list_workers()}:
            r.router.add(url)
        deadline = t0 + r.healthy_timeout_s
        while True:
            found = {w.url: w for w in r.router.list_workers()}.get(url)
            if found is None and stale:
                r.router.add(url)
                stale = False
                continue
            if found is not None and found.healthy:
                r.out.discard(url)
                return r.result("readmit", Outcome.OK, f"{url} healthy in {r.router.url}", t0)
            if r.clock.now() >= deadline:
                state = "not listed" if found is None else "listed but not healthy"
                return r.result(
                    "readmit",
                    Outcome.NOT_HEALTHY,
                    f"{url}: {state} in {r.router.url} after {r.healthy_timeout_s:g}s; "
                    "check the engine's health endpoint and the router's log",
                    t0,
                    in_router=found is not None,
                )
            r.clock.sleep(r.poll_s)
    except RouterError as exc:
        return r.result("readmit", exc.outcome, str(exc), t0, in_router=False)


def evict(r: Route) -> RouterResult:
    """The re-add's undo: take the worker out again, with no wait."""
    t0 = r.clock.now()
    try:
        r.router.remove(r.url)
    except RouterError as exc:
        return r.result("evict", exc.outcome, str(exc), t0)
    r.out.add(r.url)
    return r.result("evict", Outcome.OK, f"{r.url} out of {r.router.url}", t0, in_router=False)


def workers_out(expected: Mapping[str, str], listed: Iterable[Worker]) -> list[str]:
    """Hosts whose worker URL (``expected``: host -> URL) the router does not list: what a killed rollout left
    out of service. Pure; ``drift``/``apply`` name them."""
    have = {w.url for w in listed}
    return sorted(h for h, u in expected.items() if normalize_url(u) not in have)
