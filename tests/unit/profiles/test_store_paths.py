"""Which file a profile name or path means (ProfileStore.path_of), what a user sees when there is none, and
which catalogs a profiles folder is checked against."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from knobfleet import paths
from knobfleet.errors import ProfileError
from knobfleet.profiles import catalog
from knobfleet.profiles.store import ProfileStore


def refusal(store: ProfileStore, name: str) -> list[str]:
    with pytest.raises(ProfileError) as info:
        store.path_of(name)
    return info.value.problems


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("ctas51", "; did you mean ctas512?"),
        ("vllm-seqs", "; did you mean vllm-seqs8?"),
        ("zzz", "; run `knobfleet profiles list`"),
    ],
)
def test_an_unknown_name_says_what_was_meant_or_how_to_list(profiles_dir: Path, name: str, hint: str) -> None:
    assert refusal(ProfileStore(profiles_dir), name) == [f"profiles: profile {name!r} not found{hint}"]


def test_a_name_is_a_file_in_the_folder_and_a_path_is_a_path(
    profiles_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ProfileStore(profiles_dir)
    assert store.path_of("ctas512") == profiles_dir / "ctas512.yaml"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("solo.yaml", "solo.yml"):
        (elsewhere / name).write_text("name: solo\nversion: 1\n")
    monkeypatch.chdir(elsewhere)
    # a file name (by its .yaml/.yml suffix) is read from the working directory, not the profiles folder
    assert store.path_of("solo.yaml") == elsewhere / "solo.yaml"
    assert store.path_of("solo.yml") == elsewhere / "solo.yml"
    assert store.resolve("solo.yml").ref == "solo@1"
    # so is a path with a folder in it, suffix or not
    assert store.path_of("../profiles/ctas512.yaml") == profiles_dir / "ctas512.yaml"
    assert store.path_of("../elsewhere/solo") == elsewhere / "solo"


def test_a_profiles_folder_without_catalogs_uses_the_shipped_ones(profiles_dir: Path, tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    shutil.copy(profiles_dir / "base.yaml", own / "base.yaml")
    catalog.catalog_for.cache_clear()
    store = ProfileStore(own)
    assert store.catalog_dir == paths.catalogs_dir()
    assert store.resolve("base").engine == "sglang"
    assert ProfileStore(profiles_dir).catalog_dir == profiles_dir / "catalogs"
    assert ProfileStore(own, catalog_dir=profiles_dir / "catalogs").catalog_dir == profiles_dir / "catalogs"
