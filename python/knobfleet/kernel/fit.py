"""Fit the wave planner's GPU terms from a kernel bench sweep, and score planners against it (pure, stdlib).

A sweep (``kernel_bench.py``'s JSON) times the split kernel alone (``attn_us``) and split + combine
(``total_us``) for every (B, H, L, BLOCK_H, TARGET_CTAS) point. The fit, per BLOCK_H:

* ``resident`` (CTAs per SM in a wave, 1..4) and ``partial`` (how much a part-full last wave saves, 0..1) by
  grid search;
* for each such pair, ``fixed_us`` and ``per_token_us`` by least squares on the relative error of
  ``attn_us`` (closed form, two unknowns, both kept >= 0).

The combine pass is fitted separately on ``combine_us`` = total − attn: ``fixed + per_unit * B * H * nsplit``.

A planner is scored per (B, H, L, BLOCK_H) cell: its TARGET_CTAS pick among the grid's values is compared
with the measured best (``loss`` = measured time of the pick / best − 1); ``within`` is the share of cells
with loss <= 2%.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from knobfleet import safefile, waves

RESIDENT = (1, 2, 3, 4)
PARTIAL_STEPS = 50
WITHIN = 0.02

Cell = tuple[int, int, int, int]  # (batch, heads, context, block_h)


@dataclass(frozen=True)
class Sample:
    batch: int
    heads: int
    context: int
    block_h: int
    target_ctas: int
    nsplit: int
    ctas: int
    attn_us: float
    combine_us: float
    total_us: float

    @property
    def cell(self) -> Cell:
        return (self.batch, self.heads, self.context, self.block_h)

    @property
    def launch(self) -> tuple[int, int, int, int, int]:
        """Points sharing this are the same kernel launch (timed once)."""
        return (self.batch, self.heads, self.context, self.block_h, self.nsplit)


@dataclass(frozen=True)
class Sweep:
    path: str
    gpu: dict[str, Any]
    kernels: list[dict[str, Any]]
    settings: dict[str, Any]
    samples: list[Sample]

    @property
    def fingerprint(self) -> str:
        return waves.fingerprint(str(self.gpu["name"]), str(self.gpu["cc"]), int(self.gpu["sms"]))

    @property
    def sms(self) -> int:
        return int(self.gpu["sms"])


class SweepError(ValueError):
    pass


def parse_sweep(data: dict[str, Any], path: str = "<sweep>") -> Sweep:
    """A kernel bench result → Sweep. Raises SweepError for a skipped, failed or malformed result."""
    if not isinstance(data, dict):
        raise SweepError(f"{path}: not a kernel bench result (a JSON {type(data).__name__}, not an object)")
    if data.get("skipped"):
        raise SweepError(f"{path}: the bench was skipped ({data.get('reason', 'no reason given')}); nothing to fit")
    check = data.get("check") or {}
    if not isinstance(check, dict) or not check.get("ok"):
        raise SweepError(f"{path}: the kernel failed its correctness check; its timings are not used")
    try:
        gpu = dict(data["gpu"])
        missing = [key for key in ("name", "cc", "sms") if key not in gpu]
        if missing:
            raise KeyError(f"gpu.{missing[0]}")
        samples = [
            Sample(
                int(r["batch"]),
                int(r["heads"]),
                int(r["context"]),
                int(r["block_h"]),
                int(r["target_ctas"]),
                int(r["nsplit"]),
                int(r["ctas"]),
                float(r["attn_us"]),
                float(r["combine_us"]),
                float(r["total_us"]),
            )
            for r in data["results"]
        ]
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise SweepError(f"{path}: not a kernel bench result ({str(exc)[:120]!r})") from None
    if not samples:
        raise SweepError(f"{path}: no timings in this result")
    _check_gpu_name(path, gpu["name"])
    for i, s in enumerate(samples):
        bad = next((f for f in ("attn_us", "combine_us", "total_us")
                    if not (math.isfinite(getattr(s, f)) and getattr(s, f) >= 0)), None)  # fmt: skip
        if bad is None and s.total_us == 0:
            bad = "total_us"
        if bad is not None:
            raise SweepError(
                f"{path}: results[{i}].{bad} is {getattr(s, bad)!r}: a timing must be a finite number above 0; "
                "re-run the sweep (a NaN or 0 would store a calibration of nothing)"
            )
        low = next((f for f in ("batch", "heads", "context", "block_h", "target_ctas", "nsplit", "ctas")
                    if not 0 < getattr(s, f) <= 10**9), None)  # fmt: skip
        if low is not None:
            raise SweepError(f"{path}: results[{i}].{low} is {getattr(s, low)}: it must be between 1 and 10^9")
    return Sweep(path, gpu, list(data.get("kernels") or []), dict(data.get("settings") or {}), samples)


def load_sweep(path: Path) -> Sweep:
    try:
        data = safefile.loads_json(safefile.read_text(path, 64 * safefile.MIB, "sweep file"), "sweep file")
    except safefile.FileRefused as exc:
        raise SweepError(f"{path}: {exc}") from None
    return parse_sweep(data, str(path))


def merge(sweeps: list[Sweep]) -> list[Sample]:
    """One sample per point: the median of repeated sweeps of the same GPU (fingerprints must agree)."""
    if not sweeps:
        raise SweepError("no sweep given")
    prints = {s.fingerprint for s in sweeps}
    if len(prints) > 1:
        raise SweepError(f"sweeps of different GPUs: {', '.join(sorted(prints))}; calibrate one GPU at a time")
    by_point: dict[tuple[int, ...], list[Sample]] = defaultdict(list)
    for sw in sweeps:
        for s in sw.samples:
            by_point[(*s.cell, s.target_ctas)].append(s)
    out = []
    for group in by_point.values():
        first = group[0]
        out.append(
            Sample(
                first.batch,
                first.heads,
                first.context,
                first.block_h,
                first.target_ctas,
                first.nsplit,
                first.ctas,
                statistics.median(s.attn_us for s in group),
                statistics.median(s.combine_us for s in group),
                statistics.median(s.total_us for s in group),
            )
        )
    return sorted(out, key=lambda s: (*s.cell, s.target_ctas))


# --- holdout -----------------------------------------------------------------------------------------------

HOLDOUTS = "alt-batch (default), none, H=<heads>, L=<context>, B>=<batch>, random[:FRACTION[:SEED]]"


def held_out(samples: list[Sample], holdout: str) -> Callable[[Sample], bool]:
    """A predicate: is this sample in the held-out (test) part? Whole (B, H, L) cells are held out together."""
    spec = holdout.strip()
    if spec == "none":
        return lambda s: False
    if spec == "alt-batch":
        batches = sorted({s.batch for s in samples})
        test = set(batches[1::2])
        return lambda s: s.batch in test
    if spec.startswith(("H=", "L=", "B>=")):
        name, _, value = spec.partition("=")
        try:
            n = int(value)
        except ValueError:
            raise ValueError(f"--holdout {holdout!r}: expected {HOLDOUTS}") from None
        if name == "H":
            return lambda s: s.heads == n
        if name == "L":
            return lambda s: s.context == n
        return lambda s: s.batch >= n
    if spec.startswith("random"):
        parts = spec.split(":")
        try:
            frac = float(parts[1]) if len(parts) > 1 else 0.3
            seed = int(parts[2]) if len(parts) > 2 else 0
        except ValueError:
            raise ValueError(f"--holdout {holdout!r}: expected {HOLDOUTS}") from None
        if not 0 < frac < 1:
            raise ValueError(f"--holdout {holdout!r}: the fraction must be between 0 and 1")
        cells = sorted({(s.batch, s.heads, s.context) for s in samples})
        rng = random.Random(seed)
        test_cells = set(rng.sample(cells, max(1, round(frac * len(cells)))))
        return lambda s: (s.batch, s.heads, s.context) in test_cells
    raise ValueError(f"--holdout {holdout!r}: expected {HOLDOUTS}")


def split(samples: list[Sample], holdout: str) -> tuple[list[Sample], list[Sample]]:
    test = held_out(samples, holdout)
    train = [s for s in samples if not test(s)]
    tested = [s for s in samples if test(s)]
    if not train:
        raise ValueError(f"--holdout {holdout!r} leaves nothing to fit on")
    return train, tested


# --- fit ---------------------------------------------------------------------------------------------------


def _wave_units(ctas: int, sms: int, resident: int, partial: float) -> float:
    return waves.attention_us(ctas, 1, 1, sms, waves.BlockTerms(resident, 1.0, 0.0, partial))


def _lsq_rel(xs: list[tuple[float, float]], ys: list[float]) -> tuple[float, float, float]:
    """Minimise sum(((c0*x0 + c1*x1) / y - 1)^2) with c0, c1 >= 0. Returns (c0, c1, rms relative error)."""
    s00 = s01 = s11 = b0 = b1 = 0.0
    for (x0, x1), y in zip(xs, ys, strict=True):
        u0, u1 = x0 / y, x1 / y
        s00 += u0 * u0
        s01 += u0 * u1
        s11 += u1 * u1
        b0 += u0
        b1 += u1
    det = s00 * s11 - s01 * s01
    candidates: list[tuple[float, float]] = []
    if abs(det) > 1e-18:
        c0, c1 = (b0 * s11 - b1 * s01) / det, (b1 * s00 - b0 * s01) / det
        if c0 >= 0 and c1 >= 0:
            candidates.append((c0, c1))
    if s00 > 0:
        candidates.append((max(b0 / s00, 0.0), 0.0))
    if s11 > 0:
        candidates.append((0.0, max(b1 / s11, 0.0)))
    best = (0.0, 0.0, math.inf)
    n = len(ys)
    for c0, c1 in candidates:
        sse = sum(((c0 * x0 + c1 * x1) / y - 1) ** 2 for (x0, x1), y in zip(xs, ys, strict=True))
        rms = math.sqrt(sse / n)
        if rms < best[2]:
            best = (c0, c1, rms)
    return best


@dataclass(frozen=True)
class BlockFit:
    block_h: int
    terms: waves.BlockTerms
    rms_rel: float
    n: int


def fit_block(samples: list[Sample], sms: int) -> BlockFit:
    """Fit one BLOCK_H's terms on its split-kernel times (one sample per distinct launch)."""
    launches = {s.launch: s for s in samples}
    pts = list(launches.values())
    if len(pts) < 3:
        raise ValueError(f"BLOCK_H {samples[0].block_h}: need at least 3 distinct launches to fit, got {len(pts)}")
    ys = [s.attn_us for s in pts]
    best: tuple[float, waves.BlockTerms] | None = None
    for resident in RESIDENT:
        for step in range(PARTIAL_STEPS + 1):
            partial = step / PARTIAL_STEPS
            xs = []
            for s in pts:
                w = _wave_units(s.ctas, sms, resident, partial)
                xs.append((w, w * s.context / s.nsplit))
            c0, c1, rms = _lsq_rel(xs, ys)
            # (resident r, partial 1) predicts the same as (1, 0) scaled by 1/r: only a clearly better fit
            # earns more residency (RESIDENT ascends), so the fit does not invent co-resident CTAs.
            if best is None or rms < best[0] - 1e-3:
                best = (rms, waves.BlockTerms(resident, round(c0, 4), round(c1, 7), partial))
    assert best is not None
    return BlockFit(pts[0].block_h, best[1], best[0], len(pts))


