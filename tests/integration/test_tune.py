"""`knobfleet tune` on the lab, from a user's project: the seed's traffic mix over TARGET_CTAS x BLOCK_H (15
candidates) on the stand-in engine, from blockh16 (TARGET_CTAS 256, BLOCK_H 16). The model stage prunes, one
host runs the real interleaved A/Bs, the winner is written as a profile of the project and rolled out to every
host (the live stage is skipped here: this lab runs no router; the canary has its own lab test). The truth of
every candidate is the stand-in's own model, computed here independently of the campaign's scoring."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

from knobfleet import waves
from knobfleet.lab.sim import model
from tests.conftest import REPO
from tests.integration.conftest import Fleet

MIX = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}
SPACE = """\
schema_version: 1
name: lab
base: blockh16
knobs:
  SGLANG_SM120_MMA_TARGET_CTAS: [256, 320, 384, 512, 768]
  SGLANG_SM120_MMA_BLOCK_H: [16, 32, 64]
traffic: {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}
budget: {wall: 40m, host_minutes: 30}
stages:
  model: {keep: 2, margin: 0.10}
  kernel: {skip: "the lab has no GPU: the stand-in runs the wave model itself"}
  engine: {host: lab1, keep: 2, max_rounds: 6, round: 30s, n_mult: 1, max_tokens: 32}
  live: {skip: "this lab runs no router; the canary is tested in test_router.py"}
result: lab-tuned
"""


CTAS = (256, 320, 384, 512, 768)
# The space is chosen so that the assertions hold whatever the noise draws, not in most runs: the two candidates
# the model keeps (512/64 best, 320/64 1.6% below it) are both within 2% of the best, and 14.5% and 12.7% above
# the base, which the sequential A/B finds in its rounds. Simulated with the campaign's own code and the lab's 6.5%
# noise (tune.sim.SimStages, seeds 0-999): 1000 of 1000 end within 2% (784 on 512/64, 216 on 320/64). The first
# version of this test, from ctas512 over 256/384/512/640/768, needed the A/B to tell 512/64 from 640/64 (2.7%
# apart) and failed 24 of 200 simulated runs.


def truth(ctas: int, block_h: int) -> float:
    return model.weighted_log_tok_s(waves.KernelKnobs(ctas, block_h), MIX, 188, max_tokens=32)


def test_tune_ends_within_2_percent_of_the_best_and_rolls_it_out(fleet: Fleet, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    init = subprocess.run([sys.executable, "-m", "knobfleet", "init", str(proj)], capture_output=True, text=True)
    assert init.returncode == 0, init.stderr
    for name in ("base", "default", "ctas512", "blockh16"):
        shutil.copy(REPO / "profiles" / f"{name}.yaml", proj / "profiles")
    (proj / "space.yaml").write_text(SPACE)
    assert fleet.inventory is not None
    fleet.knobfleet("apply", "blockh16", "--yes", check=True)
    html = tmp_path / "tune.html"
    argv = [sys.executable, "-m", "knobfleet", "tune", "space.yaml", "-i", str(fleet.inventory), "--yes", "--json"]
    proc = subprocess.run([*argv, "--report", str(html)], cwd=proj, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    print(json.dumps({k: doc[k] for k in ("decision", "used")}, indent=1))
    for r in doc["stages"]["engine"]["results"]:
        print(r["name"], r["knobs"], r.get("ab", {}).get("verdict"), r.get("ab", {}).get("weighted_gain"))
    d = doc["decision"]
    best = max(truth(c, b) for c in CTAS for b in (16, 32, 64))
    current = truth(256, 16)
    ended = (
        truth(d["knobs"]["SGLANG_SM120_MMA_TARGET_CTAS"], d["knobs"]["SGLANG_SM120_MMA_BLOCK_H"])
        if d["verdict"] == "promote"
        else current
    )
    assert ended >= current, d  # never a profile worse than the current one
    assert math.expm1(best - ended) <= 0.02, (d, math.expm1(best - ended))
    # it says how much of each budget it used; the model stage pruned 15 to 2 and said why
    assert doc["used"]["host_s"] > 0 and doc["used"]["wall_s"] >= doc["used"]["host_s"]
    # issue 57: the SPACE declares `round: 30s`, a round takes longer here (two restarts and two benches); each A/B
    # is priced at the longest round measured in this campaign, so the host budget (30 min) is never overspent
    rounds = [t for r in doc["stages"]["engine"]["results"] for t in (r.get("ab", {}).get("spent") or {}).get(
        "round_s", [])]  # fmt: skip
    print(f"rounds measured {rounds} s (declared 30 s); host time used {doc['used']['host_s']:.0f} s of 1800 s")
    assert rounds and doc["used"]["host_s"] <= 30 * 60, doc["used"]
    assert doc["used_by_stage"]["engine"] > 0 and doc["used_by_stage"]["live"] > 0
    m = doc["stages"]["model"]
    assert m["candidates"] == 15 and len(m["kept"]) == 2 and m["dropped"] == 13
    assert all(r["reason"] for r in m["rows"])
    # the winner is a profile of the project, and every host runs it, verified
    assert (proj / "profiles" / "lab-tuned.yaml").is_file()
    verify = fleet.knobfleet("verify", "--json")
    assert verify.returncode == 0, verify.stdout[-2000:]
    assert {h["profile"] for h in json.loads(verify.stdout)["hosts"]} == {"lab-tuned"}
    page = html.read_text()
    assert "1. Model: 15 candidates, 2 kept" in page and "3. Engine" in page
    fleet.knobfleet("apply", "ctas512", "--yes", check=True)
