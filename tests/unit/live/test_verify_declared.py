"""verify_host against the profile the inventory declares — hash-only drift (same name@version, other content)
— and the typed findings, verdicts and fleet summary around the live-state rule."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from knobfleet.engines.adapter import engine
from knobfleet.live.verify import (
    Declared,
    Finding,
    HostVerdict,
    blocking_after_restore,
    exit_code,
    findings_of,
    summary,
    unreachable,
    verify_host,
)
from knobfleet.module_utils.knob_rules import RULES, Action, Kind

CASES = Path(__file__).parent / "verify_cases"
CLEAN = json.loads((CASES / "clean" / "probe.json").read_text())
RUNS = next(e["meta"] for e in CLEAN["generations"]["list"] if e["generation"] == CLEAN["generations"]["current"])
HASH = RUNS["hash"]
OTHER_HASH = "sha256:" + "0" * 64


def verify(doc: dict[str, Any], declared: Declared | None) -> HostVerdict:
    return verify_host("lab1", doc, declared, engine().rules())


def test_the_declared_profile_with_its_hash_is_in_sync() -> None:
    v = verify(CLEAN, Declared("ctas512", 1, HASH))
    assert (v.status, v.findings) == ("in_sync", [])
    assert (v.profile, v.version, v.hash, v.generation) == ("ctas512", 1, HASH, 1)


def test_same_name_and_version_with_other_content_is_drift() -> None:
    v = verify(CLEAN, Declared("ctas512", 1, OTHER_HASH))
    assert v.status == "drift"
    (f,) = v.findings
    assert (f.kind, f.name, f.severity, f.action) == (Kind.PROFILE_MISMATCH, "knob_profile", "warning", Action.INSTALL)
    assert f.expected == f"ctas512@1 {OTHER_HASH}"
    assert f.actual == f"ctas512@1 {HASH}"
    assert f.message == "runs ctas512@1, inventory declares ctas512@1"
    assert exit_code([v]) == 2


@pytest.mark.parametrize(
    "declared",
    [Declared("ctas512", 2, HASH), Declared("ctas768", 1, HASH), Declared("ctas512", 1, HASH.upper())],
)
def test_any_part_of_name_version_hash_differing_is_drift(declared: Declared) -> None:
    (f,) = verify(CLEAN, declared).findings
    assert f.kind == Kind.PROFILE_MISMATCH


def test_without_a_declared_profile_there_is_nothing_to_compare() -> None:
    assert verify(CLEAN, None).status == "in_sync"


def test_an_unmanaged_host_has_no_profile_to_mismatch() -> None:
    doc = copy.deepcopy(CLEAN)
    doc["generations"] = {"current": None, "list": [], "errors": []}
    v = verify(doc, Declared("ctas512", 1, OTHER_HASH))
    assert [f.kind for f in v.findings] == [Kind.UNMANAGED]
    assert (v.profile, v.generation) == (None, None)


def test_an_unreadable_generation_is_an_error_verdict() -> None:
    doc = copy.deepcopy(CLEAN)
    for e in doc["generations"]["list"]:
        e["meta"] = None
    doc["generations"]["errors"] = ["generations/0001/meta.json: bad json"]
    v = verify(doc, Declared("ctas512", 1, HASH))
    assert (v.status, v.generation, v.findings) == ("error", 1, [])
    assert v.error == (
        "generation 0001: meta.json missing or unreadable (generations/0001/meta.json: bad json); "
        "run `knobfleet history` and `knobfleet rollback --to N` to a readable generation"
    )
    assert v.as_json()["error"] == v.error


# --- typed findings and verdicts ---------------------------------------------------------------------------


def test_finding_from_the_rule_keeps_every_field() -> None:
    d = {
        "kind": "env_mismatch",
        "message": "m",
        "severity": "warning",
        "action": "restart",
        "path": "/p",
        "pid": 7,
        "name": "N",
        "expected": "1",
        "actual": "2",
        "source": "proc",
        "diff": "d",
    }
    f = Finding.from_rule(d)
    assert f == Finding(Kind.ENV_MISMATCH, "m", "warning", Action.RESTART, "/p", 7, "N", "1", "2", "proc", "d")
    assert f.as_json() == {k: v for k, v in d.items() if k not in ("severity", "action")}
    assert f.as_rule() == {"kind": "env_mismatch", "message": "m", "path": "/p", "action": "restart"}


def test_finding_defaults_and_sparse_json() -> None:
    f = Finding.from_rule({"kind": "service_inactive", "message": 5})
    assert (f.message, f.severity, f.action, f.path, f.pid) == ("5", "error", Action.NONE, None, None)
    assert f.as_json() == {"kind": "service_inactive", "message": "5"}
    assert findings_of([{"kind": "not_ready", "message": "x"}]) == [Finding(Kind.NOT_READY, "x")]


def test_verdict_json() -> None:
    v = verify(CLEAN, Declared("ctas512", 1, OTHER_HASH))
    out = v.as_json()
    assert out == {
        "host": "lab1",
        "status": "drift",
        "profile": "ctas512",
        "version": 1,
        "hash": HASH,
        "generation": 1,
        "findings": [f.as_json() for f in v.findings],
    }
    down = unreachable("lab9", "ssh: timed out")
    assert (down.host, down.status, down.error, down.findings) == ("lab9", "unreachable", "ssh: timed out", [])
    assert down.as_json()["error"] == "ssh: timed out" and down.as_json()["profile"] is None


def test_blocking_after_restore_keeps_only_findings_a_restore_must_fix() -> None:
    fs = [Finding(k, k.value) for k in Kind]
    assert blocking_after_restore(fs) == [f for f in fs if not RULES[f.kind].restore_ok]
    assert {f.kind for f in blocking_after_restore(fs)} == {k for k in Kind if not RULES[k].restore_ok}
    assert Kind.DROPIN_PRESENT not in {f.kind for f in blocking_after_restore(fs)}


def test_summary_counts_profiles_and_version_skew() -> None:
    a = verify(CLEAN, None)
    b = HostVerdict(
        "lab2", "drift", "ctas768", 1, "sha256:17c925f45c152e4787867f3d2e2f16", 2, [Finding(Kind.NOT_READY, "x")]
    )
    c = HostVerdict("lab3", "error", error="boom")
    d = unreachable("lab4", "down")
    s = summary([a, b, c, d])
    assert (s["hosts"], s["in_sync"], s["drift"], s["unreachable"], s["error"]) == (4, 1, 1, 1, 1)
    assert s["profiles"] == {
        f"ctas512@1 ({HASH[:19]})": ["lab1"],
        "ctas768@1 (sha256:17c925f45c15)": ["lab2"],
    }
    assert s["version_skew"] is True
    assert s["findings"] == {"not_ready": 1}
    same = summary([a, HostVerdict("lab5", "in_sync", "ctas512", 1, HASH)])
    assert same["profiles"] == {f"ctas512@1 ({HASH[:19]})": ["lab1", "lab5"]} and same["version_skew"] is False
    assert summary([])["version_skew"] is False


def test_exit_codes_without_drift() -> None:
    ok = verify(CLEAN, None)
    assert exit_code([]) == 0 and exit_code([ok, ok]) == 0
    assert exit_code([ok, HostVerdict("h", "error")]) == 4