def fit_combine(samples: list[Sample]) -> tuple[float, float]:
    """(fixed_us, per_unit_us) of the combine pass from samples with nsplit > 1."""
    pts = {(s.batch, s.heads, s.context, s.nsplit): s for s in samples if s.nsplit > 1 and s.combine_us > 0}
    if len(pts) < 2:
        return 0.0, 0.0
    xs = [(1.0, float(s.batch * s.heads * s.nsplit)) for s in pts.values()]
    c0, c1, _ = _lsq_rel(xs, [s.combine_us for s in pts.values()])
    return round(c0, 4), round(c1, 8)


def _check_gpu_name(path: str, name: object) -> None:
    """The device name the sweep recorded is printed by `waves calibrate` and stored as the calibration's name:
    a short text that shows, and nothing shaped like a secret."""
    from knobfleet.module_utils.knob_redact import secret_shape
    from knobfleet.rules import first_invisible, shown

    text = name if isinstance(name, str) else ""
    why = (
        f"must be a text, not {type(name).__name__}" if not isinstance(name, str)
        else "is empty" if not text.strip()
        else f"is {len(text)} characters (at most 128)" if len(text) > 128
        else f"holds an invisible character ({shown(text)})" if first_invisible(text)
        else f"looks like a secret ({secret_shape(text)})" if secret_shape(text)
        else None
    )  # fmt: skip
    if why:
        raise SweepError(
            f"{path}: gpu.name {why}; re-run the sweep on the GPU host, or set gpu.name to the "
            "device's name as nvidia-smi prints it"
        )


