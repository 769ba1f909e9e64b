"""experiment/ab.py's ``bench``, ``consistency``, ``summarise_runs`` and the A/B report document, against a fake
host (``activate``, ``run_bench`` faked at the module): what is run, what is stored, what is reported."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from knobfleet.experiment import ab as use_case
from knobfleet.experiment.bench.run import BenchSpec
from knobfleet.experiment.design import Settings
from knobfleet.fleet.hostvars import HostVars
from knobfleet.profiles.model import Profile

HV = HostVars(host="lab1")
P = Profile(name="ctas512", version=3, engine="sglang", env={"SGLANG_SM120_MMA_TARGET_CTAS": 512}, args={})


def run_doc(values: dict[int, float], errors: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "buckets": [
            {
                "concurrency": c,
                "agg_tok_s": v,
                "errors": errors,
                "n": 4 * c,
                "max_tokens": 16,
                "per_req_tok_s": 9.5,
                "latency": {"p50": 1.25},
                "tokens": 64 * c,
                "wall_s": 1.5,
            }
            for c, v in values.items()
        ],
        **extra,
    }


def test_summarise_runs_gives_a_student_t_interval_from_two_runs_on() -> None:
    one = use_case.summarise_runs([run_doc({48: 100.0, 64: 200.0})])
    assert [(b.concurrency, b.mean, b.low, b.high, b.runs) for b in one] == [
        (48, 100.0, None, None, [100.0]),
        (64, 200.0, None, None, [200.0]),
    ]
    two = use_case.summarise_runs([run_doc({64: 200.0, 48: 100.0}), run_doc({48: 110.0})])
    b48, b64 = two
    assert (b48.concurrency, b48.mean, b48.runs) == (48, 105.0, [100.0, 110.0])
    # Student-t at 1 degree of freedom: t(0.975) = 12.706, times s / sqrt(n) = 7.071 / 1.414 = 5.0
    assert b48.low is not None and b48.high is not None
    assert math.isclose(b48.high - 105.0, 12.706 * 5.0, rel_tol=1e-3)
    assert math.isclose(b48.low + b48.high, 210.0)
    assert (b64.low, b64.high) == (None, None)
    assert use_case.summarise_runs([]) == []


class Host:
    def __init__(self) -> None:
        self.applied: list[str] = []
        self.specs: list[tuple[BenchSpec, bool]] = []
        self.docs = [run_doc({48: 100.0, 64: 200.0}, tool="vllm bench serve", engine_version="0.11", settings={"x": 1})]

    def activate(self, profile: Profile, hv: HostVars, inventory: Path, on_event: Any) -> None:
        self.applied.append(profile.name)

    def run_bench(self, hosts: list[HostVars], inventory: Path, spec: BenchSpec, consistency: bool = False, **_: Any):  # type: ignore[no-untyped-def]
        self.specs.append((spec, consistency))
        if consistency:
            return {hosts[0].host: {"consistency": {"passed": True, "compared": 8}}}
        doc = self.docs[(len(self.specs) - 1) % len(self.docs)]
        return {hosts[0].host: doc}


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Host:
    h = Host()
    monkeypatch.setattr(use_case, "activate", h.activate)
    monkeypatch.setattr(use_case, "run_bench", h.run_bench)
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    return h


def test_bench_of_a_profile_applies_it_first_and_keeps_the_runs(host: Host, tmp_path: Path) -> None:
    host.docs = [run_doc({48: 100.0}, errors=1), run_doc({48: 110.0}, errors=2)]
    doc = use_case.bench(P, HV, tmp_path / "inv", BenchSpec(conc=(48,)), repeats=2)
    assert host.applied == ["ctas512"] and len(host.specs) == 2
    assert (doc["host"], doc["profile"], doc["repeats"], doc["errors"]) == ("lab1", "ctas512@3", 2, 3)
    assert doc["buckets"][0]["mean"] == 105.0 and doc["buckets"][0]["runs"] == [100.0, 110.0]
    assert doc["runs"] == [
        ["C=48 n=192 max_tokens=16 | agg=100.0 tok/s | per-req~9.5 tok/s | p50 lat=1.25s | toks=3072 errs=1 wall=1.5s"],
        ["C=48 n=192 max_tokens=16 | agg=110.0 tok/s | per-req~9.5 tok/s | p50 lat=1.25s | toks=3072 errs=2 wall=1.5s"],
    ]
    assert (doc["tool"], doc["engine_version"], doc["settings"]) == ("knobfleet", None, None)
    stored = use_case.results_path("lab1", P)
    assert stored.parent == tmp_path / "state" / "bench" / "lab1"
    assert stored.name == f"ctas512@3-{P.content_hash[7:19]}.json"
    assert json.loads(stored.read_text()) == {"runs": host.docs}


def test_bench_of_what_runs_applies_nothing_and_stores_nothing(host: Host, tmp_path: Path) -> None:
    doc = use_case.bench(None, HV, tmp_path / "inv", BenchSpec(conc=(48, 64)), repeats=1)
    assert host.applied == [] and doc["profile"] is None and doc["repeats"] == 1
    assert (doc["tool"], doc["engine_version"], doc["settings"]) == ("vllm bench serve", "0.11", {"x": 1})
    assert not (tmp_path / "state" / "bench").exists()


def test_consistency_runs_a_small_spec(host: Host, tmp_path: Path) -> None:
    spec = BenchSpec(conc=(48, 64), max_tokens=256, timeout_s=900, cons_prompts=5, cons_repeats=3)
    assert use_case.consistency(HV, tmp_path, spec, None) == {"passed": True, "compared": 8}
    ((cons, flag),) = host.specs
    assert flag is True
    assert (cons.conc, cons.max_tokens, cons.timeout_s, cons.cons_prompts, cons.cons_repeats) == ((12,), 64, 900, 5, 3)
    use_case.consistency(HV, tmp_path, BenchSpec(conc=(8,), max_tokens=32), None)
    assert (host.specs[1][0].conc, host.specs[1][0].max_tokens) == ((4,), 32)


def test_the_ab_report_document(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from knobfleet.experiment.design import Decision
    from knobfleet.experiment.stats import Interval

    a = P
    b = Profile(name="ctas768", version=1, engine="sglang", env={"SGLANG_SM120_MMA_TARGET_CTAS": 768}, args={})
    d = Decision("keep", "why", 3, Interval(math.log(1.02), math.log(0.99), math.log(1.05), 3, 0.01))
    d.buckets = {48: (Interval(math.log(1.1), math.log(1.0), math.log(1.2), 3, 0.02), "better")}
    s = Settings(weights={48: 1.0}, max_rounds=7, min_rounds=3)
    runs = {"A": {48: [100.0, 110.0]}, "B": {48: [120.0]}}
    cons: dict[str, dict[str, Any] | None] = {"A": {"passed": True}, "B": None}
    doc = use_case._document(a, b, "lab1", d, s, runs, cons, {"A": 0, "B": 2}, "ctas512", 12.345)
    assert (doc["a"], doc["b"], doc["host"], doc["verdict"], doc["winner"]) == (
        "ctas512@3",
        "ctas768@1",
        "lab1",
        "keep",
        "ctas512",
    )
    assert (doc["reason"], doc["rounds"], doc["wall_s"]) == ("why", 3, 12.3)
    assert doc["weighted_gain"] == {"estimate": 0.02, "low": -0.01, "high": 0.05}
    assert doc["buckets"] == [
        {
            "concurrency": 48,
            "weight": 1.0,
            "ratio": 0.1,
            "low": 0.0,
            "high": 0.2,
            "class": "better",
            "a_mean": 105.0,
            "b_mean": 120.0,
            "runs": {"A": [100.0, 110.0], "B": [120.0]},
        }
    ]
    assert doc["consistency"] == {"A": "pass", "B": "skipped"}
    assert doc["errors"] == {"A": 0, "B": 2}
    assert doc["settings"] == {
        "weights": {"48": 1.0},
        "min_effect": 0.01,
        "max_regression": 0.03,
        "max_rounds": 7,
        "min_rounds": 3,
        "alpha": 0.05,
        "futility": 0.05,
    }
    failed = use_case._document(
        a, b, "h", Decision("keep", "r", 0), s, {"A": {}, "B": {}}, {"A": {"passed": False}, "B": None}, {}, "x", 0
    )
    assert failed["consistency"] == {"A": "fail", "B": "skipped"}
    assert failed["weighted_gain"] == {"estimate": None, "low": None, "high": None} and failed["buckets"] == []


def test_the_ab_document_keeps_each_runs_latency_and_the_profiles_hashes(host: Host, tmp_path: Path) -> None:
    """Each run's median ITL, TTFT and end-to-end latency per bucket and arm, in seconds, for the report's latency
    plots; a value the bench did not report is None, never a made-up number."""
    b = Profile(name="ctas768", version=1, engine="sglang", env={"SGLANG_SM120_MMA_TARGET_CTAS": 768}, args={})
    lat = {"latency": {"p50": 1.5}, "itl": {"p50": 0.02}, "ttft": {"p50": 0.3}}
    host.docs = [
        {"buckets": [run_doc({48: 100.0})["buckets"][0] | lat]},
        {"buckets": [run_doc({48: 120.0})["buckets"][0]]},  # this run reports no ITL or TTFT
    ]
    settings = Settings(weights={48: 1.0}, max_rounds=1, min_rounds=1)
    doc = use_case.ab(P, b, HV, tmp_path, settings, BenchSpec(conc=(48,)), tmp_path / "r", check_consistency=False)
    (bucket,) = doc["buckets"]
    assert bucket["latency"] == {
        "A": {"itl": [0.02], "ttft": [0.3], "e2e": [1.5]},
        "B": {"itl": [None], "ttft": [None], "e2e": [1.25]},
    }
    assert doc["profile_hashes"] == {P.ref: P.content_hash, b.ref: b.content_hash}
    assert use_case.latency_p50({"buckets": [{"concurrency": 8, "itl": {"p50": True}, "ttft": "x"}]}) == {
        8: {"itl": None, "ttft": None, "e2e": None}
    }
