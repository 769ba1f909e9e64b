"""Every option is validated while the command line is parsed, before anything is read from or changed on a host:
one line, exit 64, the exact text. Gate settings are checked (and the baseline resolved) before any host is
touched."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from knobfleet.cli import build_parser, run
from knobfleet.errors import UsageError


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["apply", "p", "--max-fail-percent", "nan"],
            "knobfleet apply: error: argument --max-fail-percent: nan: not a finite number; give a value in 0..100",
        ),
        (
            ["apply", "p", "--max-fail-percent", "inf"],
            "knobfleet apply: error: argument --max-fail-percent: inf: not a finite number; give a value in 0..100",
        ),
        (
            ["apply", "p", "--max-fail-percent", "101"],
            "knobfleet apply: error: argument --max-fail-percent: 101: must be in 0..100",
        ),
        (
            ["apply", "p", "--readiness-timeout", "0"],
            "knobfleet apply: error: argument --readiness-timeout: 0: must be >= 1",
        ),
        (
            ["apply", "p", "--readiness-timeout", "-1"],
            "knobfleet apply: error: argument --readiness-timeout: -1: must be >= 1",
        ),
        (["apply", "p", "--grace", "-5"], "knobfleet apply: error: argument --grace: -5: must be >= 0"),
        (["apply", "p", "--serial", "0%"], "knobfleet apply: error: argument --serial: 0: must be 1..100"),
        (["apply", "p", "--serial", "0"], "knobfleet apply: error: argument --serial: 0: must be >= 1"),
        (["apply", "p", "--serial", "x"], "knobfleet apply: error: argument --serial: x: not a whole number"),
        (["apply", "p", "--gate-repeats", "0"], "knobfleet apply: error: argument --gate-repeats: 0: must be >= 1"),
        (
            ["apply", "p", "--gate-n-mult", "1e9"],
            "knobfleet apply: error: argument --gate-n-mult: 1e9: not a whole number",
        ),
        (
            ["apply", "p", "--gate-conc", "48,,64"],
            "knobfleet apply: error: argument --gate-conc: 48,,64: give comma-separated whole numbers, e.g. 48,64",
        ),
        (
            ["apply", "p", "--gate-conc", "48,48"],
            "knobfleet apply: error: argument --gate-conc: 48,48: a value is repeated",
        ),
        (["drift", "--forks", "0"], "knobfleet drift: error: argument --forks: 0: must be >= 1"),
        (["history", "--ledger", "-1"], "knobfleet history: error: argument --ledger: -1: must be >= 0"),
        (["rollback", "--to", "-1"], "knobfleet rollback: error: argument --to: -1: must be >= 0"),
        (
            ["ab", "a", "b", "--min-effect", "nan"],
            "knobfleet ab: error: argument --min-effect: nan: not a finite number; give a value in 0..1",
        ),
        (["ab", "a", "b", "--max-rounds", "0"], "knobfleet ab: error: argument --max-rounds: 0: must be >= 1"),
        (["bench", "--timeout", "0"], "knobfleet bench: error: argument --timeout: 0: must be >= 1"),
        (["waves", "--sms", "0"], "knobfleet waves: error: argument --sms: 0: must be >= 1"),
        (["lab", "up", "-n", "0"], "knobfleet lab up: error: argument -n: 0: must be 1..64"),
        (
            ["kernel", "bench", "--host", "h", "--budget", "nan"],
            "knobfleet kernel bench: error: argument --budget: nan: not a finite number; give a value in 1..86400",
        ),
    ],
)
def test_bad_option_values_are_one_line_before_anything_runs(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 64
    assert capsys.readouterr().err == expected + "\n"


def test_a_bad_command_line_still_shows_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["apply"])
    assert capsys.readouterr().err.startswith("usage: knobfleet apply")


@pytest.fixture
def no_hosts_touched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The apply use case and the pre-check probes record a call instead of running: the test asserts none."""
    calls: list[str] = []
    from knobfleet.fleet import probe
    from knobfleet.ops import apply as apply_uc

    monkeypatch.setattr(probe, "warm_up", lambda *a, **k: calls.append("warm_up"))
    monkeypatch.setattr(apply_uc, "apply", lambda *a, **k: calls.append("apply"))
    return calls


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["apply", "nogate", "--gate", "--yes"],
            "--gate: nogate@1 names no gate baseline; pass --baseline PROFILE (nothing was changed)",
        ),
        (["apply", "ctas512", "--gate", "--baseline", "nosuch", "--yes"], "profile 'nosuch' not found"),
        (
            ["apply", "ctas512", "--gate-conc", "48", "--yes"],
            "--gate-conc: a gate option without --gate; add --gate or drop it",
        ),
        (["apply", "ctas512", "--baseline", "default", "--yes"], "--baseline: a gate option without --gate"),
    ],
)
def test_gate_settings_are_checked_before_any_host_is_touched(
    profiles_dir: Path,
    capsys: pytest.CaptureFixture[str],
    no_hosts_touched: list[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    expected: str,
) -> None:
    monkeypatch.setenv("KNOBFLEET_HOME", str(profiles_dir.parent))
    (profiles_dir.parent / "roles").symlink_to(Path(__file__).resolve().parents[3] / "roles")
    (profiles_dir / "nogate.yaml").write_text("name: nogate\nversion: 1\nengine: sglang\n")
    inv = profiles_dir.parent / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    h1: {ansible_host: 127.0.0.1}\n")
    code = run([*argv, "-i", str(inv)])
    err = capsys.readouterr().err
    assert code in (1, 64) and expected in err and err.count("\n") == 1, err
    assert "apply" not in no_hosts_touched


def test_the_gate_check_resolves_the_baseline(profiles_dir: Path) -> None:
    from knobfleet.cli.apply import check_gate_options
    from knobfleet.profiles.store import ProfileStore

    profile = ProfileStore(profiles_dir).resolve("ctas512")
    args = argparse.Namespace(gate=True, baseline=None, gate_conc=None)
    check_gate_options(args, profile)  # ctas512's gate.baseline (default) resolves
    with pytest.raises(UsageError):
        check_gate_options(argparse.Namespace(gate=False, baseline="default", gate_conc=None), profile)
