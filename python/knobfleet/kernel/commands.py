"""Bodies of ``knobfleet kernel bench`` and ``knobfleet waves calibrate`` (plain functions for the CLI).

Each returns a JSON-able dict; ``render_*`` turns it into the text the CLI prints; ``add_*_arguments``
declares the options on an argparse parser. ``calibration_line`` is what ``waves`` / ``waves --suggest``
print about the calibration in use.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from knobfleet import argtypes as cli_types
from knobfleet import paths, safefile, waves
from knobfleet.errors import KnobfleetError
from knobfleet.kernel import fit, store
from knobfleet.kernel.grid import BATCHES, BLOCK_H, CONTEXTS, HEADS, TARGET_CTAS, Grid, parse_ints

PLAYBOOK = "kernel.yml"
TASK_RESULT = "Read the kernel bench result"
SLURP = "ansible.builtin.slurp"
TARGET_WITHIN = 0.90
TARGET_MEAN_LOSS = 0.02


class KernelBenchError(KnobfleetError):
    """The kernel bench could not run on the host or returned nothing usable."""


def _ints(text: str) -> tuple[int, ...]:
    try:
        return parse_ints(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``knobfleet kernel bench`` (``-i/--inventory`` is the CLI's common option)."""
    parser.add_argument("--host", required=True, help="inventory host to benchmark (one)")
    parser.add_argument("--batch", type=_ints, default=BATCHES, help="batch sizes, e.g. 8..160:8 (default)")
    parser.add_argument("--ctas", type=_ints, default=TARGET_CTAS, help="TARGET_CTAS values (default 128..1536)")
    parser.add_argument("--block-h", type=_ints, default=BLOCK_H, help="BLOCK_H values (default 16,32,64)")
    parser.add_argument("--heads", type=_ints, default=HEADS, help="head counts (default 64,128)")
    parser.add_argument("--context", type=_ints, default=CONTEXTS, help="context lengths (default 2048,4096)")
    parser.add_argument(
        "--budget",
        type=cli_types.number(1.0, 86400.0),
        default=480.0,
        help="seconds of timing on the host (default 480)",
    )
    parser.add_argument("--python", default=None, help="interpreter on the host that has torch and Triton")
    parser.add_argument("--out", type=cli_types.output_file, default=None, help="write the raw sweep JSON here")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def grid_from_args(args: argparse.Namespace) -> Grid:
    return Grid(
        batches=tuple(args.batch),
        target_ctas=tuple(args.ctas),
        block_h=tuple(args.block_h),
        heads=tuple(args.heads),
        contexts=tuple(args.context),
    )