def gpu_name_for(device_name: str, sms: int, gpus_file: Path | None = None) -> str:
    """knobfleet's GPU name (gpus.json key) for a device name and SM count, else the device name."""
    path = gpus_file or Path(waves.__file__).with_name("gpus.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    for key, entry in data.items():
        if key.startswith("_"):
            continue
        if str(entry.get("label", "")).lower() == device_name.lower() and int(entry["sms"]) == sms:
            return str(key)
    return device_name


def fit(samples: list[Sample], sweep: Sweep, meta: dict[str, Any] | None = None) -> waves.Calibration:
    by_block: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        by_block[s.block_h].append(s)
    blocks = {bh: fit_block(group, sweep.sms) for bh, group in sorted(by_block.items())}
    flat = [bh for bh, f in blocks.items() if not f.terms.per_token_us > 0]
    if flat:  # every comparison between builds divides by it
        raise SweepError(
            f"{sweep.path}: the fit of BLOCK_H {flat[0]} finds no time per token of context (its "
            "timings do not grow with the context: an outlier launch?); re-run the sweep"
        )
    cfix, cunit = fit_combine(samples)
    info: dict[str, Any] = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "kernel": "knob_kernel split-K MLA decode (Triton), combine pass",
        "device": {k: sweep.gpu.get(k) for k in ("name", "cc", "sms", "driver", "cuda", "torch", "triton")},
        "occupancy_reported": {str(k["block_h"]): k.get("occupancy_ctas_per_sm") for k in sweep.kernels},
        "rms_rel_error": {str(bh): round(f.rms_rel, 4) for bh, f in blocks.items()},
        "fitted_points": len(samples),
        **(meta or {}),
    }
    return waves.Calibration(
        fingerprint=sweep.fingerprint,
        gpu=gpu_name_for(str(sweep.gpu["name"]), sweep.sms),
        sms=sweep.sms,
        blocks={bh: f.terms for bh, f in blocks.items()},
        combine_fixed_us=cfix,
        combine_per_unit_us=cunit,
        meta=info,
    )


