"""Taking a host's engine out of its router and putting it back: the pure core.

A production decode server sits behind a router. Before its engine restarts, the worker is removed from the
router (drain), its in-flight requests are waited out (read from the engine's own ``/metrics``), and after it
is ready again it is put back and waited on until the router reports it healthy. This module holds what that
needs without doing any I/O: the parsed router and engine documents, the typed outcome of each operation, the
capacity guard, and the steps (``do``/``undo``) that drive a ``RouterKind`` (``fleet.router_kinds``: the HTTP
side, one class per kind of router) with an injected clock.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from knobfleet.errors import KnobfleetError

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


@dataclass(frozen=True)
class StepResult:
    """The typed result of a step's ``do`` or ``undo``: outcome, one line, how long it took, the in-flight
    count seen last (drain) and whether the worker is in the router when the step ends."""

    step: str
    host: str
    outcome: Outcome
    message: str
    seconds: float = 0.0
    inflight: int | None = None
    in_router: bool = True
    forced: bool = False  # a drain that timed out, restarted anyway (--force-restart): ``inflight`` were dropped

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK


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
class DrainStep:
    """Take ``worker_url`` out of ``router`` and wait until the engine has no request in flight, at most
    ``drain_timeout_s``. ``undo`` puts the worker back (``ReadmitStep.do``). ``inflight`` reads the engine's
    count (``router_kinds.engine_inflight``); ``out`` is the rollout's shared set of URLs it has taken out."""

    host: str
    router: RouterKind
    worker_url: str
    inflight: Callable[[], int]
    clock: Clock
    drain_timeout_s: float = 120.0
    max_unavailable: int | str = 1
    healthy_timeout_s: float = 120.0
    poll_s: float = 0.25
    out: set[str] = field(default_factory=set)
    name: str = "drain"
    force: bool = False  # --force-restart: a drain that times out goes on, counting the requests it drops

    def do(self) -> StepResult:
        t0 = self.clock.now()
        url = normalize_url(self.worker_url)
        try:
            workers = self.router.list_workers()
            if url not in {w.url for w in workers}:
                raise RouterError(
                    Outcome.UNKNOWN_WORKER,
                    f"{self.router.url}: {url} is not among its workers; add it to the router or fix knob_router_url",
                )
            reason = capacity_refusal(workers, self.out, url, self.max_unavailable, self.router.url)
            if reason:
                raise RouterError(Outcome.CAPACITY, reason)
            self.router.remove(url)
        except RouterError as exc:
            return self._result(exc.outcome, str(exc), t0, in_router=True)
        self.out.add(url)
        last: int | None = None
        zeros = 0
        deadline = t0 + self.drain_timeout_s
        while True:
            try:
                last = self.inflight()
            except RouterError as exc:
                return self._put_back(exc.outcome, str(exc), t0, None)
            zeros = zeros + 1 if last == 0 else 0
            if zeros >= 2:  # twice: a request the router dispatched just before the removal has arrived
                return self._result(Outcome.OK, f"{url} out of {self.router.url}, 0 in flight", t0, False, last)
            if self.clock.now() >= deadline and self.force:
                return StepResult(
                    self.name,
                    self.host,
                    Outcome.OK,
                    f"{url}: {last} request(s) still in flight after the drain timeout ({self.drain_timeout_s:g}s); "
                    f"restarted anyway (--force-restart): {last} dropped",
                    self.clock.now() - t0,
                    last,
                    False,
                    forced=True,
                )
            if self.clock.now() >= deadline:
                return self._put_back(
                    Outcome.DRAIN_TIMEOUT,
                    f"{url}: {last} request(s) still in flight after the drain timeout "
                    f"({self.drain_timeout_s:g}s); raise knob_drain_timeout or use --force-restart",
                    t0,
                    last,
                )
            self.clock.sleep(self.poll_s)

    def undo(self) -> StepResult:
        return ReadmitStep(
            self.host, self.router, self.worker_url, self.clock, self.healthy_timeout_s, self.poll_s, self.out
        ).do()

    def _put_back(self, outcome: Outcome, message: str, t0: float, inflight: int | None) -> StepResult:
        """A drain that fails after the worker was taken out puts it back itself (a failed step is never undone by
        the rollout, and the engine still serves its old generation): the failure, and whether that worked."""
        back = self.undo()
        if not back.ok:
            message += f"; putting it back failed too: {back.message}"
        return self._result(outcome, message, t0, back.in_router, inflight)

    def _result(
        self, outcome: Outcome, message: str, t0: float, in_router: bool, inflight: int | None = None
    ) -> StepResult:
        return StepResult(self.name, self.host, outcome, message, self.clock.now() - t0, inflight, in_router)


