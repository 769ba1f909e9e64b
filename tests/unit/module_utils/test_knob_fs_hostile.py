"""Host reads, appends and walks under hostile inputs (module_utils knob_fs and knob_observe's readers): every
FIFO, device node, socket, symlink and hard link is made by the test in its own temp dir."""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from knobfleet.module_utils import knob_fs, knob_observe
from knobfleet.module_utils.knob_fs import UnsafePath


def fifo(p: Path) -> None:
    os.mkfifo(p)


def device(p: Path) -> None:
    os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # a /dev/zero-like node in the temp dir


def sock(p: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()


def directory(p: Path) -> None:
    p.mkdir()


def oversized(p: Path) -> None:
    with open(p, "wb") as fh:
        fh.truncate(knob_fs.MAX_FILE + 1)


def hard_link(p: Path) -> None:
    (p.parent / "other").write_text("another file's content\n")
    os.link(p.parent / "other", p)


SPECIAL: dict[str, Callable[[Path], None]] = {
    "fifo": fifo,
    "device": device,
    "socket": sock,
    "directory": directory,
    "oversized": oversized,
}


@pytest.mark.parametrize("case", sorted(SPECIAL))
def test_reads_refuse_special_and_oversized_files_without_blocking(tmp_path: Path, case: str) -> None:
    SPECIAL[case](tmp_path / "f")
    with pytest.raises(UnsafePath):
        knob_fs.read_stat(str(tmp_path / "f"))
    assert knob_fs.same_content(str(tmp_path / "f"), b"x") is False  # differs; never read


def test_a_hard_link_is_refused_where_one_link_is_required(tmp_path: Path) -> None:
    hard_link(tmp_path / "f")
    assert knob_fs.read_stat(str(tmp_path / "f"))[0] == b"another file's content\n"
    with pytest.raises(UnsafePath, match="2 hard links"):
        knob_fs.read_stat(str(tmp_path / "f"), single_link=True)
    assert knob_fs.same_content(str(tmp_path / "f"), b"another file's content\n") is False


@pytest.mark.parametrize("tail", [b"", b'{"a": 1}\n', b'{"a": 1}\n{"cut sh'])
def test_appends_start_on_a_fresh_line(tmp_path: Path, tail: bytes) -> None:
    ledger = tmp_path / "ledger.jsonl"
    if tail:
        ledger.write_bytes(tail)
    knob_fs.append_line(str(ledger), b'{"b": 2}\n')
    assert ledger.read_bytes().splitlines()[-1] == b'{"b": 2}' and ledger.read_bytes().endswith(b"\n")
    assert json.loads(ledger.read_bytes().splitlines()[-1]) == {"b": 2}


@pytest.mark.parametrize("case", ["fifo", "device", "socket", "directory"])
def test_appends_refuse_what_is_not_a_regular_file(tmp_path: Path, case: str) -> None:
    SPECIAL[case](tmp_path / "ledger.jsonl")
    with pytest.raises(UnsafePath):
        knob_fs.append_line(str(tmp_path / "ledger.jsonl"), b"{}\n")


def test_remove_tree_never_follows_a_symlink_nor_leaves_the_tree(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    tree = tmp_path / "gens" / "0001"
    tree.mkdir(parents=True)
    (tree / "meta.json").write_text("{}")
    (tree / "link").symlink_to(victim)
    (tree / "dropins").mkdir()
    (tree / "dropins" / "a.conf").write_text("x")
    fd = knob_fs.open_dir(str(tmp_path / "gens"))
    try:
        knob_fs.remove_tree_at(fd, "0001")
        (tmp_path / "gens" / "0002").symlink_to(victim)
        with pytest.raises(OSError):
            knob_fs.remove_tree_at(fd, "0002")
    finally:
        os.close(fd)
    assert not tree.exists() and (victim / "precious").read_text() == "keep"


@pytest.mark.parametrize("case", ["fifo", "device", "socket", "directory", "oversized"])
def test_file_info_reports_special_files_and_ships_nothing_of_them(tmp_path: Path, case: str) -> None:
    SPECIAL[case](tmp_path / "f")
    info = knob_observe.file_info(str(tmp_path / "f"))
    assert info["exists"] and "content" not in info and info.get("sha256") is None


def test_file_info_of_a_hard_link_reads_nothing(tmp_path: Path) -> None:
    hard_link(tmp_path / "f")
    info = knob_observe.file_info(str(tmp_path / "f"))
    assert info["error"].startswith("hard-linked") and "content" not in info and "sha256" not in info


@pytest.mark.parametrize("case", ["fifo", "list", "bad json", "device"])
def test_generations_report_an_unreadable_meta_and_never_block(tmp_path: Path, case: str) -> None:
    gen = tmp_path / "generations" / "0001"
    gen.mkdir(parents=True)
    meta = gen / "meta.json"
    if case == "list":
        meta.write_text("[]")
    elif case == "bad json":
        meta.write_text("{")
    else:
        SPECIAL[case](meta)
    (tmp_path / "lock").mkdir()  # not a file either
    g = knob_observe.generations(str(tmp_path))
    assert [e["generation"] for e in g["list"]] == [1] and "meta" not in g["list"][0]
    assert any("0001/meta.json" in e for e in g["errors"]) and "corrupt" in g["lock"]


def test_a_symlinked_state_dir_is_not_read(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "generations" / "0001").mkdir(parents=True)
    (tmp_path / "state").symlink_to(real)
    g = knob_observe.generations(str(tmp_path / "state"))
    assert g["list"] == [] and g["errors"] and g["ledger"] == []
