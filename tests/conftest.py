from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def profiles_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A writable copy of the shipped profiles (and catalogs); cwd is its parent so paths print short."""
    target = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", target)
    monkeypatch.chdir(tmp_path)
    from knobfleet.profiles import catalog

    catalog.catalog_for.cache_clear()
    return target
