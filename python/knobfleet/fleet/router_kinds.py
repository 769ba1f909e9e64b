"""Router kinds: the HTTP side of ``fleet.router`` (the effectful shell). One class per kind of router,
registered by name in ``KINDS``; a host's ``knob_router_kind`` picks one.

``sglang``: SGLang's router (sglang-router). Its worker API changed between releases; the generation is
detected once from ``GET /workers`` (and ``GET /list_workers`` before that existed):

- >= 0.3: ``GET /workers`` lists ``id``, ``url``, ``is_healthy``, ``load``; ``POST /workers {"url"}`` -> 202
  (a queued job); ``DELETE /workers/{id}`` -> 202.
- 0.2.x: ``POST /workers {"url"}``; ``DELETE /workers/{url, quoted}``; workers listed without ids.
- <= 0.2.1: ``GET /list_workers`` -> ``{"urls": [...]}``; ``POST /add_worker?url=`` / ``/remove_worker?url=``.

Another kind (a vLLM production-stack router reads a dynamic config file instead) is a class with the same
three methods added to ``KINDS``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from knobfleet.fleet.router import (
    Clock,
    Generation,
    Outcome,
    Route,
    RouterError,
    RouterKind,
    Worker,
    normalize_url,
    parse_inflight,
    workers_out,
)

if TYPE_CHECKING:
    from knobfleet.fleet.hostvars import HostVars

LEGACY = "0.2.1"  # <= 0.2.1: /list_workers, /add_worker?url=, /remove_worker?url=
HTTP_TIMEOUT_S = 10.0


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _request(method: str, url: str, body: Any = None, timeout: float = HTTP_TIMEOUT_S) -> tuple[int, bytes]:
    """One HTTP request: (status, body); HTTP errors are returned, not raised; no redirect is followed (the
    router answers directly). One deadline for the whole exchange (a router that trickles its answer cannot hold
    a drain past its bound). OSError (``DeadlineExceeded`` past the deadline) when the server cannot be reached."""
    from knobfleet.deadline_http import exchange

    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    try:
        return exchange(url, method, data, headers, timeout, max_body=1 << 22)
    except ValueError as exc:
        raise OSError(str(exc)) from None


def _short(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    try:
        doc = json.loads(text)
        if isinstance(doc, dict) and isinstance(doc.get("error"), str | dict):
            err = doc["error"]
            text = err.get("message", str(err)) if isinstance(err, dict) else err
    except (ValueError, RecursionError):  # RecursionError: nested too deep for the parser
        pass
    return text[:200] or "(empty body)"


class SGLangRouter:
    """SGLang's router over HTTP (``url``: its base URL, e.g. ``http://127.0.0.1:30080``)."""

    kind = "sglang"

    def __init__(self, url: str, timeout: float = HTTP_TIMEOUT_S) -> None:
        self.url = normalize_url(url)
        self.timeout = timeout
        self.generation: Generation | str | None = None

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        try:
            return _request(method, self.url + path, body, self.timeout)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RouterError(
                Outcome.UNREACHABLE,
                f"router {self.url}: unreachable ({reason}); check knob_router_url and that the router runs",
            ) from None

    def detect(self) -> Generation | str:
        if self.generation is None:
            self.list_workers()
        assert self.generation is not None
        return self.generation

    def list_workers(self) -> list[Worker]:
        from knobfleet.fleet.router import parse_workers

        status, body = self._call("GET", "/workers")
        if status == 404:
            status, body = self._call("GET", "/list_workers")
            if status != 200:
                raise RouterError(Outcome.REFUSED, f"router {self.url}: GET /list_workers answered {status}: "
                                  f"{_short(body)}")  # fmt: skip
            try:
                urls = json.loads(body).get("urls")
                if not isinstance(urls, list):
                    raise ValueError("no 'urls' list")
            except (ValueError, AttributeError, RecursionError) as exc:
                raise RouterError(Outcome.REFUSED, f"router {self.url}: /list_workers: {exc}") from None
            self.generation = LEGACY
            return [Worker(normalize_url(str(u)), healthy=True) for u in urls]
        if status != 200:
            raise RouterError(Outcome.REFUSED, f"router {self.url}: GET /workers answered {status}: {_short(body)}")
        try:
            generation, workers = parse_workers(json.loads(body))
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep for the parser
            raise RouterError(Outcome.REFUSED, f"router {self.url}: GET /workers: {exc}") from None
        if self.generation is None or (workers and self.generation != LEGACY):
            self.generation = generation
        return workers

    def remove(self, worker_url: str) -> None:
        url = normalize_url(worker_url)
        workers = self.list_workers()
        gen = self.generation
        if gen == LEGACY:
            status, body = self._call("POST", "/remove_worker?url=" + urllib.parse.quote(url, safe=""))
        elif gen == Generation.V02 or not any(w.id for w in workers):
            status, body = self._call("DELETE", "/workers/" + urllib.parse.quote(url, safe=""))
        else:
            wid = next((w.id for w in workers if w.url == url), None)
            if wid is None:
                raise RouterError(Outcome.UNKNOWN_WORKER, f"router {self.url}: no worker {url}; it lists "
                                  f"{', '.join(w.url for w in workers) or 'none'}")  # fmt: skip
            status, body = self._call("DELETE", f"/workers/{urllib.parse.quote(wid, safe='')}")
        self._check("remove", url, status, body)

    def add(self, worker_url: str) -> None:
        url = normalize_url(worker_url)
        self.detect()
        if self.generation == LEGACY:
            status, body = self._call("POST", "/add_worker?url=" + urllib.parse.quote(url, safe=""))
        else:
            status, body = self._call("POST", "/workers", {"url": url})
        self._check("add", url, status, body)

    def _check(self, what: str, url: str, status: int, body: bytes) -> None:
        if status in (200, 201, 202, 204):
            return
        outcome = Outcome.UNKNOWN_WORKER if status == 404 else Outcome.REFUSED
        raise RouterError(outcome, f"router {self.url}: {what} {url} refused ({status}): {_short(body)}")


