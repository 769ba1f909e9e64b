"""YAML alias bombs in inventory vars (fleet/inventory.py): one in a var knobfleet never uses costs what its text
costs (the vault-value walk visits each node once), one in a knobfleet host var is refused with one line naming the
host and the var. Each case runs `knobfleet render` in a subprocess under a time limit, with its own state dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knobfleet.fleet.vaultvars import MAX_VALUES, expanded_size, vaulted_values

REPO = Path(__file__).resolve().parents[3]


def bomb(levels: int = 10, width: int = 9) -> str:
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def inventory(tmp_path: Path, extra: str = "") -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    lab1:\n      ansible_host: 127.0.1.1\n")
    (inv / "group_vars" / "all" / "bomb.yml").write_text(bomb() + extra)
    return inv


def render(tmp_path: Path, inv: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KNOBFLEET_STATE_DIR": str(tmp_path / "state"), "KNOBFLEET_INVENTORY_CACHE": "0"}
    cmd = [sys.executable, "-m", "knobfleet", "render", "ctas512", "-i", str(inv), "--what", "env"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=REPO)


def test_a_bomb_in_a_var_knobfleet_does_not_use_costs_nothing(tmp_path: Path) -> None:
    out = render(tmp_path, inventory(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "SGLANG_SM120_MMA_TARGET_CTAS=512" in out.stdout


def test_a_bomb_in_a_knobfleet_var_is_one_line(tmp_path: Path) -> None:
    out = render(tmp_path, inventory(tmp_path, "knob_serve_host_env: {X: *a9}\n"))
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().endswith(
        f"host lab1: knob_serve_host_env holds more than {MAX_VALUES:,} values once its YAML aliases are expanded "
        "(an alias bomb?) or nests deeper than 200; write it out plainly"
    )
    assert len(out.stderr.strip().splitlines()) == 1


@settings(max_examples=40, deadline=2000)
@given(levels=st.integers(1, 40), width=st.integers(1, 12))
def test_the_walks_are_linear_in_distinct_nodes(levels: int, width: int) -> None:
    node: object = ["x"] * width
    for _ in range(levels):
        node = [node] * width
    full = 1 + width  # the innermost list and its leaves, then each level: one list and width copies
    for _ in range(levels):
        full = 1 + width * full
    got = expanded_size(node)
    assert got > MAX_VALUES if full > MAX_VALUES else got == full
    assert vaulted_values(node, set()) == set()


@pytest.mark.parametrize("depth", [199, 5000])
def test_deep_nesting_is_bounded_not_a_recursion_error(depth: int) -> None:
    node: object = "x"
    for _ in range(depth):
        node = [node]
    assert (expanded_size(node) > MAX_VALUES) == (depth > 200)
    assert vaulted_values(node, set()) == set()
