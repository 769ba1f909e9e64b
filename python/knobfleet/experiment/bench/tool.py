"""The engine's own serving benchmark (``bench --tool engine``): its JSON summary per run, read into the bucket
shape of knobfleet's built-in client, so summaries, repeats and intervals treat both alike. Pure.

vLLM (``vllm bench serve --save-result``) and SGLang (``sglang.bench_serving --output-file``) write summaries of
the same family: ``completed``, ``duration``, ``output_throughput`` (generated tok/s), ``total_output_tokens``,
and per metric ``mean_/median_/pNN_<metric>_ms``; vLLM calls end-to-end latency ``e2el``, SGLang
``e2e_latency``. A bucket keeps the tool's own summary under ``tool`` untouched."""

from __future__ import annotations

from typing import Any

from knobfleet.errors import KnobfleetError

LATENCY_NAMES = {"latency": ("e2el", "e2e_latency"), "ttft": ("ttft",), "itl": ("itl",)}


class ToolResultError(KnobfleetError):
    """The engine's bench tool wrote a summary knobfleet cannot read."""


def _num(doc: dict[str, Any], key: str) -> float | None:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _percentile_s(doc: dict[str, Any], metric: str, pct: int) -> float | None:
    """The tool's ``pct``th percentile of ``metric`` in seconds (the tools report milliseconds), else None."""
    for name in LATENCY_NAMES[metric]:
        keys = [f"p{pct}_{name}_ms"] + ([f"median_{name}_ms"] if pct == 50 else [])
        for key in keys:
            v = _num(doc, key)
            if v is not None:
                return v / 1000.0
    return None


def bucket(run: dict[str, Any], tool: str, output_len: int) -> dict[str, Any]:
    """A built-in-client-shaped bucket from one run of the tool (``{concurrency, num_prompts, wall_s, result}``)."""
    doc = run.get("result")
    conc = int(run["concurrency"])
    if not isinstance(doc, dict):
        raise ToolResultError(f"{tool}: concurrency {conc}: no result document")
    throughput = _num(doc, "output_throughput")
    completed = _num(doc, "completed")
    if throughput is None or completed is None:
        raise ToolResultError(
            f"{tool}: concurrency {conc}: the result has no output_throughput/completed "
            f"(keys: {', '.join(sorted(doc)[:12])}); is this the engine version the catalog's serve.bench is for?"
        )
    asked = run.get("num_prompts")
    asked_n = int(asked) if isinstance(asked, int) else int(_num(doc, "num_prompts") or completed)
    failed = _num(doc, "failed")
    errors = int(failed) if failed is not None else max(asked_n - int(completed), 0)
    tpot_ms = _num(doc, "mean_tpot_ms")
    tokens = _num(doc, "total_output_tokens")
    return {
        "concurrency": conc,
        "n": asked_n,
        "max_tokens": output_len,
        "warmup": 0,
        "wall_s": round(_num(doc, "duration") or float(run.get("wall_s") or 0.0), 4),
        "tokens": int(tokens or 0),
        "errors": errors,
        "error_kinds": {f"{tool}: failed": errors} if errors else {},
        "agg_tok_s": throughput,
        # The per-request decode rate x C: what the built-in client's per_req_tok_s estimates.
        "per_req_tok_s": conc * 1000.0 / tpot_ms if tpot_ms else 0.0,
        **{
            metric: {f"p{p}": _percentile_s(doc, metric, p) for p in (50, 90, 99)}
            for metric in ("latency", "ttft", "itl")
        },
        "requests": [],
        "tool": doc,
    }


def document(module_result: dict[str, Any], tool: str, output_len: int) -> dict[str, Any]:
    """The per-host bench document of one tool run over every bucket (same keys as the built-in client's), with
    the engine version and settings the module read next to the buckets."""
    runs = module_result.get("runs") or []
    return {
        "tool": tool,
        "engine_version": module_result.get("version"),
        "settings": module_result.get("settings"),
        "buckets": [bucket(r, tool, output_len) for r in runs],
    }
