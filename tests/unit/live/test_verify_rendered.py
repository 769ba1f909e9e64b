"""What stands between a host and a rendered profile (live.verify.check_rendered, expected_rendered), as plan
and apply's pre-check use it on a recorded probe of a real lab host; the typed actions and refusal around it;
and the fleet summary's edge cases."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from knobfleet.engines.adapter import engine
from knobfleet.live.verify import (
    Declared,
    Finding,
    HostVerdict,
    actions,
    check_rendered,
    expected_rendered,
    refusal,
    summary,
    verify_host,
)
from knobfleet.module_utils.knob_redact import redact_value
from knobfleet.module_utils.knob_rules import Kind
from knobfleet.render import Rendered

CLEAN = json.loads((Path(__file__).parent / "verify_cases" / "clean" / "probe.json").read_text())
GEN = next(e["meta"] for e in CLEAN["generations"]["list"] if e["generation"] == CLEAN["generations"]["current"])
DECLARED = Declared(GEN["profile"], GEN["version"], GEN["hash"])


def rendered(script: str | None = None, secret: tuple[str, ...] = ()) -> Rendered:
    """What rendering the host's own profile gives: the files it has (or another script)."""
    files = CLEAN["files"]
    return Rendered(
        host="lab1",
        script=files["script"]["content"] if script is None else script,
        unit=files["unit"]["content"],
        env={},
        argv=[],
        script_path=files["script"]["path"],
        unit_path=files["unit"]["path"],
        secret=secret,
    )


def check(
    probe: dict[str, Any], r: Rendered, declared: Declared = DECLARED, run_id: str | None = None
) -> list[Finding]:
    return check_rendered(probe, r, declared, engine().rules(), run_id)


def test_the_hosts_own_profile_rendered_again_is_nothing_to_do() -> None:
    assert check(CLEAN, rendered()) == []


def test_the_expected_state_of_a_rendering_keeps_the_hosts_generation_and_profile() -> None:
    out = expected_rendered(CLEAN, rendered())
    assert out["managed"] is True and out["generation"] == CLEAN["generations"]["current"]
    assert out["profile"] == {"name": GEN["profile"], "version": GEN["version"], "hash": GEN["hash"]}
    assert out["files"]["script"]["path"] == CLEAN["files"]["script"]["path"]
    assert out["files"]["unit"]["path"] == CLEAN["files"]["unit"]["path"]
    assert out["files"]["script"]["sha256"] == CLEAN["files"]["script"]["sha256"]
    unmanaged = copy.deepcopy(CLEAN)
    unmanaged["generations"] = {"current": None, "list": []}
    out = expected_rendered(unmanaged, rendered())
    assert out["managed"] is False and out["generation"] is None and out["profile"] is None


def test_a_rendering_hides_the_hosts_secrets_the_way_the_host_reports_them() -> None:
    script = CLEAN["files"]["script"]["content"].replace("set -euo pipefail\n", "set -euo pipefail\nexport MY_CRED=s\n")
    out = expected_rendered(CLEAN, rendered(script, secret=("MY_CRED",)))
    assert out["env"]["MY_CRED"] == redact_value("s") and "MY_CRED=s" not in out["files"]["script"]["content"]


def test_another_rendering_is_a_file_change_of_the_current_generation() -> None:
    script = CLEAN["files"]["script"]["content"].replace("TARGET_CTAS=512", "TARGET_CTAS=768")
    f, *env = check(CLEAN, rendered(script))
    assert f.kind is Kind.FILE_CHANGED
    assert f.message == f"{CLEAN['files']['script']['path']} differs from generation 0001"
    # every engine process still runs 512: a restart is due after the install
    assert {e.kind for e in env} == {Kind.ENV_MISMATCH} and len(env) == len(CLEAN["processes"])
    assert actions([f, *env]) == ["install", "daemon-reload", "restart"]
    assert "+export SGLANG_SM120_MMA_TARGET_CTAS=512" in (f.diff or "")


def test_the_declared_profile_and_the_applier_run_are_passed_to_the_rule() -> None:
    (f,) = check(CLEAN, rendered(), Declared("ctas768", 2, "sha256:" + "7" * 64))
    assert (
        f.kind is Kind.PROFILE_MISMATCH
        and f.message == f"runs {GEN['profile']}@{GEN['version']}, inventory declares ctas768@2"
    )
    locked = copy.deepcopy(CLEAN)
    locked["generations"]["lock"] = {"run_id": "r1", "operator": "ann", "since": "t", "controller": "c"}
    assert check(locked, rendered(), run_id="r1") == []
    (f,) = check(locked, rendered(), run_id="r2")
    assert f.kind is Kind.INTERRUPTED_APPLY
    assert actions([f]) == ["refuse"] and actions([f], break_lock=True) == ["break-lock"]
    assert refusal([f]) == f.message and refusal([f], break_lock=True) is None
    dropin = Finding(Kind.DROPIN_PRESENT, "m", path="/etc/x.d/a.conf")
    assert actions([dropin]) == ["refuse"] and refusal([dropin]) is not None and refusal([dropin], "remove") is None


def test_an_unreadable_generation_names_the_host() -> None:
    broken = copy.deepcopy(CLEAN)
    for e in broken["generations"]["list"]:
        e.pop("meta", None)
    v = verify_host("lab7", broken, DECLARED, engine().rules())
    assert (v.host, v.status, v.generation) == ("lab7", "error", 1)


def test_summary_lists_profiles_only_of_hosts_that_answered() -> None:
    verdicts = [
        HostVerdict("a", "in_sync", "p", 1, None),
        HostVerdict("b", "error", "q", 2, "sha256:" + "1" * 64, error="x"),
        HostVerdict(
            "c", "drift", "p", 1, None, findings=[Finding(Kind.ENV_MISSING, "m"), Finding(Kind.ENV_MISSING, "n")]
        ),
        HostVerdict("d", "unreachable"),
    ]
    s = summary(verdicts)
    assert s["profiles"] == {"p@1 ()": ["a", "c"]} and s["version_skew"] is False
    assert s["findings"] == {"env_missing": 2}
    assert (s["hosts"], s["in_sync"], s["drift"], s["unreachable"], s["error"]) == (4, 1, 1, 1, 1)
