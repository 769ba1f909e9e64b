"""safeyaml to the letter: the YAML 1.1 ambiguities it refuses (with the spelling to write instead), the size,
alias, key, encoding and file-type limits at their exact bounds, and agreement with PyYAML's safe_load on
everything it accepts."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from knobfleet.profiles import safeyaml
from knobfleet.profiles.safeyaml import YamlProblem


def problem(text: str) -> str:
    with pytest.raises(YamlProblem) as info:
        safeyaml.loads(text)
    return str(info.value)


@pytest.mark.parametrize(
    ("scalar", "read_as", "write"),
    [
        ("on", "True", "true"),
        ("Off", "False", "false"),
        ("yes", "True", "true"),
        ("NO", "False", "false"),
        ("010", "8", "8"),
        ("0b11", "3", "3"),
        ("1_000", "1000", "1000"),
        ("12:30", "750", "750"),
        ("1_000.5", "1000.5", "1000.5"),
        ("12:30.5", "750.5", "750.5"),
    ],
)
def test_a_yaml_1_1_reading_is_refused_with_both_fixes(scalar: str, read_as: str, write: str) -> None:
    for text, line in ((f"a: {scalar}\n", 1), (f"x: 1\n\nb:\n  - {scalar}\n", 4)):
        assert problem(text) == (
            f"line {line}: {scalar!r} is read by YAML 1.1 as {read_as}; quote it ('{scalar}') to keep the text, "
            f"or write {write}"
        )
    # either fix loads, the first as text, the second as the value
    assert safeyaml.loads(f"a: '{scalar}'\n") == {"a": scalar}
    assert safeyaml.loads(f'a: "{scalar}"\n') == {"a": scalar}
    assert safeyaml.loads(f"a: {write}\n") == yaml.safe_load(f"a: {scalar}\n")


ACCEPTED = [
    "a: 1\nb: -2\nc: +3\nd: 0x1F\ne: 0o17\n",
    "a: .5\nb: 1.\nc: -1.5e3\nd: 1.0e+3\ne: -.inf\nf: .NaN\ng: .Inf\n",
    "a: true\nb: False\nc: TRUE\nd: ~\ne: null\nf: ''\n",
    "a: 08\nb: 1e3\nc: 0o8\nd: 'text with: colon'\n",
    "env:\n  A: 1\n  B: [x, 'y', {c: 2}]\nargs: {tp: 2, flag: true}\n",
    "a: &x {b: 1}\nc: *x\n",
    "a: &x {b: *x}\n",
    "- &l [*l, 1]\n",
    "a: |\n  two\n  lines\nb: >-\n  folded\n  text\n",
    "'quoted key': 1\n2: two\n",
    "",
    "# only a comment\n",
]


def same(a: Any, b: Any) -> bool:
    """Equality that treats nan as nan and compares recursive structures by shape."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(a[k] is a or same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(x is a or same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("text", ACCEPTED)
def test_what_is_accepted_reads_as_pyyaml_reads_it(text: str) -> None:
    assert same(safeyaml.loads(text), yaml.safe_load(text))


def test_duplicate_keys_name_both_lines() -> None:
    assert problem("a: 1\nb:\n  c: 1\n  c: 2\n") == "line 4: duplicate key 'c' (first at line 3); remove one of them"
    assert problem("1: a\n'1': b\n2: c\n2: d\n") == "line 4: duplicate key 2 (first at line 3); remove one of them"


@pytest.mark.parametrize(
    ("text", "kind", "line"), [("? [a, b]\n: x\n", "list", 1), ("x: 1\n? {a: 1}\n: x\n", "mapping", 2)]
)
def test_a_collection_as_a_key_is_a_problem_not_a_crash(text: str, kind: str, line: int) -> None:
    assert problem(text) == f"line {line}: a {kind} as a key; keys are names"


def aliases(n: int) -> str:
    return "a: &a x\nb: [" + ", ".join(["*a"] * n) + "]\n"


def test_up_to_32_aliases_are_fine_the_33rd_is_refused() -> None:
    assert safeyaml.loads(aliases(safeyaml.MAX_ALIASES)) == {"a": "x", "b": ["x"] * 32}
    assert problem(aliases(33)) == "line 2: more than 32 YAML aliases; write the values out instead of using anchors"
    assert problem("x: 0\n\n" + aliases(40)).startswith("line 4: more than 32 YAML aliases")


