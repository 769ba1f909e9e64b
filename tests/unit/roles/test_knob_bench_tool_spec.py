"""knob_bench_tool's argument spec through ``main()`` with Ansible's real AnsibleModule: the options ``run_tool``
receives (defaults, types, choices) and that it never runs in check mode (it starts a benchmark)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ansible.module_utils import basic

from tests.unit.roles.test_knob_generation import load_role_module

kb = load_role_module("knob_bench", "knob_bench_tool")
RUNS = [{"concurrency": 8, "argv": ["true"], "result_path": "{result_dir}/r.json"}]


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def run_tool(p: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        calls.append(dict(p))
        return None, {"step": "bench_tool", "runs": [], "version": None, "settings": None}

    monkeypatch.setattr(kb, "run_tool", run_tool)
    return calls


def run(capsys: pytest.CaptureFixture[str], **args: Any) -> tuple[int, dict[str, Any]]:
    basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode()
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        kb.main()
    out = capsys.readouterr().out
    result: dict[str, Any] = json.loads(out[out.index("{") :])
    return int(info.value.code or 0), result


def test_defaults(capsys: pytest.CaptureFixture[str], seen: list[dict[str, Any]]) -> None:
    rc, res = run(capsys, runs=RUNS, result_dir="/var/lib/knobfleet/bench")
    assert rc == 0 and (res["step"], res["changed"]) == ("bench_tool", False)
    assert seen == [
        {
            "runs": RUNS,
            "result_dir": "/var/lib/knobfleet/bench",
            "result_format": "json",
            "env": {},
            "timeout_s": 1800,
            "version_url": "",
            "version_key": "version",
            "info_url": "",
            "secret": [],
        }
    ]


def test_types_and_choices(
    capsys: pytest.CaptureFixture[str], seen: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KF_BENCH_ROOT", "/srv/b")
    rc, _ = run(
        capsys,
        runs=RUNS,
        result_dir="$KF_BENCH_ROOT/out",
        result_format="jsonl",
        timeout_s="60",
        env={"A": "1"},
        secret="HF_TOKEN",
    )
    assert rc == 0
    p = seen[0]
    assert (p["result_dir"], p["result_format"], p["timeout_s"], p["env"], p["secret"]) == (
        "/srv/b/out",
        "jsonl",
        60,
        {"A": "1"},
        ["HF_TOKEN"],
    )
    rc, res = run(capsys, runs=RUNS, result_dir="/x", result_format="csv")
    assert rc == 1 and "value of result_format must be one of: json, jsonl, got: csv" in res["msg"]
    for missing in ("runs", "result_dir"):
        args = {"runs": RUNS, "result_dir": "/x"}
        del args[missing]
        rc, res = run(capsys, **args)
        assert rc == 1 and res["msg"] == f"missing required arguments: {missing}"
    assert len(seen) == 1


def test_check_mode_skips_the_benchmark(capsys: pytest.CaptureFixture[str], seen: list[dict[str, Any]]) -> None:
    rc, res = run(capsys, runs=RUNS, result_dir="/x", _ansible_check_mode=True)
    assert rc == 0 and res["skipped"] is True and seen == []


def test_a_failure_carries_the_runs_so_far(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kb, "run_tool", lambda p: ("tool exited 1", {"step": "bench_tool", "runs": [{"c": 8}]}))
    rc, res = run(capsys, runs=RUNS, result_dir="/x")
    assert rc == 1 and res["msg"] == "tool exited 1" and res["runs"] == [{"c": 8}] and res["step"] == "bench_tool"
