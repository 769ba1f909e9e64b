"""Decision quality of `knobfleet tune` by simulation: campaigns on spaces whose best is known.

Each campaign draws a GPU (the SM counts of python/knobfleet/gpus.json), a traffic mix (Dirichlet over the
buckets 48, 64, 80, 96), a current profile (TARGET_CTAS from the grid, BLOCK_H from 16/32/64) and a space of
4-6 TARGET_CTAS values x BLOCK_H {16, 32, 64}. The campaign is the real one (python/knobfleet/tune/run.py with
the real model stage and the real sequential A/B rule); the engine is the stand-in's noise-free model with the
lab's 6.5% run-to-run noise (python/knobfleet/tune/sim.py), so the truth of every candidate is known.

Two scenarios:
- "model right": the model stage scores for the GPU the engine really has;
- "model wrong": it scores for a GPU with 30% fewer SMs (a stale or wrong calibration): it then prunes the wrong
  candidates, and only the A/B stands between that and a bad promotion.

Printed per scenario: campaigns, how many promoted, the rate of promoting a candidate truly worse than the current
profile (target <= 1%), the rate of ending within 2% of the best in the space (the current profile counts when
nothing beats it), and the A/B rounds used. Usage: python perf/tune_quality.py [--campaigns 300] [--seed 11]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from knobfleet import waves
from knobfleet.lab.sim import model
from knobfleet.ops import profiles as app
from knobfleet.tune import run
from knobfleet.tune.sim import SimStages
from knobfleet.tune.space import grid, parse

CTAS = [128, 192, 256, 320, 384, 448, 512, 640, 768, 1024]
BUCKETS = [48, 64, 80, 96]


def space_text(rng: random.Random, weights: dict[int, float], ctas: list[int]) -> str:
    mix = ", ".join(f"{c}: {w:.4f}" for c, w in weights.items())
    return (
        "schema_version: 1\nname: sim\nbase: ctas512\n"
        f"knobs:\n  SGLANG_SM120_MMA_TARGET_CTAS: {ctas}\n  SGLANG_SM120_MMA_BLOCK_H: [16, 32, 64]\n"
        f"traffic: {{{mix}}}\nbudget: {{wall: 2h, host_minutes: 60}}\n"
        "stages:\n  model: {keep: 4, margin: 0.10}\n  kernel: {skip: simulated}\n  engine: {host: sim, keep: 3}\n"
        "  live: {skip: simulated}\n"
    )


def one(seed: int, wrong_model: bool, base_profile: object, folder: Path) -> dict[str, float | bool]:
    rng = random.Random(seed)
    gpus = waves.load_gpus()
    sms = gpus[rng.choice(sorted(gpus))]
    raw = [rng.gammavariate(1.0, 1.0) for _ in BUCKETS]
    weights = {c: r / sum(raw) for c, r in zip(BUCKETS, raw, strict=True)}
    ctas = sorted(rng.sample(CTAS, rng.randint(4, 6)))
    cur_env = {
        **base_profile.env,  # type: ignore[attr-defined]
        "SGLANG_SM120_MMA_TARGET_CTAS": rng.choice(CTAS),
        "SGLANG_SM120_MMA_BLOCK_H": rng.choice([16, 32, 64]),
    }
    base = base_profile.model_copy(update={"env": cur_env, "name": "current"})  # type: ignore[attr-defined]
    text = space_text(rng, weights, ctas)
    sp = parse(__import__("yaml").safe_load(text), folder / "sim.yaml", text)
    stages = SimStages(weights, sms=sms, seed=seed)
    stages.base = base
    model_sms = round(sms * 0.7) if wrong_model else sms
    c = run.Campaign(sp, base, stages, folder / f"{seed}.json", model_sms)
    c.new_record()
    doc = c.run()

    def truth(env: dict[str, object]) -> float:
        k = waves.KernelKnobs(int(str(env["SGLANG_SM120_MMA_TARGET_CTAS"])), int(str(env["SGLANG_SM120_MMA_BLOCK_H"])))
        return model.weighted_log_tok_s(k, weights, sms)

    current = truth(cur_env)
    best = max([current] + [truth({**cur_env, **cand}) for cand in grid(sp.knobs)])
    d = doc["decision"]
    promoted = d["verdict"] == "promote"
    ended = truth({**cur_env, **d["knobs"]}) if promoted else current
    rounds = sum(int((r.get("ab") or {}).get("rounds") or 0) for r in doc["stages"]["engine"]["results"])
    return {
        "promoted": promoted,
        "worse": promoted and ended < current,
        "within2": math.expm1(best - ended) <= 0.02,
        "gain": math.expm1(ended - current),
        "headroom": math.expm1(best - current),
        "rounds": rounds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--campaigns", type=int, default=300)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    base = app.store().resolve("ctas512")
    print(f"tune_quality: {args.campaigns} campaigns per scenario, seed {args.seed}; 6.5% run-to-run noise")
    print("scenario     | promoted | worse than current (<= 1%) | within 2% of best | mean gain | mean rounds")
    with tempfile.TemporaryDirectory() as tmp:
        for wrong in (False, True):
            res = [one(args.seed * 100_000 + i, wrong, base, Path(tmp)) for i in range(args.campaigns)]
            n = len(res)
            promoted = sum(bool(r["promoted"]) for r in res)
            worse = sum(bool(r["worse"]) for r in res)
            within = sum(bool(r["within2"]) for r in res)
            print(
                f"{'model wrong' if wrong else 'model right':12} | {promoted / n:7.1%} | {worse}/{n} = {worse / n:.2%}"
                f"{'':12} | {within / n:16.1%} | {statistics.mean(float(r['gain']) for r in res):+8.2%} | "
                f"{statistics.mean(float(r['rounds']) for r in res):.1f}"
            )
            print(f"{'':12}   mean headroom in the space (best vs current): "
                  f"{statistics.mean(float(r['headroom']) for r in res):+.2%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
