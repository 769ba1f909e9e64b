from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def seed_record(tmp_path: Path) -> dict[str, Any]:
    """A whole campaign over the seed space on the stand-in's model (simulated stages), its record as kept on disk."""
    import yaml

    from knobfleet.ops import profiles as app
    from knobfleet.tune import run
    from knobfleet.tune.sim import SimStages
    from knobfleet.tune.space import parse

    sp = parse(yaml.safe_load(SEED_SPACE), tmp_path / "seed.yaml", SEED_SPACE)
    stages = SimStages(dict(sp.traffic or {}))
    stages.base = app.store().resolve(sp.base)
    c = run.Campaign(
        sp, stages.base, stages, tmp_path / "seed.json", 188, write_profile=run.write_profile_file(tmp_path)
    )
    c.new_record()
    c.run()
    doc: dict[str, Any] = json.loads((tmp_path / "seed.json").read_text())
    return doc
