"""The Grafana dashboards in monitoring/dashboards/: generated from the catalogs (the committed files are current),
every engine panel built on its catalog's serve.metrics names in both spellings, and every query valid PromQL
(promtool checks each one as a recording rule)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from knobfleet.profiles import catalog as catalogs
from knobfleet.telemetry import dashboards
from tests.conftest import REPO

FOLDER = REPO / "monitoring" / "dashboards"


def test_the_committed_dashboards_are_the_generated_ones() -> None:
    want = dashboards.generated()
    assert sorted(p.name for p in FOLDER.glob("*.json")) == sorted(want)
    for name, text in want.items():
        assert (FOLDER / name).read_text() == text, f"{name}: run python -m knobfleet.telemetry.dashboards"
    assert {"vllm-0.31.0.json", "vllm-0.32.0.json", "sglang-0.5.22.json", "sglang-0.5.23.json"} <= set(want)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_engine_panel_reads_its_catalogs_metric_names(engine: str) -> None:
    cat = catalogs.catalog_for(engine)
    assert cat.serve.metrics is not None
    board = dashboards.engine_dashboard(cat)
    text = json.dumps(board)
    for name in cat.serve.metrics.model_dump().values():
        assert name in text, name
        if ":" in name:  # the spelling OpenMetrics escaping stores it under too
            assert name.replace(":", "_") in text
    assert len(dashboards.queries(board)) == 7 and all('host=~\\"$host\\"' in json.dumps(e) for _, e in
                                                        dashboards.queries(board))  # fmt: skip


def test_a_catalog_without_metrics_has_no_dashboard() -> None:
    cat = catalogs.catalog_for("vllm").model_copy(update={"serve": catalogs.catalog_for("vllm").serve.model_copy(
        update={"metrics": None})})  # fmt: skip
    with pytest.raises(ValueError, match=r"the vllm catalog names no serve.metrics"):
        dashboards.engine_dashboard(cat)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: `make test` installs prometheus")
def test_promtool_accepts_every_panel_query(tmp_path: Path) -> None:
    rules = ["groups:", "  - name: dashboards", "    rules:"]
    n = 0
    for path in sorted(FOLDER.glob("*.json")):
        for title, expr in dashboards.queries(json.loads(path.read_text())):
            n += 1
            rules += [f"      - record: panel_{n}", f"        expr: {json.dumps(dashboards.as_promql(expr))}"]
            rules.append(f"        labels: {{dashboard: {json.dumps(path.stem)}, panel: {json.dumps(title)}}}")
    (tmp_path / "panels.yml").write_text("\n".join(rules) + "\n")
    proc = subprocess.run(["promtool", "check", "rules", str(tmp_path / "panels.yml")], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0 and f"SUCCESS: {n} rules found" in proc.stdout, proc.stdout + proc.stderr


def test_the_canary_board_draws_each_metrics_interval_from_the_series_canary_prom_writes() -> None:
    import re

    from knobfleet.report_prom import canary_prometheus

    board = dashboards.canary_dashboard()
    text = canary_prometheus("p", "continue", 3, {"tput": {"estimate": -0.1, "low": -0.2, "high": 0.0},
                                                  "itl": {"estimate": 0.1, "low": 0.0, "high": 0.2}}, 1.0)  # fmt: skip
    written = {line.split("{")[0] for line in text.splitlines() if not line.startswith("#")}
    for title, expr in dashboards.queries(board):
        read = set(re.findall(r"knobfleet_canary_\w+", expr))
        assert read and read <= written, (title, read - written)
    bands = [p for p in board["panels"] if "interval" in p["title"]]
    assert [p["title"] for p in bands] == [
        "Canary: throughput change and its interval",
        "Canary: inter-token latency change and its interval",
    ]
    for p in bands:  # the estimate with both ends of its interval: a band, not two lines
        assert [t["legendFormat"].split()[-1] for t in p["targets"]] == ["estimate", "low", "high"]
    assert 'profile=~".*"' in dashboards.as_promql(bands[0]["targets"][0]["expr"])
