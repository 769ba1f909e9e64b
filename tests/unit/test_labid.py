"""knobfleet.labid: what a lab's slot picks (addresses, machine names, ports), which folder an id names, and
which lab a command means (data-driven)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from knobfleet import labid
from knobfleet.errors import UsageError
from knobfleet.lab.cgroups import cgroup_dirs
from knobfleet.lab.hostfiles import LabHost


@pytest.mark.parametrize(
    ("slot", "index", "address", "machine", "unique"),
    [
        (0, 1, "127.0.1.1", "knobfleet-lab1", "lab1"),  # the default lab keeps today's names and addresses
        (0, 64, "127.0.1.64", "knobfleet-lab64", "lab64"),
        (1, 1, "127.0.2.1", "knobfleet-s1-lab1", "s1-lab1"),
        (23, 3, "127.0.24.3", "knobfleet-s23-lab3", "s23-lab3"),
    ],
)
def test_a_slot_picks_addresses_and_machine_names(
    slot: int, index: int, address: str, machine: str, unique: str
) -> None:
    host = LabHost(index, slot)
    assert (host.name, host.address, host.machine, host.unique) == (f"lab{index}", address, machine, unique)
    assert labid.slot_of_machine(machine) == slot
    assert all(d.name == unique for d in cgroup_dirs(host))


@pytest.mark.parametrize("name", ["knobfleet-router", "lab1", "knobfleet-sx-lab1", "knobfleet-s1-lab", ""])
def test_other_machine_names_belong_to_no_slot(name: str) -> None:
    assert labid.slot_of_machine(name) is None


@pytest.mark.parametrize(
    ("slot", "ports"),
    [(0, (19090, 19100, 30080, 30081)), (1, (19190, 19200, 30180, 30181)), (23, (21390, 21400, 32380, 32381))],
)
def test_a_slot_moves_the_controller_side_ports(slot: int, ports: tuple[int, ...]) -> None:
    ident = labid.Identity("x", slot)
    assert tuple(ident.port(p) for p in (19090, 19100, 30080, 30081)) == ports


def test_no_two_slots_share_a_port() -> None:
    bases = (19090, 19100, 30080, 30081)
    used = [labid.Identity("x", s).port(b) for s in range(labid.MAX_SLOTS) for b in bases]
    assert len(used) == len(set(used)) and max(used) < 32768  # below the kernel's ephemeral ports


@pytest.mark.parametrize("name", ["shard1", "a", "lab-2", "x" * 24])
def test_lab_ids_that_name_a_folder(name: str, tmp_path: Path) -> None:
    assert labid.lab_dir(tmp_path, name) == tmp_path / "labs" / name
    assert labid.lab_dir(tmp_path, labid.DEFAULT_ID) == tmp_path / "lab"


@pytest.mark.parametrize("name", ["", "Shard", "1a", "../x", "a/b", "a b", "x" * 25, "a\n"])
def test_a_bad_lab_id_is_refused_in_one_line_naming_the_fix(name: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        labid.lab_dir(tmp_path, name)
    assert "lowercase letters, digits and '-'" in str(err.value) and "\n" not in str(err.value).strip()


def test_a_folder_records_its_identity(tmp_path: Path) -> None:
    folder = tmp_path / "labs" / "shard2"
    assert labid.of(folder) == labid.Identity("shard2", 0)  # not placed yet
    assert labid.of(tmp_path / "lab") == labid.Identity()
    folder.mkdir(parents=True)
    (folder / labid.IDENTITY_FILE).write_text(json.dumps({"id": "shard2", "slot": 3}))
    assert labid.of(folder) == labid.Identity("shard2", 3) and labid.of(folder).block == 4
    for bad in ('{"id": "shard2", "slot": 99}', '{"id": "../x", "slot": 1}', "[]", "not json"):
        (folder / labid.IDENTITY_FILE).write_text(bad)
        assert labid.read(folder) is None


def _nspawn_like(tmp_path: Path, folder: Path) -> subprocess.Popen[bytes]:
    """A process whose argv[0] ends in systemd-nspawn (a copy of sleep by that name), recorded as a lab host's."""
    fake = tmp_path / "bin" / "systemd-nspawn"
    if not fake.exists():
        fake.parent.mkdir(exist_ok=True)
        fake.write_bytes(Path("/bin/sleep").read_bytes())
        fake.chmod(0o755)
    proc = subprocess.Popen([str(fake), "30"])
    for _ in range(200):  # until it has exec'd (before, its argv is still this interpreter's)
        if Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(str(fake).encode()):
            break
        time.sleep(0.01)
    (folder / "run").mkdir(parents=True)
    (folder / "run" / "lab1.pid").write_text(f"{proc.pid}\n")
    return proc


def test_the_lab_a_command_means(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(labid.ENV, raising=False)
    assert labid.selected(tmp_path) == tmp_path / "lab"  # nothing runs: the default
    monkeypatch.setenv(labid.ENV, "shard1")
    assert labid.selected(tmp_path) == tmp_path / "labs" / "shard1"
    monkeypatch.delenv(labid.ENV)
    one = _nspawn_like(tmp_path, tmp_path / "labs" / "a")
    try:
        assert labid.selected(tmp_path) == tmp_path / "labs" / "a"  # the one that runs
        two = _nspawn_like(tmp_path, tmp_path / "labs" / "b")
        try:
            with pytest.raises(UsageError, match="labs a, b run in this checkout; name one with --id NAME"):
                labid.selected(tmp_path)
            default = _nspawn_like(tmp_path, tmp_path / "lab")
            try:
                assert labid.selected(tmp_path) == tmp_path / "lab"  # the default lab, when it runs, wins
            finally:
                default.kill()
                default.wait()
        finally:
            two.kill()
            two.wait()
    finally:
        one.kill()
        one.wait()
    assert [name for name, _ in labid.ids(tmp_path)] == ["default", "a", "b"]


def test_labid_is_light_and_in_the_lowest_layer() -> None:
    code = "import sys, knobfleet.labid; print(sorted(m for m in sys.modules if m.startswith('knobfleet')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}).stdout  # fmt: skip
    assert eval(out) == ["knobfleet", "knobfleet.errors", "knobfleet.labid"]
