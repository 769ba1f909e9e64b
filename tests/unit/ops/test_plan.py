from __future__ import annotations

import pytest

from knobfleet.errors import KnobfleetError
from knobfleet.plan import batches, check_live, knob_changes, parse_script

HOSTS = [f"h{i}" for i in range(1, 8)]


@pytest.mark.parametrize(
    ("serial", "canary", "expected"),
    [
        (None, False, [HOSTS]),
        (None, True, [["h1"], HOSTS[1:]]),
        ("3", False, [HOSTS[0:3], HOSTS[3:6], HOSTS[6:]]),
        ("2", True, [["h1"], ["h2", "h3"], ["h4", "h5"], ["h6", "h7"]]),
        ("30%", False, [HOSTS[0:2], HOSTS[2:4], HOSTS[4:6], HOSTS[6:]]),
        ("1%", False, [[h] for h in HOSTS]),
    ],
)
def test_batches(serial: str | None, canary: bool, expected: list[list[str]]) -> None:
    assert batches(HOSTS, serial, canary) == expected


@pytest.mark.parametrize("bad", ["0", "-1", "x", "0%", "150%"])
def test_bad_serial(bad: str) -> None:
    with pytest.raises(KnobfleetError, match=r"--serial .*expected a count such as 2 or a percentage"):
        batches(HOSTS, bad, False)


HAND = """#!/bin/bash
export SGLANG_SM120_MMA_TARGET_CTAS=256
export FOO='a b'
exec /usr/bin/python3 -m sglang.launch_server --model-path /m \\
    --tp 2 --disable-overlap-schedule
"""
MANAGED = """#!/bin/bash
set -euo pipefail
export FOO='a b'
export SGLANG_SM120_MMA_TARGET_CTAS=512
exec \\
  /usr/bin/python3 \\
  -m \\
  sglang.launch_server \\
  --model-path=/m \\
  --tp=4
"""


def test_parse_script_reads_hand_written_and_managed_scripts() -> None:
    env, argv = parse_script(HAND)
    assert env == {"SGLANG_SM120_MMA_TARGET_CTAS": "256", "FOO": "a b"}
    assert argv[-3:] == ["--tp", "2", "--disable-overlap-schedule"]
    env, argv = parse_script(MANAGED)
    assert env["SGLANG_SM120_MMA_TARGET_CTAS"] == "512" and argv[-1] == "--tp=4"


def test_knob_changes_between_scripts() -> None:
    assert [str(c) for c in knob_changes(HAND, MANAGED)] == [
        "SGLANG_SM120_MMA_TARGET_CTAS 256 → 512",
        "--disable-overlap-schedule (set) → (unset)",
        "--tp 2 → 4",
    ]
    assert knob_changes(MANAGED, MANAGED) == []


PROC = {"pid": 10, "comm": "python3", "cmdline": ["/x", "--a=1"], "env": {"K": "1", "PATH": "/bin"}}
WORKER = {"pid": 11, "comm": "sglang::schedul", "cmdline": ["sglang::scheduler_TP0"], "env": {"K": "1"}}


def test_check_live_passes_when_env_and_argv_match() -> None:
    res = check_live({"K": "1"}, ["/x", "--a=1"], 10, [PROC, WORKER], ["K"])
    assert res.ok and res.problems == [] and res.seen == {"K": "1"}


def test_check_live_names_pid_and_knob() -> None:
    stale_worker = {**WORKER, "env": {"K": "0"}}
    res = check_live({"K": "1"}, ["/x", "--a=2"], 10, [PROC, stale_worker], ["K"])
    assert not res.ok
    assert res.problems == [
        "pid 10: cmdline differs from the rendered argv",
        "pid 11 (sglang::schedul): K='0', expected '1'",
    ]


def test_check_live_flags_engine_knobs_the_profile_does_not_set() -> None:
    injected = {**WORKER, "env": {"K": "1", "SGLANG_SM120_MMA_NSPLIT_MAX": "4", "HOME": "/root"}}
    res = check_live({"K": "1"}, ["/x", "--a=1"], 10, [PROC, injected], ["K"])
    assert res.problems == [
        "pid 11 (sglang::schedul): SGLANG_SM120_MMA_NSPLIT_MAX='4' is live but not in the profile "
        "(a drop-in or the unit's environment injects it)"
    ]


def test_check_live_main_pid_missing() -> None:
    res = check_live({"K": "1"}, [], 99, [PROC], [])
    assert not res.ok and res.problems == ["main process 99 not found in the unit's cgroup"]


def test_module_copy_of_the_script_lexer_agrees(repo) -> None:  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "knob_generation", repo / "roles/knob_serve/library/knob_generation.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for text in (HAND, MANAGED, "export A='x\ny' B=\"q\\\"\"\nexec a 'b c' \\\n  d # comment\n"):
        assert mod.script_expectations(text) == parse_script(text)
    assert parse_script("export A='x\ny' B=\"q\\\"\"\nexec a 'b c' \\\n  d # comment\n") == (
        {"A": "x\ny", "B": 'q"'},
        ["a", "b c", "d"],
    )
