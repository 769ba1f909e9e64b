from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.errors import ProfileError
from knobfleet.profiles import safeyaml
from knobfleet.profiles.store import ProfileStore

LAUGHS = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
)


def test_duplicate_keys_are_errors() -> None:
    with pytest.raises(safeyaml.YamlProblem, match=r"line 3: duplicate key 'a' \(first at line 1\)"):
        safeyaml.loads("a: 1\nb: 2\na: 3\n")


def test_billion_laughs_fails_fast() -> None:
    with pytest.raises(safeyaml.YamlProblem, match="more than 32 YAML aliases"):
        safeyaml.loads(LAUGHS)


def test_size_limit(tmp_path: Path) -> None:
    p = tmp_path / "big.yaml"
    p.write_text("a: " + "x" * (safeyaml.MAX_BYTES + 1))
    with pytest.raises(safeyaml.YamlProblem, match="larger than 256 KiB"):
        safeyaml.load_file(p)


def test_unsafe_tags_refused() -> None:
    with pytest.raises(safeyaml.YamlProblem, match="invalid YAML"):
        safeyaml.loads("a: !!python/object/apply:os.system ['true']\n")


def test_non_utf8_and_nul_rejected_at_load(profiles_dir: Path) -> None:
    (profiles_dir / "x.yaml").write_bytes(b'name: x\nversion: 1\nenv:\n  FOO: "\xff\xfe"\n')
    with pytest.raises(ProfileError) as info:
        ProfileStore(profiles_dir).resolve("x")
    assert info.value.problems == ["profiles/x.yaml: byte 32: not valid UTF-8; save the file as UTF-8"]
    (profiles_dir / "y.yaml").write_text('name: y\nversion: 1\nenv:\n  FOO: "a\\0b"\n')
    with pytest.raises(ProfileError) as info:
        ProfileStore(profiles_dir).resolve("y")
    assert info.value.problems == ["profiles/y.yaml: env.FOO: contains a NUL byte; remove it"]


def test_syntax_error_names_line(profiles_dir: Path) -> None:
    (profiles_dir / "x.yaml").write_text("name: x\nversion: 1\nenv: [\n")
    with pytest.raises(ProfileError) as info:
        ProfileStore(profiles_dir).resolve("x")
    (msg,) = info.value.problems
    assert msg.startswith("profiles/x.yaml: line 4, column 1: invalid YAML")