@dataclass
class SettleStep:
    """Wait until ``router`` no longer lists ``worker_url`` once its drain took it out, at most ``timeout_s``. SMG
    marks a removed worker ``draining`` and drops it only after its ``drain_settle_secs`` (5 s by default);
    sglang-router 0.3 removes it through a queued job. An engine that restarts faster than that would meet its old
    registration at the re-add: still listed (so not added again), never healthy, then dropped under the
    readmit's wait. ``undo``: nothing (the drain's undo puts the worker back)."""

    host: str
    router: RouterKind
    worker_url: str
    clock: Clock
    timeout_s: float = 30.0
    poll_s: float = 0.25
    name: str = "settle"

    def do(self) -> StepResult:
        t0 = self.clock.now()
        url = normalize_url(self.worker_url)
        while True:
            try:
                listed = {w.url: w for w in self.router.list_workers()}.get(url)
            except RouterError as exc:
                return StepResult(self.name, self.host, exc.outcome, str(exc), self.clock.now() - t0, in_router=False)
            if listed is None:
                return StepResult(
                    self.name, self.host, Outcome.OK, f"{url} gone from {self.router.url}", self.clock.now() - t0,
                    in_router=False,
                )  # fmt: skip
            if self.clock.now() >= t0 + self.timeout_s:
                return StepResult(
                    self.name,
                    self.host,
                    Outcome.DRAIN_TIMEOUT,
                    f"{url}: still listed by {self.router.url} {self.timeout_s:g}s after its removal (SMG keeps a "
                    "removed worker draining for its drain_settle_secs); lower that or raise knob_drain_timeout",
                    self.clock.now() - t0,
                    in_router=True,
                )
            self.clock.sleep(self.poll_s)

    def undo(self) -> StepResult:
        return StepResult(self.name, self.host, Outcome.OK, "nothing to undo", 0.0, in_router=False)


@dataclass
class ReadmitStep:
    """Put ``worker_url`` back into ``router`` and wait until the router lists it healthy, at most
    ``healthy_timeout_s``. ``undo`` takes it out again (no wait)."""

    host: str
    router: RouterKind
    worker_url: str
    clock: Clock
    healthy_timeout_s: float = 120.0
    poll_s: float = 0.25
    out: set[str] = field(default_factory=set)
    name: str = "readmit"

    def do(self) -> StepResult:
        t0 = self.clock.now()
        url = normalize_url(self.worker_url)
        try:
            # SMG still lists a worker it is draining (removed, not yet dropped): that registration cannot turn
            # healthy, so the worker is added again once the router has dropped it
            stale = url in self.out and url in {w.url for w in self.router.list_workers() if not w.healthy}
            if not stale and url not in {w.url for w in self.router.list_workers()}:
                self.router.add(url)
            deadline = t0 + self.healthy_timeout_s
            while True:
                found = {w.url: w for w in self.router.list_workers()}.get(url)
                if found is None and stale:
                    self.router.add(url)
                    stale = False
                    continue
                if found is not None and found.healthy:
                    self.out.discard(url)
                    return StepResult(
                        self.name, self.host, Outcome.OK, f"{url} healthy in {self.router.url}", self.clock.now() - t0
                    )
                if self.clock.now() >= deadline:
                    state = "not listed" if found is None else "listed but not healthy"
                    return StepResult(
                        self.name,
                        self.host,
                        Outcome.NOT_HEALTHY,
                        f"{url}: {state} in {self.router.url} after {self.healthy_timeout_s:g}s; "
                        "check the engine's health endpoint and the router's log",
                        self.clock.now() - t0,
                        in_router=found is not None,
                    )
                self.clock.sleep(self.poll_s)
        except RouterError as exc:
            return StepResult(self.name, self.host, exc.outcome, str(exc), self.clock.now() - t0, in_router=False)

    def undo(self) -> StepResult:
        t0 = self.clock.now()
        url = normalize_url(self.worker_url)
        try:
            self.router.remove(url)
        except RouterError as exc:
            return StepResult("readmit-undo", self.host, exc.outcome, str(exc), self.clock.now() - t0)
        self.out.add(url)
        return StepResult(
            "readmit-undo", self.host, Outcome.OK, f"{url} out of {self.router.url}", self.clock.now() - t0,
            in_router=False,
        )  # fmt: skip


def workers_out(expected: Mapping[str, str], listed: Iterable[Worker]) -> list[str]:
    """Hosts whose worker URL (``expected``: host -> URL) the router does not list: what a killed rollout left
    out of service. Pure; ``drift``/``apply`` name them."""
    have = {w.url for w in listed}
    return sorted(h for h, u in expected.items() if normalize_url(u) not in have)
