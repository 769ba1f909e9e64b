"""Split-K wave quantization of the SM120 MMA decode attention kernel (pure; stdlib only).

Shared by the wave planner (``knobfleet waves``) and the stand-in engine, so both use one formula.
For one decode step with batch ``B`` and context ``L`` tokens per request:

    n_hg    = ceil(H / BLOCK_H)                               head groups per request
    nsplit  = clamp(ceil(TARGET_CTAS / (B * n_hg)), 1, NSPLIT_MAX),
              then at most floor(L / MIN_CHUNK) (each split covers >= MIN_CHUNK tokens), at least 1
    CTAs    = B * n_hg * nsplit
    waves   = CTAs / SMs (exact) and ceil(CTAs / SMs); the last wave holds CTAs - (ceil-1) * SMs CTAs

Relative attention cost (the model the stand-in engine runs, in units of "one full-context CTA at
BLOCK_H 32"): waves are whole — a CTA in a 4%-full last wave costs the same wall time as a full wave —
and one CTA's time is proportional to the context slice it covers (L / nsplit) times a per-token
cost made of a KV-load part that does not shrink with the head block plus a compute part that does:

    per_cta = (L / nsplit) / L_REF * (KV_SHARE + (1 - KV_SHARE) * BLOCK_H / 32)
    cost    = ceil(waves) * per_cta

Splitting also costs a combine pass proportional to B * H * nsplit (see ``combine_cost``).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

L_REF = 4096
KV_SHARE = 0.16
COMBINE_UNIT = 0.03  # combine pass at B=96, H=64, nsplit=2, in attention-cost units
DEFAULTS = {
    "SGLANG_SM120_MMA_TARGET_CTAS": 256,
    "SGLANG_SM120_MMA_BLOCK_H": 32,
    "SGLANG_SM120_MMA_NSPLIT_MAX": 16,
    "SGLANG_SM120_MMA_MIN_CHUNK": 32,
}


@dataclass(frozen=True)
class KernelKnobs:
    target_ctas: int = 256
    block_h: int = 32
    nsplit_max: int = 16
    min_chunk: int = 32

    @classmethod
    def from_env(cls, env: dict[str, object]) -> KernelKnobs:
        """Read the four kernel knobs from env-like values; missing ones take the engine defaults."""

        def get(name: str) -> int:
            raw = env.get(name, DEFAULTS[name])
            if isinstance(raw, bool):
                raise ValueError(f"{name}={raw!r}: expected an integer")
            try:
                value = int(str(raw))
            except ValueError:
                raise ValueError(f"{name}={raw!r}: expected an integer") from None
            if value < 1:
                raise ValueError(f"{name}={value}: must be >= 1")
            return value

        return cls(
            target_ctas=get("SGLANG_SM120_MMA_TARGET_CTAS"),
            block_h=get("SGLANG_SM120_MMA_BLOCK_H"),
            nsplit_max=get("SGLANG_SM120_MMA_NSPLIT_MAX"),
            min_chunk=get("SGLANG_SM120_MMA_MIN_CHUNK"),
        )


@dataclass(frozen=True)
class WaveRow:
    batch: int
    n_hg: int
    nsplit: int
    ctas: int
    waves: float
    waves_ceil: int
    last_wave_ctas: int
    last_wave_fill: float
    cost: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def load_gpus(path: Path | None = None) -> dict[str, int]:
    """GPU name → SM count from the data file next to this module."""
    data = json.loads((path or Path(__file__).with_name("gpus.json")).read_text(encoding="utf-8"))
    return {name: int(entry["sms"]) for name, entry in data.items() if not name.startswith("_")}


def nsplit_for(batch: int, knobs: KernelKnobs, heads: int, context: int) -> int:
    n_hg = math.ceil(heads / knobs.block_h)
    wanted = math.ceil(knobs.target_ctas / (batch * n_hg))
    nsplit = min(max(wanted, 1), knobs.nsplit_max)
    return max(1, min(nsplit, context // knobs.min_chunk))


def row(batch: int, knobs: KernelKnobs, sms: int, heads: int = 64, context: int = L_REF) -> WaveRow:
    if batch < 1 or sms < 1 or heads < 1 or context < 1:
        raise ValueError("batch, sms, heads and context must be >= 1")
    n_hg = math.ceil(heads / knobs.block_h)
    nsplit = nsplit_for(batch, knobs, heads, context)
    ctas = batch * n_hg * nsplit
    waves_ceil = math.ceil(ctas / sms)
    last = ctas - (waves_ceil - 1) * sms
    per_cta = (context / nsplit) / L_REF * (KV_SHARE + (1 - KV_SHARE) * knobs.block_h / 32)
    return WaveRow(
        batch=batch,
        n_hg=n_hg,
        nsplit=nsplit,
        ctas=ctas,
        waves=round(ctas / sms, 4),
        waves_ceil=waves_ceil,
        last_wave_ctas=last,
        last_wave_fill=round(last / sms, 4),
        cost=round(waves_ceil * per_cta, 6),
    )


def combine_cost(batch: int, nsplit: int, heads: int = 64) -> float:
    """Relative cost of merging split partial results: zero without split-K."""
    return 0.0 if nsplit <= 1 else COMBINE_UNIT * batch * heads * nsplit / (96 * 64 * 2)


def table(batches: list[int], knobs: KernelKnobs, sms: int, heads: int = 64, context: int = L_REF) -> list[WaveRow]:
    return [row(b, knobs, sms, heads, context) for b in sorted(set(batches))]


def cliffs(rows: list[WaveRow]) -> list[int]:
    """Batch sizes where the attention cost per request rises as the batch grows (a wave cliff)."""
    out = []
    for prev, cur in itertools.pairwise(rows):
        if cur.cost / cur.batch > prev.cost / prev.batch * 1.0001:
            out.append(cur.batch)
    return out


def weighted_cost(
    knobs: KernelKnobs, weights: dict[int, float], sms: int, heads: int = 64, context: int = L_REF
) -> float:
    """Traffic-weighted attention cost per request; lower is better."""
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("weights must sum to more than 0")
    return sum(w / total * row(b, knobs, sms, heads, context).cost / b for b, w in weights.items())
