"""plan's compile-cache line: plan.cache_cold over the installed and the rendered script, carried by HostPlan and
HostOutcome into the plan's text and its --json document."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from knobfleet.engines.adapter import engine
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.inventory import load_hosts
from knobfleet.live.verify import Declared
from knobfleet.ops.outcome import HostOutcome
from knobfleet.ops.plan import cache_cold, plan_host
from knobfleet.profiles.model import Profile
from knobfleet.profiles.store import ProfileStore
from knobfleet.render import render_host
from knobfleet.report_rollout import apply_summary

UNIT = Path(__file__).parents[1]


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


VERSIONS = ("0.5.22", "0.5.23")
MOVES = "the compile cache moves: FLASHINFER_WORKSPACE_BASE (unset) → "


# plan_host's cache_cold over the recorded lab probe (installed script: no compile cache, --tp=2): only a plan that
# restarts or starts the engine has one, and it compares the installed script with the rendered one.
@pytest.mark.parametrize(
    ("compile_cache", "versions", "stopped", "cold"),
    [
        (False, (None, None), False, []),  # in sync: nothing restarts
        (False, VERSIONS, False, []),  # in sync: an upgrade that does not happen is no reason
        (True, (None, None), False, [MOVES]),  # the same --tp-size and --model-path: only the cache folder
        (True, VERSIONS, False, ["engine version changes from 0.5.22 to 0.5.23", MOVES]),
        (False, (None, None), True, []),  # started on the script it had: warm
        (True, (None, None), True, [MOVES]),
    ],
)
def test_plan_host_carries_why_the_cache_is_cold(
    compile_cache: bool, versions: tuple[str | None, str | None], stopped: bool, cold: list[str]
) -> None:
    doc = json.loads((UNIT / "live" / "verify_cases" / "clean" / "probe.json").read_text())
    if stopped:
        doc["unit_props"].update(MainPID="0", ActiveState="inactive")
        doc["processes"] = []
    hv = load_hosts(UNIT / "data" / "inventory_v1", "lab1")[0].model_copy(update={"compile_cache": compile_cache})
    p = ProfileStore(UNIT / "data" / "profiles_v1").resolve("ctas512")
    declared = Declared(p.name, p.version, p.content_hash)
    got = plan_host(doc, render_host(p, hv), declared, engine(), "fail", False, versions)
    assert bool(got.actions) == (compile_cache or stopped)
    assert isinstance(got.cache_cold, list) and len(got.cache_cold) == len(cold)
    assert all(line.startswith(want) for line, want in zip(got.cache_cold, cold, strict=True))
