"""bench, consistency and ab on the real lab (stand-in engine at a small time scale)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import REPO
from tests.integration.conftest import Fleet

SMALL = ["--conc", "16,32", "--n-mult", "2", "--max-tokens", "32"]
OVERLAP = "name: overlap1\nversion: 1\nextends: default\nenv:\n  SGLANG_OPT_USE_MULTI_STREAM_OVERLAP: 1\n"


def with_profile(folder: Path, name: str, text: str) -> Path:
    """A profile file next to copies of the ones it extends (base, default)."""
    for parent in ("base", "default"):
        shutil.copy(REPO / "profiles" / f"{parent}.yaml", folder)
    (folder / f"{name}.yaml").write_text(text)
    return folder / f"{name}.yaml"


def test_consistency_fails_multi_stream_overlap_and_passes_base(fleet: Fleet, tmp_path: Path) -> None:
    with_profile(tmp_path, "overlap1", OVERLAP)
    bad = fleet.knobfleet(
        "bench", str(tmp_path / "overlap1.yaml"), "--consistency", "--limit", "lab2", "--conc", "32", "--json"
    )
    assert bad.returncode == 1, bad.stderr
    result = json.loads(bad.stdout)
    assert result["passed"] is False and result["diverged"] > 0
    good = fleet.knobfleet("bench", "base", "--consistency", "--limit", "lab2", "--conc", "32", "--json")
    assert good.returncode == 0, good.stdout[-800:] + good.stderr
    assert json.loads(good.stdout)["passed"] is True


def test_bench_reports_buckets_with_intervals(fleet: Fleet) -> None:
    proc = fleet.knobfleet("bench", "ctas512", "--limit", "lab3", "--repeats", "2", "--json", *SMALL, check=True)
    doc = json.loads(proc.stdout)
    assert [b["concurrency"] for b in doc["buckets"]] == [16, 32] and doc["errors"] == 0
    assert all(b["low"] <= b["mean"] <= b["high"] and len(b["runs"]) == 2 for b in doc["buckets"])


def test_ab_produces_a_verdict_reports_and_a_verified_profile(fleet: Fleet, tmp_path: Path) -> None:
    report = tmp_path / "exp"
    proc = fleet.knobfleet(
        "ab",
        "default",
        "ctas512",
        "--limit",
        "lab1",
        *SMALL,
        "--weights",
        "16=0.5,32=0.5",
        "--max-rounds",
        "3",
        "--report",
        str(report),
        "--json",
        "--yes",
        timeout=900,
    )
    doc = json.loads(proc.stdout)
    assert doc["verdict"] in ("promote", "keep", "inconclusive")
    # the verdict is the exit status: decided 0, inconclusive 2
    assert proc.returncode == (2 if doc["verdict"] == "inconclusive" else 0), proc.stderr[-1500:]
    assert doc["winner"] == ("ctas512" if doc["verdict"] == "promote" else "default")
    assert doc["reason"] and 1 <= doc["rounds"] <= 3
    assert set(doc["weighted_gain"]) == {"estimate", "low", "high"}
    assert {b["class"] for b in doc["buckets"]} <= {"better", "worse", "same", "inconclusive"}
    assert doc["consistency"] == {"A": "pass", "B": "pass"}
    for name in ("report.json", "report.md", "report.png"):
        assert (report / name).stat().st_size > 0
    assert (report / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "**Verdict:" in (report / "report.md").read_text()
    verify = fleet.knobfleet("verify", "--limit", "lab1", "--json")
    assert verify.returncode == 0
    assert json.loads(verify.stdout)["hosts"][0]["profile"] == doc["winner"]


def test_gate_rejects_an_inconsistent_profile_and_restores(fleet: Fleet, tmp_path: Path) -> None:
    with_profile(tmp_path, "overlap1", OVERLAP)
    fleet.knobfleet("apply", "ctas512", "--limit", "lab3", "--yes", check=True)
    gate = ["--gate", "--baseline", "ctas512", "--gate-conc", "16,32", "--gate-n-mult", "2", "--gate-max-tokens", "32"]
    proc = fleet.knobfleet("apply", str(tmp_path / "overlap1.yaml"), "--limit", "lab3", "--yes", *gate, "--json")
    assert proc.returncode == 1, proc.stdout[-1500:] + proc.stderr[-1500:]
    doc = json.loads(proc.stdout)
    (g,) = doc["gate"]
    assert not g["passed"] and g["consistency"] == "fail" and g["baseline_source"] in ("stored", "measured")
    (h,) = doc["hosts"]
    assert h["restored"]["ok"] and h["restored"]["profile"] == "ctas512"
    verify = fleet.knobfleet("verify", "--limit", "lab3", "--json")
    assert verify.returncode == 0 and json.loads(verify.stdout)["hosts"][0]["profile"] == "ctas512"
    hist = json.loads(fleet.knobfleet("history", "--limit", "lab3", "--json", check=True).stdout)
    last = hist["hosts"][0]["generations"][-1]
    assert last["profile"] == "overlap1" and last["status"] == "failed" and last["reason"].startswith("gate: ")


# The stand-in's wave model makes this profile certainly slower than `default` (BLOCK_H 64, 8 target CTAs: too few
# CTAs per wave; the model predicts -57% at C=16 and -45% at C=32, far beyond 6.5% noise and the 3% guardrail).
SLOW = (
    "name: slow\nversion: 1\nextends: default\n"
    "env:\n  SGLANG_SM120_MMA_BLOCK_H: 64\n  SGLANG_SM120_MMA_TARGET_CTAS: 8\n"
)


def test_ab_keeps_the_incumbent_against_a_certainly_slower_profile(fleet: Fleet, tmp_path: Path) -> None:
    with_profile(tmp_path, "slow", SLOW)
    proc = fleet.knobfleet(
        "ab",
        str(tmp_path / "default.yaml"),
        str(tmp_path / "slow.yaml"),
        "--limit",
        "lab2",
        *SMALL,
        "--weights",
        "16=0.5,32=0.5",
        "--max-rounds",
        "3",
        "--no-consistency",
        "--report",
        str(tmp_path / "exp"),
        "--json",
        "--yes",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    doc = json.loads(proc.stdout)
    assert doc["verdict"] == "keep" and doc["winner"] == "default", doc["reason"]
    assert {b["class"] for b in doc["buckets"]} == {"worse"}, doc["buckets"]
    assert all(b["ratio"] < -0.25 for b in doc["buckets"]), doc["buckets"]
    assert "guardrail" in doc["reason"], doc["reason"]
    verify = fleet.knobfleet("verify", "--limit", "lab2", "--json")
    assert verify.returncode == 0 and json.loads(verify.stdout)["hosts"][0]["profile"] == "default"


def test_gate_rejects_a_throughput_regression_and_restores(fleet: Fleet, tmp_path: Path) -> None:
    with_profile(tmp_path, "slow", SLOW)
    fleet.knobfleet("apply", str(tmp_path / "default.yaml"), "--limit", "lab2", "--yes", check=True)
    gate = ["--gate", "--baseline", "default", "--gate-conc", "16,32", "--gate-n-mult", "2", "--gate-max-tokens", "32"]
    proc = fleet.knobfleet("apply", str(tmp_path / "slow.yaml"), "--limit", "lab2", "--yes", *gate, "--json")
    assert proc.returncode == 1, proc.stdout[-1500:] + proc.stderr[-1500:]
    doc = json.loads(proc.stdout)
    (g,) = doc["gate"]
    assert not g["passed"] and g["consistency"] == "pass", g
    assert g["reason"].startswith("throughput at concurrency "), g["reason"]
    assert all(r < 0.75 for r in g["ratios"].values()), g["ratios"]  # measured B/A well below 1
    (h,) = doc["hosts"]
    assert h["restored"]["ok"] and h["restored"]["profile"] == "default"
    verify = fleet.knobfleet("verify", "--limit", "lab2", "--json")
    assert verify.returncode == 0 and json.loads(verify.stdout)["hosts"][0]["profile"] == "default"
    hist = json.loads(fleet.knobfleet("history", "--limit", "lab2", "--json", check=True).stdout)
    last = hist["hosts"][0]["generations"][-1]
    assert last["profile"] == "slow" and last["status"] == "failed" and "throughput" in last["reason"]
