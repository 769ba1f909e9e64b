"""The shell's small commands end to end through ``knobfleet.cli.run``, each with its use case faked at the
module it is imported from (ops/history.py, engines/sync): the arguments that reach the use case, the text and
JSON printed, and the exit code. ``init`` runs for real in a temp dir.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from knobfleet import cli
from knobfleet.errors import EXIT_ERROR, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE
from knobfleet.ops import history as history_use_case
from knobfleet.ops.history import Generation, HostHistory
from knobfleet.ops.transaction import RestoreOutcome

REPO = Path(__file__).resolve().parents[3]
INV = str(REPO / "inventories" / "lab")


def call(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.run(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def gen(n: int, current: bool = False, profile: str | None = "ctas512", files_ok: bool = True) -> Generation:
    return Generation(
        number=n,
        profile=profile,
        version=1 if profile else None,
        hash="sha256:0123456789abcdef0123" if profile else None,
        status="good" if profile else "adopted",
        created="2026-11-30T10:00:00.123456+00:00",
        updated=None,
        operator="alice",
        reason="a reason",
        current=current,
        files_ok=files_ok,
    )


HISTORIES = {
    "lab1": HostHistory(
        "lab1",
        1,
        [gen(0, profile=None), gen(1, current=True)],
        ledger=[{"event": "adopt"}, {"event": "apply"}],
    ),
    "lab2": HostHistory("lab2", None, unreachable="unreachable: ssh: Connection refused"),
    "lab3": HostHistory("lab3", 0, [gen(0, current=True, profile=None, files_ok=False)], errors=["meta unreadable"]),
}


@pytest.fixture
def fake_history(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def history(hosts: list[Any], inventory: Path) -> list[HostHistory]:
        calls.append({"hosts": [h.host for h in hosts], "inventory": inventory})
        return [HISTORIES[h.host] for h in hosts]

    monkeypatch.setattr(history_use_case, "history", history)
    return calls


@pytest.mark.parametrize(
    ("limit", "code"),
    [("lab1", EXIT_OK), ("lab3", EXIT_OK), ("lab2", EXIT_UNREACHABLE), ("all", EXIT_UNREACHABLE)],
)
def test_history_exit_code_says_whether_a_host_was_unreachable(
    capsys: pytest.CaptureFixture[str], fake_history: list[dict[str, Any]], limit: str, code: int
) -> None:
    got, out, _ = call(capsys, "history", "-i", INV, "--limit", limit, "--json")
    assert got == code
    doc = json.loads(out)
    expected = ["lab1", "lab2", "lab3"] if limit == "all" else [limit]
    assert [h["host"] for h in doc["hosts"]] == expected == fake_history[0]["hosts"]
    assert fake_history[0]["inventory"].inventory == Path(INV)  # the Hosts door the CLI built for it
    assert doc["hosts"][0] == HISTORIES[expected[0]].as_json()


def test_history_text_and_ledger(capsys: pytest.CaptureFixture[str], fake_history: list[dict[str, Any]]) -> None:
    code, out, _ = call(capsys, "history", "-i", INV, "--limit", "all")
    assert code == EXIT_UNREACHABLE
    lines = out.splitlines()
    assert lines[0] == "lab1 (current 0001)"
    assert "lab2: unreachable: ssh: Connection refused" in lines
    assert "lab3 (current 0000)" in lines and "  error: meta unreadable" in lines
    assert any(line.startswith("* 0001") and "ctas512@1" in line for line in lines)
    assert any("(pre-knobfleet files)" in line and "FILES MISSING; a reason" in line for line in lines)
    assert "ledger:" not in out  # the ledger only on request
    code, out, _ = call(capsys, "history", "-i", INV, "--limit", "lab1", "--ledger", "1")
    assert [line for line in out.splitlines() if "ledger:" in line] == ["  ledger: event=apply"]
    code, out, _ = call(capsys, "history", "-i", INV, "--limit", "lab1", "--ledger", "5")
    assert [line for line in out.splitlines() if "ledger:" in line] == [
        "  ledger: event=adopt",
        "  ledger: event=apply",
    ]


@pytest.fixture
def fake_rollback(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def rollback(hosts: list[Any], inventory: Path, to: int | None, **kw: Any) -> list[RestoreOutcome]:
        calls.append({"hosts": [h.host for h in hosts], "to": to, **kw})
        out = []
        for h in hosts:
            if h.host == "lab3":
                out.append(
                    RestoreOutcome(h.host, False, None, 2, message="generation 0009 does not exist; nothing changed")
                )
            else:
                out.append(RestoreOutcome(h.host, True, 0 if to == 0 else 1, 2, "ctas512" if to != 0 else None, 1))
        return out

    monkeypatch.setattr(history_use_case, "rollback", rollback)
    return calls


@pytest.mark.parametrize(
    ("argv", "to", "break_lock", "code"),
    [
        (["--limit", "lab1"], None, False, EXIT_OK),
        (["--limit", "lab1", "--to", "0"], 0, False, EXIT_OK),
        (["--limit", "lab1", "--break-lock"], None, True, EXIT_OK),
        (["--limit", "lab3", "--to", "9"], 9, False, EXIT_ERROR),
        (["--limit", "all"], None, False, EXIT_ERROR),
    ],
)
def test_rollback_passes_its_options_and_fails_when_a_host_did(
    capsys: pytest.CaptureFixture[str],
    fake_rollback: list[dict[str, Any]],
    argv: list[str],
    to: int | None,
    break_lock: bool,
    code: int,
) -> None:
    got, out, _ = call(capsys, "rollback", "-i", INV, "--yes", "--json", *argv)
    assert got == code
    (c,) = fake_rollback
    assert (c["to"], c["break_lock"]) == (to, break_lock)
    doc = json.loads(out)
    assert [h["host"] for h in doc["hosts"]] == c["hosts"]


def test_rollback_text_names_the_refusal(
    capsys: pytest.CaptureFixture[str], fake_rollback: list[dict[str, Any]]
) -> None:
    code, out, _ = call(capsys, "rollback", "-i", INV, "--yes", "--limit", "all", "--to", "0")
    assert code == EXIT_ERROR
    assert "error: lab3: rollback refused: generation 0009 does not exist; nothing was changed" in out
    assert any(
        line.startswith("lab1") and "0002→0000" in line and "(pre-knobfleet files)" in line for line in out.splitlines()
    )


def test_rollback_refuses_a_negative_generation_before_anything(
    capsys: pytest.CaptureFixture[str], fake_rollback: list[dict[str, Any]]
) -> None:
    with pytest.raises(SystemExit) as exc:  # refused while the command line is parsed
        call(capsys, "rollback", "-i", INV, "--yes", "--limit", "lab1", "--to", "-1")
    assert exc.value.code == EXIT_USAGE and "argument --to: -1: must be >= 0" in capsys.readouterr().err
    assert fake_rollback == []


def test_rollback_without_yes_and_without_a_terminal_changes_nothing(
    capsys: pytest.CaptureFixture[str], fake_rollback: list[dict[str, Any]]
) -> None:
    code, _, err = call(capsys, "rollback", "-i", INV, "--limit", "lab1", "--json")
    assert code == EXIT_USAGE and "rollback: refusing to change 1 host(s) without confirmation; pass --yes" in err
    assert fake_rollback == []


def test_init_writes_a_project_and_says_what_next(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = call(capsys, "init", "fleet", "--name", "prod")
    assert code == EXIT_OK
    lines = out.splitlines()
    assert all(line.startswith("wrote fleet/") for line in lines[:-1]) and len(lines) > 2
    assert lines[-1] == (
        "knobfleet project 'prod' in fleet: edit inventories/hosts.yml, then "
        "`cd fleet && knobfleet profiles validate && knobfleet plan mybase`"
    )
    assert (tmp_path / "fleet" / "knobfleet.toml").is_file()
    code, out, _ = call(capsys, "init", "other")
    assert code == EXIT_OK and "knobfleet project 'other' in other:" in out.splitlines()[-1]


def test_init_keeps_existing_files_unless_forced(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert call(capsys, "init", "fleet")[0] == EXIT_OK
    (tmp_path / "fleet" / "knobfleet.toml").write_text("# mine\n")
    code, _, err = call(capsys, "init", "fleet")
    assert code != EXIT_OK and err.strip()
    assert (tmp_path / "fleet" / "knobfleet.toml").read_text() == "# mine\n"
    assert call(capsys, "init", "fleet", "--force")[0] == EXIT_OK
    assert (tmp_path / "fleet" / "knobfleet.toml").read_text() != "# mine\n"


@pytest.mark.parametrize(("version", "shown"), [(None, "pinned-9.9"), ("1.2.3", "1.2.3")])
def test_catalog_sync_passes_the_engine_and_version(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    version: str | None,
    shown: str,
) -> None:
    from knobfleet import paths
    from knobfleet.engines import sync

    calls: list[tuple[str, Path, str | None]] = []

    def fake_sync(engine: str, out_dir: Path, version: str | None = None) -> Path:
        calls.append((engine, out_dir, version))
        return tmp_path / f"{engine}.yaml"

    monkeypatch.setattr(sync, "sync", fake_sync)
    monkeypatch.setattr(sync, "pinned_version", lambda engine: "pinned-9.9")
    argv = ["catalog", "sync", "vllm"] + (["--version", version] if version else [])
    code, out, _ = call(capsys, *argv)
    assert code == EXIT_OK
    assert calls == [("vllm", paths.catalogs_dir() / "generated", version)]
    assert out == f"{paths.display(tmp_path / 'vllm.yaml')}: regenerated from vllm {shown}\n"


def test_catalog_sync_knows_only_its_engines(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.run(["catalog", "sync", "trtllm"])
    assert exc.value.code == EXIT_USAGE and "invalid choice: 'trtllm'" in capsys.readouterr().err


def test_history_canaries_lists_the_kept_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from knobfleet.experiment import records

    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path))
    assert cli.main(["history", "--canaries"]) == 0
    assert capsys.readouterr().out == "no canary records on this controller (each `knobfleet canary` keeps one)\n"
    doc = {
        "profile": "ctas512", "canaries": ["lab1"], "baseline": ["lab2"], "verdict": "promote", "advisory": True,
        "started": 1764681600.0, "windows_pre": 4, "windows_counted": 9,
        "intervals": {"tput": {"estimate": 0.012, "low": -0.011, "high": 0.035}},
    }  # fmt: skip
    records.write(records.new_path("ctas512", 1764681600.0), "canary", doc)
    (records.canary_dir() / "zz-broken.json").write_text("{")
    assert cli.main(["history", "--canaries"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["started", "(UTC)", "profile", "canaries", "vs", "baseline", "pre+judged", "verdict",
                              "tput", "record"]  # fmt: skip
    assert "unreadable" in out[2] and "zz-broken.json" in out[2]
    assert out[3].split()[:8] == ["2025-12-02", "13:20", "ctas512", "lab1", "vs", "lab2", "4+9", "promote"]
    assert "(advisory)" in out[3] and "+1.2% (-1.1% to +3.5%)" in out[3]
    assert cli.main(["history", "--canaries", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["canaries"]
    assert [c.get("verdict") for c in listed] == [None, "promote"] and "error" in listed[0]


def test_the_canary_options_default_to_the_judges() -> None:
    from knobfleet.cli.telemetry import HANG_S, MAX_PROBES, PRE_WINDOWS, PROBES
    from knobfleet.experiment.canary import MAX_PROBES as JUDGES_MAX
    from knobfleet.experiment.canary import Settings

    assert Settings().pre_windows == PRE_WINDOWS
    assert (Settings().probes, Settings().hang_s, JUDGES_MAX) == (PROBES, HANG_S, MAX_PROBES)
