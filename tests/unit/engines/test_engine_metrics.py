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
    assert adapter.engine(engine).metrics("the router drain")[0] == running
    assert adapter.engine(engine).metrics("the canary")[3] == finished
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
    names = {"the canary": "generation_tokens, e2e_latency, inter_token_latency and finished",
             "the router drain": "running and queued"}[who]  # fmt: skip
    assert str(exc.value) == (
        f"engine mute: {who} needs its Prometheus metric names, and its catalog has no serve.metrics; add {names} "
        "under serve.metrics: in profiles/catalogs/mute.overlay.yaml"
    )


@pytest.fixture
def gauges_only(monkeypatch: pytest.MonkeyPatch) -> str:
    """A fourth engine, ``llamacpp``: running and queued gauges, no latency histograms (llama.cpp's llama-server)."""
    from knobfleet.profiles.model import Metrics

    real = adapter.engine
    names = Metrics(running="llamacpp:requests_processing", queued="llamacpp:requests_deferred")

    def engine(name: str | None = None) -> adapter.Engine:
        if name == "llamacpp":
            return dataclasses.replace(real("sglang"), name="llamacpp", metric_names=names)
        return real(name)

    monkeypatch.setattr(adapter, "engine", engine)
    return "llamacpp"


def test_an_engine_with_the_gauges_only_keeps_its_drain_and_loses_only_the_canary(
    gauges_only: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 58: serve.metrics was all-or-nothing, so an engine without latency histograms lost the drain too."""
    router_kinds.engine_inflight("http://127.0.1.1:30000", gauges_only)  # a reader; nothing is sent yet
    assert adapter.engine(gauges_only).metrics("the router drain") == (
        "llamacpp:requests_processing", "llamacpp:requests_deferred")  # fmt: skip
    monkeypatch.setattr(adapter, "names", lambda: [gauges_only, "sglang"])
    assert loadprofile.running_gauges()[gauges_only] == "llamacpp:requests_processing"
    with pytest.raises(KnobfleetError) as exc:
        canary_windows.engine_series(gauges_only)
    assert str(exc.value) == (
        "engine llamacpp: the canary needs its Prometheus metric names, and its catalog has no "
        "serve.metrics.generation_tokens, serve.metrics.e2e_latency, serve.metrics.inter_token_latency, "
        "serve.metrics.finished; add generation_tokens, e2e_latency, inter_token_latency and finished under "
        "serve.metrics: in profiles/catalogs/llamacpp.overlay.yaml"
    )


def test_a_catalog_with_the_gauges_only_has_a_dashboard_of_them() -> None:
    from knobfleet.profiles import catalog as catalogs
    from knobfleet.profiles.model import Metrics
    from knobfleet.telemetry import dashboards

    cat = catalogs.catalog_for("vllm")
    gauges = Metrics(running="x:running", queued="x:queued")
    board = dashboards.engine_dashboard(
        cat.model_copy(update={"serve": cat.serve.model_copy(update={"metrics": gauges})})
    )
    assert [p["title"] for p in board["panels"]] == ["Requests running", "Requests queued"]


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
