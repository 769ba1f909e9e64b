"""The canary's warm-up rule (experiment/canary_warm.py): a period's first window counts once the next agrees with
it; a window the next disagrees with is set aside; the bound ends the wait; rows and the record say which."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet.experiment.canary import Window
from knobfleet.experiment.canary_warm import Settle, moved, summary


def win(tput: float, itl: float = 0.01, other: float = 100.0) -> Window:
    return Window({"tput": {"h1": tput}, "itl": {"h1": itl}}, {"tput": {"h2": other}, "itl": {"h2": 0.01}}, 300, 300)


def feed(settle: Settle, tputs: list[float]) -> tuple[list[list[Window]], list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    out = []
    for k, t in enumerate(tputs, start=1):
        row: dict[str, Any] = {"window": k, "requests": {"h1": 300.0, "h2": 300.0}}
        rows.append(row)
        out.append(settle.offer(win(t), row))
    return out, rows


# (figures per window, bound, windows counted after each offer, windows set aside, converged)
CASES = [
    ("warm from the start: nothing set aside", [100, 101, 100, 99], 2, [0, 2, 1, 1], [], True),
    ("one cold window", [80, 100, 101, 100], 2, [0, 0, 2, 1], [1], True),
    ("two cold windows, bound 3", [70, 85, 100, 100], 3, [0, 0, 0, 2], [1, 2], True),
    ("never settles: the bound", [60, 70, 80, 90, 100], 2, [0, 0, 1, 1, 1], [1, 2], False),
    ("bound 1", [60, 70, 80], 1, [0, 1, 1], [1], False),
    ("bound 0 judges from the first", [60, 70, 80], 0, [1, 1, 1], [], True),
    ("within the tolerance exactly", [100, 104.9], 2, [0, 2], [], True),
]


@pytest.mark.parametrize(("why", "tputs", "bound", "counted", "aside", "converged"), CASES, ids=[c[0] for c in CASES])
def test_the_rule(
    why: str, tputs: list[float], bound: int, counted: list[int], aside: list[int], converged: bool
) -> None:
    settle = Settle(bound, 0.05)
    out, rows = feed(settle, tputs)
    assert [len(o) for o in out] == counted
    assert [r["window"] for r in settle.aside] == aside
    assert settle.converged is converged
    for r in rows:  # every window says what happened to it
        assert "warmup" in r or settle.settled
        if r["window"] in aside:
            assert r["skipped"] == r["warmup"] and r["warmup"].startswith("warming up: h1 tput ")


def test_a_window_still_held_at_the_end_did_not_count_and_the_note_says_so() -> None:
    settle = Settle(2, 0.05)
    feed(settle, [80, 100])
    assert settle.held is not None and len(settle.unjudged()) == 2  # the cold one and the held one
    notes = settle.close()
    assert [r["window"] for r in settle.aside] == [1, 2] and settle.held is None
    assert notes == ["warm-up: window(s) 1, 2 set aside, the engines still settling after the restart"]
    assert "period ended" in settle.aside[1]["skipped"]


def test_nothing_set_aside_leaves_no_note_and_the_summary_sums_requests() -> None:
    warm, cold = Settle(2, 0.05), Settle(2, 0.05)
    feed(warm, [100, 100, 100])
    feed(cold, [60, 70, 80, 90])
    assert warm.close() == [] and cold.close()[0].endswith("not settled within 2, judged from the next window on")
    assert summary([warm, cold]) == {"windows": 2, "requests": 1200, "unconverged_periods": 1, "set_aside": [1, 2]}


def test_moved_names_each_host_and_metric_and_ignores_what_one_window_lacks() -> None:
    a = Window({"tput": {"h1": 100.0}, "itl": {"h1": 0.010}}, {"tput": {"h2": 100.0}}, 1, 1)
    b = Window({"tput": {"h1": 90.0}, "itl": {"h1": 0.011}}, {"tput": {"h2": 100.0}, "itl": {"h2": 1.0}}, 1, 1)
    assert moved(a, b, 0.05) == ["h1 itl +10.0%", "h1 tput -10.0%"]
    assert moved(a, b, 0.2) == []


@given(st.lists(st.floats(min_value=1.0, max_value=1e6), min_size=1, max_size=12), st.integers(0, 8))
def test_every_window_is_counted_once_or_set_aside_once(tputs: list[float], bound: int) -> None:
    settle = Settle(bound, 0.05)
    out, _rows = feed(settle, tputs)
    settle.close()
    counted = sum(len(o) for o in out)
    assert counted + len(settle.aside) == len(tputs)
    assert len(settle.aside) <= bound + 1  # the bound, and one held at the end
