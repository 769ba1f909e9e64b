"""plan's compile-cache line: plan.cache_cold over the installed and the rendered script, carried by HostPlan and
HostOutcome into the plan's text and its --json document."""

from __future__ import annotations

from types import SimpleNamespace

from knobfleet.engines.adapter import engine
from knobfleet.fleet.hostvars import HostVars
from knobfleet.ops.outcome import HostOutcome
from knobfleet.ops.plan import cache_cold
from knobfleet.profiles.model import Profile
from knobfleet.render import render_host
from knobfleet.report_rollout import apply_summary


def script(pin: str | None, tp: int) -> str:
    doc = {"name": "p", "version": 1, "engine": "sglang", "env": {}, "args": {"tp-size": tp}}
    prof = Profile.model_validate({**doc, **({"engine_version": pin} if pin else {})})
    return render_host(prof, HostVars(host="h", service="svc", compile_cache=True)).script


def test_an_upgrade_and_a_key_knob_are_named_and_printed() -> None:
    why = cache_cold(engine("sglang"), script("0.5.22", 1), script("0.5.23", 2), ("0.5.22", "0.5.23"))
    assert why == [
        "engine version changes from 0.5.22 to 0.5.23",
        "--tp-size changes (1 → 2): it enters the compile key",
    ]
    assert cache_cold(engine("sglang"), script(None, 1), script(None, 1), ("0.5.23", "0.5.23")) == []
    out = HostOutcome("h", "pending", 0, cache_cold=why)
    assert out.as_json()["compile_cache"] == {"cold": why}
    assert "compile_cache" not in HostOutcome("h", "pending", 0).as_json()
    profile = SimpleNamespace(ref="p@1", content_hash="sha256:" + "0" * 64)
    text = apply_summary(SimpleNamespace(hosts=[out], check=True, profile=profile, wall_s=0.1))
    assert "h: compile cache cold after the restart: engine version changes from 0.5.22 to 0.5.23" in text
