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

Calibrated model (``Calibration``, fitted by ``knobfleet waves calibrate`` from a kernel bench sweep and
stored in ``calibrations.json`` next to this module, keyed by GPU fingerprint). Per BLOCK_H the GPU holds
``resident`` CTAs per SM, so a wave is ``SMs * resident`` CTAs; a full wave takes

    t_wave  = fixed_us + per_token_us * L / nsplit              (per-CTA fixed cost + its context slice)

and a last wave with at most k < resident CTAs on any SM takes ``t_wave * (1 - partial * (1 - k / resident))``
(co-resident CTAs share the SM, so a half-full wave is cheaper than a full one but not half). Combine:
``combine_fixed_us + combine_per_unit_us * B * H * nsplit`` when nsplit > 1. With a calibration, ``row``'s
``cost`` and ``combine_cost`` are predicted microseconds of one kernel call; without one, the relative units
above. Comparisons (``cliffs``, ``weighted_cost``, ranking TARGET_CTAS) work the same in both.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
    resident: int = 1  # CTAs per SM in one wave (1 without a calibration)
    calibrated: bool = False  # cost in predicted microseconds (True) or relative units (False)
    combine_cost: float = 0.0  # the split-K combine pass (``combine_cost``), in the same units as ``cost``
    step_cost: float = 0.0  # cost + combine_cost: what the planner ranks TARGET_CTAS by (``step_cost``)

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


def row(
    batch: int,
    knobs: KernelKnobs,
    sms: int,
    heads: int = 64,
    context: int = L_REF,
    calibration: Calibration | None = None,
) -> WaveRow:
    if batch < 1 or sms < 1 or heads < 1 or context < 1:
        raise ValueError("batch, sms, heads and context must be >= 1")
    n_hg = math.ceil(heads / knobs.block_h)
    nsplit = nsplit_for(batch, knobs, heads, context)
    ctas = batch * n_hg * nsplit
    terms = calibration.terms(knobs.block_h) if calibration is not None else None
    slots = sms * terms.resident if terms is not None else sms  # CTAs one wave holds
    waves_ceil = math.ceil(ctas / slots)
    last = ctas - (waves_ceil - 1) * slots
    if calibration is not None and terms is not None:  # predicted microseconds
        cost, digits = round(attention_us(ctas, nsplit, context, sms, terms), 4), 4
        combine = combine_cost(batch, nsplit, heads, calibration)
    else:  # relative units
        per_cta = (context / nsplit) / L_REF * (KV_SHARE + (1 - KV_SHARE) * knobs.block_h / 32)
        cost, digits = round(waves_ceil * per_cta, 6), 6
        combine = round(combine_cost(batch, nsplit, heads), 6)
    return WaveRow(
        batch=batch,
        n_hg=n_hg,
        nsplit=nsplit,
        ctas=ctas,
        waves=round(ctas / slots, 4),
        waves_ceil=waves_ceil,
        last_wave_ctas=last,
        last_wave_fill=round(last / slots, 4),
        cost=cost,
        resident=terms.resident if terms is not None else 1,
        calibrated=terms is not None,
        combine_cost=combine,
        step_cost=round(cost + combine, digits),
    )


def combine_cost(batch: int, nsplit: int, heads: int = 64, calibration: Calibration | None = None) -> float:
    """Cost of merging split partial results (relative units, or µs with a calibration): zero without split-K."""
    if nsplit <= 1:
        return 0.0
    if calibration is not None:
        return round(calibration.combine_fixed_us + calibration.combine_per_unit_us * batch * heads * nsplit, 4)
    return COMBINE_UNIT * batch * heads * nsplit / (96 * 64 * 2)


def table(
    batches: list[int],
    knobs: KernelKnobs,
    sms: int,
    heads: int = 64,
    context: int = L_REF,
    calibration: Calibration | None = None,
) -> list[WaveRow]:
    return [row(b, knobs, sms, heads, context, calibration) for b in sorted(set(batches))]


