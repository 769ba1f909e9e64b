"""Pure: the canary's guardrails (``experiment.canary.judge``), each a one-sided two-proportion test over the windows:
the canaries' error rate against the baseline's, the router's while the canaries serve against its pre-period rate,
and the canaries' share of hung probe streams against the baseline's. Any one rolls a canary back at once, warm-up
or not: they read every window measured, those set aside while the engines settle included."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol


class Counts(Protocol):
    """What the guardrails read of a window (``experiment.canary.Window``)."""

    @property
    def canary_requests(self) -> int: ...
    @property
    def baseline_requests(self) -> int: ...
    @property
    def canary_errors(self) -> int: ...
    @property
    def baseline_errors(self) -> int: ...
    @property
    def router_requests(self) -> int: ...
    @property
    def router_errors(self) -> int: ...
    @property
    def canary_streams(self) -> int: ...
    @property
    def baseline_streams(self) -> int: ...
    @property
    def canary_hung(self) -> Mapping[str, int]: ...
    @property
    def baseline_hung(self) -> Mapping[str, int]: ...


def rate_excess(errors: int, requests: int, base_errors: int, base_requests: int, z: float) -> bool:
    """A one-sided two-proportion z-test: is errors/requests significantly above base_errors/base_requests?"""
    if requests == 0 or base_requests == 0 or errors == 0:
        return False
    p = (errors + base_errors) / (requests + base_requests)
    se = math.sqrt(max(p * (1 - p) * (1 / requests + 1 / base_requests), 1e-12))
    return (errors / requests - base_errors / base_requests) / se > z


def router_excess(pre: Sequence[Counts], post: Sequence[Counts], z: float) -> str | None:
    """The router's error rate while the canaries serve against its rate over the pre-period (one-sided)."""
    pr, pe = sum(w.router_requests for w in pre), sum(w.router_errors for w in pre)
    cr, ce = sum(w.router_requests for w in post), sum(w.router_errors for w in post)
    if not rate_excess(ce, cr, pe, pr, z):
        return None
    return (
        f"the router failed {ce} of {cr} requests ({ce / cr:.2%}) while the canaries served, against {pe} of "
        f"{pr} ({pe / pr:.2%}) before the change"
    )


def error_excess(windows: Sequence[Counts], z: float) -> str | None:
    """A two-proportion test of canary vs baseline error rates over all windows."""
    cr = sum(w.canary_requests for w in windows)
    br = sum(w.baseline_requests for w in windows)
    ce = sum(w.canary_errors for w in windows)
    be = sum(w.baseline_errors for w in windows)
    if not rate_excess(ce, cr, be, br, z):
        return None
    return (
        f"the canaries failed {ce} of {cr} requests ({ce / cr:.2%}) against {be} of {br} ({be / br:.2%}) on the "
        "baseline"
    )


def hung_excess(windows: Sequence[Counts], z: float, hang_s: float) -> str | None:
    """The hung-stream guardrail, the 5xx one's rule on the probes: is the canaries' share of hung streams
    significantly above the baseline's (one-sided two-proportion test over all windows)?"""
    hung: dict[str, int] = {}
    for w in windows:
        for host, n in w.canary_hung.items():
            hung[host] = hung.get(host, 0) + n
    cs, bs = sum(w.canary_streams for w in windows), sum(w.baseline_streams for w in windows)
    ch, bh = sum(hung.values()), sum(sum(w.baseline_hung.values()) for w in windows)
    if not rate_excess(ch, cs, bh, bs, z):
        return None
    who = ", ".join(f"{h} {n}" for h, n in sorted(hung.items()) if n)
    return (
        f"hung streams: {ch} of {cs} probe streams on the canaries ({who}) went {hang_s:g}s without a token, "
        f"status 200, against {bh} of {bs} on the baseline"
    )
