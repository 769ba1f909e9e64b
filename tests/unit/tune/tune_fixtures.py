from __future__ import annotations

from pathlib import Path

import pytest

SEED_SPACE = """\
schema_version: 1
name: seed
base: ctas512
knobs:
  SGLANG_SM120_MMA_TARGET_CTAS: [256, 384, 512, 640, 768]
  SGLANG_SM120_MMA_BLOCK_H: [16, 32, 64]
traffic: {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}
budget: {wall: 2h, host_minutes: 60}
stages:
  model: {keep: 4, margin: 0.10}
  kernel: {skip: "no GPU host in the lab"}
  engine: {host: lab1, keep: 3}
  live: {hosts: 1}
"""


@pytest.fixture
def space_file(tmp_path: Path) -> Path:
    p = tmp_path / "seed.yaml"
    p.write_text(SEED_SPACE)
    return p
