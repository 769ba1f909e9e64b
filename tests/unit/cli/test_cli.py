from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import knobfleet
from knobfleet.cli import run


def call(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_render_script_env_argv(capsys: pytest.CaptureFixture[str], repo: Path) -> None:
    code, out, _ = call(capsys, "render", "ctas512", "-i", str(repo / "inventories/lab"), "--host", "lab1")
    assert code == 0
    assert "export SGLANG_SM120_MMA_TARGET_CTAS=512\n" in out and out.count("\nexec ") == 1
    code, out, _ = call(
        capsys, "render", "ctas512", "-i", str(repo / "inventories/lab"), "--host", "lab1", "--what", "env"
    )
    assert "SGLANG_SM120_MMA_TARGET_CTAS=512" in out.splitlines()
    code, out, _ = call(
        capsys, "render", "ctas512", "-i", str(repo / "inventories/lab"), "--host", "lab2", "--what", "argv"
    )
    assert out.splitlines()[:5] == [
        "/usr/bin/python3",
        "-m",
        "sglang_sim.launch_server",
        "--model-path=/models/DeepSeek-V4-sim",
        "--host=127.0.1.2",
    ]


def test_typo_profile_exits_1_with_one_line(
    capsys: pytest.CaptureFixture[str], profiles_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KNOBFLEET_HOME", str(profiles_dir.parent))
    (profiles_dir.parent / "roles").symlink_to(Path(__file__).resolve().parents[3] / "roles")
    (profiles_dir / "typo.yaml").write_text(
        "name: typo\nversion: 1\nextends: default\nenv:\n  SGLANG_SM120_MMA_TARGET_CTS: 512\n"
    )
    code, out, err = call(capsys, "profiles", "validate", "typo")
    assert (code, out) == (1, "")
    assert err == (
        "profiles/typo.yaml: env.SGLANG_SM120_MMA_TARGET_CTS: unknown knob; "
        "did you mean SGLANG_SM120_MMA_TARGET_CTAS?\n"
    )


def test_unknown_host_limit_is_a_clear_error(capsys: pytest.CaptureFixture[str], repo: Path) -> None:
    code, _, err = call(capsys, "render", "ctas512", "-i", str(repo / "inventories/lab"), "--host", "lab9")
    assert code == 1 and "no hosts matching --limit 'lab9'" in err


def test_waves_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = call(capsys, "waves", "ctas512", "--gpu", "rtx-pro-6000", "--json")
    data = json.loads(out)
    assert code == 0 and set(data) == {"sms", "heads", "knobs", "rows", "cliffs", "calibration", "calibration_note"}
    assert data["calibration"] is None and data["calibration_note"].startswith("calibration: none for rtx-pro-6000")
    assert data["sms"] == 188 and data["heads"] == 64
    assert set(data["rows"][0]) >= {"batch", "n_hg", "nsplit", "ctas", "waves", "waves_ceil", "last_wave_fill", "cost"}
    row96 = next(r for r in data["rows"] if r["batch"] == 96)
    assert (row96["nsplit"], row96["ctas"]) == (3, 576)


def test_waves_knob_and_sms(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = call(
        capsys, "waves", "--knob", "SGLANG_SM120_MMA_TARGET_CTAS=256", "--sms", "188", "--batch", "80,96", "--json"
    )
    data = json.loads(out)
    assert data["rows"][1]["waves_ceil"] == 3 and data["cliffs"] == [96]
    code, _, err = call(capsys, "waves", "--knob", "TARGET=1")
    assert code == 1 and "--knob 'TARGET=1': expected NAME=VALUE" in err
    code, _, err = call(capsys, "waves", "ctas512", "--gpu", "h2000")
    assert code == 1 and err.startswith("--gpu: unknown GPU 'h2000'; did you mean h200?")


def test_waves_suggest_writes_candidates(
    capsys: pytest.CaptureFixture[str], profiles_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KNOBFLEET_HOME", str(profiles_dir.parent))
    (profiles_dir.parent / "roles").symlink_to(Path(__file__).resolve().parents[3] / "roles")
    code, out, _ = call(capsys, "waves", "default", "--suggest", "--top", "2")
    assert code == 0 and "not a measurement" in out
    written = sorted(p.name for p in profiles_dir.glob("default-ctas*.yaml"))
    assert len(written) == 2
    code, _, _ = call(capsys, "profiles", "validate", *[w.removesuffix(".yaml") for w in written])
    assert code == 0


def test_version_and_help_are_fast_paths(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run(["--version"])
    assert info.value.code == 0 and f"knobfleet {knobfleet.__version__}" in capsys.readouterr().out


def test_the_version_is_one_in_pyproject_the_package_and_the_changelog() -> None:
    import tomllib

    from tests.conftest import REPO

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    newest = re.search(r"(?m)^## (\S+) ", (REPO / "CHANGELOG.md").read_text())
    assert newest is not None and pyproject == knobfleet.__version__ == newest.group(1)


def test_waves_uses_the_stored_h200_calibration(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = call(capsys, "waves", "ctas512", "--gpu", "h200", "--json")
    data = json.loads(out)
    assert code == 0 and data["calibration"] == "NVIDIA H200|sm90|132" and data["sms"] == 132
    code, out, _ = call(capsys, "waves", "ctas512", "--gpu", "h200", "--no-calibration", "--json")
    assert json.loads(out)["calibration"] is None


@pytest.mark.parametrize("argv", [["apply"], ["drift", "--via", "scp"], ["no-such-command"]])
def test_usage_errors_exit_64_never_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run(argv)
    assert info.value.code == 64


def test_bare_knobfleet_prints_help_and_exits_64(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([]) == 64 and "exit codes:" in capsys.readouterr().err


def test_apply_profile_is_also_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    """The mission's spelling, `knobfleet apply-profile PROFILE`, is the apply command (as the console script)."""
    from knobfleet.cli import build_parser

    parser = build_parser("apply-profile")
    args = parser.parse_args(["apply-profile", "ctas512", "--check"])
    assert args.profile == "ctas512" and args.check is True
    assert args.func is parser.parse_args(["apply", "ctas512"]).func
