"""The campaign's steps on real hosts (tune/stages.py) where no host is needed: a stored `kernel bench` sweep is
read (the H200 sweep kept in perf/results) and ranks the survivors by measured time; the canary and the A/B get
the space's settings (the use cases themselves are faked at the module they are imported from: their own tests
and the lab hold what they do)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from knobfleet.ops import profiles as app
from knobfleet.tune import campaign, stages
from knobfleet.tune.space import parse
from tests.conftest import REPO
from tests.unit.tune.tune_fixtures import SEED_SPACE

SWEEP = REPO / "perf" / "results" / "kernel" / "sweep-h200.json"


def space_with(tmp_path: Path, text: str) -> Any:
    return parse(yaml.safe_load(text), tmp_path / "s.yaml", text)


def test_a_stored_sweep_ranks_the_survivors_by_measured_time(tmp_path: Path) -> None:
    text = SEED_SPACE.replace('{skip: "no GPU host in the lab"}', f"{{sweep: {SWEEP}}}").replace(
        "[256, 384, 512, 640, 768]", "[256, 384, 512, 768]"
    )
    sp = space_with(tmp_path, text)
    hs = stages.HostStages(sp, tmp_path / "inventory")
    rows = hs.kernel_rows([256, 384, 512, 768], [16, 32, 64], [48, 64, 80, 96])
    assert len(rows) == 1680  # the whole sweep: the ranking picks its cells
    base = app.store().resolve("ctas512")
    kept = [campaign.Scored(i, k, 0.0, 0.0, True, "kept") for i, k in enumerate(
        [{"SGLANG_SM120_MMA_TARGET_CTAS": c, "SGLANG_SM120_MMA_BLOCK_H": 32} for c in (256, 384, 768)]
    )]  # fmt: skip
    ranked = campaign.kernel_rank(kept, base.env, rows, dict(sp.traffic), 64, 4096, keep=2)
    assert [r["kept"] for r in ranked] == [True, True, False]
    times = [r["us_per_req"] for r in ranked]
    assert all(t is not None for t in times) and times == sorted(times)
    assert all(r["vs_current"] is not None for r in ranked)


@pytest.mark.parametrize("content", ["[1, 2]", "not json", ""])
def test_a_sweep_that_is_not_one_is_one_line(tmp_path: Path, content: str) -> None:
    (tmp_path / "sweep.json").write_text(content)
    sp = space_with(tmp_path, SEED_SPACE.replace('{skip: "no GPU host in the lab"}', "{sweep: sweep.json}"))
    with pytest.raises(Exception) as err:
        stages.HostStages(sp, tmp_path / "inventory").kernel_rows([512], [32], [48])
    assert "sweep" in str(err.value) and "\n" not in str(err.value)


def test_the_canary_gets_the_spaces_live_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from knobfleet.experiment import canary_run
    from knobfleet.ops import fleet

    text = SEED_SPACE.replace(
        "live: {hosts: 1}",
        "live: {hosts: 2, window: 20s, pre_windows: 3, swap_after: 2, max_windows: 5, advisory: true, prometheus: 'http://127.0.0.1:9'}",
    )
    sp = space_with(tmp_path, text)
    seen: dict[str, Any] = {}

    class Report:
        def as_json(self) -> dict[str, Any]:
            return {"verdict": "promote", "reason": "faked"}

    def fake_canary(profile: Any, hosts: Any, door: Any, prom: Any, opts: Any, **kw: Any) -> Report:
        seen.update(profile=profile.name, opts=opts, url=prom.url, keep=kw.get("keep"))
        return Report()

    monkeypatch.setattr(canary_run, "canary", fake_canary)
    monkeypatch.setattr(fleet, "door", lambda inventory, *a, **k: "door")
    monkeypatch.setattr(fleet, "hosts", lambda inventory, limit: ["lab1", "lab2", "lab3", "lab4"])
    out = stages.HostStages(sp, tmp_path / "inventory").canary(app.store().resolve("ctas512"))
    assert out == {"verdict": "promote", "reason": "faked"}
    o = seen["opts"]
    assert (o.hosts, o.window_s, o.advisory) == (2, 20.0, True)
    assert (o.settings.pre_windows, o.settings.swap_after, o.settings.max_windows) == (3, 2, 5)
    assert seen["url"].startswith("http://127.0.0.1:9") and callable(seen["keep"])