def cliffs(rows: list[WaveRow]) -> list[int]:
    """Batch sizes where the attention cost per request rises as the batch grows (a wave cliff)."""
    out = []
    for prev, cur in itertools.pairwise(rows):
        if cur.cost / cur.batch > prev.cost / prev.batch * 1.0001:
            out.append(cur.batch)
    return out


def weighted_cost(
    knobs: KernelKnobs,
    weights: dict[int, float],
    sms: int,
    heads: int = 64,
    context: int = L_REF,
    calibration: Calibration | None = None,
) -> float:
    """Traffic-weighted attention cost per request; lower is better. With a calibration the combine pass is
    included (its measured share is what a calibration knows); without one, attention only, as before."""
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("weights must sum to more than 0")
    out = 0.0
    for b, w in weights.items():
        r = row(b, knobs, sms, heads, context, calibration)
        extra = combine_cost(b, r.nsplit, heads, calibration) if calibration is not None else 0.0
        out += w / total * (r.cost + extra) / b
    return out


def step_cost(
    batch: int,
    knobs: KernelKnobs,
    sms: int,
    heads: int = 64,
    context: int = L_REF,
    calibration: Calibration | None = None,
) -> float:
    """Attention plus combine for one decode step: what the planner ranks TARGET_CTAS by."""
    r = row(batch, knobs, sms, heads, context, calibration)
    return r.cost + combine_cost(batch, r.nsplit, heads, calibration)


def best_target_ctas(
    batch: int,
    knobs: KernelKnobs,
    candidates: list[int],
    sms: int,
    heads: int = 64,
    context: int = L_REF,
    calibration: Calibration | None = None,
) -> int:
    """The candidate TARGET_CTAS with the lowest ``step_cost`` (ties: the smallest)."""

    def cost(tc: int) -> tuple[float, int]:
        k = KernelKnobs(tc, knobs.block_h, knobs.nsplit_max, knobs.min_chunk)
        return round(step_cost(batch, k, sms, heads, context, calibration), 9), tc

    return min(candidates, key=cost)


# --- calibrated GPU terms ---------------------------------------------------------------------------------

CALIBRATIONS_FILE = "calibrations.json"


