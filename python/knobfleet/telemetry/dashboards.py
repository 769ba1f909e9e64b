"""Grafana dashboards generated from the catalogs (``monitoring/dashboards/``), so a metric rename is a regeneration.

One dashboard per engine and synced catalog version, built from that catalog's ``serve.metrics`` (the names the
router drain, the canary and load-profile read, in either spelling Prometheus stores them under:
``telemetry.prom.series``), plus one of knobfleet's own series (the ``drift --prom`` textfile: findings per host and
kind, the profile each host runs, whether it could be probed, when drift last ran), and one of a running canary (the
``canary --prom`` textfile: each metric's estimate inside its interval, the verdict, the windows judged).

``python -m knobfleet.telemetry.dashboards [--check]`` writes them (or checks that the committed ones are current:
a unit test runs it). Every panel's query is a plain PromQL expression over ``host``-labelled series; import a
file in Grafana (Dashboards → New → Import) and pick the Prometheus data source. Pure but for ``main``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from knobfleet.profiles.model import Catalog
from knobfleet.telemetry.prom import series

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
VARIABLES = [
    {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
    {"name": "host", "type": "query", "datasource": DATASOURCE, "includeAll": True, "multi": True, "allValue": ".*",
     "query": "label_values(host)", "refresh": 2, "label": "host"},
]  # fmt: skip


def _panel(n: int, title: str, exprs: list[tuple[str, str]], unit: str, description: str) -> dict[str, Any]:
    return {
        "id": n,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": 12 * ((n - 1) % 2), "y": 8 * ((n - 1) // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "datasource": DATASOURCE}
            for i, (expr, legend) in enumerate(exprs)
        ],
    }


def _board(uid: str, title: str, panels: list[dict[str, Any]], tags: list[str]) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "tags": ["knobfleet", *tags],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": VARIABLES},
        "panels": panels,
    }


def engine_dashboard(cat: Catalog) -> dict[str, Any]:
    """The serving dashboard of one engine version: running and queued requests, generation throughput, mean
    end-to-end and inter-token latency, p95 end-to-end latency, finished requests; each panel only where the
    catalog names its series. A catalog without ``serve.metrics`` has none (ValueError)."""
    m = cat.serve.metrics
    if m is None or not any(m.model_dump().values()):
        raise ValueError(f"the {cat.engine} catalog names no serve.metrics: no dashboard can be generated for it")
    n = {k: str(v) for k, v in m.model_dump().items() if v}
    panels = [_panel(i, *spec) for i, spec in enumerate((spec for need, spec in _engine_panels(n)
                                                          if all(k in n for k in need)), start=1)]  # fmt: skip
    version = cat.version or "current"
    return _board(f"knobfleet-{cat.engine}-{version}".replace(".", "-")[:40],
                  f"{cat.engine} {version} serving (knobfleet)", panels, [cat.engine, version])  # fmt: skip


def _engine_panels(n: dict[str, str]) -> list[tuple[tuple[str, ...], tuple[Any, ...]]]:
    """(the serve.metrics names a panel reads, its title, queries, unit and description), for the names in ``n``."""
    sel, rate = 'host=~"$host"', "[$__rate_interval]"

    def of(key: str, suffix: str = "") -> str:
        return series(n.get(key, key) + suffix, sel)

    run, queued, tokens, finished = (n.get(k, "") for k in ("running", "queued", "generation_tokens", "finished"))
    e2e, itl = n.get("e2e_latency", ""), n.get("inter_token_latency", "")
    return [
        (("running",), ("Requests running", [(f"sum by (host) ({of('running')})", "{{host}}")], "short",
         f"{run}: requests being decoded now (the router drain waits for it to reach 0)")),
        (("queued",), ("Requests queued", [(f"sum by (host) ({of('queued')})", "{{host}}")], "short",
         f"{queued}: requests waiting to start")),
        (("generation_tokens",), ("Generation throughput", [(f"sum by (host) (rate({of('generation_tokens')}{rate}))",
         "{{host}}")], "short", f"rate of {tokens}: tokens generated per second")),
        (("finished",), ("Finished requests", [(f"sum by (host) (rate({of('finished')}{rate}))", "{{host}}")],
         "reqps", f"rate of {finished}")),
        (("e2e_latency",), ("End-to-end latency (mean)", [(f"sum by (host) (rate({of('e2e_latency', '_sum')}{rate})) "
         f"/ sum by (host) (rate({of('e2e_latency', '_count')}{rate}))", "{{host}}")], "s",
         f"{e2e}: _sum over _count (the canary judges throughput on tokens / this sum)")),
        (("e2e_latency",), ("End-to-end latency p95", [("histogram_quantile(0.95, sum by (le, host) "
         f"(rate({of('e2e_latency', '_bucket')}{rate})))", "{{host}}")], "s",
         f"{e2e}: 95th percentile from the histogram's buckets")),
        (("inter_token_latency",), ("Inter-token latency (mean)", [("sum by (host) "
         f"(rate({of('inter_token_latency', '_sum')}{rate})) / sum by (host) "
         f"(rate({of('inter_token_latency', '_count')}{rate}))", "{{host}}")], "s",
         f"{itl}: _sum over _count, as the canary judges it")),
    ]  # fmt: skip


def knobfleet_dashboard() -> dict[str, Any]:
    """knobfleet's own series, from the ``drift --prom`` textfile node_exporter exports."""
    panels = [
        _panel(1, "Drift findings per host and kind",
               [('sum by (host, kind) (knobfleet_drift_findings{host=~"$host"})', "{{host}} {{kind}}"),
                ('sum by (host) (knobfleet_probe_success{host=~"$host"}) * 0 unless on (host) '
                 'knobfleet_drift_findings', "{{host}} in sync")], "short",
               "knobfleet_drift_findings: the last drift run's findings. A host in sync has none (the textfile "
               "writes no zero): the second query draws it at 0, so the panel never goes empty"),
        _panel(2, "Profile per host", [('max by (host, profile, version) (knobfleet_profile_info{host=~"$host"})',
               "{{host}}: {{profile}}@{{version}}")], "short",
               "knobfleet_profile_info: the profile each host's current generation runs (1 per host)"),
        _panel(3, "Hosts probed", [('sum(knobfleet_probe_success{host=~"$host"})', "probed"),
               ('count(knobfleet_probe_success{host=~"$host"})', "hosts")], "short",
               "knobfleet_probe_success: hosts the last drift run could read"),
        _panel(4, "Since the last drift run", [("time() - max(knobfleet_drift_last_run_timestamp_seconds)", "age")],
               "s", "knobfleet_drift_last_run_timestamp_seconds (the KnobfleetDriftCheckStale alert watches it)"),
        _panel(5, "Generation per host", [('max by (host) (knobfleet_generation{host=~"$host"})', "{{host}}")],
               "short", "knobfleet_generation: the generation each host's current link points at; an apply raises "
               "it, a rollback lowers it"),
    ]  # fmt: skip
    return _board("knobfleet-fleet", "knobfleet: the fleet", panels, ["drift"])


