"""The in-tree collection folder is a template: `ansible-galaxy collection build collection/` must not make a
tarball that `ansible-galaxy collection install` rejects later ("invalid semantic version")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from knobfleet import __version__, collection

ROOT = Path(__file__).resolve().parents[2]


def test_the_template_is_not_a_buildable_galaxy_yml() -> None:
    assert not (ROOT / "collection" / "galaxy.yml").exists()
    head = (ROOT / "collection" / "galaxy.yml.in").read_text(encoding="utf-8").splitlines()[:3]
    assert any("make collection" in line for line in head)


def test_a_direct_build_fails_before_writing_a_tarball(tmp_path: Path) -> None:
    galaxy = Path(sys.executable).with_name("ansible-galaxy")
    proc = subprocess.run(
        [str(galaxy), "collection", "build", str(ROOT / "collection"), "--output-path", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "galaxy.yml" in proc.stdout + proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_generated_galaxy_yml_has_a_semantic_version(tmp_path: Path) -> None:
    tree = collection.stage_collection(ROOT, tmp_path / "c")
    meta = yaml.safe_load((tree / "galaxy.yml").read_text(encoding="utf-8"))
    assert meta["version"] == __version__
    assert not (tree / "galaxy.yml").read_text(encoding="utf-8").startswith("#")