@dataclass(frozen=True)
class BlockTerms:
    """The fitted cost of one split-K CTA at one BLOCK_H."""

    resident: int  # CTAs per SM in a wave
    fixed_us: float  # per-CTA fixed cost (launch of the CTA, query load, epilogue)
    per_token_us: float  # per context token of a CTA's slice
    partial: float  # share of a wave's time that shrinks when its SMs hold fewer than ``resident`` CTAs

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True)
class Calibration:
    """GPU terms fitted from a kernel bench sweep (see ``knobfleet.kernel.fit``)."""

    fingerprint: str  # "<device name>|sm<cc>|<SMs>"
    gpu: str  # knobfleet's GPU name (gpus.json key) or the device name
    sms: int
    blocks: dict[int, BlockTerms]
    combine_fixed_us: float
    combine_per_unit_us: float  # per B * H * nsplit
    meta: dict[str, Any]  # where it came from: sweep, date, kernel build, held-out accuracy

    def terms(self, block_h: int) -> BlockTerms:
        """Terms for ``block_h``; an unmeasured BLOCK_H takes the nearest measured one's occupancy and fixed
        cost and a per-token cost scaled linearly between its measured neighbours."""
        if block_h in self.blocks:
            return self.blocks[block_h]
        keys = sorted(self.blocks)
        lo = max((k for k in keys if k < block_h), default=None)
        hi = min((k for k in keys if k > block_h), default=None)
        near = self.blocks[min(keys, key=lambda k: (abs(k - block_h), k))]
        if lo is not None and hi is not None:
            a, b = self.blocks[lo].per_token_us, self.blocks[hi].per_token_us
            per_token = a + (b - a) * (block_h - lo) / (hi - lo)
        else:
            edge = lo if lo is not None else hi
            assert edge is not None
            per_token = self.blocks[edge].per_token_us * block_h / edge
        return BlockTerms(near.resident, near.fixed_us, per_token, near.partial)

    def block_h_factor(self, block_h: int, reference: int = 32) -> float:
        """Time per head and token of context at ``block_h`` relative to ``reference``, full waves, fixed cost
        left out: ``per_token_us / (resident * block_h)`` compared. >1 means that build does the same work slower."""

        def per_head_token(bh: int) -> float:
            t = self.terms(bh)
            return t.per_token_us / (t.resident * bh)

        return per_head_token(block_h) / per_head_token(reference)

    def summary(self) -> str:
        parts = [
            f"BLOCK_H {bh}: {t.resident} CTA/SM, {t.fixed_us:.1f} µs/CTA + {t.per_token_us * 1000:.1f} ns/token"
            for bh, t in sorted(self.blocks.items())
        ]
        return f"calibrated: {self.gpu} ({self.fingerprint}); " + "; ".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "gpu": self.gpu,
            "sms": self.sms,
            "blocks": {str(k): v.as_dict() for k, v in sorted(self.blocks.items())},
            "combine_fixed_us": self.combine_fixed_us,
            "combine_per_unit_us": self.combine_per_unit_us,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibration:
        try:
            blocks = {
                int(k): BlockTerms(
                    int(v["resident"]), float(v["fixed_us"]), float(v["per_token_us"]), float(v["partial"])
                )
                for k, v in data["blocks"].items()
            }
            cal = cls(
                fingerprint=str(data["fingerprint"]),
                gpu=str(data["gpu"]),
                sms=int(data["sms"]),
                blocks=blocks,
                combine_fixed_us=float(data["combine_fixed_us"]),
                combine_per_unit_us=float(data["combine_per_unit_us"]),
                meta=dict(data.get("meta") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"calibration: malformed entry ({exc!r})") from None
        if not blocks or cal.sms < 1 or any(t.resident < 1 for t in blocks.values()):
            raise ValueError(f"calibration {cal.fingerprint}: needs at least one BLOCK_H and sms, resident >= 1")
        return cal


def attention_us(ctas: int, nsplit: int, context: int, sms: int, terms: BlockTerms) -> float:
    """Predicted split kernel time: whole waves of ``sms * resident`` CTAs, a part-full last wave cheaper."""
    slots = sms * terms.resident
    full, rem = divmod(ctas, slots)
    waves_eff = float(full)
    if rem:
        per_sm = math.ceil(rem / sms)
        waves_eff += 1.0 - terms.partial * (1.0 - per_sm / terms.resident)
    return waves_eff * (terms.fixed_us + terms.per_token_us * context / nsplit)


def fingerprint(name: str, cc: str, sms: int) -> str:
    """A GPU's calibration key: device name, compute capability, SM count (``NVIDIA H200|sm90|132``)."""
    return f"{name}|sm{cc.replace('.', '')}|{sms}"


def load_calibrations(path: Path | None = None) -> dict[str, Calibration]:
    """Fingerprint → Calibration from ``calibrations.json`` next to this module (empty when there is none)."""
    file = path or Path(__file__).with_name(CALIBRATIONS_FILE)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return {key: Calibration.from_json(entry) for key, entry in data.items() if not key.startswith("_")}


def calibration_for(gpu: str, path: Path | None = None) -> Calibration | None:
    """The stored calibration for a GPU given as knobfleet's name (``h200``), its device name
    (``NVIDIA H200``) or a fingerprint; None when there is none. The newest entry wins when several match."""
    cals = load_calibrations(path)
    if gpu in cals:
        return cals[gpu]
    want = gpu.strip().lower()
    matches = [c for c in cals.values() if want in (c.gpu.lower(), c.fingerprint.split("|")[0].lower())]
    if not matches:
        return None
    return max(matches, key=lambda c: str(c.meta.get("created", "")))