KINDS: dict[str, Callable[[str], RouterKind]] = {"sglang": SGLangRouter}


def router_for(kind: str, url: str) -> RouterKind:
    """The client for a host's ``knob_router_kind`` at ``knob_router_url``; RouterError naming the known kinds."""
    try:
        factory = KINDS[kind]
    except KeyError:
        raise RouterError(
            Outcome.REFUSED, f"knob_router_kind {kind!r}: unknown router kind; known: {', '.join(sorted(KINDS))}"
        ) from None
    return factory(url)


def engine_inflight(base_url: str, engine: str, timeout: float = 5.0) -> Callable[[], int]:
    """A reader of an engine's running + queued requests from its ``/metrics`` (``fleet.router.parse_inflight``),
    by the gauges its catalog names (``serve.metrics``; an engine without them is a one-line KnobfleetError here,
    before anything changes). A process that no longer answers has nothing in flight only once it is gone; until
    then RouterError."""
    from knobfleet.engines.adapter import engine as adapter

    names = adapter(engine).metrics("the router drain")

    def read() -> int:
        try:
            status, body = _request("GET", normalize_url(base_url) + "/metrics", timeout=timeout)
        except OSError as exc:
            raise RouterError(Outcome.ENGINE_METRICS, f"{base_url}/metrics: unreachable ({exc})") from None
        if status != 200:
            raise RouterError(Outcome.ENGINE_METRICS, f"{base_url}/metrics answered {status}; SGLang needs "
                              "--enable-metrics")  # fmt: skip
        try:
            return parse_inflight(body.decode("utf-8", "replace"), names)
        except ValueError as exc:
            raise RouterError(Outcome.ENGINE_METRICS, f"{base_url}/metrics: {exc}") from None

    return read


def route_of(
    hv: HostVars,
    out: set[str],
    clock: Clock | None = None,
    max_unavailable: str | None = None,
    force_restart: bool = False,
) -> Route | None:
    """One host's worker in its router from its host vars (``knob_router_url``, ``knob_router_kind``,
    ``knob_drain_timeout``, ``knob_router_max_unavailable``), or None when no router fronts it. ``out`` is the
    rollout's shared set of worker URLs taken out (the capacity guard counts it); RouterError for an unknown
    kind. The worker is the engine's own URL (``knob_serve_listen_host``:``knob_serve_port``). ``force_restart``: a
    drain that times out goes on with the restart and counts what was still in flight (``RouterResult.forced``)."""
    if not hv.router_url:
        return None
    worker = hv.base_url
    return Route(
        hv.host,
        router_for(hv.router_kind, hv.router_url),
        worker,
        clock or MonotonicClock(),
        inflight=engine_inflight(worker, hv.adapter().name),
        drain_timeout_s=hv.drain_timeout_s,
        healthy_timeout_s=max(hv.readiness_timeout_s, 30),
        max_unavailable=max_unavailable or hv.router_max_unavailable,
        out=out,
        force=force_restart,
    )


def stop_covers_drain(hv: HostVars) -> str | None:
    """Why the unit's TimeoutStopSec does not cover the drain (one line), or None: it must exceed the engine's
    own drain bound (vLLM's --shutdown-timeout in knob_serve_host_args) and, behind a router, the drain timeout.
    Pure."""
    engine_bound = str(hv.host_args.get("shutdown-timeout", "0"))
    if engine_bound.isdigit() and hv.timeout_stop_s <= int(engine_bound):
        return (
            f"host {hv.host}: knob_serve_timeout_stop_s ({hv.timeout_stop_s}) must exceed --shutdown-timeout "
            f"({engine_bound}): systemd would kill an engine still draining"
        )
    if hv.router_url and hv.timeout_stop_s <= hv.drain_timeout_s:
        return (
            f"host {hv.host}: knob_serve_timeout_stop_s ({hv.timeout_stop_s}) must exceed knob_drain_timeout "
            f"({hv.drain_timeout_s}): systemd would kill an engine still draining"
        )
    return None


def hosts_out_of_router(hosts: list[HostVars]) -> dict[str, list[str]]:
    """Per router URL, the hosts whose worker it does not list (left out by an interrupted rollout); a router
    that cannot be read is reported under its URL with the one-line error as the only entry."""
    by_router: dict[tuple[str, str], dict[str, str]] = {}
    for hv in hosts:
        if hv.router_url:
            by_router.setdefault((hv.router_kind, hv.router_url), {})[hv.host] = hv.base_url
    found: dict[str, list[str]] = {}
    for (kind, url), expected in sorted(by_router.items()):
        try:
            missing = workers_out(expected, router_for(kind, url).list_workers())
        except RouterError as exc:
            found[url] = [str(exc)]
            continue
        if missing:
            found[url] = missing
    return found
