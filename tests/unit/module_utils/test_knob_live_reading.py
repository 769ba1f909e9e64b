"""Reading serve scripts and generations (module_utils/knob_live.py): the shell lexer word for word against
bash itself, which exports and exec line a script yields, and the expected state built from a generation or
from rendered files."""

from __future__ import annotations

import hashlib
import subprocess
from typing import Any

import pytest

from knobfleet.module_utils.knob_live import expected_from_files, expected_from_generation
from knobfleet.module_utils.knob_redact import redact_value
from knobfleet.module_utils.knob_shell import script_env_argv, shell_statements

# One statement each: what bash makes of the words (checked against bash below) and what the lexer must.
WORDS = [
    ("a b\tc", ["a", "b", "c"]),
    ("  a   b  ", ["a", "b"]),
    ("'a b' c", ["a b", "c"]),
    ("'a \\ \" $x'", ['a \\ " $x']),
    ('"a b"', ["a b"]),
    ('"\\$x \\` \\" \\\\ \\n \\a"', ['$x ` " \\ \\n \\a']),
    ('"\\X\\a"', ["\\X\\a"]),  # a backslash escapes only $ ` " \\ and newline in double quotes
    ('"line\\\nnext"', ["linenext"]),
    ('"a\nb"', ["a\nb"]),
    ("a\\ b", ["a b"]),
    ("a\\\nb c", ["ab", "c"]),
    ("\\'x\\\"", ["'x\""]),
    ("a'b'\"c\"d", ["abcd"]),
    ("''", [""]),
    ('""', [""]),
    ("x '' y", ["x", "", "y"]),
    ("a#b c", ["a#b", "c"]),
    ("a #b c", ["a"]),
    ("--port=1 '--x=a b'", ["--port=1", "--x=a b"]),
    ("$HOME '$HOME'", ["$HOME", "$HOME"]),  # kept as text, never expanded (bash check skipped)
]


@pytest.mark.parametrize(("text", "words"), WORDS)
def test_one_statement_word_for_word(text: str, words: list[str]) -> None:
    assert shell_statements(text) == [words]


@pytest.mark.parametrize(("text", "words"), [w for w in WORDS if "$HOME" not in w[0]])
def test_the_lexer_agrees_with_bash(text: str, words: list[str]) -> None:
    out = subprocess.run(
        ["bash", "-c", "printf '<%s>' " + text], capture_output=True, text=True, check=True, env={}
    ).stdout
    assert out == "".join(f"<{w}>" for w in words)


@pytest.mark.parametrize(
    ("text", "statements"),
    [
        ("a; b", [["a"], ["b"]]),
        ("a;b\nc", [["a"], ["b"], ["c"]]),
        ("\n\n;;\n", []),
        ("a\n\n\nb\n", [["a"], ["b"]]),
        ("# only a comment\n", []),
        ("a # comment ; not a statement\nb", [["a"], ["b"]]),
        ("#!/bin/bash\nexport A=1\n", [["export", "A=1"]]),
        ("a 'x;y' \"p;q\" r\\;s", [["a", "x;y", "p;q", "r;s"]]),
        ("a 'x\ny'", [["a", "x\ny"]]),
        ("exec \\\n  /bin/x \\\n  --a=1\n", [["exec", "/bin/x", "--a=1"]]),
        ("# comment at the end without newline", []),
    ],
)
def test_statements(text: str, statements: list[list[str]]) -> None:
    assert shell_statements(text) == statements


@pytest.mark.parametrize(
    ("text", "statements"),
    [
        ("a 'unterminated", [["a", "unterminated"]]),  # an open quote runs to the end
        ('a "unterminated', [["a", "unterminated"]]),
        ('"ends in \\', [["ends in \\"]]),  # a backslash with nothing after it in double quotes is kept
        ('"ends in \\$', [["ends in $"]]),  # ... and one before the last character still escapes it
        ("a\\", [["a"]]),  # a last backslash escapes nothing
        ("\\", []),
        ("'", [[""]]),
    ],
)
def test_broken_text_never_raises(text: str, statements: list[list[str]]) -> None:
    assert shell_statements(text) == statements


@pytest.mark.parametrize(
    ("script", "env", "argv"),
    [
        ("export A=1\nexport B='x y' C=\nexec /bin/e --a=1\n", {"A": "1", "B": "x y", "C": ""}, ["/bin/e", "--a=1"]),
        ("export _X1=a\n", {"_X1": "a"}, []),
        ("export 1A=x A-B=y =z NOVALUE É=1 OK=1\n", {"OK": "1"}, []),
        ("export A=1=2\n", {"A": "1=2"}, []),
        ("exec /bin/a\nexec /bin/b x\n", {}, ["/bin/b", "x"]),  # the last exec line runs
        ("exec\n", {}, []),
        ("echo export A=1\nA=2 exec x\n", {}, []),  # neither an export nor an exec statement
        ("set -e; export A=1; exec x y\n", {"A": "1"}, ["x", "y"]),
    ],
)
def test_script_env_argv(script: str, env: dict[str, str], argv: list[str]) -> None:
    assert script_env_argv(script) == (env, argv)


