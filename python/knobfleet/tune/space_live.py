"""The ``live`` stage of a SPACE file (pure): the canary ``tune`` runs on real traffic behind the router, with the
settings ``knobfleet canary`` takes on its command line, hung-stream probes and the warm-up rule included.

    live: {hosts: 1, window: 30s, pre_windows: 3, swap_after: 3, max_windows: 6, advisory: false,
           probes: 8, hang: 20s, warmup_windows: 2, warmup_tol: 0.05}      # or {skip: "why"}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from knobfleet.experiment.canary import MAX_HANG_S, MAX_PROBES, MAX_WARMUP_WINDOWS, Settings
from knobfleet.tune.space_fields import duration, int_field, skip_reason

KEYS = {"hosts", "window", "pre_windows", "swap_after", "max_windows", "advisory", "skip", "prometheus", "probes",
        "hang", "warmup_windows", "warmup_tol"}  # fmt: skip


@dataclass(frozen=True)
class LiveStage:
    skip: str | None = None
    hosts: int = 1
    window_s: float = 30.0
    pre_windows: int = 3
    swap_after: int = 3  # the canary's crossover: windows before the subsets swap; max_windows - this after it
    max_windows: int = 6
    advisory: bool = False
    prometheus: str | None = None
    probes: int = Settings.probes  # streamed probes per host and window (0: none); a stream silent hang_s is hung
    hang_s: float = Settings.hang_s
    warmup_windows: int = Settings.warmup_windows  # windows a period may set aside while its engines warm up
    warmup_tol: float = Settings.warmup_tol

    def settings(self) -> Settings:
        """The canary judge's settings for this stage (the rest at the canary's defaults)."""
        return Settings(max_windows=self.max_windows, pre_windows=self.pre_windows, swap_after=self.swap_after,
                        window_s=self.window_s, probes=self.probes, hang_s=self.hang_s,
                        warmup_windows=self.warmup_windows, warmup_tol=self.warmup_tol)  # fmt: skip


def live_stage(sec: dict[str, Any], bad: Any) -> LiveStage:
    w = "stages.live"
    window = duration(sec.get("window", LiveStage.window_s))
    if window is None:
        bad(f"{w}.window", f"{sec.get('window')!r}: expected a duration such as 30s")
    advisory = sec.get("advisory", False)
    if not isinstance(advisory, bool):
        bad(f"{w}.advisory", f"{advisory!r}: expected true or false")
        advisory = False
    prom = sec.get("prometheus")
    if prom is not None and (not isinstance(prom, str) or not prom.startswith(("http://", "https://"))):
        bad(f"{w}.prometheus", f"{prom!r}: expected an http(s) URL")
        prom = None
    probes = int_field(sec, "probes", LiveStage.probes, 0, w, bad)
    if probes > MAX_PROBES:
        bad(f"{w}.probes", f"{probes}: at most {MAX_PROBES} streamed probes per host and window (0: none)")
        probes = LiveStage.probes
    hang = duration(sec.get("hang", LiveStage.hang_s))
    if hang is None or hang > MAX_HANG_S:
        bad(f"{w}.hang", f"{sec.get('hang')!r}: expected a duration up to {MAX_HANG_S:g}s such as 20s (a stream "
            "with no token for that long counts as hung)")  # fmt: skip
        hang = LiveStage.hang_s
    warm = int_field(sec, "warmup_windows", LiveStage.warmup_windows, 0, w, bad)
    if warm > MAX_WARMUP_WINDOWS:
        bad(f"{w}.warmup_windows", f"{warm}: at most {MAX_WARMUP_WINDOWS} windows set aside per period (0: none)")
        warm = LiveStage.warmup_windows
    tol = sec.get("warmup_tol", LiveStage.warmup_tol)
    if isinstance(tol, bool) or not isinstance(tol, int | float) or not 0 < tol <= 0.5:
        bad(f"{w}.warmup_tol", f"{tol!r}: expected a fraction in (0, 0.5], e.g. 0.05")
        tol = LiveStage.warmup_tol
    return LiveStage(
        skip=skip_reason(sec, w, bad),
        hosts=int_field(sec, "hosts", LiveStage.hosts, 1, w, bad),
        window_s=window or LiveStage.window_s,
        pre_windows=int_field(sec, "pre_windows", LiveStage.pre_windows, 2, w, bad),
        swap_after=(swap := int_field(sec, "swap_after", LiveStage.swap_after, 1, w, bad)),
        max_windows=int_field(sec, "max_windows", LiveStage.max_windows, swap + 3, w, bad),
        advisory=advisory,
        prometheus=prom,
        probes=probes,
        hang_s=hang,
        warmup_windows=warm,
        warmup_tol=float(tol),
    )
