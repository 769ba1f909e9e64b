"""The SPACE's live stage (``tune/space_live.py``): the canary `tune` runs is the one `knobfleet canary` runs, its
hung-stream probes and warm-up rule included (issue 57), every setting checked before the first stage runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from knobfleet.experiment.canary import Settings
from knobfleet.tune import stages
from knobfleet.tune.space import SpaceError
from knobfleet.tune.space_live import LiveStage
from tests.unit.tune.tune_fixtures import SEED_SPACE


def _space(tmp_path: Path, live: str) -> Any:
    from knobfleet.cli.tune import load_space

    p = tmp_path / "space.yaml"
    p.write_text(SEED_SPACE.replace("live: {hosts: 1}", f"live: {live}"))
    return load_space(p)


def test_the_defaults_are_the_canary_commands() -> None:
    s, c = LiveStage().settings(), Settings()
    assert (s.probes, s.hang_s, s.warmup_windows, s.warmup_tol) == (c.probes, c.hang_s, c.warmup_windows, c.warmup_tol)
    assert (s.max_windows, s.pre_windows, s.swap_after, s.window_s) == (6, 3, 3, 30.0)


def test_the_probe_and_warm_up_settings_reach_the_judge(tmp_path: Path) -> None:
    sp = _space(tmp_path, "{hosts: 1, window: 45s, probes: 16, hang: 1m, warmup_windows: 0, warmup_tol: 0.1}")
    s = sp.live.settings()
    assert (s.probes, s.hang_s, s.warmup_windows, s.warmup_tol, s.window_s) == (16, 60.0, 0, 0.1, 45.0)


@pytest.mark.parametrize(
    ("live", "field"),
    [
        ("{probes: 33}", "stages.live.probes"),
        ("{probes: -1}", "stages.live.probes"),
        ("{probes: true}", "stages.live.probes"),
        ("{hang: 0}", "stages.live.hang"),
        ("{hang: 11m}", "stages.live.hang"),
        ("{hang: soon}", "stages.live.hang"),
        ("{warmup_windows: 9}", "stages.live.warmup_windows"),
        ("{warmup_tol: 0}", "stages.live.warmup_tol"),
        ("{warmup_tol: .nan}", "stages.live.warmup_tol"),
        ("{warmup_tol: 0.9}", "stages.live.warmup_tol"),
        ("{max_windows: 6, swap_after: 3, pre_windows: 2, probez: 1}", "stages.live.probez"),
    ],
    ids=["probes-high", "probes-negative", "probes-bool", "hang-zero", "hang-long", "hang-word", "warmup-many",
         "tol-zero", "tol-nan", "tol-high", "unknown-key"],
)  # fmt: skip
def test_a_live_setting_that_cannot_work_is_refused_before_the_first_stage(
    tmp_path: Path, live: str, field: str
) -> None:
    with pytest.raises(SpaceError) as exc:
        _space(tmp_path, live)
    assert f"{field}" in str(exc.value) and "space.yaml" in str(exc.value)


def test_a_skipped_live_stage_is_not_judged(tmp_path: Path) -> None:
    assert _space(tmp_path, '{skip: "no router here"}').live.skip == "no router here"


def test_the_campaigns_canary_sends_the_hung_stream_probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found missing in issue 57: `tune`'s canary judged throughput and latency only, never a hung stream."""
    from knobfleet.experiment import canary_probe, canary_run
    from knobfleet.ops import fleet

    seen: dict[str, Any] = {}

    class Report:
        def as_json(self) -> dict[str, Any]:
            return {"verdict": "promote"}

    def fake_canary(profile: Any, hosts: Any, door: Any, prom: Any, opts: Any, keep: Any) -> Report:
        seen["opts"] = opts
        return Report()

    monkeypatch.setattr(canary_run, "canary", fake_canary)
    monkeypatch.setattr(fleet, "door", lambda inv: None)
    monkeypatch.setattr(fleet, "hosts", lambda inv, limit: [])
    sp = _space(tmp_path, "{hosts: 1, probes: 12, hang: 15s, warmup_windows: 1}")
    out = stages.HostStages(sp, tmp_path / "inv", prometheus="http://127.0.0.1:9").canary(object())  # type: ignore[arg-type]
    opts = seen["opts"]
    assert out == {"verdict": "promote"}
    assert opts.prober is canary_probe.start
    assert (opts.settings.probes, opts.settings.hang_s, opts.settings.warmup_windows) == (12, 15.0, 1)
