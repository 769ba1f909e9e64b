from __future__ import annotations

import pytest

from knobfleet.errors import KnobfleetError
from knobfleet.ops.plan import batches, knob_changes, parse_script

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


def test_parse_script_quoting() -> None:
    assert parse_script("export A='x\ny' B=\"q\\\"\"\nexec a 'b c' \\\n  d # comment\n") == (
        {"A": "x\ny", "B": 'q"'},
        ["a", "b c", "d"],
    )


def test_knob_changes_between_scripts() -> None:
    assert [str(c) for c in knob_changes(HAND, MANAGED)] == [
        "SGLANG_SM120_MMA_TARGET_CTAS 256 → 512",
        "--disable-overlap-schedule (set) → (unset)",
        "--tp 2 → 4",
    ]
    assert knob_changes(MANAGED, MANAGED) == []


@pytest.mark.parametrize(
    ("hosts", "serial", "expected"),
    [
        (HOSTS, "1", [[h] for h in HOSTS]),
        (HOSTS, "100%", [HOSTS]),
        ([f"n{i}" for i in range(20)], "50%", [[f"n{i}" for i in range(10)], [f"n{i}" for i in range(10, 20)]]),
    ],
)
def test_batch_size_edges(hosts: list[str], serial: str, expected: list[list[str]]) -> None:
    assert batches(hosts, serial, False) == expected


def test_over_100_percent_is_refused() -> None:
    with pytest.raises(KnobfleetError, match=r"--serial '100\.5%'"):
        batches(HOSTS, "100.5%", False)
