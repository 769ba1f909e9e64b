"""The campaign's decisions (pure): candidates from the grid, the model stage's pruning, the kernel stage's
ranking from measured rows, the engine stage's pick from A/B documents, and the budget ledger.

Every function takes data and returns data; ``tune/run.py`` does the I/O (hosts, GPU, Prometheus, the record).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from knobfleet import waves
from knobfleet.errors import KnobfleetError
from knobfleet.tune.space import KERNEL_KNOBS, Space, grid

# What the kernel stage reads of one `kernel bench` row: the cell's sizes (whole numbers 1..10^9, the sweep
# files' bound in kernel/fit.py) and its median call. Anything else in a row is the bench's own.
ROW_SIZES = ("batch", "target_ctas", "block_h", "heads", "context")
ROW_TIMING = "total_us"


class SweepRowError(KnobfleetError):
    """A measured row the kernel stage cannot rank by (a stored sweep's or a bench's): one line naming where,
    the row's field and the fix."""


def json_kind(value: Any) -> str:
    """A value read from JSON, for a message: short, one line, never a container's (or a long text's) contents."""
    if isinstance(value, dict | list):
        return "a JSON " + ("object" if isinstance(value, dict) else "list")
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def row_problem(row: Any) -> tuple[str, str] | None:
    """The first field of one `kernel bench` row the ranking cannot use, with why; None when the row is usable:
    every size a whole number 1..10^9, ``total_us`` a finite number above 0 (a NaN, an infinity or a 0 would
    rank a candidate by nothing)."""
    if not isinstance(row, dict):
        return "", f"is {json_kind(row)}, not a row object"
    for name in (*ROW_SIZES, ROW_TIMING):
        if name not in row:
            return name, "is missing"
        v = row[name]
        if name == ROW_TIMING:
            if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v > 0):
                return name, f"is {json_kind(v)}: a timing must be a finite number above 0"
        elif isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 10**9:
            return name, f"is {json_kind(v)}: it must be a whole number between 1 and 10^9"
    return None


@dataclass(frozen=True)
class Scored:
    index: int  # the candidate's place in the grid: its name and its identity across a resume
    knobs: dict[str, Any]
    cost: float  # the model's weighted cost per request (lower is better)
    relative: float  # cost / best cost - 1
    kept: bool
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "knobs": self.knobs,
            "cost": self.cost,
            "relative": self.relative,
            "kept": self.kept,
            "reason": self.reason,
        }


def candidate_name(space: Space, index: int) -> str:
    return f"{space.name}-c{index}"


def kernel_knobs(env: dict[str, Any]) -> waves.KernelKnobs:
    return waves.KernelKnobs.from_env({k: v for k, v in env.items() if k in KERNEL_KNOBS})


def model_cost(
    knobs: waves.KernelKnobs,
    weights: dict[int, float],
    sms: int,
    heads: int,
    context: int,
    calibration: waves.Calibration | None,
) -> float:
    """Traffic-weighted attention + combine per request: what ``waves --suggest`` ranks by."""
    total = sum(weights.values())
    return sum(
        w / total * waves.step_cost(b, knobs, sms, heads, context, calibration) / b for b, w in weights.items() if w
    )


def model_stage(
    space: Space,
    base_env: dict[str, Any],
    weights: dict[int, float],
    sms: int,
    calibration: waves.Calibration | None,
) -> tuple[list[Scored], float]:
    """Score every candidate; keep at most ``keep`` within ``margin`` of the best prediction (never the current
    profile's own knobs). Returns the rows (every candidate, with why it was dropped) and the incumbent's cost.
    A space without kernel knobs has nothing the model can tell apart: every candidate ties, the first ``keep``
    in the file's order go on."""
    m = space.model
    current = model_cost(kernel_knobs(base_env), weights, sms, m.heads, m.context, calibration)
    rows: list[tuple[int, dict[str, Any], float]] = []
    for i, cand in enumerate(grid(space.knobs)):
        env = {**base_env, **cand}
        rows.append((i, cand, model_cost(kernel_knobs(env), weights, sms, m.heads, m.context, calibration)))
    same = {i for i, cand, _ in rows if all(base_env.get(k) == v for k, v in cand.items())}
    contenders = [r for r in rows if r[0] not in same]
    best = min((c for _, _, c in contenders), default=current)
    ranked = sorted(contenders, key=lambda r: (round(r[2], 12), r[0]))
    kept_ids = [i for i, _, c in ranked if c <= best * (1 + m.margin) + 1e-15][: m.keep]
    out = []
    for i, cand, cost in rows:
        rel = cost / best - 1 if best > 0 else 0.0
        if i in same:
            reason = "the current profile's own values (the baseline every candidate is compared with)"
        elif i in kept_ids:
            reason = f"kept: rank {kept_ids.index(i) + 1}, predicted {rel:+.1%} against the best prediction"
        elif cost > best * (1 + m.margin) + 1e-15:
            reason = f"predicted {rel:+.1%} against the best, beyond the {m.margin:.0%} margin"
        else:
            reason = f"within the margin ({rel:+.1%}) but past the {m.keep} kept"
        out.append(Scored(i, cand, cost, rel, i in kept_ids, reason))
    return out, current


