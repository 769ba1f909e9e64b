from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.errors import ProfileError
from knobfleet.profiles.store import ProfileStore


def write(d: Path, name: str, body: str) -> Path:
    p = d / f"{name}.yaml"
    p.write_text(body, encoding="utf-8")
    return p


def problems(d: Path, name: str) -> list[str]:
    with pytest.raises(ProfileError) as info:
        ProfileStore(d).resolve(name)
    return info.value.problems


def test_shipped_profiles_resolve_with_inheritance(profiles_dir: Path) -> None:
    p = ProfileStore(profiles_dir).resolve("ctas512")
    assert p.ref == "ctas512@2"
    assert p.chain == ("base", "default", "ctas512")
    assert p.env["SGLANG_SM120_MMA_TARGET_CTAS"] == 512
    assert p.env["SGLANG_SM120_MMA_BLOCK_H"] == 32
    assert p.env["SGLANG_OPT_USE_MULTI_STREAM_OVERLAP"] == 0
    assert p.args["disable-overlap-schedule"] is True
    assert p.gate.baseline == "default"


def test_typo_in_knob_gets_exact_one_line_error(profiles_dir: Path) -> None:
    write(profiles_dir, "typo", "name: typo\nversion: 1\nextends: default\nenv:\n  SGLANG_SM120_MMA_TARGET_CTS: 512\n")
    assert problems(profiles_dir, "typo") == [
        "profiles/typo.yaml: env.SGLANG_SM120_MMA_TARGET_CTS: unknown knob; did you mean SGLANG_SM120_MMA_TARGET_CTAS?"
    ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("  SGLANG_SM120_MMA_BLOCK_H: 7", "env.SGLANG_SM120_MMA_BLOCK_H: 7 is not one of 16, 32, 64"),
        ("  SGLANG_SM120_MMA_TARGET_CTAS: abc", "env.SGLANG_SM120_MMA_TARGET_CTAS: expected an integer, got 'abc'"),
        ("  SGLANG_SM120_MMA_TARGET_CTAS: 0", "env.SGLANG_SM120_MMA_TARGET_CTAS: 0 is out of range; allowed 1..65536"),
        ("  SGLANG_SM120_MMA_TARGET_CTAS: true", "env.SGLANG_SM120_MMA_TARGET_CTAS: expected an integer, got true"),
        (
            "  SGLANG_SM120_FLASHMLA_BACKEND: cuda",
            "env.SGLANG_SM120_FLASHMLA_BACKEND: 'cuda' is not one of 'flashinfer', 'triton', 'torch'",
        ),
        (
            "  SGLANG_TOTALLY_NEW: 1",
            "env.SGLANG_TOTALLY_NEW: unknown knob; add it to allow_unknown if sglang really reads it",
        ),
        ("  1BAD: x", "env.1BAD: invalid env var name; use letters, digits and _ and do not start with a digit"),
        ('  "A B": x', "env.A B: invalid env var name; use letters, digits and _ and do not start with a digit"),
    ],
)
def test_bad_env_values(profiles_dir: Path, line: str, expected: str) -> None:
    write(profiles_dir, "bad", f"name: bad\nversion: 1\nextends: default\nenv:\n{line}\n")
    assert problems(profiles_dir, "bad") == [f"profiles/bad.yaml: {expected}"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("  tp: two", "args.tp: expected an integer, got 'two'"),
        ("  mem-fraction-static: 1.5", "args.mem-fraction-static: 1.5 is out of range; allowed 0.05..0.99"),
        (
            "  disable-overlap-schedul: true",
            "args.disable-overlap-schedul: unknown flag; did you mean disable-overlap-schedule?",
        ),
        ("  trust-remote-code: 1", "args.trust-remote-code: expected true (bare flag) or false (omit), got 1"),
    ],
)
def test_bad_flags(profiles_dir: Path, line: str, expected: str) -> None:
    write(profiles_dir, "bad", f"name: bad\nversion: 1\nextends: default\nargs:\n{line}\n")
    assert problems(profiles_dir, "bad") == [f"profiles/bad.yaml: {expected}"]


