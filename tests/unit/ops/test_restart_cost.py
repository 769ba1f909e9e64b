"""ops/restart_cost: the restarts a change causes priced from each host's measured starts (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from knobfleet.ops.restart_cost import measured, price, starts


def start(profile: str, engine: str, stop: float | None, start_s: float, **more: Any) -> dict[str, Any]:
    return {"event": "start", "profile": profile, "engine_version": engine, "stop_s": stop, "start_s": start_s, **more}


LEDGER = [
    {"event": "apply", "profile": "ctas512"},
    start("base", "0.5.23", 1.0, 30.0),
    start("ctas512", "0.5.23", 2.0, 40.0, phases=[{"phase": "weights", "s": 10.0}, {"phase": "serving", "s": 30.0}]),
    start("ctas512", "0.5.23", 2.0, 44.0, phases=[{"phase": "weights", "s": 12.0}]),
    start("ctas512", "0.5.22", 9.0, 99.0),
    {"event": "start", "start_s": "garbage"},
    {"event": "start", "start_s": -1},
]

BASIS_CASES = [
    # (case, profile, engine version, expected (start_s, stop_s, n, basis))
    ("the same profile on the same engine", "ctas512", "0.5.23", (42.0, 2.0, 2, "this profile on this engine version")),
    ("another profile on the same engine", "other", "0.5.23", (40.0, 2.0, 3, "this engine version")),
    ("an engine version never measured", "other", "0.6.0", (42.0, 2.0, 4, "any profile")),
    ("no engine version read", "other", None, (42.0, 2.0, 4, "any profile")),
]  # fmt: skip


@pytest.mark.parametrize(("case", "profile", "engine", "expected"), BASIS_CASES)
def test_a_hosts_restart_is_the_median_of_its_closest_starts(
    case: str, profile: str, engine: str | None, expected: tuple[float, float, int, str]
) -> None:
    m = measured(LEDGER, profile, engine)
    assert m is not None, case
    assert (m.start_s, m.stop_s, m.n, m.basis) == expected, case


def test_phases_are_medians_of_the_starts_that_show_them() -> None:
    m = measured(LEDGER, "ctas512", "0.5.23")
    assert m is not None and m.phases == {"weights": 11.0, "serving": 30.0}
    assert m.seconds == 44.0


def test_only_the_last_starts_count() -> None:
    ledger = [start("p", "1", None, 100.0)] + [start("p", "1", None, 10.0)] * 5
    m = measured(ledger, "p", "1")
    assert m is not None and (m.start_s, m.n, m.stop_s) == (10.0, 5, None)


def test_a_host_without_a_start_is_unmeasured_never_guessed() -> None:
    assert measured([{"event": "apply"}], "p", "1") is None
    assert len(starts(LEDGER)) == 4


def test_price_a_rolling_change_batch_by_batch() -> None:
    ledgers = {"a": [start("p", "1", 2.0, 30.0)], "b": [start("p", "1", 1.0, 50.0)], "c": [start("p", "1", 0.0, 20.0)]}
    versions = {"a": "1", "b": "1", "c": "1"}
    cost = price([["a", "b"], ["c"]], {"a", "b", "c"}, ledgers, "p", versions, overhead_s=10.0)
    assert cost.batches == 2 and cost.restarts == 3
    assert cost.wall_s == (51.0 + 10.0) + (20.0 + 10.0)
    assert cost.host_minutes == round((32.0 + 51.0 + 20.0) / 60, 2)
    assert cost.unmeasured == []
    text = "\n".join(cost.lines())
    assert "restarts: 3 on 3 host(s), in 2 batch(es)" in text
    assert "b (batch 1): stop 1.0s + start 50.0s = 51.0s out of service (median of 1, this profile on" in text
    assert "expected time: 1m31s (2 batch(es), 10s a batch for the rollout itself)" in text
    assert cost.as_json()["hosts"][0]["measured"]["seconds"] == 32.0


def test_price_says_what_it_leaves_out() -> None:
    cost = price([["a"], ["b"], ["c"]], {"a", "b"}, {"a": [start("p", "1", None, 30.0)]}, "p", {}, None, 2)
    assert cost.batches == 2 and cost.restarts == 4  # an A/B: 2 restarts a host
    assert cost.unmeasured == ["b"] and cost.wall_s == 60.0
    text = "\n".join(cost.lines())
    assert "b (batch 2): unmeasured (no start in its ledger yet)" in text
    assert "the rollout's own time per batch unmeasured" in text and "leaves out 1 unmeasured host(s)" in text


def test_nothing_measured_and_nothing_to_change() -> None:
    assert (
        price([["a"]], {"a"}, {}, "p", {}).lines()[-1] == "expected time: unmeasured (no host has a measured start yet)"
    )
    assert price([["a"]], set(), {}, "p", {}).lines() == ["restarts: none (nothing to change)"]


def test_an_experiment_states_its_restarts_per_host() -> None:
    from knobfleet.ops.restart_cost import experiment_lines

    m = measured([start("p", "1", 1.0, 29.0)], "p", "1")
    lines = experiment_lines("ab on lab1", {"lab1": m, "lab2": None}, 17, "8 rounds")
    assert lines[0] == "ab on lab1: up to 34 restart(s), 17 on each of 2 host(s) (8 rounds)"
    assert lines[1] == "  lab1: 30.0s a restart (median of 1, this profile on this engine version) = 8m30s"
    assert lines[2] == "  lab2: unmeasured (no start in its ledger yet)"
    assert lines[3] == "  restarts alone: 8.5 host-minutes out of service (leaves out 1 unmeasured host(s))"
    assert experiment_lines("x", {"a": None}, 1, "y")[-1] == "  a: unmeasured (no start in its ledger yet)"


def test_a_canary_states_its_design_and_the_other() -> None:
    from knobfleet.ops.restart_cost import canary_lines

    m = measured([start("p", "1", 0.0, 60.0)], "p", "1")
    lines = canary_lines("crossover", {"lab1": m}, {"lab2": m, "lab3": None})
    assert lines[0] == (
        "canary (crossover) canaries: up to 3 restart(s), 3 on each of 1 host(s) (the profile, the swap, the verdict)"
    )
    assert "canary (crossover) baseline: up to 6 restart(s), 3 on each of 2 host(s)" in lines[3]
    assert lines[-1] == "  the did design would cost up to 4 restart(s) instead of 9"
    did = canary_lines("did", {"lab1": m}, {"lab2": m})
    assert did[-1] == "  the crossover design would cost up to 6 restart(s) instead of 3"
