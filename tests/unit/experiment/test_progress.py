"""Progress of ab / bench --repeats / the gate while they run: a live line on a terminal (tested under a real
pseudo-terminal), one line per round on stderr without one, and ``--json`` stdout unchanged.

The commands run through the real CLI in a child process against ``fake_lab.py`` (a seeded in-process fake
of the host's bench runner; no lab, no Ansible)."""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pexpect  # type: ignore[import-untyped]
import pytest

from knobfleet.experiment import ab, gate
from knobfleet.experiment.bench.run import BenchSpec
from knobfleet.experiment.design import Decision, Settings, decide
from knobfleet.progress import Rounds, duration
from tests.unit.experiment import fake_lab

REPO = Path(__file__).resolve().parents[3]
FAKE = Path(fake_lab.__file__)
ROUND_DONE = re.compile(r"round (\d+) of at most 15 done · weighted [+-]\d+\.\d% \([+-]\d+\.\d% … [+-]\d+\.\d%\)")


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The children write stored bench results and reports under the test's own state folder."""
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e.pop("KNOBFLEET_INVENTORY", None)
    e["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "python"), e.get("PYTHONPATH", "")])
    e["COLUMNS"] = "400"
    return e | extra


def run_fake(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(FAKE), *args],
        cwd=REPO,
        env=env(**extra),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- under a pseudo-terminal ---------------------------------------------------------------------------------


def test_ab_on_a_terminal_shows_the_round_the_estimate_the_pace_and_what_is_next(tmp_path: Path) -> None:
    child = pexpect.spawn(
        sys.executable,
        [str(FAKE), "ab", "ctas512", "ctas768", "--yes", "--report", str(tmp_path / "r")],
        cwd=str(REPO),
        env=env(),
        encoding="utf-8",
        timeout=120,
        dimensions=(40, 400),
    )
    try:
        child.expect(r"round 1 of at most 15")
        child.expect(r"weighted [+-]\d+\.\d% \([+-]\d+\.\d% … [+-]\d+\.\d%\) · C48 [+-]\d+\.\d% \w+")
        child.expect(r"per round, last possible round in ~")
        child.expect(r"next: round \d+ \((AB|BA), ctas\d+ first\)")
        child.expect(r"verdict: keep ctas512 — ")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before


def test_bench_repeats_on_a_terminal_shows_each_run() -> None:
    child = pexpect.spawn(
        sys.executable,
        [str(FAKE), "bench", "ctas512", "--repeats", "3", "--conc", "48,64"],
        cwd=str(REPO),
        env=env(),
        encoding="utf-8",
        timeout=120,
        dimensions=(40, 400),
    )
    try:
        child.expect(r"run 2 of 3 done · tok/s C48 \d+ \(\d+ … \d+\), C64 \d+")
        child.expect(r"note: SGLANG_SIM_TIME_SCALE=0.25 on this lab host: tok/s are 4x the modelled GPU's")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before


# --- without a terminal ----------------------------------------------------------------------------------------


def test_ab_without_a_terminal_writes_one_line_per_round_on_stderr_and_json_stays_the_document(
    tmp_path: Path,
) -> None:
    proc = run_fake("ab", "ctas512", "ctas768", "--yes", "--json", "--report", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # stdout is the JSON document and nothing else
    assert doc["verdict"] == "keep" and doc["winner"] == "ctas512" and doc["driver"] == 64
    lines = proc.stderr.splitlines()
    assert [int(m.group(1)) for m in map(ROUND_DONE.search, lines) if m] == list(range(1, doc["rounds"] + 1))
    assert len(lines) == doc["rounds"], lines  # one line per round, no live redraws
    assert lines[-1].endswith("next: stop — keep ctas512; ctas512 stays live")
    assert "\r" not in proc.stderr and "\x1b" not in proc.stderr
    assert all("per round" in ln for ln in lines)
    assert json.loads((tmp_path / "r" / "report.json").read_text())["rounds"] == doc["rounds"]


def test_ab_text_output_says_the_lab_time_scale_multiplies_throughput(tmp_path: Path) -> None:
    proc = run_fake("ab", "ctas512", "ctas768", "--yes", "--report", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    assert "SGLANG_SIM_TIME_SCALE=0.25 on this lab host: tok/s are 4x the modelled GPU's" in proc.stdout
    assert "concurrency 64" in proc.stdout.splitlines()[0]  # the verdict names the bucket that drove it


def test_bench_repeats_without_a_terminal_writes_one_line_per_run() -> None:
    proc = run_fake("bench", "ctas512", "--repeats", "3", "--conc", "48", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["repeats"] == 3 and doc["time_scale"] == 0.25
    lines = proc.stderr.splitlines()
    assert [ln.split(" · ")[0] for ln in lines] == [f"bench lab1 ctas512: run {k} of 3 done" for k in (1, 2, 3)]
    assert lines[-1].endswith("next: done: the summary")


def test_a_single_bench_run_writes_no_progress(state_dir: Path) -> None:
    proc = run_fake("bench", "ctas512", "--conc", "48", "--json")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert len(list((state_dir / "bench" / "lab1").glob("ctas512@*.json"))) == 1  # stored under the test's state


# --- the gate --------------------------------------------------------------------------------------------------


def test_gate_reports_each_run_against_the_baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from knobfleet.profiles.store import ProfileStore

    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path))
    for name in ("activate", "consistency", "run_bench"):
        monkeypatch.setattr(gate, name, getattr(fake_lab, f"fake_{name}"))
    store = ProfileStore(REPO / "profiles")
    new, base = store.resolve("ctas768"), store.resolve("ctas512")
    out = io.StringIO()
    status = Rounds("gate lab1 vs ctas512", 2, "run", at_most=False, stream=out)
    res = gate.gate_host(new, base, fake_lab.HV, Path("inventory"), BenchSpec(conc=(48, 64)), 2, None, status)
    lines = out.getvalue().splitlines()
    assert [ln.split(" · ")[0] for ln in lines] == [f"gate lab1 vs ctas512: run {k} of 4 done" for k in (1, 2, 3, 4)]
    assert "baseline ctas512: tok/s C48" in lines[0] and "next: apply ctas768 again" in lines[1]
    assert re.search(r"vs baseline C48 [+-]\d+\.\d%, C64 -\d+\.\d% \(beyond the limit\)", lines[3]), lines[3]
    assert lines[3].endswith("next: the verdict") and not res.passed


# --- the pure parts ---------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    ("times", "limit", "at_most", "pace"),
    [
        ([90.0], 15, True, "1m30s per round, last possible round in ~21m00s"),
        ([60.0, 120.0], 15, True, "1m30s per round, last possible round in ~19m30s"),
        ([30.0, 30.0, 30.0], 3, True, "30s per round, that was the last possible round"),
        ([5.0], 3, False, "5s per round, last round in ~10s"),
    ],
)
def test_pace_and_eta(times: list[float], limit: int, at_most: bool, pace: str) -> None:
    clock, out = Clock(), io.StringIO()
    r = Rounds("x", limit, at_most=at_most, stream=out, clock=clock)
    for k, t in enumerate(times, start=1):
        r.start(k, "running")
        clock.t += t
        r.done(k, "found", "next")
    assert r.pace() == pace
    assert (
        out.getvalue().splitlines()[-1]
        == f"x: round {len(times)} of {'at most ' if at_most else ''}{limit} done · found · {pace} · next: next"
    )


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_line_is_redrawn_in_place_and_cleared() -> None:
    clock, out = Clock(), Tty()
    r = Rounds("ab a vs b", 15, stream=out, clock=clock)
    r.start(1, "AB")
    clock.t += 12
    r.step("benchmarking B (b)")
    r.done(1, "weighted +1.0% (-2.0% … +4.0%)", "round 2 (BA, b first)")
    r.close("verdict line")
    text = out.getvalue()
    assert text.count("\r\x1b[K") == 4 and "\n" not in text.replace("verdict line\n", "")
    assert "ab a vs b: round 1 of at most 15 · benchmarking B (b) (12s)" in text
    assert text.endswith("\r\x1b[Kverdict line\n")


@pytest.mark.parametrize(("secs", "text"), [(0, "0s"), (59.4, "59s"), (60, "1m00s"), (3599, "59m59s"), (3720, "1h02m")])
def test_duration(secs: float, text: str) -> None:
    assert duration(secs) == text


def test_time_scale_note_only_when_the_scale_is_not_1() -> None:
    from knobfleet.fleet.hostvars import HostVars

    assert ab.time_scale(HostVars(host="h"), None) is None
    assert ab.time_scale(HostVars(host="h", host_env={"SGLANG_SIM_TIME_SCALE": "0.25"}), None) == 0.25
    assert ab.time_scale(HostVars(host="h", host_env={"SGLANG_SIM_TIME_SCALE": "fast"}), None) is None
    assert ab.time_scale_note(None) is None and ab.time_scale_note(1.0) is None
    note: Any = ab.time_scale_note(0.5)
    assert note.startswith("note: SGLANG_SIM_TIME_SCALE=0.5 on this lab host: tok/s are 2x the modelled GPU's")


# --- what a round line says (in-process) --------------------------------------------------------------------

W = {48: 0.3, 64: 0.3, 80: 0.3, 96: 0.1}


def profiles() -> tuple[Any, Any]:
    from knobfleet.profiles.store import ProfileStore

    store = ProfileStore(REPO / "profiles")
    return store.resolve("ctas512"), store.resolve("ctas768")


def per_bucket(values: dict[int, float], n: int) -> dict[int, list[float]]:
    return {b: [math.log1p(v) + d for d in (0.01, -0.01, 0.0, 0.005)[:n]] for b, v in values.items()}


def test_round_found_shows_the_weighted_interval_each_bucket_and_the_chance() -> None:
    d = decide(per_bucket({48: 0.02, 64: 0.02, 80: 0.02, 96: 0.02}, 2), Settings(weights=W))
    text = ab.round_found(d)
    assert re.fullmatch(
        r"weighted \+2\.\d% \([+-]\d+\.\d% … \+\d+\.\d%\) · C48 \+2\.0% \w+, C64 \+2\.0% \w+, C80 \+2\.0% \w+, "
        r"C96 \+2\.0% \w+ · promotion chance \d+%",
        text,
    ), text
    assert ab.round_found(Decision("continue", "no rounds yet", 0)) == "no estimate yet"
    final = decide(per_bucket({48: 0.2, 64: 0.2, 80: 0.2, 96: 0.2}, 3), Settings(weights=W))
    assert final.verdict == "promote" and "promotion chance" not in ab.round_found(final)


def test_round_next_says_the_next_order_or_the_stop() -> None:
    a, b = profiles()
    s = Settings(weights=W)
    early = decide(per_bucket(dict.fromkeys(W, 0.02), 1), s)
    assert ab.round_next(early, 0, s, a, b) == "round 2 (BA, ctas768 first) — 1 of at least 3 rounds"
    unsure = decide(per_bucket(dict.fromkeys(W, 0.01), 3), s)
    assert unsure.verdict == "continue"
    assert ab.round_next(unsure, 3, s, a, b) == (
        "round 5 (AB, ctas512 first) — not certain yet: promotion needs the weighted low end above 0, keeping A "
        "a promotion chance under 5% or the high end below +1%"
    )
    keep = decide(per_bucket({48: 0.014, 64: -0.044, 80: -0.005, 96: 0.022}, 3), s)
    assert ab.round_next(keep, 2, s, a, b) == "stop — keep ctas512; ctas512 stays live"
    promote = decide(per_bucket(dict.fromkeys(W, 0.2), 3), s)
    assert ab.round_next(promote, 2, s, a, b) == "stop — promote ctas768; ctas768 stays live"
    assert ab.round_next(Decision("inconclusive", "", 15), 14, s, a, b) == "stop — inconclusive; ctas512 stays live"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-0.1", "argument --futility: -0.1: must be in 0..1"),  # refused while parsing
        ("1", "--futility 1.0: must be in [0, 1)"),  # a fraction, but 1 would stop every experiment at once
        ("1.5", "argument --futility: 1.5: must be in 0..1"),
    ],
)
def test_futility_outside_0_1_is_a_usage_error(value: str, message: str) -> None:
    proc = run_fake("ab", "ctas512", "ctas768", "--yes", "--futility", value)
    assert proc.returncode == 64 and message in proc.stderr, proc.stderr


def test_futility_0_runs_the_old_rule(tmp_path: Path) -> None:
    proc = run_fake("ab", "ctas512", "ctas768", "--yes", "--json", "--futility", "0", "--max-rounds", "4")
    assert (tmp_path / "state" / "experiments").is_dir()  # the default report folder, under the test's state
    doc = json.loads(proc.stdout)
    assert doc["settings"]["futility"] == 0.0
    assert not doc["reason"].startswith("B cannot reach promotion")
