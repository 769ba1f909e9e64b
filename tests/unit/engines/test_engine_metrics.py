"""An engine's Prometheus names are data (catalog ``serve.metrics``): the router drain, the canary and
load-profile read them from the engine's catalog, and an engine whose catalog has none is refused with one line
naming the catalog where they are needed; it is never judged on another engine's names (the canary used SGLang's
for any engine it did not know)."""

from __future__ import annotations

import dataclasses

import pytest

from knobfleet.engines import adapter
from knobfleet.errors import KnobfleetError
from knobfleet.experiment import canary_windows
from knobfleet.fleet import router_kinds
from knobfleet.telemetry import loadprofile


@pytest.mark.parametrize(
    ("engine", "running", "finished"),
    [("sglang", "sglang:num_running_reqs", "sglang:num_requests_total"),
     ("vllm", "vllm:num_requests_running", "vllm:request_success_total")],
)  # fmt: skip
def test_the_shipped_engines_name_their_metrics(engine: str, running: str, finished: str) -> None:
    m = adapter.engine(engine).metrics("a test")
    assert (m.running, m.finished) == (running, finished)
    assert canary_windows.engine_series(engine)[3] == finished
    assert loadprofile.running_gauges()[engine] == running


@pytest.fixture
def mute(monkeypatch: pytest.MonkeyPatch) -> str:
    """A third engine, ``mute``: SGLang's catalog without its serve.metrics."""
    real = adapter.engine

    def engine(name: str | None = None) -> adapter.Engine:
        if name == "mute":
            return dataclasses.replace(real("sglang"), name="mute", metric_names=None)
        return real(name)

    monkeypatch.setattr(adapter, "engine", engine)
    return "mute"


@pytest.mark.parametrize(
    ("who", "call"),
    [
        ("the canary", lambda e: canary_windows.engine_series(e)),
        ("the router drain", lambda e: router_kinds.engine_inflight("http://127.0.1.1:30000", e)),
    ],
)
def test_an_engine_without_metric_names_is_refused_where_they_are_needed(mute: str, who: str, call: object) -> None:
    with pytest.raises(KnobfleetError) as exc:
        call(mute)  # type: ignore[operator]
    assert str(exc.value) == (
        f"engine mute: {who} needs its Prometheus metric names, and its catalog has no serve.metrics; add running, "
        "queued, generation_tokens, e2e_latency, inter_token_latency and finished under serve: in "
        "profiles/catalogs/mute.overlay.yaml"
    )


def test_load_profile_reads_only_the_engines_that_name_a_gauge(mute: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapter, "names", lambda: ["mute", "sglang", "vllm"])
    assert sorted(loadprofile.running_gauges()) == ["sglang", "vllm"]


@pytest.mark.parametrize("bad", ["", "has space", "1starts_with_digit", "x{label}"])
def test_a_metric_name_prometheus_cannot_hold_is_refused(bad: str) -> None:
    from pydantic import ValidationError

    from knobfleet.profiles.model import Metrics

    names = dict(running="a", queued="b", generation_tokens="c", e2e_latency="d", inter_token_latency="e", finished="f")
    with pytest.raises(ValidationError):
        Metrics(**{**names, "running": bad})