def test_allow_unknown_and_other_env_are_accepted(profiles_dir: Path) -> None:
    write(
        profiles_dir,
        "x",
        "name: x\nversion: 1\nextends: default\nallow_unknown: [SGLANG_NEW_THING, --new-flag]\n"
        "env:\n  SGLANG_NEW_THING: 'on'\n  NCCL_DEBUG: INFO\nargs:\n  new-flag: 3\n",
    )
    p = ProfileStore(profiles_dir).resolve("x")
    assert p.env["NCCL_DEBUG"] == "INFO" and p.args["new-flag"] == 3


def test_null_removes_inherited_key(profiles_dir: Path) -> None:
    write(
        profiles_dir,
        "x",
        "name: x\nversion: 1\nextends: default\nenv:\n  SGLANG_EXPOSE_OWN_ENV_VARS: null\nargs:\n  tp-size: null\n",
    )
    p = ProfileStore(profiles_dir).resolve("x")
    assert "SGLANG_EXPOSE_OWN_ENV_VARS" not in p.env and "tp-size" not in p.args


def test_extends_cycle_and_missing_parent(profiles_dir: Path) -> None:
    write(profiles_dir, "a", "name: a\nversion: 1\nextends: b\n")
    write(profiles_dir, "b", "name: b\nversion: 1\nextends: a\n")
    assert problems(profiles_dir, "a") == ["profiles/a.yaml: extends: cycle a -> b -> a; remove one extends"]
    write(profiles_dir, "c", "name: c\nversion: 1\nextends: defualt\n")
    assert problems(profiles_dir, "c") == [
        "profiles/c.yaml: extends: profile 'defualt' not found; did you mean default?"
    ]


def test_extends_depth_limit(profiles_dir: Path) -> None:
    write(profiles_dir, "d0", "name: d0\nversion: 1\n")
    for i in range(1, 10):
        write(profiles_dir, f"d{i}", f"name: d{i}\nversion: 1\nextends: d{i - 1}\n")
    (msg,) = problems(profiles_dir, "d9")
    assert "extends: chain deeper than 8" in msg


def test_unknown_top_level_field_and_wrong_version(profiles_dir: Path) -> None:
    write(profiles_dir, "x", "name: x\nversion: '2'\nenvs: {}\n")
    got = problems(profiles_dir, "x")
    assert "profiles/x.yaml: version: expected an integer version such as 3, got '2'" in got
    assert any(p.startswith("profiles/x.yaml: envs: unknown field; allowed fields: schema_version, name") for p in got)


def test_name_must_match_file(profiles_dir: Path) -> None:
    write(profiles_dir, "x", "name: y\nversion: 1\n")
    assert problems(profiles_dir, "x") == [
        "profiles/x.yaml: name: 'y' does not match the file name; rename the file to y.yaml or set name: x"
    ]


def test_lock_detects_changed_published_version(profiles_dir: Path) -> None:
    st = ProfileStore(profiles_dir)
    st.write_lock()
    path = profiles_dir / "ctas512.yaml"
    path.write_text(path.read_text().replace("TARGET_CTAS: 512", "TARGET_CTAS: 640"))
    (msg,) = problems(profiles_dir, "ctas512")
    assert msg.startswith("profiles/ctas512.yaml: version: ctas512@2 is published with sha256:")
    assert msg.endswith("published versions are immutable: bump `version` and run `knobfleet profiles lock`")
    path.write_text(path.read_text().replace("\nversion: 2", "\nversion: 3"))
    lock, added = st.write_lock()
    assert added == ["ctas512@3"] and "ctas512@2" in lock


def test_base_change_requires_bump_of_children(profiles_dir: Path) -> None:
    st = ProfileStore(profiles_dir)
    st.write_lock()
    base = profiles_dir / "base.yaml"
    base.write_text(base.read_text().replace("tp-size: 2", "tp-size: 4"))
    (msg,) = problems(profiles_dir, "ctas512")
    assert "(its content includes base, default)" in msg


def test_hash_ignores_description_but_not_values(profiles_dir: Path) -> None:
    st = ProfileStore(profiles_dir)
    h1 = st.resolve("ctas512").content_hash
    path = profiles_dir / "ctas512.yaml"
    path.write_text(path.read_text().replace("Split-K target 512", "Split-K target of 512"))
    assert st.resolve("ctas512").content_hash == h1
