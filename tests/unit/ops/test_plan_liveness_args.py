"""Who sends the liveness completion: the probe options carry the engine's liveness URL where its health check
does not generate (vLLM), and only ``verify`` keeps it; ``drift`` blanks it (a completion on every drift of a
large fleet is load on every engine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from knobfleet.fleet import probe as probing
from knobfleet.fleet.hostvars import HostVars
from knobfleet.fleet.readhost import plan_from_hostvars
from knobfleet.ops import drift


def test_the_probe_options_carry_the_engines_liveness_url() -> None:
    vllm = probing.probe_args(HostVars(host="v", engine="vllm", listen_host="127.0.1.1", port=8000))
    sglang = probing.probe_args(HostVars(host="s", engine="sglang", listen_host="127.0.1.2", port=30000))
    assert vllm["liveness_url"] == "http://127.0.1.1:8000/v1/completions"
    assert vllm["health_url"] == "http://127.0.1.1:8000/health"
    assert sglang["liveness_url"] == ""  # /health_generate already generates
    assert vllm["liveness_timeout_s"] == probing.LIVENESS_TIMEOUT_S


@pytest.mark.parametrize(("liveness", "sent"), [(True, "http://127.0.1.1:8000/v1/completions"), (False, "")])
def test_only_verify_sends_the_completion(monkeypatch: pytest.MonkeyPatch, liveness: bool, sent: str) -> None:
    seen: list[dict[str, Any]] = []

    def fake_stream(hosts: Any, *_a: Any, **_k: Any) -> Iterator[Any]:
        seen.extend(h.probe for h in hosts)
        return iter(())

    monkeypatch.setattr(probing, "stream", fake_stream)
    plan = plan_from_hostvars([HostVars(host="v", engine="vllm", listen_host="127.0.1.1", port=8000)])
    assert list(drift.stream(plan, Path("inventory"), liveness=liveness)) == []
    assert [p["liveness_url"] for p in seen] == [sent]
