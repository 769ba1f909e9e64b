"""The canary's line after each window on a terminal: window k of N, the running estimate per metric with its
interval (positive: the canary better), the judge's word, and when the last possible window ends."""

from __future__ import annotations

import math

from knobfleet.cli.telemetry import progress_line
from knobfleet.experiment.canary import Verdict
from knobfleet.experiment.stats import Interval


def test_the_line_carries_the_running_estimate_and_the_eta() -> None:
    iv = Interval(math.log(0.955), math.log(0.94), math.log(0.97), 4, 0.01)
    v = Verdict("continue", "tput is -4.5% (-6.0% to -3.0%)", 4, intervals={"tput": iv})
    assert progress_line("ctas512", 4, 12, v, 60.0) == (
        "canary ctas512: window 4 of at most 12 · tput -4.5% (-6.0% to -3.0%) · tput is -4.5% (-6.0% to -3.0%) · "
        "next: continue · last possible window in ~480s"
    )


def test_before_any_estimate_the_line_says_so() -> None:
    assert progress_line("x", 1, 3, Verdict("continue", "too few windows", 1), 15.0).startswith(
        "canary x: window 1 of at most 3 · no estimate yet · too few windows · next: continue · "
    )
