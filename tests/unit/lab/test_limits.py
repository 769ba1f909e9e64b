"""Sizing the inotify limits a lab of N hosts needs (pure), and recording / putting them back."""

from __future__ import annotations

from pathlib import Path

import pytest

from knobfleet.lab import limits
from knobfleet.lab.limits import INSTANCES, WATCHES


def test_a_small_lab_changes_nothing() -> None:
    assert limits.plan(3, {INSTANCES: 128, WATCHES: 192536}, in_use_instances=10, in_use_watches=50) == []


def test_64_hosts_raise_instances_sized_to_the_count() -> None:
    (change,) = limits.plan(64, {INSTANCES: 128, WATCHES: 192536}, in_use_instances=10, in_use_watches=50)
    assert change.name == INSTANCES
    assert change.wanted == 10 + 64 * limits.INSTANCES_PER_HOST + limits.INSTANCES_SPARE
    assert "64 new host(s)" in change.message() and "lab down" in change.message()


def test_limits_are_never_lowered_and_no_new_host_needs_nothing() -> None:
    assert limits.plan(64, {INSTANCES: 100000, WATCHES: 10**7}, 10, 50) == []
    assert limits.plan(0, {INSTANCES: 1, WATCHES: 1}, 10, 50) == []


def test_watches_are_raised_when_low() -> None:
    names = {c.name for c in limits.plan(16, {INSTANCES: 10**5, WATCHES: 1000}, 0, 900)}
    assert names == {WATCHES}


@pytest.fixture
def fake_sys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "sys"
    for name, value in ((INSTANCES, 128), (WATCHES, 192536)):
        p = root / name.replace(".", "/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{value}\n")
    monkeypatch.setattr(limits, "PROC_SYS", root)
    monkeypatch.setattr(limits, "usage", lambda uid=0: (20, 100))
    return root


def test_raise_records_the_first_value_and_restore_puts_it_back(fake_sys: Path, tmp_path: Path) -> None:
    rec = tmp_path / "run"
    (c,) = limits.raise_for(32, rec)
    assert limits.read(INSTANCES) == c.wanted
    limits.raise_for(64, rec)  # a bigger lab later: the recorded first value stays 128
    assert limits.read(INSTANCES) > c.wanted
    assert limits.restore(rec) == [f"{INSTANCES}=128"]
    assert limits.read(INSTANCES) == 128
    assert not (rec / limits.RECORD).exists()


def test_restore_leaves_a_value_someone_else_changed(fake_sys: Path, tmp_path: Path) -> None:
    rec = tmp_path / "run"
    limits.raise_for(64, rec)
    limits.write(INSTANCES, 4096)
    assert limits.restore(rec) == []
    assert limits.read(INSTANCES) == 4096
    assert limits.restore(rec) == []  # nothing recorded any more