def kernel_bench(
    inventory: Path,
    host: str,
    grid: Grid | None = None,
    budget_s: float = 480.0,
    out: Path | None = None,
    *,
    python: str | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run roles/knob_kernel on ``host`` and return a summary; the raw sweep goes to ``out`` (default:
    ``<state>/kernel/<run id>-<host>.json``). A host without torch/Triton/GPU is a success with skipped True."""
    from knobfleet.fleet.runner import RunRequest, new_run_id, run_playbook

    if budget_s <= 0:
        raise KnobfleetError(f"--budget {budget_s}: must be > 0")
    run_id = new_run_id()
    grid = grid or Grid()
    trusted: dict[str, Any] = {
        "knob_targets": host,
        "knob_kernel_budget_s": math.ceil(budget_s),
        "knob_kernel_run_id": run_id,
        "knob_kernel_bench_src": str(paths.roles_dir() / "knob_kernel" / "files" / "kernel_bench.py"),
    }
    if python:
        trusted["knob_kernel_python"] = python
    result = run_playbook(
        RunRequest(
            playbook=PLAYBOOK,
            inventory=inventory,
            hosts=(host,),
            trusted_vars=trusted,
            unsafe_vars={"knob_kernel_grid": grid.as_json()},
            forks=1,
            on_event=on_event,
            run_id=run_id,
        )
    )
    hr = result.hosts.get(host)
    if hr is None:
        raise KernelBenchError(f"{host}: not in the inventory (or not reached)")
    res = hr.results.get(SLURP) or hr.results.get(TASK_RESULT) or {}
    if "content" not in res:
        raise KernelBenchError(f"{host}: kernel bench failed: {hr.first_failure()}")
    doc = json.loads(base64.b64decode(res["content"]))
    if not doc.get("skipped"):
        target = out or paths.state_dir() / "kernel" / f"{run_id}-{host}.json"
        safefile.write_text(target, json.dumps(doc, indent=1, sort_keys=True) + "\n")
        out = target
    return summarize_bench(host, doc, out if not doc.get("skipped") else None)


def summarize_bench(host: str, doc: dict[str, Any], out: Path | None) -> dict[str, Any]:
    """The controller's summary of one kernel bench result (also usable on a file read back later)."""
    if doc.get("skipped"):
        return {"host": host, "skipped": True, "reason": str(doc.get("reason") or f"skipped on {host}")}
    gpu = dict(doc.get("gpu") or {})
    check = dict(doc.get("check") or {})
    rows = list(doc.get("results") or [])
    best: dict[tuple[int, int, int, int], tuple[float, int]] = {}
    for r in rows:
        key = (int(r["batch"]), int(r["heads"]), int(r["context"]), int(r["block_h"]))
        cand = (float(r["total_us"]), int(r["target_ctas"]))
        best[key] = min(best.get(key, cand), cand)
    return {
        "host": host,
        "skipped": False,
        "gpu": gpu,
        "fingerprint": waves.fingerprint(str(gpu.get("name")), str(gpu.get("cc")), int(gpu.get("sms") or 0)),
        "check_ok": bool(check.get("ok")),
        "worst_rel_err": check.get("worst_rel_err"),
        "kernels": list(doc.get("kernels") or []),
        "n_points": len(rows),
        "n_launch_configs": doc.get("n_launch_configs"),
        "complete": bool(doc.get("complete")),
        "elapsed_s": doc.get("elapsed_s"),
        "best_ctas": [
            {"batch": k[0], "heads": k[1], "context": k[2], "block_h": k[3], "target_ctas": v[1], "total_us": v[0]}
            for k, v in sorted(best.items())
        ],
        "out": str(out) if out else None,
    }


def render_bench(summary: dict[str, Any]) -> str:
    if summary.get("skipped"):
        return str(summary["reason"])
    gpu = summary["gpu"]
    lines = [
        f"{summary['host']}: {gpu.get('name')} ({gpu.get('sms')} SMs, sm{str(gpu.get('cc', '')).replace('.', '')}, "
        f"driver {gpu.get('driver') or '?'}, torch {gpu.get('torch')}, triton {gpu.get('triton')})",
        f"check: {'ok' if summary['check_ok'] else 'FAILED'} (worst relative error {summary['worst_rel_err']:.2g})",
    ]
    for k in summary["kernels"]:
        lines.append(
            f"kernel BLOCK_H={k['block_h']}: {k['num_warps']} warps, {k['n_regs']} regs, {k['n_spills']} spills, "
            f"{k['shared_bytes']} B shared -> {k['occupancy_ctas_per_sm']} CTAs/SM"
        )
    state = "complete" if summary["complete"] else "cut short by the budget"
    lines.append(
        f"{summary['n_points']} points ({summary['n_launch_configs']} launches) in {summary['elapsed_s']}s, {state}"
    )
    if summary.get("out"):
        lines.append(f"sweep: {summary['out']}  (fit it: knobfleet waves calibrate {summary['out']})")
    return "\n".join(lines)


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``knobfleet waves calibrate SWEEP...``."""
    parser.add_argument(
        "sweeps",
        nargs="+",
        type=cli_types.input_file(cli_types.SWEEP_MAX, "sweep file"),
        help="kernel bench sweep JSON files of one GPU",
    )
    parser.add_argument("--gpu", default=None, help="knobfleet GPU name to store it under (default: from gpus.json)")
    parser.add_argument("--holdout", default="alt-batch", help=f"cells kept out of the fit: {fit.HOLDOUTS}")
    parser.add_argument("--dry-run", action="store_true", help="fit and score, store nothing")
    parser.add_argument(
        "--store", type=cli_types.calibrations_file, default=None, help="calibrations file (default: next to gpus.json)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def calibrate(
    sweep_paths: list[Path],
    gpu: str | None = None,
    holdout: str = "alt-batch",
    *,
    write: bool = True,
    store_path: Path | None = None,
) -> dict[str, Any]:
    """Fit the GPU terms on the sweep minus the held-out cells, score the calibrated and the uncalibrated
    planner on the held-out cells, and store the fitted calibration (the one that was scored)."""
    try:
        sweeps = [fit.load_sweep(p) for p in sweep_paths]
        samples = fit.merge(sweeps)
        train, test = fit.split(samples, holdout)
    except ValueError as exc:
        raise KnobfleetError(f"waves calibrate: {exc}") from None
    sweep = sweeps[0]
    if gpu is not None:
        known = waves.load_gpus()
        if gpu in known and known[gpu] != sweep.sms:
            raise KnobfleetError(f"--gpu {gpu}: gpus.json says {known[gpu]} SMs, the sweep ran on {sweep.sms}")
    cal = fit.fit(train, sweep, {"sweeps": [paths.display(p) for p in sweep_paths], "holdout": holdout})
    if gpu is not None:
        cal = waves.Calibration(
            cal.fingerprint, gpu, cal.sms, cal.blocks, cal.combine_fixed_us, cal.combine_per_unit_us, cal.meta
        )
    result: dict[str, Any] = {
        "fingerprint": cal.fingerprint,
        "gpu": cal.gpu,
        "sms": cal.sms,
        "holdout": holdout,
        "train_cells": len(fit.cells_of(train)),
        "test_cells": len(fit.cells_of(test)),
    }
    if test:
        before = fit.score(test, sweep.sms, None)
        after = fit.score(test, sweep.sms, cal)
        result["before"] = before.as_json()
        result["after"] = after.as_json()
        result["time_error"] = fit.time_error(test, sweep.sms, cal)
        result["target_met"] = after.within >= TARGET_WITHIN and after.mean_loss <= TARGET_MEAN_LOSS
        cal.meta["held_out"] = {
            "cells": after.cells,
            "within_2pct": round(after.within, 4),
            "mean_loss": round(after.mean_loss, 4),
            "uncalibrated_within_2pct": round(before.within, 4),
            "uncalibrated_mean_loss": round(before.mean_loss, 4),
        }
    result["train"] = fit.score(train, sweep.sms, cal).as_json()
    result["calibration"] = cal.as_json()
    result["stored"] = paths.display(store.save(cal, store_path)) if write else None
    return result


def render_calibrate(result: dict[str, Any]) -> str:
    cal = waves.Calibration.from_json(result["calibration"])
    lines = [f"{cal.gpu}: {cal.fingerprint}", f"fit on {result['train_cells']} cells (holdout {result['holdout']}):"]
    lines.append("BLOCK_H  CTAs/SM  fixed µs/CTA  ns/token  part-wave saving  BLOCK_H factor  rms error")
    rms = cal.meta.get("rms_rel_error", {})
    for bh, t in sorted(cal.blocks.items()):
        lines.append(
            f"{bh:>7}  {t.resident:>7}  {t.fixed_us:>12.2f}  {t.per_token_us * 1000:>8.1f}  {t.partial:>16.2f}  "
            f"{cal.block_h_factor(bh):>14.2f}  {float(rms.get(str(bh), 0)):>9.1%}"
        )
    lines.append(f"combine: {cal.combine_fixed_us:.2f} µs + {cal.combine_per_unit_us * 1000:.3f} ns x B x H x nsplit")
    if "after" in result:
        b, a, te = result["before"], result["after"], result["time_error"]
        lines.append(f"held-out cells: {result['test_cells']} (B, H, L, BLOCK_H)")
        lines.append("planner       picks within 2%  mean loss  worst loss  rank corr")
        for name, acc in (("uncalibrated", b), ("calibrated", a)):
            lines.append(
                f"{name:<12}  {acc['within']:>15.1%}  {acc['mean_loss']:>9.2%}  {acc['worst_loss']:>10.1%}  "
                f"{acc['median_rank_corr']:>9.2f}"
            )
        lines.append(
            f"predicted time error: median {te['median']:.1%}, p90 {te['p90']:.1%}, max {te['max']:.1%}; "
            f"target (>= 90% within 2%, mean loss <= 2%) {'met' if result['target_met'] else 'NOT met'}"
        )
    lines.append(f"stored in {result['stored']}" if result["stored"] else "not stored (--dry-run)")
    return "\n".join(lines)


def calibration_line(gpu: str | None, sms: int | None = None) -> tuple[waves.Calibration | None, str]:
    """The calibration ``waves`` should use for ``gpu`` and the line it prints about it. ``--sms N`` that
    disagrees with the calibration's SM count means another GPU: no calibration then."""
    name = gpu or "rtx-pro-6000"
    cal = waves.calibration_for(name)
    if cal is None:
        return None, f"calibration: none for {name} (uncalibrated wave model; cost in relative units)"
    if sms is not None and sms != cal.sms:
        return None, f"calibration: not used (--sms {sms}, {cal.gpu} was measured with {cal.sms}); uncalibrated model"
    held = cal.meta.get("held_out") or {}
    score = (
        f"; held-out picks {held['within_2pct']:.0%} within 2% of the measured best" if "within_2pct" in held else ""
    )
    return cal, f"{cal.summary()}; cost in predicted µs per kernel call{score}"
