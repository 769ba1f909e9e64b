"""The lab's load generator: its pure parts (stream classification, percentiles, summary, bounds) and a short
real run against an in-process stand-in engine on a loopback port."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet.lab import loadgen
from knobfleet.lab.loadgen import LoadSpec, Record, classify_stream, percentile, summarize
from knobfleet.lab.sim.engine import Engine, EngineConfig
from knobfleet.lab.sim.server import State, make_server
from knobfleet.waves import KernelKnobs

DONE = [b'data: {"choices": [{"text": " a"}]}\n', b"\n", b'data: {"choices": [{"text": " b"}]}\n', b"data: [DONE]\n"]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (DONE, ("ok", 2, True)),
        (DONE[:3], ("truncated", 2, True)),
        ([], ("truncated", 0, False)),
        ([b": keep-alive\n", b"data: [DONE]\n"], ("ok", 0, False)),
        ([b"event: x\n", b"data:{}\n"], ("truncated", 1, True)),
    ],
)
def test_classify_stream(lines: list[bytes], expected: tuple[str, int, bool]) -> None:
    assert classify_stream(lines) == expected


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([], 50, None), ([3.0], 99, 3.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.5), ([4.0, 1.0, 3.0, 2.0], 0, 1.0),
     ([1.0, 2.0, 3.0, 4.0], 100, 4.0)],
)  # fmt: skip
def test_percentile(values: list[float], q: float, expected: float | None) -> None:
    assert percentile(values, q) == expected


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_stays_within_the_values(values: list[float], q: float) -> None:
    p = percentile(values, q)
    assert p is not None and min(values) <= p <= max(values)


def test_summarize_counts_every_outcome_and_windows() -> None:
    records = [
        Record(0, 0.1, True, "ok", 200, ttft_s=0.01),
        Record(1, 1.2, True, "truncated", 200, ttft_s=0.5),
        Record(2, 1.5, False, "http_error", 503),
        Record(3, 2.5, True, "ok", 200, ttft_s=0.03),
        Record(4, 2.6, False, "connection_reset"),
    ]
    s = summarize(records, {"before": (0, 1), "during": (1, 2), "after": (2, 9)})
    assert {k: s[k] for k in ("sent", "ok", "http_error", "connection_reset", "truncated", "timeout", "failed")} == {
        "sent": 5, "ok": 2, "http_error": 1, "connection_reset": 1, "truncated": 1, "timeout": 0, "failed": 3,
    }  # fmt: skip
    assert s["during"] == {"sent": 2, "failed": 2, "ttft": {"n": 0, "p50_s": None, "p99_s": None}}
    assert s["after"] == {"sent": 2, "failed": 1, "ttft": {"n": 1, "p50_s": 0.03, "p99_s": 0.03}}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (LoadSpec("http://10.0.0.1:30080", "m"), "not a loopback address"),
        (LoadSpec("http://example.org", "m"), "not a loopback address"),
        (LoadSpec("http://127.0.0.1:1", "m", rate=0), "choose 0 < rate"),
        (LoadSpec("http://127.0.0.1:1", "m", max_requests=0), "max_requests 0"),
        (LoadSpec("http://127.0.0.1:1", "m", max_seconds=1e9), "max_seconds"),
    ],
)
def test_bad_specs_are_refused_before_any_request(spec: LoadSpec, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        loadgen.run(spec)


@pytest.mark.parametrize(("every", "streams"), [(2, [False, True, False, True]), (1, [False] * 4), (0, [True] * 4)])
def test_stream_every(every: int, streams: list[bool]) -> None:
    spec = LoadSpec("http://127.0.0.1:1", "m", stream_every=every)
    assert [spec.streams(i) for i in range(4)] == streams


@pytest.fixture
def engine_url() -> Iterator[str]:
    cfg = EngineConfig(KernelKnobs(), 188, time_scale=0.001, noise=0.0, overlap=False, max_running=64, seed=1)
    engine = Engine(cfg)
    state = State({"model_path": "/m", "port": 0}, {}, engine, expose_env=False, model_name="/m")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    httpd = make_server("127.0.0.1", port, state)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    engine.start()
    state.ready.set()
    yield f"http://127.0.0.1:{port}"
    engine.stop()
    httpd.shutdown()
    httpd.server_close()


def test_run_against_a_real_engine_and_a_closed_port(engine_url: str) -> None:
    records = loadgen.run(LoadSpec(engine_url, "/m", rate=50, max_requests=10, max_seconds=5, max_tokens=8))
    assert [r.index for r in records] == list(range(10))
    assert {r.outcome for r in records} == {"ok"}
    assert all(r.ttft_s is not None and r.chunks == 9 for r in records if r.stream)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    refused = loadgen.run(LoadSpec(closed, "/m", rate=50, max_requests=2, max_seconds=5))
    assert [r.outcome for r in refused] == ["connection_reset", "connection_reset"]


def test_run_stops_by_time_before_the_count(engine_url: str) -> None:
    records = loadgen.run(LoadSpec(engine_url, "/m", rate=10, max_requests=1000, max_seconds=0.35, max_tokens=4))
    assert len(records) == 4  # requests start at 0, 0.1, 0.2, 0.3 s
