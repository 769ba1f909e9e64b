"""experiment/ab.Spent: where an A/B's time went, and the deadline no round may run past."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from knobfleet.experiment.ab import Spent, restart_seconds
from knobfleet.ops.outcome import HostOutcome


def report(restarted: bool, startup: dict[str, float | None] | None) -> SimpleNamespace:
    o = HostOutcome("lab1", "applied", 1, restarted=restarted)
    o.startup = startup
    return SimpleNamespace(hosts=[o])


@pytest.mark.parametrize(
    ("rep", "seconds"),
    [
        (report(True, {"stop_s": 1.5, "start_s": 30.0}), 31.5),
        (report(True, {"stop_s": None, "start_s": 2.0}), 2.0),
        (report(True, None), None),
        (report(False, {"stop_s": 1.0, "start_s": 9.0}), None),
        (None, None),
    ],
)
def test_restart_seconds(rep: SimpleNamespace | None, seconds: float | None) -> None:
    assert restart_seconds(rep) == seconds


def test_spent_counts_restarts_measured_and_not() -> None:
    s = Spent()
    s.restart(report(True, {"stop_s": 1.0, "start_s": 9.0}))
    s.restart(report(True, None))
    s.warmed("B", {"buckets": [{"warmup": 16, "warmup_detail": {"converged": True}},
                               {"warmup": 128, "warmup_detail": {"converged": False}}]})  # fmt: skip
    assert s.as_json() == {"round_s": [], "restarts": 2, "restart_s": 10.0, "unmeasured_restarts": 1, "stopped": None,
                           "warmup_requests": {"A": 0, "B": 144}, "warmup_unconverged": 1}  # fmt: skip


@pytest.mark.parametrize(("left", "stops"), [(None, False), (400.0, False), (140.0, True), (-5.0, True)])
def test_no_round_starts_that_would_end_past_the_deadline(left: float | None, stops: bool) -> None:
    s = Spent(rounds=[80.0, 100.0])
    deadline = None if left is None else time.monotonic() + left
    assert s.out_of_time(deadline) is stops
    if stops:
        assert s.stopped.startswith("stopped before round 3: the budget has ") and "took up to 100s" in s.stopped


def test_the_first_round_always_runs() -> None:
    assert Spent().out_of_time(time.monotonic() - 1) is False
