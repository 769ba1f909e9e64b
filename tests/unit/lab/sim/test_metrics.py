"""The stand-in's metrics: SGLang's names and buckets, cumulative counts, and text promtool accepts."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet.lab.sim.metrics import ITL_BUCKETS, TTFT_BUCKETS, Histogram, Metrics


def test_histogram_is_cumulative_with_inf() -> None:
    h = Histogram("x_seconds", "doc", (0.1, 1))
    h.observe(0.05)
    h.observe(0.1)
    h.observe(0.5, n=3)
    h.observe(7)
    assert h.lines('model_name="m"')[2:] == [
        'x_seconds_bucket{model_name="m",le="0.1"} 2.0',
        'x_seconds_bucket{model_name="m",le="1.0"} 5.0',
        'x_seconds_bucket{model_name="m",le="+Inf"} 6.0',
        'x_seconds_sum{model_name="m"} 8.65',
        'x_seconds_count{model_name="m"} 6.0',
    ]


def test_sglang_bucket_bounds() -> None:
    assert TTFT_BUCKETS[:3] == (0.1, 0.2, 0.4) and TTFT_BUCKETS[-1] == 400
    assert len(ITL_BUCKETS) == 23 and ITL_BUCKETS[4:8] == (0.010, 0.015, 0.020, 0.025)


def test_bounds_must_increase() -> None:
    with pytest.raises(ValueError, match="bucket bounds must increase"):
        Histogram("x", "d", (1, 0.5))


def _served() -> Metrics:
    m = Metrics()
    m.request_started(24)
    m.token(0.3, first=True)
    for _ in range(3):
        m.token(0.012, first=False)
    m.request_finished(0.336)
    return m


def test_exposition_names_and_values() -> None:
    text = _served().exposition('tiny "m"', running=2, queued=1, gen_throughput=812.5, token_usage=0.25)
    lines = text.splitlines()
    assert 'sglang:num_running_reqs{model_name="tiny \\"m\\""} 2.0' in lines
    assert 'sglang:prompt_tokens_total{model_name="tiny \\"m\\""} 24.0' in lines
    assert 'sglang:generation_tokens_total{model_name="tiny \\"m\\""} 4.0' in lines
    assert 'sglang:time_to_first_token_seconds_count{model_name="tiny \\"m\\""} 1.0' in lines
    assert 'sglang:inter_token_latency_seconds_bucket{model_name="tiny \\"m\\"",le="0.015"} 3.0' in lines
    assert 'sglang:e2e_request_latency_seconds_sum{model_name="tiny \\"m\\""} 0.336' in lines
    assert 'sglang:token_usage{model_name="tiny \\"m\\""} 0.25' in lines


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: `make test` installs prometheus")
def test_promtool_accepts_the_exposition() -> None:
    text = _served().exposition("tiny", running=0, queued=0, gen_throughput=0.0, token_usage=0.0)
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    # SGLang's own names contain ':' (a recording-rule convention promtool's linter flags); nothing else may be off
    problems = [p for p in (proc.stdout + proc.stderr).splitlines() if "should not contain ':'" not in p]
    assert problems == [], proc.stdout + proc.stderr


@given(st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), max_size=200))
def test_count_equals_observations_and_buckets_never_decrease(values: list[float]) -> None:
    h = Histogram("y", "d", TTFT_BUCKETS)
    for v in values:
        h.observe(v)
    counts = [float(line.rsplit(" ", 1)[1]) for line in h.lines("")[2:-2]]
    assert counts == sorted(counts) and counts[-1] == len(values)
    assert h.sum == pytest.approx(sum(values))


def test_process_start_time_is_this_process_start() -> None:
    import time

    from knobfleet.lab.sim.metrics import process_start_time

    started = process_start_time()
    assert time.time() - 24 * 3600 * 365 < started <= time.time()
    text = Metrics().exposition("m", 0, 0, 0.0, 0.0)
    assert f"process_start_time_seconds {started:.2f}" in text.splitlines()
