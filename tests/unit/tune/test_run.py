"""A whole campaign over the stand-in's model (``lab.sim.tune.SimStages``: the real sequential rule over runs
with the lab's 6.5% noise): where it ends, what it never does, its record, ``--resume`` after an interruption at
every step, and the refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from knobfleet import waves
from knobfleet.cli.tune import load_space
from knobfleet.lab.sim import model
from knobfleet.ops import profiles as app
from knobfleet.tune import run, space
from knobfleet.tune.sim import SimStages
from tests.unit.tune.tune_fixtures import SEED_SPACE

MIX = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}


def truth(env: dict[str, Any], weights: dict[int, float]) -> float:
    """Computed here from the stand-in's model, independently of the campaign's own scoring."""
    k = waves.KernelKnobs(int(env["SGLANG_SM120_MMA_TARGET_CTAS"]), int(env["SGLANG_SM120_MMA_BLOCK_H"]))
    return model.weighted_log_tok_s(k, weights, 188)


def campaign(tmp_path: Path, text: str = SEED_SPACE, seed: int = 0, **sim: Any) -> tuple[run.Campaign, SimStages]:
    p = tmp_path / "space.yaml"
    p.write_text(text)
    sp = load_space(p)
    base = app.store().resolve(sp.base)
    stages = SimStages(dict(sp.traffic or MIX), seed=seed, **sim)
    stages.base = base
    c = run.Campaign(sp, base, stages, tmp_path / "record.json", 188, write_profile=run.write_profile_file(tmp_path))
    return c, stages


def test_the_seed_space_ends_within_2_percent_of_the_best_and_writes_the_winner(tmp_path: Path) -> None:
    c, stages = campaign(tmp_path)
    c.new_record()
    doc = c.run()
    d = doc["decision"]
    assert doc["status"] == "done" and d["verdict"] == "promote", d
    base_env = c.base.env
    best = max(truth({**base_env, **cand}, MIX) for cand in space.grid(c.space.knobs))
    got = truth({**base_env, **d["knobs"]}, MIX)
    assert math.expm1(best - got) <= 0.02, (d, best, got)
    assert got > truth(base_env, MIX)
    # the winner is a profile file that extends the base with only the chosen knobs
    text = (tmp_path / "seed-best.yaml").read_text()
    assert "extends: ctas512" in text and all(f"{k}: {v}" in text for k, v in d["knobs"].items())
    # the record says what each stage kept and dropped, and is what was returned
    rec = json.loads((tmp_path / "record.json").read_text())
    assert rec["kind"] == "tune" and rec["decision"] == d
    m = rec["stages"]["model"]
    assert m["candidates"] == 15 and m["dropped"] == 15 - len(m["kept"])
    assert rec["stages"]["kernel"]["skipped"] == "no GPU host in the lab"
    assert stages.calls[-2:] == ["restore", "canary"]


@pytest.mark.parametrize(("weights", "may_promote"), [(MIX, False), ({96: 1.0}, True)])
def test_the_seeds_own_case_768_is_not_promoted_under_the_mix(
    tmp_path: Path, weights: dict[int, float], may_promote: bool
) -> None:
    """Current 512, candidate 768 (BLOCK_H 32): under the seed's mix 768 is -0.8% (never promoted); at C96 alone
    it is +2.2% and may be."""
    traffic = "{" + ", ".join(f"{c}: {w}" for c, w in weights.items()) + "}"
    text = (
        SEED_SPACE.replace("[256, 384, 512, 640, 768]", "[512, 768]")
        .replace("[16, 32, 64]", "[32]")
        .replace("{48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}", traffic)
    )
    promoted = 0
    for seed in range(20):
        c, _ = campaign(tmp_path, text, seed=seed)
        c.new_record()
        doc = c.run()
        assert [r["knobs"] for r in doc["stages"]["engine"]["results"]] == [
            {"SGLANG_SM120_MMA_TARGET_CTAS": 768, "SGLANG_SM120_MMA_BLOCK_H": 32}
        ]
        promoted += doc["decision"]["verdict"] == "promote"
        (tmp_path / "seed-best.yaml").unlink(missing_ok=True)
    if not may_promote:
        assert promoted == 0
    else:
        assert promoted >= 1  # not a requirement of the rule, a check that the case is reachable


def test_a_candidate_that_crashes_is_out_with_its_reason_and_the_next_one_decides(tmp_path: Path) -> None:
    c, _ = campaign(tmp_path, scale={"seed-c8": 0.0})
    c.new_record()
    doc = c.run()
    results = {r["name"]: r for r in doc["stages"]["engine"]["results"]}
    assert "engine exited at start" in results["seed-c8"]["out"]
    assert doc["decision"]["candidate"] != 8


def test_a_space_where_nothing_beats_the_current_profile_keeps_it_and_takes_nothing_live(tmp_path: Path) -> None:
    text = SEED_SPACE.replace("[256, 384, 512, 640, 768]", "[256, 384]").replace("[16, 32, 64]", "[16]")
    c, stages = campaign(tmp_path, text)
    c.new_record()
    doc = c.run()
    assert doc["decision"]["verdict"] == "keep" and doc["decision"]["profile"] == c.base.ref
    assert "canary" not in stages.calls and not (tmp_path / "seed-best.yaml").exists()


def test_the_host_budget_bounds_the_rounds_and_skips_what_it_cannot_pay_for(tmp_path: Path) -> None:
    text = SEED_SPACE.replace("host_minutes: 60", "host_minutes: 4").replace(
        "{host: lab1, keep: 3}", "{host: lab1, keep: 3, round: 60s}"
    )
    c, _ = campaign(tmp_path, text)
    c.clock = iter(range(0, 100_000, 70)).__next__  # every step "takes" 70 s
    c.new_record()
    doc = c.run()
    results = doc["stages"]["engine"]["results"]
    assert any("budget:" in (r.get("skipped") or "") for r in results), results
    assert doc["used"]["host_s"] <= 4 * 60 + 70
    by = doc["used_by_stage"]  # what each stage used, as the budget lines print it
    assert set(by) == {"model", "kernel", "engine", "live"} and by["engine"] + by["live"] == doc["used"]["host_s"]


STEPS = ["model:", "ab seed-c8", "ab seed-c11", "restore", "canary"]


@pytest.mark.parametrize("at", STEPS)
def test_an_interrupted_campaign_resumes_to_the_same_decision_with_the_engine_host_restored(
    tmp_path: Path, at: str
) -> None:
    (tmp_path / "ref").mkdir()
    ref, _ = campaign(tmp_path / "ref")
    ref.new_record()
    want = ref.run()["decision"]

    c, stages = campaign(tmp_path)
    fired: list[str] = []

    def interrupt(what: str) -> None:
        if what.startswith(at) and not fired:
            fired.append(what)
            raise KeyboardInterrupt

    stages.on_call = interrupt
    c.on_step = interrupt
    c.new_record()
    with pytest.raises(KeyboardInterrupt):
        c.run()
    rec = json.loads((tmp_path / "record.json").read_text())
    assert rec["status"] == "interrupted" and fired
    if at.startswith("ab "):
        assert stages.calls[-1] == "restore" and stages.current == c.base.name  # the host is back on the base
    done_before = [r["name"] for r in rec["stages"].get("engine", {}).get("results", [])]
    again, stages2 = campaign(tmp_path)
    again.load(rec)
    doc = again.run()
    assert doc["status"] == "done" and doc["decision"] == want
    assert not [n for n in done_before if f"ab {n}" in stages2.calls], (done_before, stages2.calls)  # never twice


def test_a_changed_space_file_is_refused_on_resume_with_both_hashes(tmp_path: Path) -> None:
    c, _ = campaign(tmp_path)
    c.new_record()
    c.save()
    rec = json.loads((tmp_path / "record.json").read_text())
    changed, _ = campaign(tmp_path, SEED_SPACE.replace("keep: 3", "keep: 2"))
    with pytest.raises(run.TuneError) as err:
        changed.load(rec)
    msg = str(err.value)
    assert rec["space"]["sha256"] in msg and changed.space.sha256 in msg and "space.yaml" in msg


def test_the_winners_file_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "seed-best.yaml").write_text("# mine\n")
    c, _ = campaign(tmp_path)
    c.new_record()
    with pytest.raises(run.TuneError, match="exists with other content"):
        c.run()
    assert (tmp_path / "seed-best.yaml").read_text() == "# mine\n"
    assert json.loads((tmp_path / "record.json").read_text())["status"] == "failed"


def test_the_winners_file_says_what_it_is(tmp_path: Path) -> None:
    c, _ = campaign(tmp_path)
    c.new_record()
    doc = c.run()
    knobs = doc["decision"]["knobs"]
    assert (tmp_path / "seed-best.yaml").read_text() == (
        "# Written by `knobfleet tune space.yaml`: the campaign's winner over ctas512@2.\n"
        "# Commit it with the lock (`knobfleet profiles lock`) to keep what was shipped.\n"
        "schema_version: 1\nname: seed-best\nversion: 1\nextends: ctas512\n"
        "description: chosen by tune seed over ctas512.\nenv:\n" + "".join(f"  {k}: {v}\n" for k, v in knobs.items())
    )
    live = doc["stages"]["live"]
    assert live["done"] and live["canary"]["verdict"] == "promote" and live["profile_file"].endswith("seed-best.yaml")
    assert doc["decision"]["profile"] == "seed-best@1" and doc["decision"]["candidate"] == 8


def test_a_candidate_whose_outputs_diverge_is_out_even_if_faster(tmp_path: Path) -> None:
    c, _ = campaign(tmp_path, inconsistent={"seed-c8"})
    c.new_record()
    doc = c.run()
    c8 = next(r for r in doc["stages"]["engine"]["results"] if r["name"] == "seed-c8")
    assert c8["out"] == "failed the output-consistency check" and c8["ab"]["verdict"] == "keep"
    assert doc["decision"].get("candidate") != 8


KERNEL_SPACE = SEED_SPACE.replace('{skip: "no GPU host in the lab"}', "{host: gpu1, keep: 2}").replace(
    "host_minutes: 60}", "host_minutes: 60, gpu_minutes: 5}"
)


def test_the_kernel_stage_measures_the_survivors_and_the_current_profile(tmp_path: Path) -> None:
    c, stages = campaign(tmp_path, KERNEL_SPACE)
    c.new_record()
    doc = c.run()
    k = doc["stages"]["kernel"]
    model_kept = doc["stages"]["model"]["kept"]
    assert k["source"] == "gpu1"
    ctas, bh, batches = stages.kernel_asked
    assert 512 in ctas and 32 in bh and batches == [48, 64, 80, 96]  # the current profile's cells too
    assert k["points"] == len(ctas) * len(bh) * 4
    assert sorted(r["index"] for r in k["rows"]) == sorted(model_kept) and len(k["kept"]) == 2
    assert [r["index"] for r in doc["stages"]["engine"]["results"]] == k["kept"]


def test_a_resumed_campaign_does_not_measure_the_kernel_again(tmp_path: Path) -> None:
    c, stages = campaign(tmp_path, KERNEL_SPACE)

    def stop(what: str) -> None:
        if what.startswith("ab "):
            raise KeyboardInterrupt

    stages.on_call = stop
    c.new_record()
    with pytest.raises(KeyboardInterrupt):
        c.run()
    rec = json.loads((tmp_path / "record.json").read_text())
    again, stages2 = campaign(tmp_path, KERNEL_SPACE)
    again.load(rec)
    again.run()
    assert "kernel" not in stages2.calls and stages.calls.count("kernel") == 1


def test_live_traffic_is_measured_once_and_weights_the_ab(tmp_path: Path) -> None:
    text = SEED_SPACE.replace("traffic: {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}", "traffic: live")
    c, stages = campaign(tmp_path, text, live={96: 1.0})
    seen: list[dict[int, float]] = []
    real_ab = stages.ab
    stages.ab = lambda base, cand, rounds, weights, left=None: (  # type: ignore[method-assign]
        seen.append(weights),
        real_ab(base, cand, rounds, weights, left),
    )[1]
    c.new_record()
    doc = c.run()
    assert stages.calls.count("live_weights") == 1 and doc["weights"] == {"96": 1.0}
    assert seen and all(w == {96: 1.0} for w in seen)


def test_a_live_stage_that_fails_keeps_the_engine_stages_decision_in_the_record(tmp_path: Path) -> None:
    """Issue 58: a failure after the engine stage leaves the record `failed` with the engine stage's winner as its
    decision, so applying it or --resume needs no rerun of the model and engine stages."""
    from knobfleet.errors import KnobfleetError

    c, stages = campaign(tmp_path)

    def broken(_winner: Any) -> dict[str, Any]:
        raise KnobfleetError("canary: lab1 is behind no router (knob_router_url)")

    stages.canary = broken  # type: ignore[method-assign]
    c.new_record()
    with pytest.raises(KnobfleetError):
        c.run()
    rec = json.loads((tmp_path / "record.json").read_text())
    assert rec["status"] == "failed" and rec["stages"]["engine"]["done"]
    d = rec["decision"]
    assert d["verdict"] == "engine" and d["candidate"] == rec["stages"]["engine"]["winner"] and d["knobs"]
    assert d["profile"] == c.space.result and "behind no router" in d["reason"] and "--resume" in d["reason"]


def test_the_restarts_the_ab_stages_cost_are_added_up_in_the_record(tmp_path: Path) -> None:
    """``used.restart_s`` is the sum of each A/B's measured restarts (it once stayed 0.0: the ledger added to was a
    copy read from the record, never written back)."""
    c, _ = campaign(tmp_path, restart_s=12.0)
    c.new_record()
    doc = c.run()
    spent = [r["ab"]["spent"] for r in doc["stages"]["engine"]["results"] if "ab" in r]
    assert spent and all(s["restart_s"] == 12.0 * s["restarts"] for s in spent)
    assert doc["used"]["restart_s"] == round(sum(s["restart_s"] for s in spent), 1) > 0
    assert json.loads((tmp_path / "record.json").read_text())["used"]["restart_s"] == doc["used"]["restart_s"]
