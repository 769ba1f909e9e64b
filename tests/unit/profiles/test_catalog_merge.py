"""Catalog files → one catalog, computed afresh (profiles/catalog._merged) rather than read back from the
JSON cache under the state dir, which would hide a wrong merge behind the result of an earlier right one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from knobfleet.errors import ProfileError
from knobfleet.profiles import catalog

CATALOGS = Path(__file__).resolve().parents[3] / "profiles" / "catalogs"


@pytest.fixture(autouse=True)
def fresh_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    state = tmp_path / "state"
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(state))
    catalog.catalog_for.cache_clear()
    yield state
    catalog.catalog_for.cache_clear()


def test_generated_plus_overlay_merges_the_overlay_on_top(fresh_state: Path) -> None:
    files = catalog.catalog_files("sglang", CATALOGS)
    assert [f.name for f in files] == ["sglang.yaml", "sglang.overlay.yaml"]
    merged = catalog._merged(files)
    generated, overlay = catalog._read(files[0]), catalog._read(files[1])
    assert merged["engine"] == "sglang"
    assert set(overlay["knobs"]) <= set(merged["knobs"]) and set(generated["knobs"]) <= set(merged["knobs"])
    assert merged["serve"] == overlay["serve"]
    # the cache holds exactly what the merge gave, keyed by the files' content
    assert catalog._cached(files) == json.loads(json.dumps(merged))
    (cached,) = (fresh_state / "cache" / "catalogs").glob("*.json")
    assert json.loads(cached.read_text()) == json.loads(json.dumps(merged))


def test_an_overlay_without_generated_catalog_stands_alone(tmp_path: Path) -> None:
    (tmp_path / "toy.overlay.yaml").write_text("engine: toy\nenv_prefixes: [TOY_]\nknobs: {}\n")
    files = catalog.catalog_files("toy", tmp_path)
    assert files == [tmp_path / "toy.overlay.yaml"]
    merged = catalog._merged(files)
    assert (merged["engine"], merged["env_prefixes"], merged["knobs"]) == ("toy", ["TOY_"], {})


def test_a_hand_written_catalog_is_read_as_it_is(tmp_path: Path) -> None:
    own = tmp_path / "toy.yaml"
    own.write_text("engine: toy\nenv_prefixes: [TOY_]\nknobs: {}\n")
    assert catalog.catalog_files("toy", tmp_path) == [own]
    assert catalog._merged([own]) == {"engine": "toy", "env_prefixes": ["TOY_"], "knobs": {}}
    assert catalog.engine_names(tmp_path) == ["toy"]


def test_engine_names_from_catalog_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("engine: a\n")
    (tmp_path / "b.overlay.yaml").write_text("engine: b\n")
    (tmp_path / "c.d.yaml").write_text("engine: c\n")
    assert catalog.engine_names(tmp_path) == ["a", "b"]
    assert catalog.engine_names(CATALOGS) == ["sglang", "vllm"]


def test_a_bad_overlay_names_its_file(tmp_path: Path) -> None:
    (tmp_path / "toy.overlay.yaml").write_text("- not a mapping\n")
    with pytest.raises(ProfileError) as info:
        catalog._merged(catalog.catalog_files("toy", tmp_path))
    assert info.value.problems[0].endswith("toy.overlay.yaml: expected a mapping with engine, env_prefixes and knobs")


@pytest.mark.parametrize(("value", "shown"), [(True, "true"), (False, "false"), ("x", "'x'"), (3, "3"), (0.5, "0.5")])
def test_values_in_messages(value: str | bool | int | float, shown: str) -> None:
    assert catalog._fmt(value) == shown


def test_did_you_mean() -> None:
    assert catalog.did_you_mean("tp-sise", ["tp-size", "dp-size"]) == "; did you mean tp-size?"
    assert catalog.did_you_mean("zzz", ["tp-size"]) == ""