def canary_dashboard() -> dict[str, Any]:
    """A running canary, from the ``canary --prom`` textfile: each judged metric's estimate with its interval (the
    band the verdict is read from, not a baseline line next to a canary line), the verdict so far, the windows
    judged."""
    sel = 'profile=~"$profile"'
    panels = [
        _panel(n, f"Canary: {label} change and its interval",
               [(f'max by (profile) (knobfleet_canary_{name}{{{sel},metric="{metric}"}})', f"{{{{profile}}}} {key}")
                for name, key in (("estimate", "estimate"), ("interval_low", "low"), ("interval_high", "high"))],
               "percentunit",
               f"knobfleet_canary_estimate and _interval_low/_high (metric {metric}): the canary against its baseline "
               "with the pre-period's host difference removed. Promotion needs the low end above -max-regression; "
               "a rollback, the interval wholly below it")
        for n, (metric, label) in enumerate((("tput", "throughput"), ("itl", "inter-token latency")), start=1)
    ]  # fmt: skip
    panels += [
        _panel(3, "Canary verdict", [(f"max by (profile, verdict) (knobfleet_canary_verdict{{{sel}}})",
               "{{profile}}: {{verdict}}")], "short",
               "knobfleet_canary_verdict: continue while windows are judged, then promote, rollback or inconclusive"),
        _panel(4, "Canary windows judged", [(f"max by (profile) (knobfleet_canary_windows{{{sel}}})", "{{profile}}")],
               "short", "knobfleet_canary_windows: windows counted so far (skipped ones are not)"),
    ]  # fmt: skip
    board = _board("knobfleet-canary", "knobfleet: canary", panels, ["canary"])
    board["templating"] = {"list": [
        VARIABLES[0],
        {"name": "profile", "type": "query", "datasource": DATASOURCE, "includeAll": True, "multi": True,
         "allValue": ".*", "query": "label_values(knobfleet_canary_windows, profile)", "refresh": 2,
         "label": "profile"},
    ]}  # fmt: skip
    return board


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of ``board``: what a lab test evaluates."""
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p["targets"]]


def as_promql(expr: str, window: str = "1m") -> str:
    """A panel's query with Grafana's variables filled in (every host, ``window`` as the rate interval): what
    Prometheus itself can evaluate or ``promtool`` check."""
    return expr.replace('"$host"', '".*"').replace('"$profile"', '".*"').replace("$__rate_interval", window)


def render(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=1, sort_keys=True) + "\n"


def generated(catalog_dir: Path | None = None) -> dict[str, str]:
    """File name -> text of every dashboard: one per engine with metrics and per synced version, and knobfleet's."""
    from knobfleet.profiles import catalog as catalogs

    out = {"knobfleet.json": render(knobfleet_dashboard()), "knobfleet-canary.json": render(canary_dashboard())}
    for engine in catalogs.engine_names(catalog_dir):
        pinned = catalogs.catalog_for(engine, catalog_dir)
        if pinned.serve.metrics is None:
            continue
        for version in catalogs.synced_versions(engine, catalog_dir) or [pinned.version or "current"]:
            cat = catalogs.catalog_for(engine, catalog_dir, version if pinned.generated else None)
            out[f"{engine}-{cat.version or 'current'}.json"] = render(engine_dashboard(cat))
    return out


def main(argv: list[str] | None = None) -> int:
    from knobfleet import paths

    args = sys.argv[1:] if argv is None else argv
    folder = paths.project_root() / "monitoring" / "dashboards"
    want = generated()
    if "--check" in args:
        have = {p.name: p.read_text(encoding="utf-8") for p in folder.glob("*.json")} if folder.is_dir() else {}
        stale = sorted(n for n in set(want) | set(have) if want.get(n) != have.get(n))
        if stale:
            print(
                f"monitoring/dashboards: out of date: {', '.join(stale)}; run python -m knobfleet.telemetry.dashboards"
            )
            return 1
        print(f"monitoring/dashboards: {len(want)} dashboards, current")
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in want.items():
        (folder / name).write_text(text, encoding="utf-8")
    for old in folder.glob("*.json"):
        if old.name not in want:
            old.unlink()
    print(f"monitoring/dashboards: wrote {len(want)} dashboards")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
