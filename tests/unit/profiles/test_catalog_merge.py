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


def test_the_cache_dir_is_private_and_holds_every_catalog(fresh_state: Path, tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.yaml").write_text(f"engine: {name}\nenv_prefixes: [X_]\nknobs: {{}}\n")
        assert catalog._cached([tmp_path / f"{name}.yaml"])["engine"] == name
    cache = fresh_state / "cache" / "catalogs"
    assert cache.stat().st_mode & 0o777 == 0o700
    assert sorted(json.loads(p.read_text())["engine"] for p in cache.glob("*.json")) == ["a", "b"]
    # the key is the files' content: an edit is never served from the cache
    (tmp_path / "a.yaml").write_text("engine: a\nenv_prefixes: [Y_]\nknobs: {}\n")
    assert catalog._cached([tmp_path / "a.yaml"])["env_prefixes"] == ["Y_"]


def test_an_overlay_standing_alone_is_merged_like_any_overlay(tmp_path: Path) -> None:
    """Without a generated catalog under it, every knob of an overlay is one upstream does not have: it needs
    its origin (the patch it comes from), as in an overlay on top of a generated catalog."""
    overlay = tmp_path / "toy.overlay.yaml"
    overlay.write_text("engine: toy\nknobs:\n  TOY_X: {kind: env, type: int}\n")
    with pytest.raises(ProfileError) as info:
        catalog._merged([overlay])
    assert info.value.problems == [f"{overlay}: overlay knob 'TOY_X' is not upstream and lacks origin"]
    overlay.write_text("engine: toy\nknobs:\n  TOY_X: {kind: env, type: int, origin: our-patch}\n")
    merged = catalog._merged([overlay])
    assert merged["knobs"]["TOY_X"]["origin"] == "our-patch"
    assert merged["env_prefixes"] == ()  # none given: an empty tuple, which validates


def test_a_catalog_may_be_larger_than_a_profile(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    padding = "".join(f"# {'x' * 76}\n" for _ in range(4000))  # ~310 KiB: over a profile's 256 KiB limit
    big.write_text(f"engine: big\nenv_prefixes: [B_]\nknobs: {{}}\n{padding}")
    assert catalog._read(big)["engine"] == "big"
    huge = tmp_path / "huge.yaml"
    huge.write_text("engine: huge\n" + "#\n" * (2 * 1024 * 1024 + 1))
    with pytest.raises(ProfileError) as info:
        catalog._read(huge)
    assert info.value.problems == [f"{huge}: file is larger than 4096 KiB; check the path"]


def test_a_catalog_that_is_not_yaml_names_its_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: bad\nknobs: [\n")
    with pytest.raises(ProfileError) as info:
        catalog._read(bad)
    (msg,) = info.value.problems
    assert msg.startswith(f"{bad}: line 3, column 1: invalid YAML")
