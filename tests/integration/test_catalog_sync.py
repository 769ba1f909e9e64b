"""The committed vLLM catalog is what the installed engine's own registry gives today.

Installs vLLM (CPU) through the lab's cached installer (~2 min the first time, nothing after), runs its
registry dump and compares the rendered catalog with profiles/catalogs/generated/vllm.yaml byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.engines import sync

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_vllm_catalog_regenerates_identically(tmp_path: Path) -> None:
    path = sync.sync("vllm", tmp_path)
    committed = REPO / "profiles" / "catalogs" / "generated" / "vllm.yaml"
    assert path.read_text(encoding="utf-8") == committed.read_text(encoding="utf-8"), (
        "the vLLM registry differs from the committed catalog: run knobfleet catalog sync vllm and review the diff"
    )
