"""``knobfleet tune`` through ``cli.run``: a bad SPACE file, a GPU stage with no GPU host, a host not in the
inventory and a resume without a record are one line each, before anything runs (no host is asked anything: the
inventory is a file with hosts no one can reach); the page of a record renders through ``report``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from knobfleet.errors import EXIT_ERROR, EXIT_OK
from tests.unit.cli.test_commands import call
from tests.unit.tune.tune_fixtures import SEED_SPACE


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KNOBFLEET_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    lab1:\n      ansible_host: 127.0.0.9\n")
    return tmp_path


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        (SEED_SPACE.replace('  kernel: {skip: "no GPU host in the lab"}\n', ""), "stages.kernel: the space varies"),
        (SEED_SPACE.replace("host: lab1", "host: lab7"), "stages.engine.host: 'lab7' is not in the inventory"),
        (SEED_SPACE.replace("[16, 32, 64]", "[16, 128]"), "knobs.SGLANG_SM120_MMA_BLOCK_H: 128 is not one of"),
        (SEED_SPACE.replace("base: ctas512", "base: ctas513"), "profile 'ctas513' not found"),
        ("- a\n- list\n", "expected a mapping"),
    ],
)
def test_a_space_that_cannot_run_is_one_line_and_nothing_runs(
    capsys: pytest.CaptureFixture[str], project: Path, text: str, expect: str
) -> None:
    (project / "s.yaml").write_text(text)
    code, out, err = call(capsys, "tune", str(project / "s.yaml"), "-i", str(project / "hosts.yml"), "--yes")
    assert code == EXIT_ERROR and out == ""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and expect in lines[0], err
    assert not (project / "state" / "tune").exists()  # no record: nothing started


# The seed SPACE takes its winner live through the rollout here: its canary needs a router this inventory lacks,
# which tune refuses before anything else (tests/unit/tune/test_live_preconditions.py).
NO_ROUTER_SPACE = SEED_SPACE.replace("live: {hosts: 1}", 'live: {skip: "no router in front of lab1"}')


def test_resume_without_a_campaign_says_so(capsys: pytest.CaptureFixture[str], project: Path) -> None:
    (project / "s.yaml").write_text(NO_ROUTER_SPACE)
    code, _, err = call(capsys, "tune", str(project / "s.yaml"), "-i", str(project / "hosts.yml"), "--resume")
    assert code == EXIT_ERROR and "no campaign seed to resume" in err


def test_a_running_campaign_is_not_started_over(capsys: pytest.CaptureFixture[str], project: Path) -> None:
    (project / "s.yaml").write_text(NO_ROUTER_SPACE)
    rec = project / "state" / "tune" / "seed.json"
    rec.parent.mkdir(parents=True)
    rec.write_text(json.dumps({"schema_version": 1, "kind": "tune", "status": "interrupted"}))
    code, _, err = call(capsys, "tune", str(project / "s.yaml"), "-i", str(project / "hosts.yml"), "--yes")
    assert code == EXIT_ERROR and "is interrupted; continue it with `knobfleet tune SPACE --resume`" in err


def test_a_tune_record_renders_as_a_page_with_every_stage(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import yaml

    from knobfleet.ops import profiles as app
    from knobfleet.tune import run
    from knobfleet.tune.sim import SimStages
    from knobfleet.tune.space import parse

    sp = parse(yaml.safe_load(SEED_SPACE), tmp_path / "s.yaml", SEED_SPACE)
    base = app.store().resolve("ctas512")
    stages = SimStages(dict(sp.traffic or {}))
    c = run.Campaign(sp, base, stages, tmp_path / "seed.json", 188, write_profile=run.write_profile_file(tmp_path))
    c.new_record()
    c.run()
    code, _, _ = call(capsys, "report", str(tmp_path / "seed.json"), "-o", str(tmp_path / "seed.html"))
    assert code == EXIT_OK
    page = (tmp_path / "seed.html").read_text()
    for part in ("1. Model: 15 candidates", "2. Kernel: skipped", "3. Engine", "4. Live", "budget used"):
        assert part in page
    assert "http://" not in page.replace('content="default-src', "") and "https://" not in page


def test_a_live_stage_that_needs_a_router_is_refused_before_the_model_stage(
    capsys: pytest.CaptureFixture[str], project: Path
) -> None:
    (project / "s.yaml").write_text(SEED_SPACE)
    code, out, err = call(capsys, "tune", str(project / "s.yaml"), "-i", str(project / "hosts.yml"), "--yes")
    assert code == EXIT_ERROR and out == "" and err.count("\n") == 1, err
    assert "stages.live: canary: lab1 is behind no router (knob_router_url)" in err
    assert not (project / "state" / "tune").exists()  # no record: no stage ran


def test_a_second_shell_is_refused_while_a_campaign_runs_naming_its_pid(
    capsys: pytest.CaptureFixture[str], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 56, cause 9: ``tune --resume`` (or the same ``tune``) from a second shell while the first runs the
    campaign is refused in one line naming the first's PID; nothing of the first's is touched. The first is a forked
    process whose stages wait (no host is asked anything)."""
    import multiprocessing
    import os
    import socket

    from knobfleet import cli
    from knobfleet.tune import run

    fork = multiprocessing.get_context("fork")
    started, release = fork.Event(), fork.Event()

    def stages_wait(self: run.Campaign) -> dict[str, object]:
        started.set()
        release.wait(60)
        raise run.TuneError("stopped by the test")

    monkeypatch.setattr(run.Campaign, "run", stages_wait)
    (project / "s.yaml").write_text(NO_ROUTER_SPACE)
    argv = ["tune", str(project / "s.yaml"), "-i", str(project / "hosts.yml"), "--yes"]
    first = fork.Process(target=lambda: os._exit(cli.run(argv)))
    first.start()
    try:
        assert started.wait(60), "the first run never reached its stages"
        for extra in (["--resume"], []):
            code, out, err = call(capsys, *argv, *extra)
            assert code == EXIT_ERROR and out == "" and err.count("\n") == 1, err
            assert f"campaign seed is being run by PID {first.pid} on host {socket.gethostname()} since " in err
            assert f"wait for it or stop PID {first.pid} (kill {first.pid})" in err
    finally:
        release.set()
        first.join(60)
    assert first.exitcode == EXIT_ERROR  # the first ended as its stages did, its own way
    assert (project / "state" / "tune" / "seed.lock").read_text() == ""  # let go: the next run may own it
