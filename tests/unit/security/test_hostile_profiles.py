"""Profiles: loader variables need the profile's own allow_unknown; invisible characters are named; a file that is
not a profile is refused without echoing a byte of it. Each case: the exact one-line message."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.cli import run
from knobfleet.errors import ProfileError
from knobfleet.profiles.store import ProfileStore

HEAD = "name: x\nversion: 1\nextends: default\n"


def loader_line(name: str) -> str:
    return (
        f"profiles/x.yaml: env.{name}: a loader variable (it changes what the engine's processes load or run); set it "
        f"in the host vars (knob_serve_host_env.{name}), or name it in this profile's allow_unknown"
    )


@pytest.mark.parametrize(
    "name",
    ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV", "ENV", "IFS", "PATH", "PYTHONPATH", "PYTHONSTARTUP"],
)
def test_loader_variables_are_refused_in_profiles(profiles_dir: Path, name: str) -> None:
    (profiles_dir / "x.yaml").write_text(HEAD + f"env:\n  {name}: /tmp/x\n")
    with pytest.raises(ProfileError) as info:
        ProfileStore(profiles_dir).resolve("x")
    assert info.value.problems == [loader_line(name)]


def test_a_loader_variable_the_profile_names_in_allow_unknown_is_kept(profiles_dir: Path) -> None:
    (profiles_dir / "x.yaml").write_text(HEAD + "allow_unknown: [LD_LIBRARY_PATH]\nenv:\n  LD_LIBRARY_PATH: /opt/x\n")
    profile = ProfileStore(profiles_dir).resolve("x")
    assert profile.env["LD_LIBRARY_PATH"] == "/opt/x"
    from knobfleet.render import profile_vars

    assert profile_vars(profile)["allow_unknown"] == ["LD_LIBRARY_PATH"]  # so the role's preflight lets it through


def test_names_like_loader_prefixes_but_not_loaders_pass(profiles_dir: Path) -> None:
    (profiles_dir / "x.yaml").write_text(HEAD + "allow_unknown: [MY_PATH]\nenv:\n  NCCL_DEBUG: INFO\n  MY_PATH: /x\n")
    assert ProfileStore(profiles_dir).resolve("x").env["MY_PATH"] == "/x"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            'env:\n  "SGLANG_X\\u200b": 1\n',
            "profiles/x.yaml: env.'SGLANG_X\\u200b': invalid env var name; contains U+200B ZERO WIDTH SPACE at "
            "position 8 (invisible); remove it",
        ),
        (
            'args:\n  "tp\\u2060size": 2\n',
            "profiles/x.yaml: args.'tp\\u2060size': invalid flag name; contains U+2060 WORD JOINER at position 2 "
            "(invisible); remove it",
        ),
        (
            'env:\n  NCCL_DEBUG: "INFO\\e[2K"\n',
            "profiles/x.yaml: env.NCCL_DEBUG: the value contains U+001B ESCAPE at position 4 (invisible, or rewrites "
            "the terminal); remove it",
        ),
        (
            'env:\n  NCCL_DEBUG: "WARN\\rINFO"\n',
            "profiles/x.yaml: env.NCCL_DEBUG: the value contains U+000D CARRIAGE RETURN at position 4 (invisible, or "
            "rewrites the terminal); remove it",
        ),
        (
            'env:\n  NCCL_DEBUG: "abc\\u202eofni"\n',
            "profiles/x.yaml: env.NCCL_DEBUG: the value contains U+202E RIGHT-TO-LEFT OVERRIDE at position 3 "
            "(invisible, or rewrites the terminal); remove it",
        ),
        (
            'env:\n  "A B": 1\n',
            "profiles/x.yaml: env.A B: invalid env var name; use letters, digits and _ and do not start with a digit",
        ),
    ],
)
def test_invisible_characters_are_named(profiles_dir: Path, body: str, expected: str) -> None:
    (profiles_dir / "x.yaml").write_text(HEAD + body)
    with pytest.raises(ProfileError) as info:
        ProfileStore(profiles_dir).resolve("x")
    assert info.value.problems == [expected]


SHADOW = "root:$6$c2FsdHNhbHQ$c2VjcmV0aGFzaA:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n"
YAML_SECRET = "aws_secret_access_key: AKIAEXAMPLEKEY\nother: value\n"


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("shadow", SHADOW, "not a profile file (profile files end in .yaml or .yml); check the path"),
        ("creds.yaml", YAML_SECRET, "not a knob profile (it has no name or version field); point at a profile file"),
        ("list.yaml", "- root:x:0:0\n", "expected a mapping with name, version, env, args; got list"),
    ],
)
def test_errors_never_echo_a_stray_files_contents(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    content: str,
    expected: str,
) -> None:
    secret_dir = tmp_path / "etc"
    secret_dir.mkdir()
    (secret_dir / name).write_text(content)
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    for argv in (["render", f"../../etc/{name}"], ["profiles", "validate", f"../../etc/{name}"]):
        code = run(argv)
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1, err
        assert err.strip().endswith(expected), err
        for line in content.splitlines():
            for word in line.replace(":", " ").split():
                if len(word) > 4:
                    assert word not in err, (word, err)
