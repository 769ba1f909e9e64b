"""tools/shards.py: modules onto shards (real engines spread, then longest first onto the lightest shard), the
default count from cores and memory, and module times read from junit XML (data-driven)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO


def _shards() -> ModuleType:
    spec = importlib.util.spec_from_file_location("shards", REPO / "tools" / "shards.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["shards"] = mod
    spec.loader.exec_module(mod)
    return mod


shards = _shards()


def test_real_engine_modules_never_share_a_shard_while_another_has_none() -> None:
    weights = {
        "test_sglang.py": 600.0,
        "test_vllm.py": 400.0,
        "test_a.py": 500.0,
        "test_b.py": 300.0,
        "test_c.py": 100.0,
    }
    plan = shards.plan(weights, 2)
    assert plan[0].modules[0] == "test_sglang.py" and plan[1].modules[-1] == "test_vllm.py"  # staggered
    assert sorted(m for s in plan for m in s.modules) == sorted(weights)
    assert [s.weight for s in plan] == [1000.0, 900.0]  # sglang+b+c ; vllm+a


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_every_module_runs_once_and_the_shards_stay_balanced(count: int) -> None:
    weights = {f"test_{i}.py": float(10 + 7 * i) for i in range(20)}
    plan = shards.plan(weights, count)
    assert sorted(m for s in plan for m in s.modules) == sorted(weights)
    heaviest = max(weights.values())
    assert max(s.weight for s in plan) - min(s.weight for s in plan) <= heaviest  # LPT's bound
    assert len(plan) == count


def test_more_shards_than_modules_leaves_none_empty() -> None:
    assert len(shards.plan({"test_a.py": 1.0}, 4)) == 1


def test_an_unmeasured_module_weighs_the_median() -> None:
    got = shards.module_weights(["test_a.py", "test_new.py"], {"test_a.py": 10.0, "test_b.py": 30.0, "test_c.py": 20.0})
    assert got == {"test_a.py": 10.0, "test_new.py": 20.0}


@pytest.mark.parametrize(("env", "expected"), [("3", 3), ("0", 1), ("", None)])
def test_the_shard_count(env: str, expected: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KNOBFLEET_SHARDS", env)
    monkeypatch.setattr(shards.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(
        shards.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 24 * (1 << 30) // 4096}[name]
    )
    assert shards.default_count() == (expected if expected is not None else 2)  # 2 cores, 24 GiB: 2


def test_module_times_from_junit(tmp_path: Path) -> None:
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.integration.test_ab" name="t1" time="10.5"/>'
        '<testcase classname="tests.integration.test_ab" name="t2" time="2"/>'
        '<testcase classname="tests.integration.test_lab.TestX" name="t3" time="4"/>'
        "</testsuite></testsuites>"
    )
    assert shards.junit_times(xml) == {"test_ab.py": 12.5, "test_lab.py": 4.0}
    assert shards.junit_times(tmp_path / "missing.xml") == {}
