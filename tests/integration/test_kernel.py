"""The kernel bench role on a lab host: no GPU there, so it must report skipped, as a success."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from knobfleet.kernel import commands
from knobfleet.kernel.grid import Grid
from tests.integration.conftest import Fleet, boot_fleet

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def one_host(lab_state: Path) -> Iterator[Fleet]:
    f = boot_fleet(lab_state, 1)
    yield f
    f.lab.down()


def test_role_skips_cleanly_without_a_gpu(one_host: Fleet, tmp_path: Path) -> None:
    grid = Grid(batches=(8, 16), target_ctas=(256, 512), block_h=(32,), heads=(64,), contexts=(2048,))
    out = tmp_path / "sweep.json"
    summary = commands.kernel_bench(one_host.inventory, "lab1", grid, budget_s=10, out=out)
    assert summary == {"host": "lab1", "skipped": True, "reason": "skipped: no torch on lab1"}
    assert commands.render_bench(summary) == "skipped: no torch on lab1"
    assert not out.exists()
    # the role shipped its script and left no grid or result behind
    listing = one_host.ssh("lab1", "ls /var/lib/knobfleet/kernel").stdout.split()
    assert listing == ["kernel_bench.py"]
