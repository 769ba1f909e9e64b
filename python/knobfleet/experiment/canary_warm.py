"""Pure: the canary judges warm engines only (``knobfleet canary``, #57).

Both subsets restart at the start of each period (the canary apply, the baseline restarted as fresh, the crossover's
swap), and a restarted engine is not yet the engine that will serve: SGLang on 8xH200 served TTFT 27% worse and
throughput 6.6% lower right after a restart, and converged over its first ~50-100 requests.

The rule, on the engines' own per-window figures (throughput per running request and mean ITL, per host, as the
judge reads them): a period's first window is **held**, and counts only once the next window agrees with it, every
host's every figure within ``tol`` (the lab's window-to-window noise is ~2.6% sd, so 5% sets aside about one warm
window in twenty). A held window the next one disagrees with is **set aside**, and the next is held in its place.
After ``bound`` windows set aside, the next window counts whatever it shows and the period is reported as not
converged. The judge needs ``min_windows`` (3) counted windows before its first look, so a held window costs no look
when the engines are warm: only a cold window is paid for, one window each.

Every window keeps its reason in its row (``warmup``; a set-aside window also ``skipped``, the way the reports show a
window that does not count), and the canary's record sums the windows and requests set aside."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from knobfleet.experiment.canary import Window


def figures(w: Window) -> dict[str, dict[str, float]]:
    """metric -> host -> value, both sides of the window."""
    out: dict[str, dict[str, float]] = {}
    for side in (w.canary, w.baseline):
        for metric, hosts in side.items():
            out.setdefault(metric, {}).update(hosts)
    return out


def moved(before: Window, after: Window, tol: float) -> list[str]:
    """The figures that moved by more than ``tol`` from one window to the next, as 'lab1 itl +7.2%' (a host or metric
    missing from either window is not compared)."""
    a, b = figures(before), figures(after)
    out = []
    for metric in sorted(set(a) & set(b)):
        for host in sorted(set(a[metric]) & set(b[metric])):
            x, y = a[metric][host], b[metric][host]
            if x > 0 and y > 0 and abs(math.log(y / x)) > tol:
                out.append(f"{host} {metric} {y / x - 1:+.1%}")
    return out


@dataclass
class Settle:
    """One period's warm-up: each measured window goes in, in order (``offer``); out come the windows that count now."""

    bound: int
    tol: float
    held: tuple[Window, dict[str, Any]] | None = None
    aside: list[dict[str, Any]] = field(default_factory=list)  # the rows set aside
    aside_windows: list[Window] = field(default_factory=list)  # and their windows
    settled: bool = False
    converged: bool = True  # False: the bound was reached, and windows counted all the same

    def offer(self, window: Window, row: dict[str, Any]) -> list[Window]:
        if self.settled or self.bound == 0:
            self.settled = True
            return [window]
        if self.held is None:
            self.held = (window, row)
            row["warmup"] = "held: the first window after a restart counts once the next one agrees with it"
            return []
        first, first_row = self.held
        drift = moved(first, window, self.tol)
        if not drift:
            self.settled, self.held = True, None
            first_row["warmup"] = f"counted: the next window agreed within {self.tol:.0%}"
            return [first, window]
        why = f"warming up: {', '.join(drift)} in the next window (more than {self.tol:.0%})"
        first_row["warmup"] = first_row["skipped"] = why
        self.aside.append(first_row)
        self.aside_windows.append(first)
        if len(self.aside) >= self.bound:
            self.settled, self.held, self.converged = True, None, False
            row["warmup"] = f"counted: {self.bound} window(s) set aside, the bound; the engines had not settled"
            return [window]
        self.held = (window, row)
        row["warmup"] = "held: counts once the next window agrees with it"
        return []

    def unjudged(self) -> list[Window]:
        """The windows set aside or held: the judge's error and hung-stream guardrails count them all the same (a
        profile that fails requests is rolled back at once, warm or not)."""
        return [*self.aside_windows, *([self.held[0]] if self.held is not None else [])]

    def close(self) -> list[str]:
        """The period's end: a window still held was never confirmed, so it did not count. The notes say what the
        period set aside (none when nothing was)."""
        if self.held is not None:
            window, row = self.held
            row["warmup"] = row["skipped"] = "warming up: the period ended before the next window could confirm it"
            self.aside.append(row)
            self.aside_windows.append(window)
            self.held = None
        if not self.aside:
            return []
        which = ", ".join(str(r.get("window")) for r in self.aside)
        settled = "" if self.converged else f"; not settled within {self.bound}, judged from the next window on"
        return [f"warm-up: window(s) {which} set aside, the engines still settling after the restart{settled}"]


def summary(periods: list[Settle]) -> dict[str, Any]:
    """What a canary set aside, for its record: windows, their finished requests, and the periods that never settled."""
    rows = [r for p in periods for r in p.aside]
    requests = sum(sum((r.get("requests") or {}).values()) for r in rows)
    return {
        "windows": len(rows),
        "requests": round(requests),
        "unconverged_periods": sum(1 for p in periods if not p.converged),
        "set_aside": [r.get("window") for r in rows],
    }
