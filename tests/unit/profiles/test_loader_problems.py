"""Profile files → one readable line per problem (profiles/loader.py), and the lock file write_lock produces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from knobfleet.errors import ProfileError
from knobfleet.profiles.loader import load_doc, pydantic_problems
from knobfleet.profiles.model import ProfileDoc
from knobfleet.profiles.store import LOCK_HEADER, ProfileStore


def problems_of(body: str, profiles_dir: Path) -> list[str]:
    path = profiles_dir / "x.yaml"
    path.write_text(body)
    with pytest.raises(ProfileError) as info:
        load_doc(path)
    return [p.removeprefix("profiles/x.yaml: ") for p in info.value.problems]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("version: 1\n", "name: required field is missing"),
        (
            "name: Bad!\nversion: 1\n",
            "name: 'Bad!' is not a valid name; use lowercase letters, digits, '.', '_' and '-'",
        ),
        ("name: x\nversion: 0\n", "version: 0 is too small; input should be greater than or equal to 1"),
        ("name: x\nversion: 1.5\n", "version: expected an integer version such as 3, got 1.5"),
        ("name: x\nversion: '2'\n", "version: expected an integer version such as 3, got '2'"),
        ("name: x\nversion: 1\nschema_version: 2\n", "schema_version: 2 is not allowed; input should be 1"),
        ("name: x\nversion: 1\nenv: [1, 2]\n", "env: expected a mapping, got list"),
        ("name: x\nversion: 1\ngate: 3\n", "gate: expected a mapping, got int"),
        (
            "name: x\nversion: 1\nenv:\n  A: [1]\n",
            "env.A: expected a string, integer, number, true/false or null, got list",
        ),
        (
            "name: x\nversion: 1\nargs:\n  a: {b: 1}\n",
            "args.a: expected a string, integer, number, true/false or null, got dict",
        ),
        ("name: x\nversion: 1\ngate: {foo: 1}\n", "gate.foo: unknown field"),
        (
            "name: x\nversion: 1\nfingerprint: {sm_count: 0}\n",
            "fingerprint.sm_count: 0 is too small; input should be greater than or equal to 1",
        ),
        ("name: x\nversion: 1\ndescription: [1]\n", "description: input should be a valid string"),
        ("name: x\nversion: 1\nenv:\n  1: a\n", "env.1: names must be strings; quote it"),
        ("name: x\nversion: 1\nargs:\n  2: a\n", "args.2: names must be strings; quote it"),
        ("- a\n", "expected a mapping with name, version, env, args; got list"),
        ("name: x\nversion: 1\nenv: {A: 1\n", None),
    ],
)
def test_one_line_per_problem(profiles_dir: Path, body: str, expected: str | None) -> None:
    got = problems_of(body, profiles_dir)
    if expected is None:  # a YAML syntax error: safeyaml's message, prefixed with the file
        assert len(got) == 1 and got[0]
    else:
        assert got == [expected]


def test_unknown_top_level_field_lists_the_allowed_ones(profiles_dir: Path) -> None:
    (line,) = problems_of("name: x\nversion: 1\nenvs: {}\n", profiles_dir)
    assert line == (
        "envs: unknown field; allowed fields: schema_version, name, version, extends, description, engine, "
        "engine_version, env, args, allow_unknown, gate, fingerprint"
    )


def test_several_problems_one_line_per_field_in_order(profiles_dir: Path) -> None:
    assert problems_of("name: x\nversion: 1\ngate: {min_effect: 2, max_regression: -1}\n", profiles_dir) == [
        "gate.min_effect: input should be less than or equal to 1",
        "gate.max_regression: -1 is too small; input should be greater than or equal to 0",
    ]


def test_a_valid_file_loads(profiles_dir: Path) -> None:
    path = profiles_dir / "x.yaml"
    path.write_text("name: x\nversion: 3\nenv:\n  A: 1\n")
    doc = load_doc(path)
    assert (doc.name, doc.version, doc.env) == ("x", 3, {"A": 1})


def test_top_level_and_union_member_locations() -> None:
    with pytest.raises(ValidationError) as info:
        ProfileDoc.model_validate("just text")
    assert pydantic_problems(info.value) == ["(top level): expected a mapping, got str"]
    with pytest.raises(ValidationError) as info:
        ProfileDoc.model_validate({"name": "x", "version": 1, "env": {"A": [1]}})
    # pydantic reports one error per union member (env.A.str, env.A.int, …): one line for the field
    assert len(info.value.errors()) > 1
    assert pydantic_problems(info.value) == ["env.A: expected a string, integer, number, true/false or null, got list"]


# --- the lock file -----------------------------------------------------------------------------------------


def test_write_lock_records_every_profile_sorted_under_the_header(profiles_dir: Path) -> None:
    (profiles_dir / "profiles.lock").unlink(missing_ok=True)
    st = ProfileStore(profiles_dir)
    lock, added = st.write_lock()
    names = st.names()
    refs = {st.resolve(n).ref: st.resolve(n).content_hash for n in names}
    assert lock == refs and sorted(added) == sorted(refs)
    text = (profiles_dir / "profiles.lock").read_text()
    assert text == LOCK_HEADER + "".join(f"{r}: {refs[r]}\n" for r in sorted(refs))
    assert os.stat(profiles_dir / "profiles.lock").st_mode & 0o777 == 0o644
    assert not list(profiles_dir.glob(".profiles.lock.*"))
    assert st.read_lock() == refs
    assert st.write_lock() == (refs, [])  # relocking changes nothing


def test_write_lock_keeps_old_versions_and_refuses_every_changed_one(profiles_dir: Path) -> None:
    st = ProfileStore(profiles_dir)
    st.write_lock()
    before = (profiles_dir / "profiles.lock").read_text()
    for name in ("ctas512", "ctas768"):
        path = profiles_dir / f"{name}.yaml"
        path.write_text(path.read_text().replace("TARGET_CTAS: ", "TARGET_CTAS: 1"))
    with pytest.raises(ProfileError) as info:
        st.write_lock()
    assert [p.split(":")[0] for p in info.value.problems] == ["profiles/ctas512.yaml", "profiles/ctas768.yaml"]
    assert (profiles_dir / "profiles.lock").read_text() == before