# --- scoring -----------------------------------------------------------------------------------------------


@dataclass
class Accuracy:
    cells: int
    within: float  # share of cells whose pick is within WITHIN of the measured best
    mean_loss: float
    worst_loss: float
    median_rank_corr: float  # Spearman, predicted vs measured, within a cell
    picks: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self, with_picks: bool = False) -> dict[str, Any]:
        out = asdict(self)
        if not with_picks:
            out.pop("picks")
        for key in ("within", "mean_loss", "worst_loss", "median_rank_corr"):
            out[key] = round(out[key], 4)
        return out


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    den = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return num / den if den > 0 else 1.0


def cells_of(samples: Iterable[Sample]) -> dict[Cell, list[Sample]]:
    out: dict[Cell, list[Sample]] = defaultdict(list)
    for s in samples:
        out[s.cell].append(s)
    return dict(out)


def predict(s: Sample, sms: int, calibration: waves.Calibration | None) -> float:
    knobs = waves.KernelKnobs(s.target_ctas, s.block_h)
    return waves.step_cost(s.batch, knobs, sms, s.heads, s.context, calibration)


def score(samples: list[Sample], sms: int, calibration: waves.Calibration | None) -> Accuracy:
    """How well the planner (calibrated or not) picks TARGET_CTAS in each (B, H, L, BLOCK_H) cell."""
    losses: list[float] = []
    corrs: list[float] = []
    picks: list[dict[str, Any]] = []
    for cell, group in sorted(cells_of(samples).items()):
        measured = {s.target_ctas: s.total_us for s in group}
        candidates = sorted(measured)
        knobs = waves.KernelKnobs(candidates[0], cell[3])
        pick = waves.best_target_ctas(cell[0], knobs, candidates, sms, cell[1], cell[2], calibration)
        best = min(measured.values())
        loss = measured[pick] / best - 1
        losses.append(loss)
        if len(set(measured.values())) > 1:
            corrs.append(spearman([predict(s, sms, calibration) for s in group], [s.total_us for s in group]))
        picks.append(
            {
                "batch": cell[0],
                "heads": cell[1],
                "context": cell[2],
                "block_h": cell[3],
                "pick": pick,
                "best": min(measured, key=lambda tc: (measured[tc], tc)),
                "loss": round(loss, 4),
            }
        )
    if not losses:
        return Accuracy(0, 0.0, 0.0, 0.0, 0.0, [])
    return Accuracy(
        cells=len(losses),
        within=sum(loss <= WITHIN for loss in losses) / len(losses),
        mean_loss=statistics.fmean(losses),
        worst_loss=max(losses),
        median_rank_corr=statistics.median(corrs) if corrs else 1.0,
        picks=picks,
    )


def time_error(samples: list[Sample], sms: int, calibration: waves.Calibration) -> dict[str, float]:
    """Relative error of predicted total time (attention + combine) against measured, over ``samples``."""
    errs = [abs(predict(s, sms, calibration) / s.total_us - 1) for s in samples]
    if not errs:
        return {"median": 0.0, "p90": 0.0, "max": 0.0}
    errs.sort()
    return {
        "median": round(statistics.median(errs), 4),
        "p90": round(errs[min(len(errs) - 1, int(0.9 * len(errs)))], 4),
        "max": round(errs[-1], 4),
    }
