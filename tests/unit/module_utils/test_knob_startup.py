"""module_utils/knob_startup: a start's figures from systemd's timestamps, the first health 200 and the journal."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from knobfleet.module_utils.knob_startup import compile_phases, journal_entries, phases, timing

S = 1_000_000  # one second in microseconds

SGLANG = [
    {"name": "weights", "pattern": r"^Load weight end\."},
    {"name": "memory_pool", "pattern": r"^Memory pool end\."},
    {"name": "cuda_graph", "pattern": r"^Capture .*CUDA graph end\."},
]


def props(**us: int) -> dict[str, str]:
    names = {
        "left": "ActiveExitTimestampMonotonic",
        "gone": "InactiveEnterTimestampMonotonic",
        "start": "InactiveExitTimestampMonotonic",
        "main": "ExecMainStartTimestampMonotonic",
    }
    return {names[k]: str(v) for k, v in us.items()}


TIMING_CASES = [
    # (case, props, ready, restarted, expected stop_s, pre_s, start_s)
    ("a restart", props(left=100 * S, gone=102 * S, start=102 * S + 50_000, main=103 * S), 133 * S, True,
     2.0, 0.95, 30.95),
    ("a first start has no stop", props(left=0, gone=0, start=10 * S, main=10 * S), 12 * S, False, None, 0.0, 2.0),
    ("a start after an earlier stop is no restart", props(left=1 * S, gone=2 * S, start=10 * S, main=10 * S),
     11 * S, False, None, 0.0, 1.0),
    ("stop timestamps out of order are not a stop", props(left=5 * S, gone=4 * S, start=6 * S, main=6 * S),
     7 * S, True, None, 0.0, 1.0),
    ("a main start outside the start counts from the start", props(start=6 * S, main=99 * S), 8 * S, False,
     None, 0.0, 2.0),
]  # fmt: skip


@pytest.mark.parametrize(("case", "p", "ready", "restarted", "stop", "pre", "start"), TIMING_CASES)
def test_timing(
    case: str, p: dict[str, str], ready: int, restarted: bool, stop: float | None, pre: float, start: float
) -> None:
    t = timing(p, ready, restarted)
    assert t is not None, case
    assert (t["stop_s"], t["pre_s"], t["start_s"]) == (stop, pre, start), case


@pytest.mark.parametrize(
    "p",
    [props(), props(start=20 * S), {"InactiveExitTimestampMonotonic": "garbage"}],
    ids=["never started", "started after ready", "unreadable"],
)
def test_no_timing_without_a_start_before_ready(p: dict[str, str]) -> None:
    assert timing(p, 10 * S, True) is None


def line(at_us: int, message: object) -> str:
    return json.dumps({"__MONOTONIC_TIMESTAMP": str(at_us), "MESSAGE": message, "__CURSOR": "c"})


def test_sglang_phases_end_at_their_last_line_before_ready() -> None:
    main, ready = 100 * S, 140 * S
    text = "\n".join(
        [
            line(99 * S, "Load weight end. elapsed=1 s (the previous start's)"),
            line(101 * S, "Load weight begin. avail mem=70 GB"),
            line(109 * S, "Load weight end. elapsed=8.0 s, type=X"),
            line(110 * S, "Memory pool end. avail mem=10 GB"),
            line(120 * S, "Capture prefill CUDA graph end. elapsed=10 s"),
            line(135 * S, "Capture decode CUDA graph end. elapsed=15 s"),
            line(141 * S, "Load weight end. (after ready: not this start's)"),
            "not json",
            json.dumps(["a list"]),
        ]
    )
    got = phases(journal_entries(text), compile_phases(SGLANG), main, ready)
    assert got == [
        {"phase": "weights", "s": 9.0, "end_s": 9.0},
        {"phase": "memory_pool", "s": 1.0, "end_s": 10.0},
        {"phase": "cuda_graph", "s": 25.0, "end_s": 35.0},
        {"phase": "serving", "s": 5.0, "end_s": 40.0},
    ]


def test_a_phase_the_log_never_shows_is_not_reported_and_no_phase_means_none() -> None:
    entries = journal_entries(line(5 * S, "Memory pool end. x"))
    assert [p["phase"] for p in phases(entries, compile_phases(SGLANG), 0, 10 * S)] == ["memory_pool", "serving"]
    assert phases(journal_entries(line(5 * S, "something else")), compile_phases(SGLANG), 0, 10 * S) == []


def test_a_binary_message_is_decoded_and_an_overlong_one_never_matched() -> None:
    raw = list(b"Load weight end. \xff")
    assert journal_entries(line(3, raw)) == [(3, "Load weight end. \ufffd")]
    long = "Load weight end. " + "x" * 5000
    assert phases(journal_entries(line(3, long)), compile_phases(SGLANG), 0, 10) == []


def test_a_pattern_that_does_not_compile_names_itself() -> None:
    with pytest.raises(ValueError, match="weights"):
        compile_phases([{"name": "weights", "pattern": "("}])


@given(st.lists(st.tuples(st.integers(0, 200 * S), st.sampled_from(["Load weight end.", "Memory pool end.", "x"]))))
def test_phases_add_up_to_the_time_from_the_process_to_ready(entries: list[tuple[int, str]]) -> None:
    main, ready = 50 * S, 150 * S
    got = phases(sorted(entries), compile_phases(SGLANG), main, ready)
    if got:
        assert got[-1]["phase"] == "serving"
        assert sum(p["s"] for p in got) == pytest.approx(100.0, abs=0.01)
        assert all(p["s"] >= 0 for p in got)
        assert [p["end_s"] for p in got] == sorted(p["end_s"] for p in got)


@given(st.text())
def test_journal_entries_never_raises(text: str) -> None:
    for at, message in journal_entries(text):
        assert isinstance(at, int) and isinstance(message, str)
