"""Hostile inputs, one row per class from the audit: each gets one clear line naming file/field and fix (or a
usage error), never a traceback, and changes nothing (nothing here reaches a host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.cli import run
from knobfleet.errors import InventoryError
from knobfleet.fleet.hostvars import from_inventory_vars
from knobfleet.profiles import safeyaml
from knobfleet.profiles.store import ProfileStore

PROFILE = "name: x\nversion: 1\nextends: default\n"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # names are matched whole: a trailing newline cannot add a shell line
        ('env:\n  "SGLANG_SM120_MMA_TARGET_CTAS\\n": 512\n', "invalid env var name"),
        ('args:\n  "tp-size\\nx": 2\n', "invalid flag name"),
        # YAML 1.1 would silently change these values' meaning
        ("env:\n  SGLANG_SM120_MMA_TARGET_CTAS: 8:32\n", "'8:32' is read by YAML 1.1 as 512"),
        ("env:\n  NCCL_DEBUG: on\n", "'on' is read by YAML 1.1 as True; quote it ('on')"),
        ("env:\n  SGLANG_SM120_MMA_TARGET_CTAS: 010\n", "'010' is read by YAML 1.1 as 8"),
        ("env:\n  SGLANG_SM120_MMA_TARGET_CTAS: 1_000\n", "'1_000' is read by YAML 1.1 as 1000"),
        ("env:\n  NCCL_TIMEOUT: 12:30\n", "'12:30' is read by YAML 1.1 as 750"),
        # values that cannot reach an engine
        ('env:\n  NCCL_X: "a\\0b"\n', "NUL byte"),
        ("env:\n  NCCL_X: 1" + "0" * 30 + "\n", "too large for any engine"),
        ("env:\n  NCCL_X: .nan\n", "not a finite number"),
        # a secret value in a profile
        ("env:\n  HF_TOKEN: hf_x\n", "a secret does not belong in a profile"),
        # nesting and aliases
        ("env: " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
    ],
)
def test_profile_inputs_are_refused_in_one_line(profiles_dir: Path, body: str, expected: str) -> None:
    (profiles_dir / "x.yaml").write_text(PROFILE + body)
    with pytest.raises(Exception) as info:
        ProfileStore(profiles_dir).resolve("x")
    text = str(info.value)
    assert expected in text, text
    assert text.startswith("profiles/x.yaml:") and "Traceback" not in text


def test_a_profile_path_that_is_not_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(safeyaml.YamlProblem, match="not a regular file"):
        safeyaml.load_file(tmp_path)
    with pytest.raises(safeyaml.YamlProblem, match="cannot read"):
        safeyaml.load_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("var", "value", "expected"),
    [
        (
            "knob_serve_user",
            "root\nExecStartPre=/bin/sh -c id",
            "knob_serve_user: Value error, contains U+000A LINE FEED at position 4 (invisible); remove it",
        ),
        ("knob_serve_listen_host", "127.0.0.1\nEnvironment=X=1", "knob_serve_listen_host: Value error"),
        ("knob_serve_script_path", "/root/serve.sh\n", "knob_serve_script_path: Value error"),
        ("knob_serve_script_path", "/root/../etc/passwd", "knob_serve_script_path: Value error"),
        ("knob_serve_service", "eng\nExecStart=/x", "knob_serve_service: Value error"),
        ("knob_serve_readiness_path", "/health generate", "knob_serve_readiness_path: Value error"),
        ("knob_serve_host_env", {"A\nB": "1"}, "not a valid env var name"),
        ("knob_serve_host_env", {"A": "x\0y"}, "NUL byte"),
        ("knob_serve_launcher", ["/usr/bin/python3", ""], "knob_serve_launcher: Value error"),
        ("knob_engine", "sglang\nx", "knob_engine: Value error"),
    ],
)
def test_host_vars_that_reach_the_unit_or_script_are_validated(var: str, value: object, expected: str) -> None:
    with pytest.raises(InventoryError) as info:
        from_inventory_vars("h1", {var: value}, "inventories/x")
    text = str(info.value)
    assert text.startswith("inventories/x: host h1: ") and expected in text and "\n" not in text.strip(), text


@pytest.mark.parametrize(
    "argv",
    [
        ["drift", "-i", "/nonexistent/inventory"],
        ["drift", "-i", "{repo}/inventories/lab", "--limit", "lab9"],
        ["apply", "ctas512", "-i", "{repo}/inventories/lab", "--serial", "0%", "--yes"],
        ["waves", "ctas512", "--batch", "1,x"],
        ["waves", "--knob", "SGLANG_SM120_MMA_TARGET_CTAS=" + "9" * 5000],
        ["profiles", "validate", "/dev/null"],
    ],
)
def test_no_command_input_ends_in_a_traceback(capsys: pytest.CaptureFixture[str], repo: Path, argv: list[str]) -> None:
    argv = [a.replace("{repo}", str(repo)) for a in argv]
    try:
        code = run(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert code in (1, 4, 64), (code, out, err)
    assert "Traceback" not in out + err and "internal error" not in err, err
    assert err.strip(), "an error must say what went wrong"


def test_an_unreadable_inventory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    h1:\n      knob_serve_port: [not, a, port]\n")
    code = run(["drift", "-i", str(inv)])
    err = capsys.readouterr().err
    assert code == 1 and "knob_serve_port" in err and "Traceback" not in err, err
