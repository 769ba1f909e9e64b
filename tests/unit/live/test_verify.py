"""verify.py against recorded probe documents: one folder per scenario (probe.json + expected.json).

The probes were recorded from the lab with `knobfleet drift --save-probes DIR` after injecting each fault
(see each case's "about"); three are synthesized from the clean probe where the stand-in engine cannot
produce the fault live, or a killed controller would be needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from knobfleet.engines.adapter import engine
from knobfleet.live.verify import KINDS, Declared, exit_code, summary, verify_host

CASES = Path(__file__).parent / "verify_cases"


def load(case: str) -> tuple[dict[str, Any], dict[str, Any]]:
    return (
        json.loads((CASES / case / "probe.json").read_text()),
        json.loads((CASES / case / "expected.json").read_text()),
    )


def run(case: str):  # type: ignore[no-untyped-def]
    probe, expected = load(case)
    declared = Declared(**expected["declared"]) if expected["declared"] else None
    return verify_host("lab1", probe, declared, engine().rules()), expected


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.iterdir() if p.is_dir()))
def test_recorded_case(case: str) -> None:
    verdict, expected = run(case)
    got = [
        {k: f.as_json()[k] for k in ("kind", "name", "pid", "path", "source") if k in f.as_json()}
        for f in verdict.findings
    ]
    assert verdict.status == expected["status"]
    assert got == expected["findings"]
    assert all(f["kind"] in KINDS for f in got)


def test_every_finding_kind_has_a_case() -> None:
    seen = set()
    for case in CASES.iterdir():
        seen |= {f["kind"] for f in load(case.name)[1]["findings"]}
    # The group kinds come from the cross-rank rule over several hosts' documents (tests/unit/live/test_group_rule.py);
    # out_of_router and engine_version_mismatch from drift's own reads (test_drift_router.py, test_versions.py).
    assert seen == set(KINDS) - {"group_mismatch", "group_rank_down", "out_of_router", "engine_version_mismatch"}


def test_clean_host_has_no_false_positives_despite_extra_env() -> None:
    verdict, _ = run("clean")
    env = load("clean")[0]["processes"][0]["env"]
    assert {"INVOCATION_ID", "PATH"} <= set(env)  # systemd adds these; they are not findings
    assert verdict.status == "in_sync" and verdict.findings == []


def test_sed_edit_reports_a_unified_diff_and_the_stale_pid() -> None:
    verdict, _ = run("sed_edit_without_restart")
    changed = next(f for f in verdict.findings if f.kind == "file_changed")
    assert changed.diff is not None
    assert "-export SGLANG_SM120_MMA_TARGET_CTAS=512\n" in changed.diff
    assert "+export SGLANG_SM120_MMA_TARGET_CTAS=768\n" in changed.diff
    stale = next(f for f in verdict.findings if f.kind == "stale_process")
    assert stale.pid == int(load("sed_edit_without_restart")[0]["unit_props"]["MainPID"])


def test_env_mismatch_names_knob_expected_live_and_pid() -> None:
    verdict, _ = run("sed_edit_then_restart")
    f = next(f for f in verdict.findings if f.kind == "env_mismatch")
    assert (f.name, f.expected, f.actual) == ("SGLANG_SM120_MMA_TARGET_CTAS", "512", "768") and f.pid


def test_typo_knob_gets_did_you_mean() -> None:
    verdict, _ = run("typo_knob_set_by_hand")
    f = next(f for f in verdict.findings if f.kind == "env_unexpected")
    assert f.message.endswith("did you mean SGLANG_SM120_MMA_TARGET_CTAS?")


def test_engine_source_is_marked() -> None:
    verdict, _ = run("engine_reports_other_env")
    (f,) = verdict.findings
    assert (f.kind, f.source, f.actual, f.expected) == ("env_mismatch", "engine", "256", "512")


def test_corrupt_meta_is_an_error_naming_the_file() -> None:
    verdict, _ = run("corrupt_meta")
    assert verdict.status == "error" and "generations/0001/meta.json" in (verdict.error or "")


def test_summary_and_exit_codes() -> None:
    clean, _ = run("clean")
    drifted, _ = run("service_stopped")
    other, _ = run("declared_profile_differs")
    from knobfleet.live.verify import unreachable

    down = unreachable("lab9", "unreachable: ssh timed out")
    assert exit_code([clean]) == 0
    assert exit_code([clean, drifted]) == 2
    assert exit_code([clean, down]) == 4
    assert exit_code([drifted, down]) == 6
    s = summary([clean, drifted, down])
    assert (s["in_sync"], s["drift"], s["unreachable"], s["version_skew"]) == (1, 1, 1, False)
    assert s["findings"] == {"service_inactive": 1}
    assert other.status == "drift"