def kernel_rank(
    kept: list[Scored],
    base_env: dict[str, Any],
    rows: list[dict[str, Any]],
    weights: dict[int, float],
    heads: int,
    context: int,
    keep: int,
) -> list[dict[str, Any]]:
    """Rank the model's survivors by measured traffic-weighted µs per request from ``kernel bench`` rows (the
    fastest measurement of each cell). A candidate the sweep does not cover at every bucket is kept after the
    measured ones, marked unmeasured (its model rank orders it); the first ``keep`` go on."""
    cells: dict[tuple[int, int, int], float] = {}
    for i, r in enumerate(rows):
        if isinstance(r, dict) and (r.get("heads", 0) != heads or r.get("context", 0) != context):
            continue  # another shape's cell
        problem = row_problem(r)
        if problem is not None:
            field, why = problem
            raise SweepRowError(
                f"kernel stage: measured rows[{i}]{'.' + field if field else ''} {why}; re-run `kernel bench`, or "
                "point stages.kernel.sweep at a sweep it wrote"
            )
        key = (r["batch"], r["target_ctas"], r["block_h"])
        us = float(r["total_us"])  # the cell's median call (total_us_min is its best: optimistic)
        cells[key] = min(cells.get(key, us), us)

    def measured(env: dict[str, Any]) -> float | None:
        k = kernel_knobs(env)
        total, out = sum(weights.values()), 0.0
        for b, w in weights.items():
            if not w:
                continue
            us = cells.get((b, k.target_ctas, k.block_h))
            if us is None:
                return None
            out += w / total * us / b
        return out

    current = measured(base_env)
    ranked: list[tuple[int, float, int, Scored, float | None]] = []
    for s in kept:
        got = measured({**base_env, **s.knobs})
        ranked.append((0 if got is not None else 1, got if got is not None else s.cost, s.index, s, got))
    ranked.sort(key=lambda t: (t[0], t[1], t[2]))
    out = []
    for n, (_, _, _, s, per_req) in enumerate(ranked):
        rel = None if per_req is None or current is None else per_req / current - 1
        if n < keep:
            why = "kept" if per_req is not None else "kept, unmeasured (not in the sweep at every bucket)"
        else:
            why = f"dropped: rank {n + 1}, past the {keep} kept"
        out.append(
            {
                "index": s.index,
                "knobs": s.knobs,
                "us_per_req": per_req,
                "vs_current": rel,
                "kept": n < keep,
                "reason": why,
            }
        )
    return out


def ab_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """What the record keeps of one A/B: verdict, reason, rounds, weighted gain, per-bucket classes."""
    return {
        "verdict": doc.get("verdict"),
        "reason": doc.get("reason"),
        "rounds": doc.get("rounds"),
        "weighted_gain": doc.get("weighted_gain"),
        "buckets": [
            {k: b.get(k) for k in ("concurrency", "ratio", "low", "high", "class")} for b in doc.get("buckets") or []
        ],
        "consistency": doc.get("consistency"),
        "wall_s": doc.get("wall_s"),
        **({"spent": doc["spent"]} if isinstance(doc.get("spent"), dict) else {}),
    }


def round_estimate(space: Space, results: list[dict[str, Any]]) -> tuple[float, str]:
    """What one AB/BA round costs on the engine host: the longest round an earlier A/B of this campaign measured
    there (two applies with their restarts, two benches), never less than the space's declared ``round``; the
    declared one until an A/B has run. (seconds, where the figure comes from)"""
    measured = [
        float(x)
        for r in results
        for x in (((r.get("ab") or {}).get("spent") or {}).get("round_s") or [])
        if isinstance(x, int | float)
    ]
    declared = space.engine.round_s
    if not measured:
        return declared, f"declared round {declared:g}s (no round measured on this host yet)"
    longest = max(measured)
    if longest <= declared:
        return declared, f"declared round {declared:g}s (measured rounds took up to {longest:.0f}s)"
    return longest, f"measured: a round took up to {longest:.0f}s here (declared {declared:g}s)"


def engine_pick(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The winner of the engine stage: among the candidates the sequential rule promoted over the current
    profile, the one with the highest lower bound of its weighted gain (then the estimate). None when no candidate
    was promoted: the campaign keeps the current profile."""
    promoted = [r for r in results if (r.get("ab") or {}).get("verdict") == "promote"]
    if not promoted:
        return None

    def key(r: dict[str, Any]) -> tuple[float, float, int]:
        g = r["ab"].get("weighted_gain") or {}
        low = g.get("low")
        est = g.get("estimate")
        return (
            low if isinstance(low, int | float) and math.isfinite(low) else -math.inf,
            est if isinstance(est, int | float) and math.isfinite(est) else -math.inf,
            -int(r["index"]),
        )

    return max(promoted, key=key)


@dataclass
class Ledger:
    """Budget used so far, by kind (seconds)."""

    wall_s: float = 0.0
    host_s: float = 0.0
    gpu_s: float = 0.0
    restart_s: float = 0.0  # of host_s: the engine's restarts (stop + start to ready, measured by knob_ready)

    def as_json(self) -> dict[str, float]:
        return {
            "wall_s": round(self.wall_s, 1),
            "host_s": round(self.host_s, 1),
            "gpu_s": round(self.gpu_s, 1),
            "restart_s": round(self.restart_s, 1),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any] | None) -> Ledger:
        doc = doc or {}
        return cls(
            float(doc.get("wall_s", 0)),
            float(doc.get("host_s", 0)),
            float(doc.get("gpu_s", 0)),
            float(doc.get("restart_s", 0)),
        )


def budget_left(space: Space, used: Ledger) -> float:
    """Seconds the host budget (and the wall budget) has left."""
    return max(0.0, min(space.budget.host_s - used.host_s, space.budget.wall_s - used.wall_s))


def rounds_affordable(space: Space, used: Ledger, round_s: float | None = None) -> int:
    """How many AB/BA rounds the host budget (and the wall budget) still pays for, at ``round_s`` a round (the
    measured round time, ``round_estimate``; default the space's declared round)."""
    return max(0, int(budget_left(space, used) // (round_s or space.engine.round_s)))