def test_the_size_limit_is_inclusive(tmp_path: Path) -> None:
    text = "a: " + "x" * (safeyaml.MAX_BYTES - 4) + "\n"
    assert len(text.encode()) == safeyaml.MAX_BYTES
    assert safeyaml.loads(text) == {"a": "x" * (safeyaml.MAX_BYTES - 4)}
    path = tmp_path / "p.yaml"
    path.write_text(text)
    assert safeyaml.load_file(path)["a"].startswith("xxx")
    too_big = text.replace("x", "é", 1)  # one byte more in UTF-8, same length in characters
    assert problem(too_big) == "file is larger than 256 KiB; profiles are small, check the path"
    path.write_text(too_big)
    with pytest.raises(YamlProblem, match=r"^file is larger than 256 KiB; profiles are small, check the path$"):
        safeyaml.load_file(path)
    assert safeyaml.load_file(path, max_bytes=safeyaml.MAX_BYTES + 1)["a"].startswith("éx")
    with pytest.raises(YamlProblem, match=r"^file is larger than 1 KiB; check the path$"):
        safeyaml.loads(text, max_bytes=1024)


def test_files_that_cannot_be_profiles(tmp_path: Path) -> None:
    with pytest.raises(YamlProblem, match=r"^cannot read: No such file or directory$"):
        safeyaml.load_file(tmp_path / "missing.yaml")
    with pytest.raises(YamlProblem, match=r"^is a directory, not a regular file; point at a YAML file$"):
        safeyaml.load_file(tmp_path)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(YamlProblem, match=r"^is a FIFO \(named pipe\), not a regular file; point at a YAML file$"):
        safeyaml.load_file(fifo)  # opened non-blocking, never read: reading a fifo would hang
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(b"a: x\x00y\n")
    with pytest.raises(YamlProblem, match=r"^contains a NUL byte; remove it$"):
        safeyaml.load_file(nul)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"a: caf\xe9\n")
    with pytest.raises(YamlProblem, match=r"^byte 6: not valid UTF-8; save the file as UTF-8$"):
        safeyaml.load_file(latin)


def test_syntax_errors_name_line_and_column() -> None:
    assert problem("a: [1, 2\n") == "line 2, column 1: invalid YAML: expected ',' or ']', but got '<stream end>'"
    assert problem("a: 1\n b: 2\n").startswith("line 2, column 3: invalid YAML: mapping values are not allowed")
    assert problem("--- a\n--- b\n") == "line 2, column 1: invalid YAML: but found another document"


def test_deep_nesting_is_a_problem_not_a_crash() -> None:
    assert problem("a: " + "[" * 5000 + "]" * 5000 + "\n") == "nested too deeply; profiles are flat maps of knobs"


@pytest.mark.parametrize(
    ("text", "where", "char"),
    [
        ("a: \x07\n", "line 1, column 4", "0007"),
        ("a: 1\nb: x\x1by\n", "line 2, column 5", "001B"),
        ("a: \ud800", "line 1, column 4", "D800"),
        ("\n\x07", "line 2, column 1", "0007"),
    ],
)
def test_a_control_character_is_a_problem_not_a_crash(text: str, where: str, char: str) -> None:
    assert problem(text) == f"{where}: invalid YAML: character U+{char} is not allowed; remove it"


def test_a_control_character_in_a_profile_file_names_the_file(tmp_path: Path) -> None:
    from knobfleet.errors import ProfileError
    from knobfleet.profiles.loader import load_doc

    path = tmp_path / "p.yaml"
    path.write_bytes(b"name: p\nversion: 1\nenv:\n  A: \x1b[31m\n")
    with pytest.raises(ProfileError) as info:
        load_doc(path)
    assert info.value.problems == [
        f"{path}: line 4, column 6: invalid YAML: character U+001B is not allowed; remove it"
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "a: 0x_\n",
            "line 1: '0x_' cannot be read as int (invalid literal for int() with base 16: ''); quote it ('0x_')",
        ),
        (
            "x: 1\na: -0b_\n",
            "line 2: '-0b_' cannot be read as int (invalid literal for int() with base 2: ''); quote it",
        ),
        ("a: 2020-13-45\n", "line 1: '2020-13-45' cannot be read as timestamp (month must be in 1..12); quote it"),
        ("a: !!float x\n", "line 1: 'x' cannot be read as float (could not convert string to float: 'x'); quote it"),
        ("a: [1, !!bool x]\n", "line 1: 'x' cannot be read as bool ('x'); quote it ('x') to keep the text"),
    ],
)
def test_a_value_pyyaml_cannot_construct_is_a_problem_not_a_crash(text: str, message: str) -> None:
    assert problem(text).startswith(message)
