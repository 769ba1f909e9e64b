#!/usr/bin/env python3
"""knobfleet kernel bench: a split-K MLA decode attention microbenchmark (Triton + torch).

Written for knobfleet; self-contained so the knob_kernel role can ship it to any GPU host:

    python3 kernel_bench.py --grid grid.json --budget-s 300 --out result.json
    python3 kernel_bench.py --check --out check.json          # correctness only

The kernel is the shape of DeepSeek MLA decode with an absorbed latent cache: every query head is
576 wide (512 latent + 64 rope), every token of context has ONE shared bf16 row of 576 (K = the row,
V = its first 512 columns). Grid (B, ceil(H / BLOCK_H), nsplit): each CTA takes BLOCK_H heads of one
request and a contiguous slice of its context, runs an online softmax over BLOCK_N-token tiles and
writes fp32 partial outputs plus their log-sum-exp; a combine kernel (grid (B, H)) merges the nsplit
partials into the bf16 output. With nsplit == 1 there is no combine.

The grid file lists the points to time (the controller computes nsplit with knobfleet's rule):
``{"points": [[B, H, L, BLOCK_H, TARGET_CTAS, nsplit], ...], "num_warps": {"16": 4, ...}, ...}``.
Points that share (B, H, L, BLOCK_H, nsplit) are the same launch and are timed once.

Timing: the KV pool (``--pool-mb``, default 4096) is filled once; each timed launch reads its batch's
rows from another region of it (rotated, >= 256 MB between reuses where the pool allows), so KV comes
from HBM, not L2. ``--launches`` launches are captured in one CUDA graph; the graph is replayed
``--reps`` times, each replay timed with CUDA events; the median replay / launches is reported. The
split kernel alone and split + combine are separate graphs; combine_us is their difference.

Without torch, Triton or a CUDA GPU it prints and writes ``{"skipped": true, "reason": ...}`` and
exits 0. Exit 1 only when the kernel's output disagrees with the torch reference.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

D_V = 512
D_R = 64
D_QK = D_V + D_R
ROW_BYTES = D_QK * 2
LOG2E = 1.4426950408889634


def skipped(reason: str) -> dict[str, Any]:
    return {
        "schema": 1,
        "skipped": True,
        "reason": f"skipped: {reason} on {socket.gethostname()}",
        "host": socket.gethostname(),
    }


def emit(result: dict[str, Any], out: str | None) -> None:
    text = json.dumps(result, indent=1, sort_keys=True)
    if out:
        tmp = out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, out)
    summary = {k: result.get(k) for k in ("skipped", "reason", "complete", "n_points", "elapsed_s") if k in result}
    summary["gpu"] = (result.get("gpu") or {}).get("name")
    print(json.dumps(summary))


def build(torch: Any, triton: Any, tl: Any) -> tuple[Any, Any]:
    @triton.jit
    def split_kernel(
        Q,
        KV,
        Start,
        Opart,
        Lse,
        H,
        L,
        chunk,
        stride_qb,
        stride_qh,
        stride_ob,
        stride_oh,
        stride_os,
        stride_lb,
        stride_lh,
        qk_scale,
        BLOCK_H: tl.constexpr,
        BLOCK_N: tl.constexpr,
        DV: tl.constexpr,
        DR: tl.constexpr,
    ):
        b = tl.program_id(0)
        hg = tl.program_id(1)
        s = tl.program_id(2)
        heads = hg * BLOCK_H + tl.arange(0, BLOCK_H)
        hmask = heads < H
        offs_v = tl.arange(0, DV)
        offs_r = tl.arange(0, DR)
        q_base = Q + b * stride_qb + heads[:, None] * stride_qh
        q_nope = tl.load(q_base + offs_v[None, :], mask=hmask[:, None], other=0.0)
        q_rope = tl.load(q_base + DV + offs_r[None, :], mask=hmask[:, None], other=0.0)
        start = tl.load(Start + b).to(tl.int64)
        lo = s * chunk
        hi = tl.minimum(lo + chunk, L)
        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, DV], dtype=tl.float32)
        for n0 in range(lo, hi, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            nmask = offs_n < hi
            rows = KV + (start + offs_n.to(tl.int64))[:, None] * (DV + DR)
            k_nope = tl.load(rows + offs_v[None, :], mask=nmask[:, None], other=0.0)
            k_rope = tl.load(rows + DV + offs_r[None, :], mask=nmask[:, None], other=0.0)
            qk = tl.dot(q_nope, tl.trans(k_nope))
            qk += tl.dot(q_rope, tl.trans(k_rope))
            qk = qk * qk_scale
            qk = tl.where(nmask[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(k_nope.dtype), k_nope)
            m_i = m_new
        has = l_i > 0
        l_safe = tl.where(has, l_i, 1.0)
        out = acc / l_safe[:, None]
        o_ptr = Opart + b * stride_ob + heads[:, None] * stride_oh + s * stride_os + offs_v[None, :]
        tl.store(o_ptr, out, mask=hmask[:, None])
        lse = tl.where(has, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(Lse + b * stride_lb + heads * stride_lh + s, lse, mask=hmask)

    @triton.jit
    def combine_kernel(
        Opart,
        Lse,
        Out,
        nsplit,
        stride_ob,
        stride_oh,
        stride_os,
        stride_lb,
        stride_lh,
        stride_xb,
        stride_xh,
        DV: tl.constexpr,
        NS: tl.constexpr,
    ):
        b = tl.program_id(0)
        h = tl.program_id(1)
        offs_s = tl.arange(0, NS)
        smask = offs_s < nsplit
        lse = tl.load(Lse + b * stride_lb + h * stride_lh + offs_s, mask=smask, other=float("-inf"))
        m = tl.max(lse, 0)
        w = tl.where(smask, tl.exp2(lse - m), 0.0)
        w = w / tl.sum(w, 0)
        offs_v = tl.arange(0, DV)
        o = tl.load(
            Opart + b * stride_ob + h * stride_oh + offs_s[:, None] * stride_os + offs_v[None, :],
            mask=smask[:, None],
            other=0.0,
        )
        out = tl.sum(o * w[:, None], 0)
        tl.store(Out + b * stride_xb + h * stride_xh + offs_v, out.to(Out.dtype.element_ty))

    return split_kernel, combine_kernel


class Bench:
    def __init__(self, torch: Any, triton: Any, tl: Any, args: argparse.Namespace, num_warps: dict[int, int]):
        self.torch, self.triton = torch, triton
        self.split_kernel, self.combine_kernel = build(torch, triton, tl)
        self.args = args
        self.num_warps = num_warps
        self.compiled: dict[tuple[int, int], Any] = {}
        self.dev = torch.device("cuda")
        self.pool: Any = None

    def ensure_pool(self, rows: int) -> None:
        if self.pool is None or self.pool.shape[0] < rows:
            self.pool = None
            self.torch.cuda.empty_cache()
            g = self.torch.Generator(device=self.dev).manual_seed(0)
            self.pool = self.torch.randn((rows, D_QK), device=self.dev, dtype=self.torch.bfloat16, generator=g)

    def chunk(self, length: int, nsplit: int) -> int:
        bn = self.args.block_n
        return max(bn, math.ceil(math.ceil(length / nsplit) / bn) * bn)

    def launch_split(
        self, q: Any, start: Any, opart: Any, lse: Any, heads: int, length: int, block_h: int, nsplit: int
    ) -> Any:
        batch = q.shape[0]
        chunk = self.chunk(length, nsplit)
        grid = (batch, math.ceil(heads / block_h), nsplit)
        k = self.split_kernel[grid](
            q,
            self.pool,
            start,
            opart,
            lse,
            heads,
            length,
            chunk,
            q.stride(0),
            q.stride(1),
            opart.stride(0),
            opart.stride(1),
            opart.stride(2),
            lse.stride(0),
            lse.stride(1),
            LOG2E / math.sqrt(D_QK),
            BLOCK_H=block_h,
            BLOCK_N=self.args.block_n,
            DV=D_V,
            DR=D_R,
            num_warps=self.num_warps.get(block_h, 4),
            num_stages=self.args.num_stages,
        )
        key = (block_h, self.num_warps.get(block_h, 4))
        if key not in self.compiled and k is not None:
            self.compiled[key] = k
        return k

    def launch_combine(self, opart: Any, lse: Any, out: Any, nsplit: int) -> None:
        batch, heads = out.shape[0], out.shape[1]
        ns = max(2, 1 << (nsplit - 1).bit_length())
        self.combine_kernel[(batch, heads)](
            opart,
            lse,
            out,
            nsplit,
            opart.stride(0),
            opart.stride(1),
            opart.stride(2),
            lse.stride(0),
            lse.stride(1),
            out.stride(0),
            out.stride(1),
            DV=D_V,
            NS=ns,
            num_warps=4,
        )

    def buffers(self, batch: int, heads: int, nsplit: int) -> tuple[Any, Any, Any, Any]:
        t = self.torch
        g = t.Generator(device=self.dev).manual_seed(1)
        q = t.randn((batch, heads, D_QK), device=self.dev, dtype=t.bfloat16, generator=g)
        opart = t.empty((batch, heads, nsplit, D_V), device=self.dev, dtype=t.float32)
        lse = t.empty((batch, heads, nsplit), device=self.dev, dtype=t.float32)
        out = t.empty((batch, heads, D_V), device=self.dev, dtype=t.bfloat16)
        return q, opart, lse, out

    def run(
        self,
        q: Any,
        start: Any,
        bufs: tuple[Any, Any, Any],
        heads: int,
        length: int,
        block_h: int,
        nsplit: int,
        combine: bool = True,
    ) -> Any:
        opart, lse, out = bufs
        self.launch_split(q, start, opart, lse, heads, length, block_h, nsplit)
        if nsplit == 1:
            return opart[:, :, 0, :]
        if combine:
            self.launch_combine(opart, lse, out, nsplit)
        return out

    def reference(self, q: Any, starts: list[int], length: int) -> Any:
        t = self.torch
        outs = []
        for b, st in enumerate(starts):
            kv = self.pool[st : st + length].float()
            scores = (q[b].float() @ kv.T) / math.sqrt(D_QK)
            outs.append(t.softmax(scores, dim=-1) @ kv[:, :D_V])
        return t.stack(outs)

    def check(self) -> dict[str, Any]:
        t = self.torch
        self.ensure_pool(1 << 16)
        cases = []
        worst = 0.0
        for batch, heads, length, block_h, nsplit in [
            (3, 64, 1000, 16, 1),
            (3, 64, 1000, 32, 3),
            (2, 128, 777, 64, 7),
            (4, 64, 2048, 32, 16),
            (2, 128, 96, 16, 5),
            (5, 64, 4096, 64, 2),
            (1, 128, 33, 32, 2),
        ]:
            starts = [(b * 7919 + 13) % (self.pool.shape[0] - length) for b in range(batch)]
            start = t.tensor(starts, device=self.dev, dtype=t.int64)
            q, opart, lse, out = self.buffers(batch, heads, nsplit)
            got = self.run(q, start, (opart, lse, out), heads, length, block_h, nsplit).float()
            ref = self.reference(q, starts, length)
            err = (got - ref).abs().max().item()
            scale = ref.abs().max().item()
            worst = max(worst, err / max(scale, 1e-6))
            cases.append(
                {
                    "batch": batch,
                    "heads": heads,
                    "context": length,
                    "block_h": block_h,
                    "nsplit": nsplit,
                    "max_abs_err": err,
                    "ref_max": scale,
                    "ok": bool(err <= 2e-2 + 2e-2 * scale),
                }
            )
        t.cuda.synchronize()
        return {"ok": all(c["ok"] for c in cases), "worst_rel_err": worst, "cases": cases}

    def time_launch(self, batch: int, heads: int, length: int, block_h: int, nsplit: int) -> dict[str, float]:
        t = self.torch
        per_launch_rows = batch * length
        regions = max(1, min(self.args.launches, self.pool.shape[0] // per_launch_rows))
        starts = t.stack(
            [t.arange(batch, device=self.dev, dtype=t.int64) * length + r * per_launch_rows for r in range(regions)]
        )
        q, opart, lse, out = self.buffers(batch, heads, nsplit)
        bufs = (opart, lse, out)
        self.run(q, starts[0], bufs, heads, length, block_h, nsplit)  # compile outside capture
        t.cuda.synchronize()
        res: dict[str, float] = {}
        variants = [("attn", False)] + ([("total", True)] if nsplit > 1 else [])
        for name, combine in variants:
            graph = t.cuda.CUDAGraph()
            stream = t.cuda.Stream()
            stream.wait_stream(t.cuda.current_stream())
            with t.cuda.stream(stream):
                self.run(q, starts[0], bufs, heads, length, block_h, nsplit, combine)
            t.cuda.current_stream().wait_stream(stream)
            with t.cuda.graph(graph):
                for i in range(self.args.launches):
                    self.run(q, starts[i % regions], bufs, heads, length, block_h, nsplit, combine)
            graph.replay()
            t.cuda.synchronize()
            times = []
            for _ in range(self.args.reps):
                a, z = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
                a.record()
                graph.replay()
                z.record()
                z.synchronize()
                times.append(a.elapsed_time(z) * 1000.0 / self.args.launches)
            res[name + "_us"] = statistics.median(times)
            res[name + "_us_min"] = min(times)
            del graph
        res.setdefault("total_us", res["attn_us"])
        res.setdefault("total_us_min", res["attn_us_min"])
        res["combine_us"] = max(0.0, res["total_us"] - res["attn_us"]) if nsplit > 1 else 0.0
        res["kv_mb_rotated"] = regions * per_launch_rows * ROW_BYTES / 2**20
        return res

    def kernel_info(self, props: Any, smem_per_sm: int, regs_per_sm: int) -> list[dict[str, Any]]:
        out = []
        for (block_h, warps), k in sorted(self.compiled.items()):
            n_regs = int(getattr(k, "n_regs", 0) or 0)
            n_spills = int(getattr(k, "n_spills", 0) or 0)
            meta = getattr(k, "metadata", None)
            shared = int(getattr(meta, "shared", 0) or 0)
            limits = {"warps": 64 // warps, "hw": 32}
            if n_regs:
                per_cta = math.ceil(n_regs * 32 / 256) * 256 * warps
                limits["registers"] = regs_per_sm // per_cta
            if shared:
                limits["shared"] = smem_per_sm // (shared + 1024)
            out.append(
                {
                    "kernel": "split",
                    "block_h": block_h,
                    "num_warps": warps,
                    "n_regs": n_regs,
                    "n_spills": n_spills,
                    "shared_bytes": shared,
                    "occupancy_ctas_per_sm": min(limits.values()),
                    "occupancy_limits": limits,
                }
            )
        return out


def gpu_identity(torch: Any, triton: Any) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    driver = ""
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = ""
    return {
        "name": props.name,
        "sms": int(props.multi_processor_count),
        "cc": f"{props.major}.{props.minor}",
        "memory_bytes": int(props.total_memory),
        "l2_bytes": int(getattr(props, "L2_cache_size", 0) or 0),
        "regs_per_sm": int(getattr(props, "regs_per_multiprocessor", 65536) or 65536),
        "smem_per_sm": int(getattr(props, "shared_memory_per_multiprocessor", 233472) or 233472),
        "driver": driver,
        "cuda": str(torch.version.cuda),
        "torch": str(torch.__version__),
        "triton": str(triton.__version__),
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", help="grid JSON (points to time)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop timing new points after this many seconds")
    ap.add_argument("--out", help="write the JSON result here")
    ap.add_argument("--check", action="store_true", help="correctness check only")
    ap.add_argument("--pool-mb", type=int, default=4096)
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--block-n", type=int, default=32)
    ap.add_argument("--num-stages", type=int, default=2)
    args = ap.parse_args(argv)
    began = time.monotonic()
    try:
        import torch
    except ImportError:
        emit(skipped("no torch"), args.out)
        return 0
    try:
        import triton
        import triton.language as tl
    except ImportError:
        emit(skipped("no triton"), args.out)
        return 0
    if not torch.cuda.is_available():
        emit(skipped("no GPU"), args.out)
        return 0
    grid: dict[str, Any] = {}
    if args.grid:
        with open(args.grid, encoding="utf-8") as fh:
            grid = json.load(fh)
    for key in ("launches", "reps", "block_n", "num_stages", "pool_mb"):
        if key in grid:
            setattr(args, key, int(grid[key]))
    num_warps = {int(k): int(v) for k, v in (grid.get("num_warps") or {"16": 4, "32": 4, "64": 8}).items()}
    gpu = gpu_identity(torch, triton)
    bench = Bench(torch, triton, tl, args, num_warps)
    result: dict[str, Any] = {
        "schema": 1,
        "skipped": False,
        "host": socket.gethostname(),
        "gpu": gpu,
        "settings": {
            "launches": args.launches,
            "reps": args.reps,
            "block_n": args.block_n,
            "num_stages": args.num_stages,
            "pool_mb": args.pool_mb,
            "num_warps": num_warps,
            "budget_s": args.budget_s,
        },
    }
    check = bench.check()
    result["check"] = check
    if not check["ok"] or args.check:
        result["kernels"] = bench.kernel_info(None, gpu["smem_per_sm"], gpu["regs_per_sm"])
        result["elapsed_s"] = round(time.monotonic() - began, 2)
        result["complete"] = bool(check["ok"])
        result["results"] = []
        emit(result, args.out)
        return 0 if check["ok"] else 1
    points = [tuple(int(x) for x in p) for p in grid.get("points", [])]
    # Whole (B, H, L, BLOCK_H) cells in a fixed shuffled order: a run cut short by its budget is still
    # a spread sample of complete cells rather than the first few axes.
    cells = sorted({p[:4] for p in points})
    random.Random(0).shuffle(cells)
    rank = {c: i for i, c in enumerate(cells)}
    points.sort(key=lambda p: (rank[p[:4]], p[4]))
    bench.ensure_pool(args.pool_mb * 2**20 // ROW_BYTES)
    timed: dict[tuple[int, ...], dict[str, float]] = {}
    rows: list[dict[str, Any]] = []
    complete = True
    for batch, heads, length, block_h, target, nsplit in points:
        key = (batch, heads, length, block_h, nsplit)
        if key not in timed:
            if time.monotonic() - began > args.budget_s:
                complete = False
                break
            timed[key] = bench.time_launch(batch, heads, length, block_h, nsplit)
        rows.append(
            {
                "batch": batch,
                "heads": heads,
                "context": length,
                "block_h": block_h,
                "target_ctas": target,
                "nsplit": nsplit,
                "ctas": batch * math.ceil(heads / block_h) * nsplit,
                **timed[key],
            }
        )
    result["kernels"] = bench.kernel_info(None, gpu["smem_per_sm"], gpu["regs_per_sm"])
    rows.sort(key=lambda r: (r["heads"], r["context"], r["block_h"], r["batch"], r["target_ctas"]))
    result["results"] = rows
    result["n_points"] = len(rows)
    result["n_launch_configs"] = len(timed)
    result["complete"] = complete and len(rows) == len(points)
    result["elapsed_s"] = round(time.monotonic() - began, 2)
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
