"""knobfleet.lab.neighbours: which lab, of any checkout, runs a lab machine now (from this machine's processes), and
which of those are another checkout's."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from knobfleet.lab import neighbours
from knobfleet.lab.hostfiles import LabHost


def test_others_are_the_machines_a_lab_but_this_one_runs() -> None:
    mine, theirs = Path("/a/.state/lab"), Path("/b/.state/lab")
    labs = {"knobfleet-lab1": [mine], "knobfleet-lab2": [theirs], "knobfleet-lab3": [mine, theirs]}
    assert neighbours.others(labs, mine) == {"knobfleet-lab2": theirs, "knobfleet-lab3": theirs}
    assert neighbours.others(labs, theirs) == {"knobfleet-lab1": mine, "knobfleet-lab3": mine}
    assert neighbours.others({}, mine) == {}


def test_running_lab_finds_the_lab_of_a_process_shaped_as_nspawn(tmp_path: Path) -> None:
    """A process of this test's own, named systemd-nspawn and given a lab host's arguments (nothing is booted)."""
    fake = tmp_path / "systemd-nspawn"
    fake.symlink_to(sys.executable)
    lab = tmp_path / "other" / ".state" / "lab"
    host = LabHost(250)  # far above any lab the suite boots
    proc = subprocess.Popen([str(fake), "-c", "import time; time.sleep(60)", f"--machine={host.machine}",
                             f"--directory={lab / 'hosts' / host.name / 'root'}"])  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while host.machine not in neighbours.running_labs() and time.monotonic() < deadline:
            time.sleep(0.05)  # until the child has exec'd
        assert neighbours.running_labs()[host.machine] == [lab]
    finally:
        proc.kill()
        proc.wait()
    assert host.machine not in neighbours.running_labs()
