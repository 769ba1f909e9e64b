"""``catalog sync``'s output (issue 56): a symlink, FIFO or device planted where it writes, or an --out-dir that is
not a folder, is refused in one line before the engine's registry is dumped, and nothing is written through it;
a real catalog is written atomically and an unchanged one keeps its mtime. Nodes are made in a temp dir."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from knobfleet.engines import sync
from knobfleet.errors import KnobfleetError

TEXT = "# generated\nknobs: {}\n"


@pytest.fixture
def dumped(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def fake_dump(engine: str, *_: Any) -> dict[str, Any]:
        calls.append(engine)
        return {}

    monkeypatch.setattr(sync, "dump", fake_dump)
    monkeypatch.setattr(sync, "render_dump", lambda _data: TEXT)
    return calls


def _plant(kind: str, path: Path, victim: Path) -> None:
    if kind == "symlink":
        path.symlink_to(victim)
    elif kind == "dangling":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()


@pytest.mark.parametrize("kind", ["symlink", "dangling", "fifo", "folder"])
def test_a_planted_node_at_the_output_is_refused_before_the_dump(kind: str, tmp_path: Path, dumped: list[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    _plant(kind, out / "vllm.yaml", victim)
    with pytest.raises(KnobfleetError) as exc:
        sync.sync("vllm", out)
    msg = str(exc.value)
    assert "vllm.yaml" in msg and "nothing was written" in msg and "\n" not in msg
    assert dumped == [] and victim.read_text() == "keep\n"
    assert sorted(p.name for p in out.iterdir()) == ["vllm.yaml"]  # no temp file left beside it


@pytest.mark.parametrize("kind", ["symlink", "fifo", "file"])
def test_an_out_dir_that_is_no_folder_is_refused(kind: str, tmp_path: Path, dumped: list[str]) -> None:
    real = tmp_path / "real"
    real.mkdir()
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("x")
    else:
        _plant(kind, out, real)
    with pytest.raises(KnobfleetError, match="nothing was written"):
        sync.sync("vllm", out)
    assert dumped == [] and list(real.iterdir()) == []


def test_a_catalog_is_written_and_an_unchanged_one_kept(tmp_path: Path, dumped: list[str]) -> None:
    out = tmp_path / "new" / "folder"
    path = sync.sync("vllm", out)
    assert path == out / "vllm.yaml" and path.read_text() == TEXT
    os.utime(path, (1, 1))
    assert sync.sync("vllm", out) == path and path.stat().st_mtime == 1  # unchanged: not rewritten
    path.write_text("old\n")
    sync.sync("vllm", out)
    assert path.read_text() == TEXT and sorted(p.name for p in out.iterdir()) == ["vllm.yaml"]


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_node_planted_at_the_old_fixed_temp_name_is_never_written_through(
    kind: str, tmp_path: Path, dumped: list[str]
) -> None:
    """Before 0.2.4 sync wrote OUT/<engine>.yaml.tmp with Path.write_text: through a symlink there, or hanging on
    a FIFO. The temp file now has a random name (safefile)."""
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    _plant(kind, out / "vllm.yaml.tmp", victim)
    assert sync.sync("vllm", out).read_text() == TEXT
    assert victim.read_text() == "keep\n"
