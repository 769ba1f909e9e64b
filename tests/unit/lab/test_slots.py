"""knobfleet.lab.slots: the machine-wide registry of lab slots (claim, stale claims, release), in a registry
folder the test makes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from knobfleet import labid
from knobfleet.errors import LabError
from knobfleet.lab import slots


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_default_id_takes_slot_0_and_others_the_first_free_slot(tmp_path: Path) -> None:
    reg = tmp_path / "registry"
    state = tmp_path / "state"
    assert slots.claim(state / "lab", "default", set(), reg) == labid.Identity("default", 0)
    assert slots.claim(state / "labs" / "a", "a", set(), reg) == labid.Identity("a", 1)
    assert slots.claim(state / "labs" / "b", "b", {2}, reg) == labid.Identity("b", 3)  # 2: a lab host runs there
    assert labid.read(state / "labs" / "b") == labid.Identity("b", 3)
    # claiming again keeps the slot it holds
    assert slots.claim(state / "labs" / "a", "a", set(), reg) == labid.Identity("a", 1)
    doc = json.loads((reg / "slot-1.json").read_text())
    assert doc["dir"] == str((state / "labs" / "a").resolve()) and doc["id"] == "a"


def test_the_default_slot_held_elsewhere_is_refused_with_the_way_out(tmp_path: Path) -> None:
    reg = tmp_path / "registry"
    slots.claim(tmp_path / "one" / "lab", "default", set(), reg)  # this process is alive: a live claim
    with pytest.raises(LabError, match=r"default lab's addresses \(127\.0\.1\.N\) are taken by the lab in .*one/lab"):
        slots.claim(tmp_path / "two" / "lab", "default", set(), reg)
    with pytest.raises(LabError, match="start this one beside it with --id NAME"):
        slots.claim(tmp_path / "three" / "lab", "default", {0}, reg)


def test_a_stale_claim_is_taken_over_and_a_release_frees_the_slot(tmp_path: Path) -> None:
    reg = tmp_path / "registry"
    reg.mkdir()
    gone = tmp_path / "gone" / "labs" / "x"
    (reg / "slot-1.json").write_text(json.dumps({"dir": str(gone), "id": "x", "pid": _dead_pid()}))
    assert slots.holder(1, reg) is None  # its process is gone and no host of its lab runs
    mine = tmp_path / "state" / "labs" / "y"
    assert slots.claim(mine, "y", set(), reg).slot == 1
    slots.release(mine, reg)
    assert not (reg / "slot-1.json").exists() and labid.read(mine) is None
    assert slots.holder(1, reg) is None


def test_release_leaves_a_slot_another_lab_took_over(tmp_path: Path) -> None:
    reg = tmp_path / "registry"
    mine = tmp_path / "state" / "labs" / "y"
    slots.claim(mine, "y", set(), reg)
    (reg / "slot-1.json").write_text(json.dumps({"dir": str(tmp_path / "other"), "id": "z", "pid": 1}))
    slots.release(mine, reg)
    assert json.loads((reg / "slot-1.json").read_text())["id"] == "z"


def test_every_slot_taken_says_how_to_free_one(tmp_path: Path) -> None:
    with pytest.raises(LabError, match=r"all 23 lab slots of this machine are taken; stop a lab"):
        slots.claim(tmp_path / "labs" / "a", "a", set(range(labid.MAX_SLOTS)), tmp_path / "registry")


def test_lab_up_without_id_takes_the_default_when_free_else_the_first_free_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(labid.ENV, raising=False)
    monkeypatch.setattr(slots, "taken_slots", lambda mine: set())
    reg = tmp_path / "registry"
    state = tmp_path / "state"
    assert slots.for_up(state, reg) == state / "lab"
    slots.claim(tmp_path / "elsewhere" / "lab", "default", set(), reg)  # another checkout's default lab
    assert slots.for_up(state, reg) == state / "labs" / "lab-2"
    monkeypatch.setattr(slots, "taken_slots", lambda mine: {1})
    assert slots.for_up(state, reg) == state / "labs" / "lab-3"
    monkeypatch.setenv(labid.ENV, "mine")
    assert slots.for_up(state, reg) == state / "labs" / "mine"
