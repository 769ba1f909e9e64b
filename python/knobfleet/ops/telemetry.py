"""Use cases over live telemetry: ``load-profile`` (A/B weights from the running-request distribution)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from knobfleet.telemetry.loadprofile import LoadProfile, profile, running_gauges
from knobfleet.telemetry.prom import PromError, Prometheus, series


@dataclass(frozen=True)
class LoadProfileResult:
    url: str
    window_s: float
    step_s: float
    engines: list[str]  # host labels that had samples
    profile: LoadProfile


def load_profile(
    prom: Prometheus, buckets: list[int], window_s: float, step_s: float, host_regex: str = ".+"
) -> LoadProfileResult:
    end = time.time()
    values: list[float] = []
    hosts: set[str] = set()
    gauges = running_gauges()
    for metric in gauges.values():
        expr = series(metric, f'host=~"{host_regex}"')
        for labels, points in prom.query_range(expr, end - window_s, end, step_s):
            hosts.add(labels.get("host", labels.get("instance", "?")))
            values.extend(points)
    if not hosts:
        raise PromError(
            f"{prom.url}: no running-request series ({', '.join(gauges.values())}) in the last {window_s:g}s; "
            "are the engines scraped (SGLang needs --enable-metrics)?"
        )
    return LoadProfileResult(prom.url, window_s, step_s, sorted(hosts), profile(values, buckets))
