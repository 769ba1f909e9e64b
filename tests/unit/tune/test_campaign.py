"""The campaign's pure decisions, case by case: the model stage's pruning and ties, the kernel ranking from
measured rows, what the record keeps of an A/B, the engine stage's pick, the budget ledger."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from knobfleet.tune import campaign
from knobfleet.tune.space import parse
from tests.unit.tune.tune_fixtures import SEED_SPACE

BASE = {"SGLANG_SM120_MMA_TARGET_CTAS": 512, "SGLANG_SM120_MMA_BLOCK_H": 32, "SGLANG_OPT_USE_MULTI_STREAM_OVERLAP": 0}
MIX = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}


def space(tmp_path: Path, text: str = SEED_SPACE) -> Any:
    return parse(yaml.safe_load(text), tmp_path / "s.yaml", text)


def test_the_model_keeps_the_best_within_the_margin_and_says_why_for_the_rest(tmp_path: Path) -> None:
    rows, current = campaign.model_stage(space(tmp_path), BASE, MIX, 188, None)
    assert len(rows) == 15 and current > 0
    kept = [r for r in rows if r.kept]
    assert kept[0].knobs == {"SGLANG_SM120_MMA_TARGET_CTAS": 512, "SGLANG_SM120_MMA_BLOCK_H": 64}
    assert all(r.relative <= 0.10 + 1e-9 for r in kept) and len(kept) <= 4
    assert kept[0].reason == "kept: rank 1, predicted +0.0% against the best prediction"
    own = next(r for r in rows if r.knobs == {"SGLANG_SM120_MMA_TARGET_CTAS": 512, "SGLANG_SM120_MMA_BLOCK_H": 32})
    assert not own.kept and own.reason.startswith("the current profile's own values")
    far = [r for r in rows if not r.kept and r is not own]
    assert far and all("beyond the 10% margin" in r.reason or "past the 4 kept" in r.reason for r in far)
    assert rows[0].as_json() == {
        "index": 0,
        "knobs": rows[0].knobs,
        "cost": rows[0].cost,
        "relative": rows[0].relative,
        "kept": rows[0].kept,
        "reason": rows[0].reason,
    }


def test_a_space_of_only_the_current_values_keeps_nothing(tmp_path: Path) -> None:
    text = SEED_SPACE.replace("[256, 384, 512, 640, 768]", "[512]").replace("[16, 32, 64]", "[32]")
    rows, current = campaign.model_stage(space(tmp_path, text), BASE, MIX, 188, None)
    assert [(r.kept, r.relative) for r in rows] == [(False, 0.0)] and current > 0


def test_knobs_the_model_cannot_tell_apart_tie_and_go_on_in_the_files_order(tmp_path: Path) -> None:
    text = SEED_SPACE.replace(
        "  SGLANG_SM120_MMA_TARGET_CTAS: [256, 384, 512, 640, 768]\n  SGLANG_SM120_MMA_BLOCK_H: [16, 32, 64]\n",
        "  SGLANG_INIT_NEW_TOKEN_RATIO: [0.9, 0.7, 0.5, 0.3, 0.1]\n",
    ).replace("keep: 4", "keep: 2")
    rows, _ = campaign.model_stage(space(tmp_path, text), BASE, MIX, 188, None)
    assert [r.index for r in rows if r.kept] == [0, 1]
    assert rows[2].reason == "within the margin (+0.0%) but past the 2 kept"


def row(batch: int, ctas: int, bh: int, us: float, heads: int = 64, context: int = 4096) -> dict[str, Any]:
    return {"batch": batch, "target_ctas": ctas, "block_h": bh, "heads": heads, "context": context, "total_us": us}


def test_the_kernel_stage_ranks_by_measured_weighted_time_and_keeps_unmeasured_ones_last() -> None:
    weights = {48: 0.5, 96: 0.5}
    a = campaign.Scored(0, {"SGLANG_SM120_MMA_TARGET_CTAS": 256}, 1.0, 0.0, True, "kept")
    b = campaign.Scored(1, {"SGLANG_SM120_MMA_TARGET_CTAS": 768}, 2.0, 0.1, True, "kept")
    c = campaign.Scored(2, {"SGLANG_SM120_MMA_TARGET_CTAS": 384}, 0.5, 0.0, True, "kept")
    rows = [
        {"batch": 48, "target_ctas": 256, "block_h": 32, "total_us": 1.0},  # no heads/context: not this shape
        row(48, 256, 32, 90.0, heads=128),  # another head count: ignored
        row(48, 256, 32, 48.0), row(96, 256, 32, 192.0),  # 256: 0.5 * 1 + 0.5 * 2 = 1.5 us per request
        row(48, 768, 32, 24.0), row(96, 768, 32, 96.0),  # 768: 0.75
        row(48, 768, 32, 30.0),  # a slower repeat of a cell: the faster is the cell's
        row(48, 512, 32, 96.0), row(96, 512, 32, 192.0),  # the current profile: 2.0
        row(48, 384, 32, 1.0),  # 384 at one bucket only: unmeasured
    ]  # fmt: skip
    ranked = campaign.kernel_rank([a, b, c], BASE, rows, weights, 64, 4096, keep=2)
    assert [(r["index"], r["kept"], r["reason"]) for r in ranked] == [
        (1, True, "kept"),
        (0, True, "kept"),
        (2, False, "dropped: rank 3, past the 2 kept"),
    ]
    assert ranked[0]["us_per_req"] == pytest.approx(0.75) and ranked[0]["vs_current"] == pytest.approx(-0.625)
    assert ranked[0]["knobs"] == b.knobs and ranked[2]["us_per_req"] is None and ranked[2]["vs_current"] is None
    # a bucket of weight 0 is not measured, and does not end the sum
    zero_first = campaign.kernel_rank([a, b], BASE, rows, {32: 0.0, **weights}, 64, 4096, keep=2)
    assert [r["us_per_req"] for r in zero_first] == pytest.approx([0.75, 1.5])
    only = campaign.kernel_rank([c], BASE, rows, weights, 64, 4096, keep=1)
    assert only[0]["reason"] == "kept, unmeasured (not in the sweep at every bucket)"


def test_what_the_record_keeps_of_an_ab() -> None:
    doc = {
        "verdict": "promote", "reason": "r", "rounds": 4, "wall_s": 9.5, "winner": "B", "settings": {},
        "weighted_gain": {"estimate": 0.04, "low": 0.01, "high": 0.07},
        "buckets": [{"concurrency": 48, "ratio": 0.1, "low": 0.0, "high": 0.2, "class": "better", "a_mean": 1}],
        "consistency": {"A": "pass", "B": "pass"},
    }  # fmt: skip
    assert campaign.ab_summary(doc) == {
        "verdict": "promote",
        "reason": "r",
        "rounds": 4,
        "weighted_gain": {"estimate": 0.04, "low": 0.01, "high": 0.07},
        "buckets": [{"concurrency": 48, "ratio": 0.1, "low": 0.0, "high": 0.2, "class": "better"}],
        "consistency": {"A": "pass", "B": "pass"},
        "wall_s": 9.5,
    }


def result(index: int, verdict: str, low: float | None, est: float | None) -> dict[str, Any]:
    return {"index": index, "ab": {"verdict": verdict, "weighted_gain": {"low": low, "estimate": est}}}


@pytest.mark.parametrize(
    ("results", "winner"),
    [
        ([result(0, "keep", 0.5, 0.6), result(1, "inconclusive", 0.4, 0.5)], None),
        ([result(0, "promote", 0.01, 0.05), result(1, "promote", 0.02, 0.03)], 1),  # the higher lower bound
        ([result(0, "promote", 0.02, 0.03), result(1, "promote", 0.02, 0.04)], 1),  # then the estimate
        ([result(0, "promote", 0.02, 0.03), result(1, "promote", 0.02, 0.03)], 0),  # then the earlier
        ([result(0, "promote", None, None), result(1, "promote", 0.001, 0.002)], 1),
        ([{"index": 0, "out": "crashed"}, result(1, "promote", 0.01, 0.02)], 1),
    ],
)
def test_the_engine_stage_picks_the_surest_promoted_candidate(
    results: list[dict[str, Any]], winner: int | None
) -> None:
    got = campaign.engine_pick(results)
    assert (got["index"] if got else None) == winner


def test_the_ledger_round_trips_and_starts_at_zero() -> None:
    zero = {"wall_s": 0.0, "host_s": 0.0, "gpu_s": 0.0, "restart_s": 0.0}
    assert campaign.Ledger.from_json(None).as_json() == zero
    assert campaign.Ledger.from_json({}).as_json() == zero
    led = campaign.Ledger(1.26, 2.0, 3.0, 0.5)
    assert campaign.Ledger.from_json(led.as_json()).as_json() == {**zero, "wall_s": 1.3, "host_s": 2.0, "gpu_s": 3.0,
                                                                  "restart_s": 0.5}  # fmt: skip


def ab_result(*rounds: float) -> dict[str, Any]:
    return {"ab": {"spent": {"round_s": list(rounds), "restarts": 2 * len(rounds)}}}


@pytest.mark.parametrize(
    ("results", "expected", "basis"),
    [
        ([], 30.0, "declared round 30s (no round measured on this host yet)"),
        ([ab_result(20.0, 25.0)], 30.0, "declared round 30s (measured rounds took up to 25s)"),
        ([ab_result(240.0, 251.0), {"skipped": "x"}, ab_result(190.0)], 251.0,
         "measured: a round took up to 251s here (declared 30s)"),
    ],
)  # fmt: skip
def test_rounds_are_priced_at_the_longest_measured_round(
    results: list[dict[str, Any]], expected: float, basis: str
) -> None:
    space = SimpleNamespace(engine=SimpleNamespace(round_s=30.0))
    assert campaign.round_estimate(space, results) == (expected, basis)  # type: ignore[arg-type]


def test_the_cap_follows_the_measured_round_not_the_declared_one() -> None:
    """The lab's case: a 45-minute host budget, a declared 30 s round, rounds measured at 250 s: 10 rounds, not
    90; the declared round would have allowed 8 (max_rounds) and overrun the budget by minutes."""
    budget = SimpleNamespace(host_s=2700.0, wall_s=7200.0)
    space = SimpleNamespace(budget=budget, engine=SimpleNamespace(round_s=30.0))
    used = campaign.Ledger(wall_s=200.0, host_s=200.0)
    assert campaign.budget_left(space, used) == 2500.0  # type: ignore[arg-type]
    assert campaign.rounds_affordable(space, used) == 83  # type: ignore[arg-type]
    assert campaign.rounds_affordable(space, used, 250.0) == 10  # type: ignore[arg-type]


def test_rounds_affordable_is_bounded_by_the_smaller_budget(tmp_path: Path) -> None:
    sp = space(tmp_path)  # wall 2h, host 60 min, 60 s rounds
    assert campaign.rounds_affordable(sp, campaign.Ledger()) == 60
    assert campaign.rounds_affordable(sp, campaign.Ledger(wall_s=7200 - 125, host_s=0)) == 2
    assert campaign.rounds_affordable(sp, campaign.Ledger(wall_s=0, host_s=3600 - 59)) == 0
    assert campaign.rounds_affordable(sp, campaign.Ledger(wall_s=9000, host_s=9000)) == 0
