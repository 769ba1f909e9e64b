"""One run of a tune campaign at a time (issue 56, cause 9: ``--resume`` from a second shell ran the same campaign
again). The lock is taken by one process and tried by another (forked); a lock left by a killed run is taken over
without a word; a lock path that cannot be a lock file (a FIFO, a symlink, a folder, a device) is refused in one line
and left as it was. Everything lives in the test's temp folder."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import stat
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from knobfleet.tune import owner
from knobfleet.tune.run import TuneError
from tests.unit.test_paths import PHRASE, plant, tree

FORK = multiprocessing.get_context("fork")


def hold(record: str, ready: Event, release: Event) -> None:
    """The other process: own the campaign until told to let go (or killed)."""
    with owner.owned(Path(record), "seed"):
        ready.set()
        release.wait(30)


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path / "state" / "tune" / "seed.json"


def start_holder(record: Path) -> tuple[multiprocessing.process.BaseProcess, Event]:
    ready, release = FORK.Event(), FORK.Event()
    child = FORK.Process(target=hold, args=(str(record), ready, release))
    child.start()
    assert ready.wait(20), "the holder never took the lock"
    return child, release


def test_a_second_process_is_refused_naming_the_holder_until_it_lets_go(record: Path) -> None:
    child, release = start_holder(record)
    try:
        assert child.pid is not None
        with pytest.raises(owner.CampaignBusy) as info, owner.owned(record, "seed"):
            pytest.fail("ran while another process owns the campaign")
        line = str(info.value)
        assert "\n" not in line and info.value.exit_code == 1
        assert line.startswith(
            f"state/tune/seed.json: campaign seed is being run by PID {child.pid} on host {socket.gethostname()} since "
        )
        assert line.endswith(
            f"; wait for it or stop PID {child.pid} (kill {child.pid}), then continue it with "
            "`knobfleet tune SPACE --resume`"
        )
    finally:
        release.set()
        child.join(20)
    assert child.exitcode == 0
    with owner.owned(record, "seed"):  # let go: the next run owns it
        assert f'"pid": {os.getpid()}' in owner.lock_path(record).read_text()
    assert owner.lock_path(record).read_text() == ""


def test_a_lock_left_by_a_killed_run_is_taken_over_silently(record: Path) -> None:
    child, _release = start_holder(record)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join(20)
    assert f'"pid": {child.pid}' in owner.lock_path(record).read_text()  # the file stays, naming the dead run
    with owner.owned(record, "seed"):
        assert f'"pid": {os.getpid()}' in owner.lock_path(record).read_text()


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        (b"", "by another process (it has not written its PID yet)"),
        (b'{"pid": "1; rm -rf /", "host": "h"}', "by another process"),
        (b'{"pid": 4242, "host": "gpu\\u3164-2\\u001b[2J", "started": 0}', "PID 4242 on host 'gpu\\u3164-2\\x1b[2J'"),
    ],
)
def test_what_the_holder_wrote_is_shown_escaped_or_not_at_all(tmp_path: Path, content: bytes, expect: str) -> None:
    (tmp_path / "seed.lock").write_bytes(content)
    with open(tmp_path / "seed.lock", "rb") as fh:
        line = owner.busy_line(Path("seed.json"), "seed", owner.holder(fh.fileno()))
    assert expect in line and "\n" not in line and "\x1b" not in line and "\u3164" not in line


@pytest.mark.parametrize("kind", ["fifo", "device", "folder", "dangling", "symlink", "loop"])
def test_a_lock_path_that_cannot_be_a_lock_file_is_refused_and_left_alone(record: Path, kind: str) -> None:
    lock = owner.lock_path(record)
    lock.parent.mkdir(parents=True)
    if kind == "symlink":
        (lock.parent / "elsewhere.txt").write_text("keep me\n")
        os.symlink(lock.parent / "elsewhere.txt", lock)
    else:
        plant(lock, kind)
    before = tree(lock.parent)
    with pytest.raises(TuneError) as info, owner.owned(record, "seed"):
        pytest.fail("ran without owning the campaign")
    what = "is a symlink" if kind in ("symlink", "dangling", "loop") else PHRASE[kind]  # never followed
    assert str(info.value) == (
        f"state/tune/seed.lock: {what}; a campaign lock must be a regular file: remove it; it only holds the PID "
        "of the run in progress"
    )
    assert tree(lock.parent) == before
    if kind == "symlink":
        assert (lock.parent / "elsewhere.txt").read_text() == "keep me\n"


def test_the_lock_file_is_owner_only(record: Path) -> None:
    with owner.owned(record, "seed"):
        assert stat.S_IMODE(os.stat(owner.lock_path(record)).st_mode) == 0o600
