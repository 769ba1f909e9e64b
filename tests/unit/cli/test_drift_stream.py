"""drift/verify output as hosts answer: rows, JSON lines, the summary line; the read path's parser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from knobfleet import cli, report, report_text
from knobfleet.live.verify import Finding, HostVerdict, summary
from knobfleet.module_utils.knob_rules import Kind

HOSTS = ["lab1", "lab2", "a-much-longer-host-name"]


def verdicts() -> list[HostVerdict]:
    drifted = HostVerdict("lab2", "drift", "ctas512", 2, "sha256:ab", 1, [Finding(Kind("file_changed"), "differs")])
    return [
        HostVerdict("lab1", "in_sync", "ctas512", 2, "sha256:ab", 1),
        drifted,
        HostVerdict("a-much-longer-host-name", "unreachable", error="unreachable: refused"),
    ]


def test_rows_line_up_under_the_heads_whatever_order_hosts_answer_in() -> None:
    head = report.drift_head("drift: inv", HOSTS).splitlines()
    assert head[0] == "drift: inv"
    col = head[1].index("status")
    for v in reversed(verdicts()):
        first = report.drift_rows(v, HOSTS).splitlines()[0]
        assert first.startswith(v.host) and first[col:].startswith(v.status)
    assert report.drift_rows(verdicts()[1], HOSTS).splitlines()[1] == "lab2: file_changed: differs"


def test_the_tail_is_the_summary() -> None:
    tail = report.drift_tail(summary(verdicts()))
    assert tail.splitlines()[-1] == "3 hosts: 1 in sync, 1 drifted, 1 unreachable, 0 error"


def test_json_lines_are_one_object_per_line() -> None:
    lines = [report_text.json_line(v.as_json()) for v in verdicts()]
    assert all("\n" not in ln for ln in lines)
    assert [json.loads(ln)["host"] for ln in lines] == [v.host for v in verdicts()]


def test_the_read_path_registers_its_own_module_alone() -> None:
    assert cli._command(["-v", "--debug", "drift", "--json"]) == "drift"
    assert cli._command(["--help"]) is None
    full = cli.build_parser()
    for command in cli.ALONE:
        alone = cli.build_parser(command)
        argv = [command, "--json-lines", "--forks", "4", "--limit", "lab1", "--via", "ssh"]
        a, b = vars(alone.parse_args(argv)), vars(full.parse_args(argv))
        assert a == b and a["forks"] == 4 and a["json_lines"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["drift", "--rounds", "3"], "--rounds counts the rounds of --watch"),
        (["drift", "--watch", "5", "--json"], "use --json-lines, not --json"),
        (["verify", "--watch", "5", "--testinfra"], "--testinfra runs once"),
    ],
)
def test_watch_options_that_cannot_go_together_are_usage_errors_before_any_host_is_read(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc = cli.main([*argv, "-i", str(tmp_path / "no-such-inventory")])  # never read: the options are refused first
    err = capsys.readouterr().err
    assert rc == 64 and message in err and "no-such-inventory" not in err


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "86401", "x"])
def test_watch_takes_a_finite_interval_up_to_a_day(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.build_parser("drift").parse_args(["drift", f"--watch={bad}"])
    assert exc.value.code == 64 and "--watch" in capsys.readouterr().err  # a usage error, as every option


def test_watch_and_rounds_parse() -> None:
    a = cli.build_parser("drift").parse_args(["drift", "--watch", "0.5", "--rounds", "3", "--json-lines"])
    assert (a.watch, a.rounds, a.json_lines) == (0.5, 3, True)
    assert cli.build_parser("drift").parse_args(["drift"]).watch is None
