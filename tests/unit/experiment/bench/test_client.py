"""The bench client against the stand-in engine in process (real HTTP on loopback)."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from knobfleet.experiment.bench import client
from knobfleet.lab.sim.engine import Engine, EngineConfig
from knobfleet.lab.sim.server import State, make_server
from knobfleet.waves import KernelKnobs


def start(overlap: bool) -> tuple[str, Engine, object]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = Engine(EngineConfig(KernelKnobs(), 188, 0.002, 0.0, overlap, 256, 1))
    state = State({"model_path": "/m"}, {}, engine, expose_env=False, model_name="/m")
    state.ready.set()
    httpd = make_server("127.0.0.1", port, state)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    engine.start()
    return f"http://127.0.0.1:{port}", engine, httpd


@pytest.fixture(params=[False, True], ids=["overlap0", "overlap1"])
def engine_url(request: pytest.FixtureRequest) -> Iterator[tuple[str, bool]]:
    url, engine, httpd = start(request.param)
    yield url, request.param
    engine.stop()
    httpd.shutdown()  # type: ignore[attr-defined]


def test_bucket_counts_tokens_and_prints_the_familiar_line(engine_url: tuple[str, bool]) -> None:
    url, _ = engine_url
    t = client.Target(url, None, 30)
    assert t.discover_model() == "/m"
    b = client.bucket(t, 8, 16, 12, warmup=4, seed=0, timeout=30)
    assert (b["errors"], b["tokens"], len(b["requests"])) == (0, 16 * 12, 16)
    assert b["agg_tok_s"] > 0 and b["ttft"]["p50"] is not None and b["itl"]["p50"] is not None
    line = client.summary_line(b)
    assert re.fullmatch(
        r"C=8 n=16 max_tokens=12 \| agg=[\d.]+ tok/s \| per-req~[\d.]+ tok/s \| p50 lat=[\d.]+s \| "
        r"toks=192 errs=0 wall=[\d.]+s",
        line,
    ), line


def test_consistency_passes_without_overlap_and_fails_with_it(engine_url: tuple[str, bool]) -> None:
    url, overlap = engine_url
    res = client.consistency(client.Target(url, "/m", 30), 8, 12, 40, seed=0, repeats=2, timeout=60)
    assert res["compared"] == 24 and res["errors"] == 0
    assert res["passed"] is (not overlap)
    if overlap:
        assert res["diverged"] > 0 and all(d["first_divergent_token"] >= 2 for d in res["divergences"])


def test_errors_are_counted_not_hidden() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here
    t = client.Target(f"http://127.0.0.1:{port}", "m", 2)
    b = client.bucket(t, 4, 6, 8, warmup=0, seed=0, timeout=5)
    assert b["errors"] == 6 and b["tokens"] == 0
    assert sum(b["error_kinds"].values()) == 6


def test_deadline_bounds_a_bucket() -> None:
    url, engine, httpd = start(False)
    try:
        started = time.monotonic()
        b = client.bucket(client.Target(url, "/m", 30), 2, 400, 64, warmup=0, seed=0, timeout=0.5)
        assert time.monotonic() - started < 20
        assert b["errors"] > 0 and len(b["requests"]) == 400
    finally:
        engine.stop()
        httpd.shutdown()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("tokens", "period"),
    [(["a", "b"] * 8, 2), (list("xyzxyzxyzxyzxyz"), 3), (list("abcdefgh"), None), (["q"] * 4, 1), ([], None)],
)
def test_loop_period(tokens: list[str], period: int | None) -> None:
    assert client.loop_period(tokens) == period


def test_first_divergence() -> None:
    assert client.first_divergence(list("abc"), list("abc")) is None
    assert client.first_divergence(list("abc"), list("abd")) == 2
    assert client.first_divergence(list("abc"), list("ab")) == 2
