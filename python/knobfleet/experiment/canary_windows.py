"""The canary's windows as Prometheus measures them (pure but for the queries): each side's per-host throughput per
running request, mean ITL and finished requests over one window from the engine's own series (its catalog's
``serve.metrics``), the router's requests and 5xx answers, the window's hung-stream probes (``canary_probe``: their
counts join the row and the ``Window``), and the row and ``Window`` the judge reads."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from knobfleet.experiment.canary import Window
from knobfleet.experiment.canary_probe import HostProbes, Pending
from knobfleet.fleet.hostvars import HostVars
from knobfleet.telemetry.prom import PromError, Prometheus, series

# Per engine: (output tokens counter, end-to-end latency histogram prefix, ITL histogram prefix, finished-requests
# counter). The time requests spent in flight per second, rate(e2e _sum), is the mean number running over the window
# (Little's law): a running-requests gauge sampled every scrape aliases with regular arrivals (in the lab, 8 requests/s
# and a 2 s scrape read one host 20% "slower" than an identical one, window after window).


# The router's own counters (both router kinds the lab runs export SGLang router's smg_* names): every request it
# answered and those that failed; the canary's guardrail compares their rate with the pre-period's.
ROUTER_SERIES = ("smg_router_requests_total", "smg_http_responses_total", 'status_code=~"5.."')


def engine_name(hv: HostVars) -> str:
    return hv.adapter().name


def engine_series(engine: str) -> tuple[str, str, str, str]:
    """(generation tokens, e2e latency, inter-token latency, finished requests): the names the engine's catalog gives
    (``serve.metrics``); an engine without them is a one-line error, never judged on another engine's names."""
    from knobfleet.engines.adapter import engine as adapter

    tokens, e2e, itl, finished = adapter(engine).metrics("the canary")
    return tokens, e2e, itl, finished


def router_values(prom: Prometheus, end: float, window_s: float) -> tuple[int, int]:
    """(requests, 5xx answers) of the router over the window ending at ``end``; (0, 0) where it exports neither."""
    w = f"{max(1, round(window_s))}s"
    total_name, responses, bad = ROUTER_SERIES
    total = sum(x.value for x in prom.query(f"sum(increase({total_name}[{w}]))", at=end) if math.isfinite(x.value))
    errors = sum(
        x.value for x in prom.query(f"sum(increase({responses}{{{bad}}}[{w}]))", at=end) if math.isfinite(x.value)
    )
    return max(0, round(total)), max(0, round(errors))


def window_values(
    prom: Prometheus, hosts: Sequence[HostVars], end: float, window_s: float
) -> tuple[dict[str, dict[str, float]], dict[str, float], dict[str, float]]:
    """Per host at ``end``: {metric: value} for tput and itl, requests finished, and the counter resets in the window
    (an engine restart)."""
    w = f"{max(1, round(window_s))}s"
    values: dict[str, dict[str, float]] = {"tput": {}, "itl": {}}
    requests: dict[str, float] = {}
    resets: dict[str, float] = {}
    for engine in sorted({engine_name(hv) for hv in hosts}):
        tokens, e2e, itl, done = engine_series(engine)
        names = "|".join(hv.host for hv in hosts if engine_name(hv) == engine)
        sel = f'host=~"{names}"'

        def of(name: str, sel: str = sel) -> str:  # either spelling Prometheus stored it under (prom.series)
            return series(name, sel)

        queries = {
            "tput": f"sum by (host) (rate({of(tokens)}[{w}])) / sum by (host) (rate({of(e2e + '_sum')}[{w}]))",
            "itl": f"sum by (host) (rate({of(itl + '_sum')}[{w}])) / sum by (host) (rate({of(itl + '_count')}[{w}]))",
            "requests": f"sum by (host) (increase({of(done)}[{w}]))",
            "resets": f"max by (host) (resets({of(done)}[{w}]))",
        }
        for key, expr in queries.items():
            for s in prom.query(expr, at=end):
                host = s.labels.get("host", "")
                if math.isnan(s.value) or math.isinf(s.value):
                    continue
                if key in values:
                    values[key][host] = s.value
                elif key == "requests":
                    requests[host] = s.value
                else:
                    resets[host] = s.value
    return values, requests, resets


def measure(
    prom: Prometheus,
    canaries: Sequence[HostVars],
    baseline: Sequence[HostVars],
    k: int,
    end: float,
    window_s: float,
    fresh_since: float,
    probes: Pending | None = None,
) -> tuple[dict[str, Any], Window | None]:
    """One window: its row for the report, and the judge's ``Window`` (None: the window does not count).
    ``probes``: the window's hung-stream probes, waited for here (Prometheus is asked at ``end`` all the same)."""
    side = {"canary": [h.host for h in canaries], "baseline": [h.host for h in baseline]}
    probed: Mapping[str, HostProbes] = probes.result() if probes is not None else {}
    kept = {"probes": {h: p.as_json() for h, p in probed.items()}} if probes is not None else {}
    try:
        values, requests, resets = window_values(prom, list(canaries) + list(baseline), end, window_s)
        router_requests, router_errors = router_values(prom, end, window_s)
    except PromError as exc:
        return {"window": k, "end": end, "skipped": str(exc), **kept}, None
    absent = [
        f"{h} ({', '.join(m for m in ('tput', 'itl') if h not in values[m])})"
        for names in side.values()
        for h in names
        if h not in values["tput"] or h not in values["itl"]
    ]
    restarted = [h for h in side["canary"] + side["baseline"] if resets.get(h, 0) > 0]
    row: dict[str, Any] = {
        "window": k,
        "end": end,
        "values": values,
        "requests": requests,
        "router": {"requests": router_requests, "errors": router_errors},
        **kept,
    }
    if absent:
        # ITL comes from streamed requests only (real SGLang fills its histogram there): a host sent none has none
        row["skipped"] = (
            f"metric missing on {', '.join(absent)}: an engine without --enable-metrics, or (itl) no streamed "
            "request in the window"
        )
    elif restarted and end - window_s >= fresh_since:
        row["skipped"] = f"{', '.join(restarted)} restarted during the window (counters reset)"
    if "skipped" in row:
        return row, None
    window = Window(
        {m: {h: values[m][h] for h in side["canary"]} for m in ("tput", "itl")},
        {m: {h: values[m][h] for h in side["baseline"]} for m in ("tput", "itl")},
        round(sum(requests.get(h, 0.0) for h in side["canary"])),
        round(sum(requests.get(h, 0.0) for h in side["baseline"])),
        router_requests=router_requests,
        router_errors=router_errors,
        canary_streams=sum(p.sent - p.failed for h, p in probed.items() if h in side["canary"]),
        baseline_streams=sum(p.sent - p.failed for h, p in probed.items() if h in side["baseline"]),
        canary_hung={h: p.hung for h, p in probed.items() if h in side["canary"]},
        baseline_hung={h: p.hung for h, p in probed.items() if h in side["baseline"]},
    )
    return row, window
