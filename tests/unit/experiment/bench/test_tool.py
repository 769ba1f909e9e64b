"""Reading the engine's own benchmark summaries (vllm bench serve, sglang.bench_serving) into buckets."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet.experiment.ab import summarise_runs
from knobfleet.experiment.bench.client import summary_line
from knobfleet.experiment.bench.run import errors, throughput
from knobfleet.experiment.bench.tool import ToolResultError, bucket, document

# The summary scalars vllm bench serve 0.32.0 saves (--percentile-metrics ttft,tpot,itl,e2el
# --metric-percentiles 50,90,99), per-request lists removed on the host.
VLLM = {
    "date": "20261130-140000",
    "backend": "vllm",
    "model_id": "/var/cache/knobfleet/vllm-0.32.0/model",
    "num_prompts": 8,
    "max_concurrency": 4,
    "duration": 2.5,
    "completed": 8,
    "failed": 0,
    "total_input_tokens": 1024,
    "total_output_tokens": 128,
    "request_throughput": 3.2,
    "output_throughput": 51.2,
    "total_token_throughput": 460.8,
    "mean_ttft_ms": 120.0,
    "median_ttft_ms": 110.0,
    "p50_ttft_ms": 110.0,
    "p90_ttft_ms": 180.0,
    "p99_ttft_ms": 200.0,
    "mean_tpot_ms": 40.0,
    "p50_itl_ms": 39.0,
    "p90_itl_ms": 45.0,
    "p99_itl_ms": 60.0,
    "p50_e2el_ms": 700.0,
    "p90_e2el_ms": 800.0,
    "p99_e2el_ms": 900.0,
}
# sglang.bench_serving's JSON line: medians by name, end-to-end latency as e2e_latency, no "failed".
SGLANG = {
    "backend": "sglang",
    "num_prompts": 8,
    "max_concurrency": 4,
    "duration": 2.0,
    "completed": 7,
    "total_output_tokens": 112,
    "output_throughput": 56.0,
    "mean_tpot_ms": 25.0,
    "median_ttft_ms": 90.0,
    "p99_ttft_ms": 150.0,
    "median_itl_ms": 24.0,
    "p99_itl_ms": 30.0,
    "median_e2e_latency_ms": 500.0,
    "p99_e2e_latency_ms": 650.0,
}


@pytest.mark.parametrize(
    ("result", "agg", "errs", "lat_p50", "ttft_p99", "itl_p90"),
    [
        (VLLM, 51.2, 0, 0.7, 0.2, 0.045),
        (SGLANG, 56.0, 1, 0.5, 0.15, None),  # 8 asked, 7 completed: one error; no p90 reported
        ({**VLLM, "failed": 2, "completed": 6}, 51.2, 2, 0.7, 0.2, 0.045),
    ],
)
def test_a_tool_summary_becomes_a_bucket(
    result: dict[str, Any], agg: float, errs: int, lat_p50: float, ttft_p99: float, itl_p90: float | None
) -> None:
    b = bucket({"concurrency": 4, "num_prompts": 8, "wall_s": 9.0, "result": result}, "t", 16)
    assert b["concurrency"] == 4 and b["n"] == 8 and b["max_tokens"] == 16
    assert b["agg_tok_s"] == agg
    assert b["errors"] == errs and (b["error_kinds"] == {"t: failed": errs} if errs else b["error_kinds"] == {})
    assert b["latency"]["p50"] == pytest.approx(lat_p50)
    assert b["ttft"]["p99"] == pytest.approx(ttft_p99)
    assert b["itl"]["p90"] == (None if itl_p90 is None else pytest.approx(itl_p90))
    assert b["wall_s"] == result["duration"]  # the tool's own duration, not the module's wall time
    assert b["tokens"] == result["total_output_tokens"]
    assert b["per_req_tok_s"] == pytest.approx(4 * 1000.0 / result["mean_tpot_ms"])
    assert b["tool"] is result
    summary_line(b)  # the bench table's line reads every bucket the same way


def test_a_summary_without_throughput_names_the_keys_it_has() -> None:
    with pytest.raises(ToolResultError, match=r"vllm bench serve: concurrency 4: .*output_throughput.*keys: a, b"):
        bucket({"concurrency": 4, "result": {"a": 1, "b": "x"}}, "vllm bench serve", 16)
    with pytest.raises(ToolResultError, match="no result document"):
        bucket({"concurrency": 4, "result": None}, "t", 16)
    with pytest.raises(ToolResultError):  # a bool is not a number, even where Python says it is
        bucket({"concurrency": 4, "result": {**VLLM, "output_throughput": True}}, "t", 16)


def test_the_document_keeps_version_and_settings_next_to_the_buckets() -> None:
    settings = {"vllm_config": {"scheduler_config": {"max_num_seqs": 8}}}
    runs = [
        {"concurrency": c, "num_prompts": 2 * c, "wall_s": 1.0, "result": {**VLLM, "output_throughput": 10.0 * c}}
        for c in (2, 4)
    ]
    doc = document({"runs": runs, "version": "0.32.0", "settings": settings}, "vllm bench serve", 16)
    assert doc["tool"] == "vllm bench serve" and doc["engine_version"] == "0.32.0" and doc["settings"] == settings
    assert throughput(doc) == {2: 20.0, 4: 40.0}
    assert errors(doc) == 0
    stats = summarise_runs([doc, doc])
    assert [(s.concurrency, s.mean) for s in stats] == [(2, 20.0), (4, 40.0)]


@given(
    conc=st.integers(1, 512),
    completed=st.integers(0, 1000),
    asked=st.integers(0, 1000),
    tput=st.floats(0, 1e6, allow_nan=False),
    pct=st.dictionaries(
        st.sampled_from(["p50_ttft_ms", "median_ttft_ms", "p90_itl_ms", "p99_e2el_ms", "median_e2e_latency_ms"]),
        st.floats(0, 1e6, allow_nan=False),
    ),
)
def test_any_summary_of_the_family_reads_without_error(
    conc: int, completed: int, asked: int, tput: float, pct: dict[str, float]
) -> None:
    result = {"completed": completed, "output_throughput": tput, **pct}
    b = bucket({"concurrency": conc, "num_prompts": asked, "result": result}, "t", 8)
    assert b["agg_tok_s"] == tput
    assert b["errors"] == max(asked - completed, 0)
    # The oracle: vLLM's pNN key first, then SGLang's median, for each name the metric goes by.
    order = {
        ("ttft", "p50"): ["p50_ttft_ms", "median_ttft_ms"],
        ("itl", "p90"): ["p90_itl_ms"],
        ("latency", "p99"): ["p99_e2el_ms"],
        ("latency", "p50"): ["median_e2e_latency_ms"],
    }
    for (metric, p), keys in order.items():
        present = [pct[k] for k in keys if k in pct]
        assert b[metric][p] == (pytest.approx(present[0] / 1000.0) if present else None)
