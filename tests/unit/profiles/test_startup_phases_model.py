"""Catalog ``serve.startup_phases``: names and patterns validated where the catalog is read."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from knobfleet.engines.adapter import engine
from knobfleet.profiles.model import StartupPhase

BAD = [
    ({"name": "Weights", "pattern": "x"}, "name"),
    ({"name": "weights", "pattern": ""}, "pattern"),
    ({"name": "weights", "pattern": "init engine (profile"}, r"escape \( \) \[ \] \. with a backslash"),
    ({"name": "weights", "pattern": "x", "extra": 1}, "extra"),
]


@pytest.mark.parametrize(("doc", "named"), BAD)
def test_a_bad_phase_is_refused_naming_the_field(doc: dict[str, object], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        StartupPhase.model_validate(doc)


@pytest.mark.parametrize(
    ("name", "line", "phase"),
    [
        ("sglang", "[2026-12-06 14:00:01] Load weight end. elapsed=8.02 s, type=LlamaForCausalLM", "weights"),
        ("sglang", "[2026-12-06 14:00:09] Capture decode CUDA graph end. elapsed=12.0 s", "cuda_graph"),
        ("vllm", "INFO 12-06 14:00:01 [gpu_model_runner.py:5150] Model loading took 0.1 GiB memory and 2 s", "weights"),
        ("vllm", "INFO 12-06 14:00:09 [monitor.py:20] torch.compile took 41.50 s in total", "torch_compile"),
        ("vllm", "INFO 12-06 14:01:00 [core.py:403] init engine (profile, create kv cache, warmup model) took 9.1 s",
         "init_engine"),
    ],
)  # fmt: skip
def test_the_shipped_catalogs_phases_match_the_engines_own_lines(name: str, line: str, phase: str) -> None:
    import re

    hits = [n for n, p in engine(name).startup_phases if re.search(p, line)]
    assert hits == [phase]
