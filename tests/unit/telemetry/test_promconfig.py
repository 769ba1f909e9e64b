"""The scrape config generated from the inventory: exact jobs and labels, refusals, and promtool's approval."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet.telemetry.promconfig import (
    ConfigError,
    Settings,
    Target,
    drift_target,
    engine_target,
    node_target,
    render,
)

ROOT = Path(__file__).resolve().parents[3]


def _lab() -> list[Target]:
    out = []
    for n in (1, 2, 3):
        out += [engine_target(f"lab{n}", f"127.0.1.{n}", 30000, None), node_target(f"lab{n}", f"127.0.1.{n}")]
    out.append(engine_target("lab4", "127.0.1.4", 8000, "vllm"))
    out.append(drift_target("127.0.0.1:9100"))
    return out


def test_one_job_per_kind_with_the_host_label() -> None:
    doc = yaml.safe_load(render(_lab(), Settings(scrape_interval_s=5, rule_files=("rules/knobfleet.rules.yml",))))
    assert doc["global"] == {"scrape_interval": "5s", "evaluation_interval": "15s"}
    assert doc["rule_files"] == ["rules/knobfleet.rules.yml"]
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert sorted(jobs) == ["engine", "knobfleet", "node"]
    assert jobs["engine"]["static_configs"][0] == {
        "targets": ["127.0.1.1:30000"],
        "labels": {"host": "lab1", "engine": "sglang"},
    }
    assert {"targets": ["127.0.1.4:8000"], "labels": {"host": "lab4", "engine": "vllm"}} in jobs["engine"][
        "static_configs"
    ]
    assert jobs["knobfleet"]["honor_labels"] is True  # the drift textfile's own host labels stay host
    assert jobs["knobfleet"]["static_configs"] == [{"targets": ["127.0.0.1:9100"], "labels": {}}]
    assert "honor_labels" not in jobs["engine"]
    assert [g["targets"] for g in jobs["node"]["static_configs"]] == [
        ["127.0.1.1:9100"],
        ["127.0.1.2:9100"],
        ["127.0.1.3:9100"],
    ]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (Target("engine", "10.0.0.5:30000", "gpu1"), "gpu1: engine target 10.0.0.5:30000: not a loopback address"),
        (Target("engine", "127.0.1.1", "lab1"), "lab1: engine target '127.0.1.1': expected HOST:PORT"),
        (Target("engine", "127.0.1.1:0", "lab1"), "lab1: engine target '127.0.1.1:0': expected HOST:PORT"),
        (Target("eng ine", "127.0.1.1:1", "lab1"), "lab1: job 'eng ine': letters, digits"),
        (Target("engine", "127.0.1.1:1", "lab1", {"host": "x"}), "lab1: label 'host': not a Prometheus label"),
        (Target("engine", "127.0.1.1:1", "lab1", {"__x": "x"}), "lab1: label '__x': not a Prometheus label"),
    ],
)
def test_refusals(target: Target, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        render([target], Settings(loopback_only=True))
    assert str(info.value).startswith(message)


def test_a_target_listed_twice_is_refused() -> None:
    t = node_target("lab1", "127.0.1.1")
    with pytest.raises(ConfigError, match=r"^lab1b: node target 127.0.1.1:9100 is listed twice$"):
        render([t, node_target("lab1b", "127.0.1.1")])


def test_production_addresses_are_allowed_outside_the_lab() -> None:
    doc = yaml.safe_load(render([engine_target("gpu1", "gpu1.example.internal", 30000, "sglang")]))
    assert doc["scrape_configs"][0]["static_configs"][0]["targets"] == ["gpu1.example.internal:30000"]


_names = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_names, st.integers(1, 254), st.integers(1, 65535)), max_size=12, unique_by=lambda t: t[0]))
def test_render_round_trips_every_target(hosts: list[tuple[str, int, int]]) -> None:
    targets = [engine_target(h, f"127.0.1.{n}", port, None) for h, n, port in hosts]
    unique = {(t.address) for t in targets}
    if len(unique) != len(targets):
        with pytest.raises(ConfigError):
            render(targets, Settings(loopback_only=True))
        return
    doc = yaml.safe_load(render(targets, Settings(loopback_only=True)))
    got = {(g["labels"]["host"], g["targets"][0]) for job in doc["scrape_configs"] for g in job["static_configs"]}
    assert got == {(t.host, t.address) for t in targets}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: `make test` installs prometheus")
def test_promtool_accepts_the_generated_config_with_the_shipped_rules(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    shutil.copy(ROOT / "monitoring" / "rules" / "knobfleet.rules.yml", tmp_path / "rules")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(render(_lab(), Settings(rule_files=("rules/knobfleet.rules.yml",), loopback_only=True)))
    proc = subprocess.run(["promtool", "check", "config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 8 rules found" in proc.stdout
