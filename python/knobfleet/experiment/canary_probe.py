"""The canary's hung-stream probes: a few small streamed completions per window, sent straight to each host's engine,
each closed and counted hung when its next token does not come within the bound (issue #57: Dynamo's churn test left
1.6% of requests hanging for minutes while every status was 200).

Why the canary sends its own requests rather than reading a hang from metrics: a hung stream leaves no trace where
the canary already looks. The router counts a response's status when the response starts (200 for a stream that
then stops); the engine's histograms count what it generated, and an engine whose stream is lost between its
scheduler and the socket (or a frontend that stops forwarding) finishes the request as usual, so its counters, its
latency histograms and its running gauge look healthy. Only a client waiting for the next token can tell, so the
canary is that client: ``probes`` requests per host and window (``Settings.probes``, default 8), each of
``PROBE_TOKENS`` tokens with ``ignore_eos``, to the host's own engine URL (``HostVars.base_url``: the engine, not the
router, so a hung stream is charged to the host that holds it). The bench client's ``Target.complete`` sends them
(``stall_s``: no token, the first included, for ``Settings.hang_s`` seconds, default 20, and the stream is closed
and counted hung). A probe that gets no stream at all (refused, reset, a non-200 status, a draining engine's 503)
is ``failed``: that is the 5xx guardrail's business, not this one's.

Everything is bounded: at most ``MAX_PROBES`` (32) per host and window and ``MAX_THREADS`` threads for all of them; the
probes start spread over the first ``window - hang_s`` seconds of the window (all at once when the window is no
longer than the bound); each ends within ``hang_s`` of its last token and within ``probe_limit`` overall (after its
model look-up, itself bounded); ``result`` waits at most until the last one's bound, and a probe still running then
is not counted. The threads are daemons: an interrupted canary does not wait for them. The probes are requests like
any other in the engines' metrics: every probed host gets the same few, so both sides carry them alike.
Only the head of an engine group (rank 0 of a tensor-parallel group) is probed: the other ranks serve no API.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from knobfleet.experiment.canary import MAX_PROBES, Settings
from knobfleet.fleet.hostvars import HostVars

PROBE_TOKENS = 8
MAX_THREADS = 64
PROMPT = "knobfleet canary probe: is this stream alive"


@dataclass(frozen=True)
class HostProbes:
    """One host's probes in one window."""

    sent: int = 0
    hung: int = 0  # a 200 stream, then no token within the bound
    failed: int = 0  # no stream: refused, reset, a non-200 status, or too slow overall

    def as_json(self) -> dict[str, int]:
        return {"sent": self.sent, "hung": self.hung, "failed": self.failed}


class Pending(Protocol):
    def result(self) -> Mapping[str, HostProbes]: ...


Complete = Callable[[HostVars, float, float], dict[str, Any]]  # (host, stall_s, deadline) -> the client's answer


def probe_limit(hang_s: float) -> float:
    """The most one probe may last: its tokens each within the bound, so a stream that keeps a token coming just
    inside the bound still ends (as ``failed``, too slow) rather than running on."""
    return hang_s * 2 + 10.0


def probed(hv: HostVars) -> bool:
    """Whether the host serves the API: a host of no group, or the head of a tensor-parallel group."""
    return hv.group is None or (hv.group.kind == "tp" and hv.group.head.host == hv.host)


def complete(hv: HostVars, stall_s: float, deadline: float) -> dict[str, Any]:
    """One probe to the host's engine through the bench client (``experiment/bench/client.py``)."""
    from knobfleet.experiment.bench.client import Target

    target = Target(hv.base_url, None, timeout=max(1.0, deadline - time.time()))
    target.discover_model()
    return target.complete(PROMPT, PROBE_TOKENS, deadline, stall_s=stall_s)


class Round:
    """One window's probes, started by the constructor; ``result`` waits for them (bounded) and counts them."""

    def __init__(
        self, hosts: Sequence[HostVars], probes: int, hang_s: float, window_s: float, send: Complete = complete
    ) -> None:
        self.hang_s, self.send = hang_s, send
        self.probes = min(MAX_PROBES, max(0, probes))
        self.hosts = [hv for hv in hosts if probed(hv)]
        spread = max(0.0, window_s - hang_s)
        now = time.monotonic()
        jobs = [(now + i * spread / self.probes, hv) for i in range(self.probes) for hv in self.hosts]
        self._jobs: queue.Queue[tuple[float, HostVars]] = queue.Queue()
        for job in sorted(jobs, key=lambda j: j[0]):
            self._jobs.put(job)
        self._outcomes: list[tuple[str, str]] = []  # (host, ok | hung | failed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # the last probe's start, its model look-up (the bench client's 10 s GET) and its bound
        self._until = now + spread + probe_limit(hang_s) + 15.0
        self._threads = [
            threading.Thread(target=self._work, name=f"canary-probe-{k}", daemon=True)
            for k in range(min(MAX_THREADS, len(jobs)))
        ]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                at, hv = self._jobs.get_nowait()
            except queue.Empty:
                return
            if self._stop.wait(max(0.0, at - time.monotonic())):
                return
            try:
                answer = self.send(hv, self.hang_s, time.time() + probe_limit(self.hang_s))
                kind = "hung" if answer.get("stalled") else "failed" if answer.get("error") else "ok"
            except Exception:  # a probe that could not run is a failed probe, never the canary's end
                kind = "failed"
            with self._lock:
                self._outcomes.append((hv.host, kind))

    def result(self) -> dict[str, HostProbes]:
        """Each probed host's counts, once every probe ended (or its bound passed: one still running then is not
        counted); the probes not yet started are dropped."""
        for t in self._threads:
            t.join(max(0.0, self._until - time.monotonic()))
        self._stop.set()
        with self._lock:
            outcomes = list(self._outcomes)
        out = {}
        for hv in self.hosts:
            kinds = [k for h, k in outcomes if h == hv.host]
            out[hv.host] = HostProbes(len(kinds), kinds.count("hung"), kinds.count("failed"))
        return out


def start(hosts: Sequence[HostVars], s: Settings) -> Round | None:
    """This window's probes of ``hosts`` by the canary's settings (None when ``s.probes`` is 0: probing is off)."""
    return Round(hosts, s.probes, s.hang_s, s.window_s) if s.probes > 0 else None
