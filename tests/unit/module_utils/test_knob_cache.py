"""module_utils/knob_cache.cache_state: off / cold / warm, read-only, no symlink followed, light."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from knobfleet.module_utils import knob_cache
from knobfleet.module_utils.knob_cache import cache_state


def test_off_cold_warm(tmp_path: Path) -> None:
    assert cache_state(None) == "off" and cache_state("") == "off"
    assert cache_state(str(tmp_path / "missing")) == "cold"
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert cache_state(str(tmp_path)) == "cold"  # folders only
    (tmp_path / "a" / "b" / "kernel.so").write_bytes(b"x")
    assert cache_state(str(tmp_path)) == "warm"
    assert cache_state(str(tmp_path / "a" / "b" / "kernel.so")) == "cold"  # a file is no cache folder


def test_a_symlink_below_the_root_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "f").write_text("x")
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(elsewhere)
    (root / "flink").symlink_to(elsewhere / "f")
    assert cache_state(str(root)) == "cold"


def test_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(knob_cache, "MAX_ENTRIES", 3)
    for i in range(5):
        (tmp_path / f"d{i}").mkdir()
    (tmp_path / "d0" / "f").write_text("x")
    assert cache_state(str(tmp_path)) == "cold"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every folder")
def test_unreadable_is_cold(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    tmp_path.chmod(0)
    try:
        assert cache_state(str(tmp_path)) == "cold"
    finally:
        tmp_path.chmod(0o755)


def test_it_imports_only_os() -> None:
    tree = ast.parse(Path(knob_cache.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"os", "__future__"}