# --- expected state --------------------------------------------------------------------------------------------

SCRIPT = "#!/bin/bash\nexport K=1\nexec /bin/e --a=1\n"


def generation_doc(**gens: Any) -> dict[str, Any]:
    meta = {
        "profile": "p",
        "version": 2,
        "hash": "sha256:h",
        "files": {
            "script": {"path": "/root/serve.sh", "name": "serve.sh", "sha256": "s1"},
            "unit": {"path": "/etc/systemd/system/e.service", "name": "e.service", "sha256": "u1"},
        },
    }
    return {
        "generations": {
            "current": 3,
            "list": [{"generation": 2, "meta": {}}, {"generation": 3, "meta": meta}, "junk"],
            "current_files": {"serve.sh": {"content": SCRIPT}, "e.service": {"content": "[Service]\n"}},
            **gens,
        }
    }


def test_expected_from_the_current_generation() -> None:
    expected, why = expected_from_generation(generation_doc())
    assert why is None
    assert expected == {
        "generation": 3,
        "profile": {"name": "p", "version": 2, "hash": "sha256:h"},
        "files": {
            "script": {"path": "/root/serve.sh", "sha256": "s1", "content": SCRIPT},
            "unit": {"path": "/etc/systemd/system/e.service", "sha256": "u1", "content": "[Service]\n"},
        },
        "env": {"K": "1"},
        "argv": ["/bin/e", "--a=1"],
        "script_known": True,
    }


def test_a_generation_whose_files_were_not_read_knows_no_env() -> None:
    expected, _ = expected_from_generation(generation_doc(current_files={}))
    assert expected is not None
    assert expected["files"]["script"] == {"path": "/root/serve.sh", "sha256": "s1", "content": None}
    assert (expected["env"], expected["argv"], expected["script_known"]) == ({}, [], False)


def test_a_generation_without_a_script_path_has_no_script() -> None:
    doc = generation_doc()
    meta = doc["generations"]["list"][1]["meta"]
    meta["files"] = {"script": {"path": "", "sha256": "s"}, "unit": meta["files"]["unit"], "other": {"path": "/x"}}
    expected, _ = expected_from_generation(doc)
    assert expected is not None and set(expected["files"]) == {"unit"} and expected["script_known"] is False


@pytest.mark.parametrize(
    ("gens", "result"),
    [
        ({}, (None, None)),
        ({"current": None, "list": []}, (None, None)),
        ({"current": 7, "list": []}, (None, "generation 0007: meta.json missing or unreadable (not found)")),
        (
            {"current": 7, "list": [{"generation": 7, "meta": "garbage"}], "errors": ["bad json", "io"]},
            (None, "generation 0007: meta.json missing or unreadable (bad json; io)"),
        ),
    ],
)
def test_no_or_an_unreadable_generation(gens: dict[str, Any], result: tuple[Any, Any]) -> None:
    assert expected_from_generation({"generations": gens} if gens else {}) == result


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_expected_from_rendered_files_hashes_the_bytes_and_hides_secrets() -> None:
    script = "#!/bin/bash\nexport HF_TOKEN=hunter2\nexport MINE=x\nexport NAME=café\nexec /bin/e --a=1\n"
    unit = "[Service]\nDescription=café\n"
    expected = expected_from_files("/s.sh", script, "/u.service", unit, sha, ["MINE"])
    assert expected["files"]["script"]["sha256"] == sha(script.encode("utf-8"))
    assert expected["files"]["unit"] == {"path": "/u.service", "sha256": sha(unit.encode("utf-8")), "content": unit}
    assert expected["files"]["script"]["path"] == "/s.sh"
    shown = expected["files"]["script"]["content"]
    assert "hunter2" not in shown and "MINE='x'" not in shown
    assert expected["env"] == {"HF_TOKEN": redact_value("hunter2"), "MINE": redact_value("x"), "NAME": "café"}
    assert expected["argv"] == ["/bin/e", "--a=1"]
    assert (expected["generation"], expected["profile"], expected["script_known"]) == (None, None, True)
    plain = expected_from_files("/s.sh", script, "/u.service", unit, sha)
    assert plain["env"]["MINE"] == "x" and plain["env"]["HF_TOKEN"] == redact_value("hunter2")
