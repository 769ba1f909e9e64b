"""experiment/ab.py's ``ab`` end to end against a fake host: which profile is live when the experiment ends, and
which one the report calls the winner, for every verdict and for both parities of the round budget.

The boundary is faked, the rule is real: ``activate`` (apply a profile on the host) records which profile is
live, ``run_bench`` answers with the throughput a scripted B/A ratio gives for the live profile, ``consistency``
passes. ``design.decide`` decides. Rounds run AB, BA, AB, …: after an odd number of rounds B ran last, after an
even number A did, so a rule that forgot to put A back would be caught on one parity or the other only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from knobfleet.errors import KnobfleetError
from knobfleet.experiment import ab as use_case
from knobfleet.experiment.bench.run import BenchSpec
from knobfleet.experiment.design import Settings
from knobfleet.fleet.hostvars import HostVars
from knobfleet.profiles.model import Profile

CONC = (48, 64, 80, 96)
WEIGHTS = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}
BASE = 1000.0


def profile(name: str, ctas: int) -> Profile:
    return Profile(name=name, version=1, engine="sglang", env={"SGLANG_SM120_MMA_TARGET_CTAS": ctas}, args={})


A, B = profile("incumbent", 512), profile("candidate", 768)
HV = HostVars(host="lab1")


class FakeHost:
    """One host: the live profile, and a bench that answers B/A = ``ratio(round, concurrency)``."""

    def __init__(self, ratio: Callable[[int, int], float], b_errors: int = 0) -> None:
        self.ratio = ratio
        self.b_errors = b_errors
        self.live: str | None = None
        self.activations: list[str] = []
        self.runs = {A.name: 0, B.name: 0}

    def activate(self, p: Profile, hv: HostVars, inventory: Path, on_event: Any) -> None:
        assert hv.host == "lab1"
        self.live = p.name
        self.activations.append(p.name)

    def run_bench(self, hosts: list[HostVars], inventory: Path, spec: BenchSpec, **_: Any) -> dict[str, Any]:
        assert self.live is not None, "bench before any profile was applied"
        r = self.runs[self.live]
        self.runs[self.live] += 1
        is_b = self.live == B.name
        buckets = [
            {
                "concurrency": c,
                "agg_tok_s": BASE * (self.ratio(r, c) if is_b else 1.0),
                "errors": self.b_errors if is_b else 0,
            }
            for c in spec.conc
        ]
        return {hosts[0].host: {"buckets": buckets}}

    def consistency(self, hv: HostVars, inventory: Path, spec: BenchSpec, on_event: Any) -> dict[str, Any]:
        return {"passed": True}


def run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, host: FakeHost, max_rounds: int, futility: float = 0.05
) -> tuple[dict[str, Any], dict[str, Any]]:
    monkeypatch.setattr(use_case, "activate", host.activate)
    monkeypatch.setattr(use_case, "run_bench", host.run_bench)
    monkeypatch.setattr(use_case, "consistency", host.consistency)
    settings = Settings(weights=WEIGHTS, max_rounds=max_rounds, min_rounds=min(3, max_rounds), futility=futility)
    doc = use_case.ab(A, B, HV, tmp_path / "inv", settings, BenchSpec(conc=CONC), tmp_path / "report")
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    return doc, written


def noisy_equal(r: int, c: int) -> float:
    """B is as fast as A, behind ±10% noise per round: no budget of a few rounds can tell."""
    return 1.10 if r % 2 == 0 else 1 / 1.10


def clear_gain(r: int, c: int) -> float:
    return 1.20 * (1 + 0.001 * ((r + c) % 3))


def clear_loss(r: int, c: int) -> float:
    return 0.80 * (1 + 0.001 * ((r + c) % 3))


@pytest.mark.parametrize("max_rounds", [3, 4, 5, 6])
def test_an_inconclusive_experiment_puts_the_incumbent_back_and_never_calls_the_candidate_winner(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, max_rounds: int
) -> None:
    host = FakeHost(noisy_equal)
    # futility 0: the rule may not keep A early on B's small promotion chance, so the budget runs out
    doc, written = run(monkeypatch, tmp_path, host, max_rounds, futility=0.0)
    assert doc["verdict"] == "inconclusive"
    assert doc["rounds"] == max_rounds
    assert host.runs == {A.name: max_rounds, B.name: max_rounds}
    assert host.live == A.name, f"after {max_rounds} rounds the candidate was left live"
    assert host.activations[-1] == A.name
    assert doc["winner"] == A.name and written["winner"] == A.name
    assert written["verdict"] == "inconclusive"


@pytest.mark.parametrize(
    ("ratio", "b_errors", "verdict", "winner"),
    [
        (clear_gain, 0, "promote", B),
        (clear_loss, 0, "keep", A),
        (clear_gain, 3, "keep", A),  # B dropped requests: never promoted, whatever its throughput
    ],
    ids=["gain", "loss", "errors"],
)
@pytest.mark.parametrize("max_rounds", [3, 4])
def test_a_decided_experiment_leaves_its_winner_live(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    ratio: Callable[[int, int], float],
    b_errors: int,
    verdict: str,
    winner: Profile,
    max_rounds: int,
) -> None:
    host = FakeHost(ratio, b_errors)
    doc, written = run(monkeypatch, tmp_path, host, max_rounds)
    assert (doc["verdict"], written["verdict"]) == (verdict, verdict)
    assert host.live == winner.name and host.activations[-1] == winner.name
    assert doc["winner"] == winner.name == written["winner"]
    # Every activation switched the profile: no needless re-apply of the one already live.
    assert all(x != y for x, y in zip(host.activations, host.activations[1:], strict=False))


def test_the_report_carries_the_measured_ratio_per_bucket(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    doc, _ = run(monkeypatch, tmp_path, FakeHost(clear_gain), 3)
    by_c = {b["concurrency"]: b for b in doc["buckets"]}
    assert sorted(by_c) == list(CONC)
    for c, b in by_c.items():
        ratios = [clear_gain(r, c) for r in range(doc["rounds"])]
        assert b["a_mean"] == BASE
        assert math.isclose(b["b_mean"], BASE * sum(ratios) / len(ratios))
        assert b["ratio"] > 0.19 and b["weight"] == WEIGHTS[c]


def test_the_same_profile_content_is_refused_before_touching_the_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    host = FakeHost(noisy_equal)
    monkeypatch.setattr(use_case, "activate", host.activate)
    twin = profile(A.name, 512)
    with pytest.raises(KnobfleetError, match="same profile content; nothing to compare"):
        use_case.ab(A, twin, HV, tmp_path, Settings(weights=WEIGHTS), BenchSpec(conc=CONC), tmp_path / "r")
    assert host.activations == []
